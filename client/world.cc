#include "muster/world.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/backend.h"
#include "backends/builtin/cpu_backends.h"
#include "backends/gloo/gloo_communicator.h"
#include "client/cuda_driver.h"
#include "client/gpu_path.h"
#include "common/paths.h"
#include "common/status_macros.h"
#include "muster/prefix_store.h"
#include "muster/tcp_store.h"
#include "proto/gpu.grpc.pb.h"
#include "proto/groups.grpc.pb.h"
#include "proto/session.grpc.pb.h"

namespace muster {
namespace {

absl::Status FromGrpc(const grpc::Status& s, absl::string_view context) {
  if (s.ok()) return absl::OkStatus();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(
        absl::StrCat(context, ": musterd unreachable: ", s.error_message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// Reads an integer variable; absent: leaves *value; malformed: error.
absl::Status EnvInt(const char* name, int* value) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return absl::OkStatus();
  if (!absl::SimpleAtoi(v, value)) {
    return absl::InvalidArgumentError(absl::StrCat(name, "='", v, "' is not an integer"));
  }
  return absl::OkStatus();
}

std::string EnvString(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

std::string Hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

absl::StatusOr<InitOptions> InitOptionsFromEnv(InitOptions o) {
  if (o.job_id.empty()) o.job_id = EnvString("MUSTER_JOB_ID");
  if (o.job_id.empty()) o.job_id = "default";
  if (o.rank < 0) RETURN_IF_ERROR(EnvInt("RANK", &o.rank));
  if (o.world_size < 0) RETURN_IF_ERROR(EnvInt("WORLD_SIZE", &o.world_size));
  if (o.local_rank < 0) RETURN_IF_ERROR(EnvInt("LOCAL_RANK", &o.local_rank));
  if (o.local_world_size < 0) RETURN_IF_ERROR(EnvInt("LOCAL_WORLD_SIZE", &o.local_world_size));
  if (o.master_addr.empty()) o.master_addr = EnvString("MASTER_ADDR");
  if (o.master_port == 0) RETURN_IF_ERROR(EnvInt("MASTER_PORT", &o.master_port));
  if (o.socket.empty()) o.socket = ClientSocketPath();
  if (o.generation < 0) {
    int g = -1;
    RETURN_IF_ERROR(EnvInt("MUSTER_GENERATION", &g));
    if (g < 0) RETURN_IF_ERROR(EnvInt("TORCHELASTIC_RESTART_COUNT", &g));
    o.generation = g < 0 ? 0 : g;
  }
  if (o.store_token.empty()) o.store_token = EnvString("MUSTER_STORE_TOKEN");
  if (std::string file = EnvString("MUSTER_STORE_TOKEN_FILE");
      o.store_token.empty() && !file.empty()) {
    std::ifstream in(file);
    std::stringstream content;
    content << in.rdbuf();
    o.store_token = std::string(absl::StripAsciiWhitespace(content.str()));
    if (!in || o.store_token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("MUSTER_STORE_TOKEN_FILE=", file, ": cannot read a token from it"));
    }
  }
  if (o.rank < 0) return absl::InvalidArgumentError("RANK is not set (or pass InitOptions.rank)");
  if (o.world_size < 1) {
    return absl::InvalidArgumentError("WORLD_SIZE is not set (or pass InitOptions.world_size)");
  }
  if (o.master_addr.empty()) {
    return absl::InvalidArgumentError("MASTER_ADDR is not set (or pass InitOptions.master_addr)");
  }
  if (o.master_port <= 0 || o.master_port > 65535) {
    return absl::InvalidArgumentError("MASTER_PORT is not set to a port (1-65535)");
  }
  if (o.local_rank < 0) o.local_rank = o.rank;
  if (o.local_world_size < 0) o.local_world_size = o.world_size;
  return o;
}

// The rank's session with its daemon: the Attach stream; a reader thread
// that collects failure events and notices the stream's end; and the
// rank's unary calls to the daemon, which fail at once after that end and
// are cancelled by it.
//
// The daemon is gone when the stream ends without this rank having left
// (musterd was killed, crashed or shut down): status() turns UNAVAILABLE
// naming its pid and socket, for good (a restarted musterd is a new
// daemon: the rank never reattaches), and `on_gone` runs once on the
// reader thread. Thread-safe.
class WorldSession {
 public:
  using GoneCallback = std::function<void(const absl::Status&)>;

  ~WorldSession() { Close(); }

  absl::Status Open(const InitOptions& o, GoneCallback on_gone) {
    on_gone_ = std::move(on_gone);
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    channel_ = grpc::CreateCustomChannel(absl::StrCat("unix:", o.socket),
                                         grpc::InsecureChannelCredentials(), args);
    if (!channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(10)))) {
      return absl::UnavailableError(absl::StrCat("cannot reach musterd at unix socket ", o.socket,
                                                 " (is it running? MUSTER_SOCKET?)"));
    }
    session_stub_ = v1::Session::NewStub(channel_);
    groups_stub_ = v1::Groups::NewStub(channel_);
    stream_ = session_stub_->Attach(&context_);
    v1::SessionClientMessage hello;
    v1::RegisterRequest* r = hello.mutable_register_();
    r->mutable_rank()->set_job_id(o.job_id);
    r->mutable_rank()->set_global_rank(o.rank);
    r->set_world_size(o.world_size);
    r->set_local_rank(o.local_rank);
    r->set_local_world_size(o.local_world_size);
    r->set_pid(::getpid());
    r->set_host(Hostname());
    r->set_generation(o.generation);
    r->set_master_store_address(absl::StrCat(o.master_addr, ":", o.master_port));
    if (!stream_->Write(hello)) return Finish("registration");
    v1::SessionServerMessage reply;
    if (!stream_->Read(&reply) || !reply.has_registered()) return Finish("registration");
    session_id_ = reply.registered().session_id();
    int64_t pid = reply.registered().daemon_pid();
    daemon_ = pid > 0 ? absl::StrCat("musterd (pid ", pid, ", unix:", o.socket, ")")
                      : absl::StrCat("musterd (unix:", o.socket, ")");
    reader_ = std::thread([this] { ReadEvents(); });
    return absl::OkStatus();
  }

  // Leaves the job (an orderly end of the stream) and joins the reader.
  void Close() {
    if (stream_ == nullptr) return;
    bool write_leave;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      closed_ = true;
      leaving_ = true;
      write_leave = !ended_;  // else the reader finishes the dead stream
    }
    if (write_leave) {
      v1::SessionClientMessage leave;
      leave.mutable_leave();
      stream_->Write(leave);
      stream_->WritesDone();
    }
    if (reader_.joinable()) reader_.join();
    bool finish;
    {
      absl::MutexLock lock(&mu_);
      finish = !finished_;
      finished_ = true;
    }
    if (finish) stream_->Finish();
  }

  // OK while the session lives; UNAVAILABLE naming the daemon once it is gone.
  absl::Status status() const {
    if (!gone_fast_.load(std::memory_order_acquire)) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    return gone_status_;
  }

  // The error `s` as the caller should see it. Once the daemon is gone,
  // every failure is that (UNAVAILABLE naming it; `what` says which call).
  // UNAVAILABLE or CANCELLED while the session still looks alive is how a
  // daemon going away shows first (a shutting-down musterd aborts its
  // segments as UNAVAILABLE; a dead one breaks the connection under a
  // call): wait up to a second for the stream's end to say so.
  absl::Status Explain(absl::Status s, absl::string_view what = "") const {
    if (s.ok()) return s;
    absl::MutexLock lock(&mu_);
    bool maybe_gone =
        s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kCancelled;
    if (!gone_ && maybe_gone && !leaving_ && reader_started()) {
      mu_.AwaitWithTimeout(absl::Condition(&gone_), absl::Seconds(1));
    }
    if (!gone_) return s;
    if (absl::StrContains(s.message(), gone_status_.message())) {
      return absl::UnavailableError(s.message());
    }
    if (what.empty()) return gone_status_;
    return absl::UnavailableError(absl::StrCat(what, ": ", gone_status_.message()));
  }

  // Runs one unary RPC to the daemon (`rpc` gets its context, deadline
  // set): refused once the daemon is gone, cancelled if it goes meanwhile,
  // errors translated (and explained) with `what` as context.
  absl::Status Call(const std::string& what, absl::Duration timeout,
                    const std::function<grpc::Status(grpc::ClientContext*)>& rpc) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    {
      absl::MutexLock lock(&mu_);
      if (gone_) return absl::UnavailableError(absl::StrCat(what, ": ", gone_status_.message()));
      calls_.insert(&context);
    }
    grpc::Status s = rpc(&context);
    {
      absl::MutexLock lock(&mu_);
      calls_.erase(&context);
    }
    if (s.ok()) return absl::OkStatus();
    return Explain(FromGrpc(s, what), what);
  }

  std::vector<std::string> failures() const {
    absl::MutexLock lock(&mu_);
    return failures_;
  }

  v1::Groups::Stub* groups() { return groups_stub_.get(); }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }

 private:
  // Registration failed: the stream's status says why.
  absl::Status Finish(const char* what) {
    grpc::Status s = stream_->Finish();
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      finished_ = true;
    }
    if (s.ok())
      return absl::UnavailableError(absl::StrCat("musterd ended the session during ", what));
    return FromGrpc(s, what);
  }

  bool reader_started() const { return !daemon_.empty(); }

  // The reader thread: failure events until the stream ends; then, unless
  // this rank is leaving, the daemon is gone.
  void ReadEvents() {
    v1::SessionServerMessage event;
    while (stream_->Read(&event)) {
      absl::MutexLock lock(&mu_);
      if (event.has_rank_failed()) {
        const v1::RankInfo& r = event.rank_failed().rank();
        failures_.push_back(absl::StrCat("rank ", r.rank().global_rank(), " (host ", r.host(),
                                         ", pid ", r.pid(), ") failed: ", r.failure()));
      } else if (event.has_job_aborted()) {
        failures_.push_back(absl::StrCat("job aborted: ", event.job_aborted().reason()));
      }
    }
    {
      absl::MutexLock lock(&mu_);
      if (leaving_) return;  // Close() finishes the stream
      ended_ = true;
    }
    // The daemon ended the stream (its status says why) or the connection
    // broke: a unix socket reports a dead peer at once.
    grpc::Status end = stream_->Finish();
    std::string why =
        end.ok() ? "musterd closed it"
                 : absl::StrCat(
                       absl::StatusCodeToString(static_cast<absl::StatusCode>(end.error_code())),
                       ": ", end.error_message());
    absl::Status gone = absl::UnavailableError(
        absl::StrCat(daemon_, " is gone: the session stream ended (", why,
                     "); this rank cannot continue (restart the job's ranks)"));
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
      gone_status_ = gone;
      gone_ = true;
      gone_fast_.store(true, std::memory_order_release);
      failures_.push_back(std::string(gone.message()));
      // Calls in flight would wait for a daemon that cannot answer.
      for (grpc::ClientContext* c : calls_) c->TryCancel();
    }
    if (on_gone_) on_gone_(gone);
  }

  GoneCallback on_gone_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Session::Stub> session_stub_;
  std::unique_ptr<v1::Groups::Stub> groups_stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionClientMessage, v1::SessionServerMessage>>
      stream_;
  std::string session_id_;
  std::string daemon_;  // "musterd (pid P, unix:SOCKET)", set before the reader starts
  std::thread reader_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;   // Close() began: the end is no failure
  bool ended_ ABSL_GUARDED_BY(mu_) = false;     // the reader saw the stream end
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // stream_->Finish() was called
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> gone_fast_{false};  // gone_, for the collectives' fast path
  absl::Status gone_status_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> failures_ ABSL_GUARDED_BY(mu_);
};

World::World(InitOptions options) : options_(std::move(options)) {}

World::~World() {
  if (session_ != nullptr) session_->Close();
}

absl::StatusOr<std::unique_ptr<World>> World::Init(InitOptions options) {
  // Debian's Abseil is built with Mutex deadlock detection on: a lock-order
  // graph updated on every lock and every Mutex destroyed (each Work has
  // one). Off in ranks, as in musterd; TSan checks lock order in our tests.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  ASSIGN_OR_RETURN(options, InitOptionsFromEnv(std::move(options)));
  std::unique_ptr<World> world(new World(options));
  world->session_ = std::make_shared<Session>();
  World* self = world.get();
  RETURN_IF_ERROR(world->session_->Open(
      world->options_, [self](const absl::Status& gone) { self->OnDaemonGone(gone); }));
  std::vector<int> all(options.world_size);
  for (int r = 0; r < options.world_size; ++r) all[r] = r;
  GroupOptions world_options;
  world_options.backend = options.backend;
  world_options.timeout = options.timeout;
  ASSIGN_OR_RETURN(world->world_group_,
                   world->CreateGroup(all, world_options, options.world_group_name));
  return world;
}

namespace {

// musterd's NCCL communicators as the group's "nccl" (cuda) backend: its
// calls go through the group's GpuPath (stream-ordered requests to
// musterd), not through a Communicator in this process.
class DaemonGpuBackend final : public Backend {
 public:
  explicit DaemonGpuBackend(BackendOptions options) : options_(std::move(options)) {}
  const std::string& name() const override { return name_; }
  const BackendOptions& options() const override { return options_; }

 private:
  const std::string name_ = "nccl";
  const BackendOptions options_;
};

// The SDK's built-in backends, registered once like a third party's.
void RegisterSdkBackends() {
  static std::once_flag once;
  std::call_once(once, [] {
    RegisterBuiltinCpuBackends();
    (void)RegisterBackend("nccl",
                          [](const BackendOptions& o) -> absl::StatusOr<std::unique_ptr<Backend>> {
                            return std::make_unique<DaemonGpuBackend>(o);
                          },
                          {"cuda"});
  });
}

const char* DeviceName(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

}  // namespace

void World::CreateBackends(ProcessGroup& group, const std::map<std::string, std::string>& config,
                           const v1::GroupInfo& info) {
  for (Device device : {Device::kCpu, Device::kCuda}) {
    absl::Status& status = device == Device::kCpu ? group.cpu_status_ : group.cuda_status_;
    auto it = config.find(DeviceName(device));
    if (it == config.end()) {
      status = absl::InvalidArgumentError(
          absl::StrCat(device == Device::kCpu ? "CPU" : "CUDA", " tensors on a group without a ",
                       DeviceName(device), " backend (group '", group.name_, "', backend '",
                       group.backend_, "'; create it with e.g. \"cpu:gloo,cuda:nccl\")"));
      continue;
    }
    if (!group.is_member()) {
      status = absl::InvalidArgumentError(
          absl::StrCat("rank ", options_.rank, " is not a member of group '", group.name_, "'"));
      continue;
    }
    const std::string& backend = it->second;
    BackendOptions o;
    o.group_name = group.name_;
    o.group_rank = group.rank_;
    o.group_size = group.size();
    o.global_ranks = group.ranks_;
    o.device = DeviceName(device);
    o.timeout = group.timeout_;
    for (const auto& m : info.members()) o.member_nodes.push_back(m.daemon());
    o.shm_name = info.shm_name();
    o.shm_group_ranks.assign(info.shm_group_ranks().begin(), info.shm_group_ranks().end());
    if (auto address = LocalAddressToward(options_.master_addr, options_.master_port);
        address.ok()) {
      o.local_address = *address;
    }
    // Gloo's keys keep their historical prefix; other backends get their own.
    std::string prefix =
        absl::StrCat(backend == "gloo" || backend == "shm" ? "muster-gloo" : "muster-" + backend,
                     "/", options_.job_id, "/", options_.generation, "/", group.name_);
    InitOptions w = options_;
    absl::Duration timeout = group.timeout_;
    o.connect_store = [w, timeout, prefix]() -> absl::StatusOr<std::shared_ptr<Store>> {
      TcpStoreOptions t;
      t.host = w.master_addr;
      t.port = w.master_port;
      t.token = w.store_token;
      t.timeout = timeout;
      ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> tcp, TcpStore::Connect(t));
      return std::shared_ptr<Store>(
          std::make_shared<PrefixStore>(prefix, std::shared_ptr<Store>(std::move(tcp))));
    };
    absl::StatusOr<std::unique_ptr<Backend>> created = BackendRegistry::Global().Create(backend, o);
    if (!created.ok()) {
      status = Annotate(created.status(), absl::StrCat("backend '", backend, "'"));
      continue;
    }
    if (device == Device::kCpu) {
      group.cpu_backend_ = std::move(*created);
    } else {
      group.daemon_gpu_ = dynamic_cast<DaemonGpuBackend*>(created->get()) != nullptr;
      group.cuda_backend_ = std::move(*created);
    }
  }
}

std::string World::NextGroupName() {
  absl::MutexLock lock(&mu_);
  return absl::StrCat("group_", ++group_counter_);
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> World::CreateGroup(const std::vector<int>& ranks,
                                                                 const GroupOptions& options,
                                                                 const std::string& name) {
  RegisterSdkBackends();
  auto config =
      BackendRegistry::Global().Parse(options.backend.empty() ? options_.backend : options.backend);
  if (!config.ok()) return config.status();
  v1::CreateGroupRequest req;
  req.mutable_caller()->set_job_id(options_.job_id);
  req.mutable_caller()->set_global_rank(options_.rank);
  for (int r : ranks) req.add_ranks(r);
  req.set_name(name);
  req.set_tag(options.tag);
  req.mutable_options()->set_backend(FormatBackendConfig(*config));
  absl::Duration timeout =
      options.timeout > absl::ZeroDuration() ? options.timeout : options_.timeout;
  req.mutable_options()->mutable_timeout()->set_millis(absl::ToInt64Milliseconds(timeout));
  req.mutable_options()->set_local_synchronization(options.local_synchronization);
  v1::CreateGroupResponse resp;
  RETURN_IF_ERROR(session_->Call(absl::StrCat("new group '", name, "'"),
                                 timeout + absl::Seconds(30), [&](grpc::ClientContext* context) {
                                   return session_->groups()->CreateGroup(context, req, &resp);
                                 }));
  auto group = std::make_shared<ProcessGroup>();
  group->world_ = this;
  group->session_ = session_;
  group->name_ = resp.group().name();
  group->tag_ = resp.group().tag();
  group->backend_ = resp.group().backend();
  group->ranks_ = ranks;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == options_.rank) group->rank_ = static_cast<int>(i);
  }
  if (resp.group().timeout_millis() > 0) {
    group->timeout_ = absl::Milliseconds(resp.group().timeout_millis());
  }
  CreateBackends(*group, *config, resp.group());
  // From now on the daemon's end breaks the group; if it already ended,
  // the group is of no use.
  {
    absl::MutexLock lock(&groups_mu_);
    groups_.erase(std::remove_if(groups_.begin(), groups_.end(),
                                 [](const std::weak_ptr<ProcessGroup>& g) { return g.expired(); }),
                  groups_.end());
    groups_.push_back(group);
  }
  if (absl::Status gone = session_->status(); !gone.ok()) {
    group->BreakForDaemon(gone);
    return absl::UnavailableError(absl::StrCat("new group '", name, "': ", gone.message()));
  }
  return group;
}

void World::OnDaemonGone(const absl::Status& gone) {
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  {
    absl::MutexLock lock(&groups_mu_);
    for (const auto& weak : groups_) {
      if (auto g = weak.lock()) groups.push_back(std::move(g));
    }
  }
  for (const auto& g : groups) g->BreakForDaemon(gone);
}

absl::Status World::session_status() const { return session_->status(); }

absl::Status ProcessGroup::SessionStatus() const {
  return session_ != nullptr ? session_->status() : absl::OkStatus();
}

absl::Status ProcessGroup::Explain(absl::Status status) const {
  return session_ != nullptr ? session_->Explain(std::move(status)) : status;
}

void ProcessGroup::BreakForDaemon(const absl::Status& gone) {
  // The built-in CPU backends wake a collective waiting in shared memory
  // and fail later ones (a Gloo collective in flight finishes with its
  // peers, then the meshes close), and end point-to-point waits.
  if (cpu_backend_ != nullptr) cpu_backend_->Abort(gone);
  if (cuda_backend_ != nullptr) cuda_backend_->Abort(gone);
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> World::NewGroup(std::vector<int> ranks,
                                                              GroupOptions options) {
  std::string name = options.name.empty() ? NextGroupName() : options.name;
  if (!options.name.empty()) {
    absl::MutexLock lock(&mu_);
    ++group_counter_;  // keep automatic names aligned across ranks
  }
  return CreateGroup(ranks, options, name);
}

absl::StatusOr<std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>>
World::NewSubgroups(int group_size, GroupOptions options) {
  if (group_size <= 0 || world_size() % group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group size ", group_size, " must be positive and divide the world size ", world_size()));
  }
  std::vector<std::vector<int>> lists;
  for (int start = 0; start < world_size(); start += group_size) {
    std::vector<int> list;
    for (int r = start; r < start + group_size; ++r) list.push_back(r);
    lists.push_back(std::move(list));
  }
  return NewSubgroupsByEnumeration(lists, options);
}

absl::StatusOr<std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>>
World::NewSubgroupsByEnumeration(const std::vector<std::vector<int>>& rank_lists,
                                 GroupOptions options) {
  std::vector<int> owner(world_size(), -1);
  for (size_t i = 0; i < rank_lists.size(); ++i) {
    for (int r : rank_lists[i]) {
      if (r < 0 || r >= world_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " is outside the world of size ", world_size()));
      }
      if (owner[r] >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " is in subgroups ", owner[r], " and ", i));
      }
      owner[r] = static_cast<int>(i);
    }
  }
  std::shared_ptr<ProcessGroup> mine;
  std::vector<std::shared_ptr<ProcessGroup>> all;
  for (const auto& list : rank_lists) {
    GroupOptions o = options;
    o.name.clear();
    ASSIGN_OR_RETURN(auto group, NewGroup(list, o));
    if (group->is_member()) mine = group;
    all.push_back(std::move(group));
  }
  return std::make_pair(mine, all);
}

std::shared_ptr<Work> ProcessGroup::SubmitGpu(const GpuCall& call) {
  if (!is_member()) {
    return Failed(absl::FailedPreconditionError(
        absl::StrCat("this rank is not a member of group '", name_, "'")));
  }
  // musterd runs the GPU collectives: nothing to do without it.
  if (absl::Status gone = SessionStatus(); !gone.ok()) return Failed(gone);
  std::shared_ptr<GpuPath> path;
  {
    absl::MutexLock lock(&gpu_mu_);
    if (gpu_ == nullptr) {
      absl::StatusOr<CudaDriver*> driver = SystemCudaDriver();
      if (!driver.ok()) return Failed(driver.status());
      std::shared_ptr<v1::Gpu::Stub> stub = v1::Gpu::NewStub(world_->session_->channel());
      // Creating the communicator may take up to the group timeout.
      const absl::Duration deadline = timeout_ + absl::Seconds(10);
      GpuTransport transport = [stub, deadline](const v1::GpuCollectiveRequest& request)
          -> absl::StatusOr<v1::GpuCollectiveResponse> {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
        v1::GpuCollectiveResponse response;
        grpc::Status s = stub->Collective(&context, request, &response);
        if (!s.ok()) {
          return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
        }
        return response;
      };
      GpuStatusCheck status_check = [stub, job = world_->job_id(), rank = world_->rank(),
                                     group = name_](uint64_t sequence) -> absl::Status {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
        v1::CollectiveStatusRequest request;
        request.mutable_caller()->set_job_id(job);
        request.mutable_caller()->set_global_rank(rank);
        request.set_group(group);
        request.set_sequence(sequence);
        v1::CollectiveStatusResponse response;
        grpc::Status s = stub->CollectiveStatus(&context, request, &response);
        if (!s.ok()) {
          return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
        }
        return absl::OkStatus();
      };
      gpu_ = std::make_shared<GpuPath>(*driver, std::move(transport), world_->job_id(),
                                       world_->rank(), name_, std::move(status_check), deadline);
    }
    path = gpu_;
  }
  absl::StatusOr<GpuPath::Launched> launched = path->Run(call);
  if (!launched.ok()) return Failed(Explain(launched.status()));
  auto work = std::make_shared<Work>();
  work->sequence_ = launched->sequence;
  std::shared_ptr<void> marker(launched->marker, [path](void* e) { path->Release(e); });
  work->synchronize_ = [path, marker, sequence = launched->sequence](absl::Time deadline) {
    return path->Synchronize(marker.get(), sequence, deadline);
  };
  work->Complete(absl::OkStatus());
  return work;
}

absl::Status World::DestroyProcessGroup(ProcessGroup& group) {
  v1::DestroyGroupRequest req;
  req.mutable_caller()->set_job_id(options_.job_id);
  req.mutable_caller()->set_global_rank(options_.rank);
  req.set_name(group.name());
  v1::DestroyGroupResponse resp;
  return session_->Call(absl::StrCat("destroy group '", group.name(), "'"), absl::Seconds(30),
                        [&](grpc::ClientContext* context) {
                          return session_->groups()->DestroyGroup(context, req, &resp);
                        });
}

absl::StatusOr<std::shared_ptr<Store>> World::store() {
  absl::MutexLock lock(&mu_);
  if (store_ == nullptr) {
    TcpStoreOptions o;
    o.host = options_.master_addr;
    o.port = options_.master_port;
    o.token = options_.store_token;
    o.timeout = options_.timeout;
    ASSIGN_OR_RETURN(auto tcp, TcpStore::Connect(o));
    store_ = std::make_shared<PrefixStore>(
        absl::StrCat("user/", options_.job_id, "/", options_.generation),
        std::shared_ptr<Store>(std::move(tcp)));
  }
  return store_;
}

std::vector<std::string> World::failures() const { return session_->failures(); }

namespace {
absl::Mutex default_world_mu;
World* default_world ABSL_GUARDED_BY(default_world_mu) = nullptr;
}  // namespace

absl::Status InitProcessGroup(InitOptions options) {
  absl::MutexLock lock(&default_world_mu);
  if (default_world != nullptr) {
    return absl::FailedPreconditionError("InitProcessGroup was already called in this process");
  }
  ASSIGN_OR_RETURN(auto world, World::Init(std::move(options)));
  default_world = world.release();
  return absl::OkStatus();
}

World* DefaultWorld() {
  absl::MutexLock lock(&default_world_mu);
  return default_world;
}

bool IsInitialized() { return DefaultWorld() != nullptr; }

absl::Status DestroyProcessGroup() {
  World* world;
  {
    absl::MutexLock lock(&default_world_mu);
    world = default_world;
    default_world = nullptr;
  }
  if (world == nullptr) return absl::FailedPreconditionError("InitProcessGroup was not called");
  delete world;
  return absl::OkStatus();
}

absl::StatusOr<int> ProcessGroup::GroupRank(int global_rank) const {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] == global_rank) return static_cast<int>(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("rank ", global_rank, " is not in group '", name_, "'"));
}

absl::StatusOr<int> ProcessGroup::GlobalRank(int group_rank) const {
  if (group_rank < 0 || group_rank >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("group rank ", group_rank, " is outside group '",
                                                   name_, "' of size ", size()));
  }
  return ranks_[group_rank];
}

absl::Status ProcessGroup::Barrier(absl::Duration timeout) {
  if (!is_member()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", world_->rank(), " is not a member of group '", name_, "'"));
  }
  int64_t sequence;
  {
    absl::MutexLock lock(&world_->mu_);
    sequence = ++barrier_sequence_;
  }
  v1::BarrierRequest req;
  req.mutable_caller()->set_job_id(world_->job_id());
  req.mutable_caller()->set_global_rank(world_->rank());
  req.set_name(name_);
  req.set_sequence(sequence);
  if (timeout > absl::ZeroDuration()) {
    req.mutable_timeout()->set_millis(absl::ToInt64Milliseconds(timeout));
  }
  absl::Duration rpc =
      (timeout > absl::ZeroDuration() ? timeout : world_->options_.timeout) + absl::Seconds(30);
  v1::BarrierResponse resp;
  return world_->session_->Call(absl::StrCat("barrier on group '", name_, "'"), rpc,
                                [&](grpc::ClientContext* context) {
                                  return world_->session_->groups()->Barrier(context, req, &resp);
                                });
}

}  // namespace muster
