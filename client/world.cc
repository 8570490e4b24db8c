// World (the public handle and World::Impl), the session with musterd it
// shares with its groups, the c10d-style globals and InitOptionsFromEnv.
#include "muster/world.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "backends/backend.h"
#include "client/process_group_impl.h"
#include "client/world_impl.h"
#include "common/paths.h"
#include "common/status_macros.h"
#include "muster/prefix_store.h"
#include "muster/tcp_store.h"
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
  if (o.trace_records < 0) {
    int n = -1;
    RETURN_IF_ERROR(EnvInt("MUSTER_TRACE_RECORDS", &n));
    o.trace_records = n < 0 ? 2048 : n;
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
  if (o.min_world_size < 0) RETURN_IF_ERROR(EnvInt("MUSTER_MIN_WORLD_SIZE", &o.min_world_size));
  if (o.min_world_size == 0 || o.min_world_size > o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("MUSTER_MIN_WORLD_SIZE=", o.min_world_size,
                                                   " must be in 1..WORLD_SIZE (", o.world_size,
                                                   ")"));
  }
  if (o.local_rank < 0) o.local_rank = o.rank;
  if (o.local_world_size < 0) o.local_world_size = o.world_size;
  return o;
}

absl::Status WorldSession::Open(const InitOptions& o, GoneCallback on_gone) {
  on_gone_ = std::move(on_gone);
  RETURN_IF_ERROR(CheckDefaultSocketOwner(o.socket));
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
  // A daemon that took the connection but never answers (stuck, stopped)
  // must not hold init past its timeout: the stream is cancelled then.
  absl::Notification answered;
  std::atomic<bool> timed_out{false};
  std::thread watchdog([&] {
    if (answered.WaitForNotificationWithTimeout(o.timeout)) return;
    timed_out = true;
    context_.TryCancel();
  });
  v1::SessionServerMessage reply;
  absl::Status registered = Register(o, &reply);
  answered.Notify();
  watchdog.join();
  if (!registered.ok() && timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(
        "musterd at unix socket ", o.socket, " accepted the session but did not answer its ",
        "registration within the init timeout (", absl::FormatDuration(o.timeout), ")"));
  }
  RETURN_IF_ERROR(registered);
  session_id_ = reply.registered().session_id();
  rejoin_epoch_ = reply.registered().rejoin_epoch();
  rejoin_grows_ = reply.registered().rejoin_grows();
  int64_t pid = reply.registered().daemon_pid();
  daemon_ = pid > 0 ? absl::StrCat("musterd (pid ", pid, ", unix:", o.socket, ")")
                    : absl::StrCat("musterd (unix:", o.socket, ")");
  reader_ = std::thread([this] { ReadEvents(); });
  return absl::OkStatus();
}

// Sends the rank's Register message and reads the daemon's answer.
absl::Status WorldSession::Register(const InitOptions& o, v1::SessionServerMessage* reply) {
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
  // `registered` comes first; a daemon older than that rule may send a
  // failure event ahead of it, kept like later ones.
  while (true) {
    if (!stream_->Read(reply)) return Finish("registration");
    if (reply->has_registered()) return absl::OkStatus();
    if (!reply->has_rank_failed() && !reply->has_job_aborted()) {
      context_.TryCancel();  // an unexpected message: end the stream, don't wait on it
      return Finish("registration");
    }
    absl::MutexLock lock(&mu_);
    RecordEvent(*reply);
  }
}

void WorldSession::Close() {
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

absl::Status WorldSession::status() const {
  if (!gone_fast_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return gone_status_;
}

absl::Status WorldSession::Explain(absl::Status s, absl::string_view what) const {
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

absl::Status WorldSession::Call(const std::string& what, absl::Duration timeout,
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

std::vector<std::string> WorldSession::failures() const {
  absl::MutexLock lock(&mu_);
  return failures_;
}

absl::Status WorldSession::Finish(const char* what) {
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

void WorldSession::RecordEvent(const v1::SessionServerMessage& event) {
  if (event.has_rank_failed()) {
    const v1::RankInfo& r = event.rank_failed().rank();
    failures_.push_back(absl::StrCat("rank ", r.rank().global_rank(), " (host ", r.host(), ", pid ",
                                     r.pid(), ") failed: ", r.failure()));
  } else if (event.has_job_aborted()) {
    failures_.push_back(absl::StrCat("job aborted: ", event.job_aborted().reason()));
  }
}

void WorldSession::ReadEvents() {
  v1::SessionServerMessage event;
  while (stream_->Read(&event)) {
    absl::MutexLock lock(&mu_);
    RecordEvent(event);
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
      end.ok()
          ? "musterd closed it"
          : absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(end.error_code())),
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

// World: a handle over World::Impl.

World::World(InitOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

World::~World() = default;

absl::StatusOr<std::unique_ptr<World>> World::Init(InitOptions options) {
  // Debian's Abseil is built with Mutex deadlock detection on: a lock-order
  // graph updated on every lock and every Mutex destroyed (each Work has
  // one). Off in ranks, as in musterd; TSan checks lock order in our tests.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  ASSIGN_OR_RETURN(options, InitOptionsFromEnv(std::move(options)));
  std::unique_ptr<World> world(new World(std::move(options)));
  RETURN_IF_ERROR(world->impl_->Start());
  return world;
}

const std::string& World::job_id() const { return impl_->options().job_id; }
int64_t World::generation() const { return impl_->options().generation; }
int64_t World::epoch() const { return impl_->epoch(); }
absl::StatusOr<int64_t> World::Reconfigure(absl::Duration timeout) {
  return impl_->Reconfigure(timeout, /*allow_shrink=*/false);
}
absl::StatusOr<int64_t> World::Reconfigure(ReconfigureOptions options) {
  return impl_->Reconfigure(options.timeout, options.allow_shrink);
}
absl::StatusOr<int> World::PendingJoins() { return impl_->PendingJoins(); }
std::vector<int> World::members() const { return impl_->members(); }
int World::rank() const { return impl_->rank(); }
int World::world_size() const { return impl_->world_size(); }
int World::local_rank() const { return impl_->options().local_rank; }
int World::local_world_size() const { return impl_->options().local_world_size; }
ProcessGroup& World::world_group() { return impl_->world_group(); }

absl::StatusOr<std::shared_ptr<ProcessGroup>> World::NewGroup(std::vector<int> ranks,
                                                              GroupOptions options) {
  return impl_->NewGroup(std::move(ranks), std::move(options));
}

absl::StatusOr<std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>>
World::NewSubgroups(int group_size, GroupOptions options) {
  return impl_->NewSubgroups(group_size, std::move(options));
}

absl::StatusOr<std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>>
World::NewSubgroupsByEnumeration(const std::vector<std::vector<int>>& rank_lists,
                                 GroupOptions options) {
  return impl_->NewSubgroupsByEnumeration(rank_lists, std::move(options));
}

absl::Status World::DestroyProcessGroup(ProcessGroup& group) {
  return impl_->DestroyProcessGroup(group);
}

absl::StatusOr<std::shared_ptr<Store>> World::store() { return impl_->store(); }

std::vector<std::string> World::failures() const { return impl_->failures(); }

absl::Status World::session_status() const { return impl_->session_status(); }

// World::Impl.

World::Impl::Impl(InitOptions options) : options_(std::move(options)) {
  for (int r = 0; r < options_.world_size; ++r) members_.push_back(r);
}

int World::Impl::rank() const {
  absl::MutexLock lock(&mu_);
  auto it = std::find(members_.begin(), members_.end(), options_.rank);
  return it == members_.end() ? -1 : static_cast<int>(it - members_.begin());
}

int World::Impl::world_size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(members_.size());
}

std::vector<int> World::Impl::members() const {
  absl::MutexLock lock(&mu_);
  return members_;
}

World::Impl::~Impl() {
  if (session_ != nullptr) session_->Close();
}

absl::Status World::Impl::Start() {
  session_ = std::make_shared<WorldSession>();
  RETURN_IF_ERROR(
      session_->Open(options_, [this](const absl::Status& gone) { OnDaemonGone(gone); }));
  int64_t rejoin = session_->rejoin_epoch();
  bool grows = session_->rejoin_grows();
  if (rejoin == 0 && options_.min_world_size > 0 && options_.min_world_size < options_.world_size) {
    // An elastic start: the ranks here now form epoch 1; who comes later
    // joins the next one.
    absl::Status started =
        JoinEpoch(1, options_.timeout, /*allow_shrink=*/true, options_.min_world_size);
    if (absl::IsFailedPrecondition(started)) {
      rejoin = 2;
      grows = true;
    } else if (!started.ok()) {
      return started;
    }
  }
  if (rejoin > 0) {
    // This process took over a rank of a running (or finished) job: it
    // joins the job's next epoch with the others. An epoch that formed
    // without it (the others shrank meanwhile) leaves it for the next one,
    // which the others form once they see it waiting (PendingJoins). Into a
    // world that shrank it joins with the ranks alive; else every rank of
    // the job comes back (a replacement, or the job run again).
    absl::Time give_up = absl::Now() + options_.timeout;
    for (int64_t epoch = rejoin;; ++epoch) {
      absl::Status joined = JoinEpoch(epoch, give_up - absl::Now(), grows);
      if (joined.ok()) break;
      if (!absl::IsFailedPrecondition(joined) || absl::Now() >= give_up) return joined;
    }
  }
  std::vector<int> all(world_size());
  for (int r = 0; r < static_cast<int>(all.size()); ++r) all[r] = r;
  GroupOptions world_options;
  world_options.backend = options_.backend;
  world_options.timeout = options_.timeout;
  ASSIGN_OR_RETURN(world_group_,
                   CreateGroup(all, world_options, options_.world_group_name, /*world=*/true));
  return absl::OkStatus();
}

std::string World::Impl::NextGroupName() {
  absl::MutexLock lock(&mu_);
  return absl::StrCat("group_", ++group_counter_);
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> World::Impl::CreateGroup(
    const std::vector<int>& ranks, const GroupOptions& options, const std::string& name,
    bool world) {
  std::vector<int> slots;
  {
    absl::MutexLock lock(&mu_);
    for (int r : ranks) {
      if (r < 0 || r >= static_cast<int>(members_.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r, " in group '", name, "' is outside the world of size ", members_.size()));
      }
      slots.push_back(members_[r]);
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> group, FormGroup(slots, options, name));
  // From now on the daemon's end breaks the group; if it already ended,
  // the group is of no use.
  {
    absl::MutexLock lock(&groups_mu_);
    groups_.erase(
        std::remove_if(groups_.begin(), groups_.end(),
                       [](const HeldGroup& g) { return g.destroyed || g.group.expired(); }),
        groups_.end());
    groups_.push_back(HeldGroup{group, slots, options, name, world});
  }
  if (absl::Status gone = session_->status(); !gone.ok()) {
    ProcessGroup::Impl::Of(*group).BreakForDaemon(gone);
    return absl::UnavailableError(absl::StrCat("new group '", name, "': ", gone.message()));
  }
  return group;
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> World::Impl::FormGroup(const std::vector<int>& slots,
                                                                     const GroupOptions& options,
                                                                     const std::string& name) {
  ProcessGroup::Impl::RegisterSdkBackends();
  // What this rank is in this epoch: its rank among the members, and the
  // group's ranks the same way.
  InitOptions epoch_options = options_;
  std::vector<int> ranks;
  {
    absl::MutexLock lock(&mu_);
    auto self = std::find(members_.begin(), members_.end(), options_.rank);
    epoch_options.rank = self == members_.end() ? -1 : static_cast<int>(self - members_.begin());
    epoch_options.world_size = static_cast<int>(members_.size());
    for (int slot : slots) {
      auto it = std::find(members_.begin(), members_.end(), slot);
      if (it == members_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("group '", name, "': rank ", slot, " is not in this epoch"));
      }
      ranks.push_back(static_cast<int>(it - members_.begin()));
    }
  }
  auto config =
      BackendRegistry::Global().Parse(options.backend.empty() ? options_.backend : options.backend);
  if (!config.ok()) return config.status();
  v1::CreateGroupRequest req;
  req.mutable_caller()->set_job_id(options_.job_id);
  req.mutable_caller()->set_global_rank(options_.rank);
  for (int slot : slots) req.add_ranks(slot);
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
  if (options.trace_records >= 0) epoch_options.trace_records = options.trace_records;
  return ProcessGroup::Impl::Create(session_, epoch_options, options_.rank, ranks, *config,
                                    resp.group());
}

absl::Status World::Impl::JoinEpoch(int64_t epoch, absl::Duration timeout, bool allow_shrink,
                                    int start_min_size) {
  if (timeout <= absl::ZeroDuration()) timeout = options_.timeout;
  v1::ReconfigureRequest req;
  req.mutable_caller()->set_job_id(options_.job_id);
  req.mutable_caller()->set_global_rank(options_.rank);
  req.set_epoch(epoch);
  req.set_allow_shrink(allow_shrink);
  req.set_start_min_size(start_min_size);
  req.mutable_timeout()->set_millis(absl::ToInt64Milliseconds(timeout));
  v1::ReconfigureResponse resp;
  RETURN_IF_ERROR(session_->Call(absl::StrCat("reconfigure (join epoch ", epoch, ")"),
                                 timeout + absl::Seconds(30), [&](grpc::ClientContext* context) {
                                   return session_->groups()->Reconfigure(context, req, &resp);
                                 }));
  absl::MutexLock lock(&mu_);
  epoch_ = resp.epoch();
  members_.assign(resp.members().begin(), resp.members().end());
  return absl::OkStatus();
}

absl::StatusOr<int> World::Impl::PendingJoins() {
  v1::PendingJoinsRequest req;
  req.mutable_caller()->set_job_id(options_.job_id);
  req.mutable_caller()->set_global_rank(options_.rank);
  v1::PendingJoinsResponse resp;
  RETURN_IF_ERROR(
      session_->Call("pending joins", absl::Seconds(30), [&](grpc::ClientContext* context) {
        return session_->groups()->PendingJoins(context, req, &resp);
      }));
  return resp.waiting();
}

int64_t World::Impl::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

absl::StatusOr<int64_t> World::Impl::Reconfigure(absl::Duration timeout, bool allow_shrink) {
  RETURN_IF_ERROR(JoinEpoch(epoch() + 1, timeout, allow_shrink));
  std::vector<int> members;
  {
    absl::MutexLock lock(&mu_);
    members = members_;
  }
  std::vector<std::pair<std::shared_ptr<ProcessGroup>, HeldGroup>> held;
  {
    absl::MutexLock lock(&groups_mu_);
    for (const HeldGroup& g : groups_) {
      if (g.destroyed) continue;
      if (auto group = g.group.lock()) held.emplace_back(std::move(group), g);
    }
  }
  for (auto& [group, how] : held) {
    // The world group spans the new epoch's members; another keeps those of
    // its members still in the job (a shrink drops the others).
    std::vector<int> slots;
    if (how.world) {
      slots = members;
    } else {
      for (int slot : how.slots) {
        if (std::find(members.begin(), members.end(), slot) != members.end()) slots.push_back(slot);
      }
    }
    if (slots.empty()) continue;
    ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> fresh, FormGroup(slots, how.options, how.name));
    {
      absl::MutexLock lock(&groups_mu_);
      for (HeldGroup& g : groups_) {
        // Compared by owner, not lock(): a temporary that turned out to be
        // another group's last handle would run its destructor (and its
        // Works' callbacks) under groups_mu_.
        if (!g.group.owner_before(group) && !group.owner_before(g.group)) g.slots = slots;
      }
    }
    // The caller's handle now runs the new epoch's group; the old one's
    // backends and executor go with `fresh`.
    ProcessGroup::Impl::Swap(*group, *fresh);
    if (absl::Status gone = session_->status(); !gone.ok()) {
      ProcessGroup::Impl::Of(*group).BreakForDaemon(gone);
      return gone;
    }
  }
  return epoch();
}

void World::Impl::OnDaemonGone(const absl::Status& gone) {
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  {
    absl::MutexLock lock(&groups_mu_);
    for (const HeldGroup& held : groups_) {
      if (auto g = held.group.lock()) groups.push_back(std::move(g));
    }
  }
  for (const auto& g : groups) ProcessGroup::Impl::Of(*g).BreakForDaemon(gone);
}

absl::Status World::Impl::session_status() const { return session_->status(); }

absl::StatusOr<std::shared_ptr<ProcessGroup>> World::Impl::NewGroup(std::vector<int> ranks,
                                                                    GroupOptions options) {
  std::string name = options.name.empty() ? NextGroupName() : options.name;
  if (!options.name.empty()) {
    absl::MutexLock lock(&mu_);
    ++group_counter_;  // keep automatic names aligned across ranks
  }
  return CreateGroup(ranks, options, name);
}

absl::StatusOr<std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>>
World::Impl::NewSubgroups(int group_size, GroupOptions options) {
  const int world_size = this->world_size();
  if (group_size <= 0 || world_size % group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group size ", group_size, " must be positive and divide the world size ", world_size));
  }
  std::vector<std::vector<int>> lists;
  for (int start = 0; start < world_size; start += group_size) {
    std::vector<int> list;
    for (int r = start; r < start + group_size; ++r) list.push_back(r);
    lists.push_back(std::move(list));
  }
  return NewSubgroupsByEnumeration(lists, options);
}

absl::StatusOr<std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>>
World::Impl::NewSubgroupsByEnumeration(const std::vector<std::vector<int>>& rank_lists,
                                       GroupOptions options) {
  const int world_size = this->world_size();
  std::vector<int> owner(world_size, -1);
  for (size_t i = 0; i < rank_lists.size(); ++i) {
    for (int r : rank_lists[i]) {
      if (r < 0 || r >= world_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " is outside the world of size ", world_size));
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

absl::Status World::Impl::DestroyProcessGroup(ProcessGroup& group) {
  v1::DestroyGroupRequest req;
  req.mutable_caller()->set_job_id(options_.job_id);
  req.mutable_caller()->set_global_rank(options_.rank);
  req.set_name(group.name());
  v1::DestroyGroupResponse resp;
  RETURN_IF_ERROR(session_->Call(absl::StrCat("destroy group '", group.name(), "'"),
                                 absl::Seconds(30), [&](grpc::ClientContext* context) {
                                   return session_->groups()->DestroyGroup(context, req, &resp);
                                 }));
  // Handles taken under the lock are dropped after it: one may be another
  // group's last, whose destructor completes Works (user callbacks).
  std::vector<std::shared_ptr<ProcessGroup>> taken;
  absl::MutexLock lock(&groups_mu_);
  for (HeldGroup& held : groups_) {
    taken.push_back(held.group.lock());
    if (taken.back().get() == &group) held.destroyed = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Store>> World::Impl::store() {
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

std::vector<std::string> World::Impl::failures() const { return session_->failures(); }

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

}  // namespace muster
