#include "daemon/gpu/nccl_engine.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "core/signature.h"
#include "daemon/gpu/gpu_plan.h"
#include "daemon/gpu/uid_rendezvous.h"

namespace muster {

// One communicator: (job, group, global rank). See the header.
struct NcclEngine::Slot {
  std::string job, group, owner;
  int global_rank = 0, group_rank = 0, group_size = 0;
  int64_t generation = 0;
  std::vector<int> global_ranks;       // every member's, by group rank
  std::vector<int> local_group_ranks;  // members at this musterd, ascending
  absl::Duration timeout;
  std::string origin = "init";
  // How many communicators this rank created for the group before (a
  // destroyed group re-created under its name) in the job's epoch: with
  // uid_group (the group's name, qualified by the job epoch after the
  // first), part of the unique-id key.
  int64_t epoch = 0;
  std::string uid_group;
  int64_t user = -1;  // the uid the job's ranks run as (owns the channel)

  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  // Guarded by mu.
  std::deque<std::function<void()>> tasks;
  bool stopping = false;
  bool drained = false;  // the worker took its last task: Post refuses
  bool exited = false;
  std::string state = "initializing";
  std::string error;
  bool failed = false;
  bool break_requested = false;  // the registry broke the group (Fail may follow)
  bool busy = false;             // the worker is inside an NCCL call on `comm`
  void* comm = nullptr;
  bool comm_ready = false;  // comm (or comm_status) delivered
  absl::Status comm_status;
  uint64_t launched = 0, completed = 0;
  uint64_t last_launched_sequence = 0;
  uint64_t channel_requests = 0;
  struct Pending {
    void* event;
    uint64_t sequence;
    absl::Time launched_at;
    std::string what;
  };
  std::deque<Pending> pending;
  std::vector<void*> spare_events;
  std::string bus_id;
  int device = -1;
  bool initialized = false;  // InitComm finished
  // The worker may serve the channel: InitComm finished or the first
  // request was taken (the communicator is created lazily).
  bool serving = false;

  // The rank's fast path (null if shared memory failed); the pointer is set
  // before the worker starts and never changes.
  std::unique_ptr<GpuChannel> channel;

  // Worker only.
  void* stream = nullptr;
  void* scratch = nullptr;
  absl::Status init_status;
};

namespace {

// What one member published for one collective. The verdict is kept as
// its parts: every member builds its own Status from them (an absl::Status
// shared between threads is released in uninstrumented Abseil code, which
// ThreadSanitizer cannot follow).
struct AgreementEntry {
  OpSignature signature;
  std::vector<uint64_t> send, recv;  // all_to_all, elements per peer
  // The member's own checks.
  absl::StatusCode verdict_code = absl::StatusCode::kOk;
  std::string verdict_message;
  absl::Status verdict() const { return absl::Status(verdict_code, verdict_message); }
};

}  // namespace

// The collectives the node's members of one group published, until each
// of them consumed the outcome. See the header. Guarded by table_mu_.
struct NcclEngine::SignatureTable {
  std::vector<int> local;          // group ranks of the members at this musterd, ascending
  std::vector<int> global_ranks;   // every member's, by group rank
  std::map<int, uint64_t> issued;  // collectives each local member published
  std::set<int> gone;              // local members (global ranks) that left
  using Entry = AgreementEntry;
  struct Round {
    std::map<int, Entry> entries;  // by group rank
    bool decided = false;          // every member published, or it failed
    std::string failure;           // why it failed (its waiters' DEADLINE_EXCEEDED)
    size_t consumed = 0;           // members that took a successful outcome
  };
  std::map<uint64_t, Round> rounds;
  // Set once: every later collective fails ABORTED with it.
  std::string broken;
};

class NcclEngine::MemOpener : public IpcOpener {
 public:
  explicit MemOpener(GpuRuntime* runtime) : runtime_(runtime) {}
  absl::StatusOr<IpcResource> Open(const std::string& handle) override {
    absl::StatusOr<void*> base = runtime_->OpenMemHandle(handle);
    if (!base.ok()) return base.status();
    absl::StatusOr<size_t> bytes = runtime_->AllocationSize(*base);
    if (!bytes.ok()) {
      runtime_->CloseMemHandle(*base);
      return bytes.status();
    }
    return IpcResource{*base, *bytes};
  }
  void Close(void* opened) override { runtime_->CloseMemHandle(opened); }

 private:
  GpuRuntime* runtime_;
};

class NcclEngine::EventOpener : public IpcOpener {
 public:
  explicit EventOpener(GpuRuntime* runtime) : runtime_(runtime) {}
  absl::StatusOr<IpcResource> Open(const std::string& handle) override {
    absl::StatusOr<void*> event = runtime_->OpenEventHandle(handle);
    if (!event.ok()) return event.status();
    return IpcResource{*event, 0};
  }
  void Close(void* opened) override { runtime_->DestroyEvent(opened); }

 private:
  GpuRuntime* runtime_;
};

namespace {

constexpr size_t kIpcHandleBytes = 64;

bool HasNccl(const std::string& backend) {
  return absl::StrContains(absl::StrCat(",", backend, ","), ",cuda:nccl,");
}

// The group ranks of `local` (global ranks) among `members`, ascending;
// just `self` where the directory did not say.
std::vector<int> LocalGroupRanks(const std::vector<int>& members, const std::vector<int>& local,
                                 int self) {
  std::vector<int> out;
  for (size_t i = 0; i < members.size(); ++i) {
    if (std::find(local.begin(), local.end(), members[i]) != local.end()) {
      out.push_back(static_cast<int>(i));
    }
  }
  if (std::find(out.begin(), out.end(), self) == out.end()) {
    out.push_back(self);
    std::sort(out.begin(), out.end());
  }
  return out;
}

// The collective a request is, for the agreement before launch (none for
// point to point, whose members are a pair).
std::optional<CollectiveKind> KindOf(v1::GpuOp op) {
  switch (op) {
    case v1::GPU_ALL_REDUCE:
      return CollectiveKind::kAllReduce;
    case v1::GPU_BROADCAST:
      return CollectiveKind::kBroadcast;
    case v1::GPU_REDUCE:
      return CollectiveKind::kReduce;
    case v1::GPU_ALL_GATHER:
      return CollectiveKind::kAllGather;
    case v1::GPU_REDUCE_SCATTER:
      return CollectiveKind::kReduceScatter;
    case v1::GPU_ALL_TO_ALL:
      return CollectiveKind::kAllToAll;
    case v1::GPU_GATHER:
      return CollectiveKind::kGather;
    case v1::GPU_SCATTER:
      return CollectiveKind::kScatter;
    case v1::GPU_BARRIER:
      return CollectiveKind::kBarrier;
    default:
      return std::nullopt;
  }
}

// The outcome for group rank `me` of a round every local member published:
// different collectives, then a member's failed checks, then all_to_all
// splits that do not match (between members at this musterd).
absl::Status CompareRound(const std::map<int, AgreementEntry>& entries, int me, int size) {
  const AgreementEntry& mine = entries.at(me);
  for (const auto& [j, theirs] : entries) {
    if (!SameSignature(theirs.signature, mine.signature)) {
      return absl::FailedPreconditionError(
          SignatureMismatch(me, mine.signature, j, theirs.signature));
    }
  }
  if (mine.verdict_code != absl::StatusCode::kOk) return mine.verdict();
  for (const auto& [j, theirs] : entries) {
    if (theirs.verdict_code != absl::StatusCode::kOk) {
      return absl::Status(theirs.verdict_code,
                          absl::StrCat(DescribeSignature(mine.signature), " failed on group rank ",
                                       j, ": ", theirs.verdict_message));
    }
  }
  if (static_cast<CollectiveKind>(mine.signature.kind) != CollectiveKind::kAllToAll) {
    return absl::OkStatus();
  }
  for (const auto& [i, sender] : entries) {
    for (const auto& [j, receiver] : entries) {
      if (sender.send.size() != static_cast<size_t>(size) ||
          receiver.recv.size() != static_cast<size_t>(size)) {
        continue;  // its checks failed above
      }
      const uint64_t sends = sender.send[j], expects = receiver.recv[i];
      if (sends != expects) {
        return absl::InvalidArgumentError(absl::StrCat("all_to_all: group rank ", i, " sends ",
                                                       sends, " elements to group rank ", j,
                                                       ", which expects ", expects));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

NcclEngine::NcclEngine(GpuRuntime* runtime, GpuGroupDirectory* directory, NcclEngineOptions options)
    : runtime_(runtime),
      directory_(directory),
      options_(options),
      mem_opener_(std::make_unique<MemOpener>(runtime)),
      event_opener_(std::make_unique<EventOpener>(runtime)),
      mem_cache_(std::make_unique<IpcCache>(mem_opener_.get(), "memory", kIpcHandleBytes)),
      event_cache_(std::make_unique<IpcCache>(event_opener_.get(), "event", kIpcHandleBytes)) {
  watchdog_ = std::thread([this] { Watchdog(); });
}

NcclEngine::~NcclEngine() { Shutdown(); }

void NcclEngine::Shutdown() {
  std::vector<std::shared_ptr<Slot>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [key, slot] : slots_) all.push_back(slot);
    for (auto& slot : retired_) all.push_back(slot);
    slots_.clear();
    retired_.clear();
  }
  watchdog_cv_.notify_all();
  watchdog_.join();
  for (auto& slot : all) Fail(*slot, "musterd is shutting down", /*break_group=*/false);
  for (auto& slot : all) {
    {
      std::lock_guard<std::mutex> lock(slot->mu);
      slot->stopping = true;
    }
    slot->cv.notify_all();
    if (slot->channel != nullptr) slot->channel->Wake();
    if (slot->worker.joinable()) slot->worker.join();
  }
  // Every worker is gone: close what the ranks' handles opened.
  std::lock_guard<std::mutex> lock(mu_);
  mem_cache_.reset();
  event_cache_.reset();
}

std::string NcclEngine::Owner(const std::string& job_id, int global_rank) const {
  return absl::StrCat(job_id, "/", global_rank);
}

bool NcclEngine::Post(Slot& slot, std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    if (slot.drained) return false;
    slot.tasks.push_back(std::move(task));
  }
  slot.cv.notify_all();
  if (slot.channel != nullptr) slot.channel->Wake();
  return true;
}

void NcclEngine::AttachChannel(Slot& slot) {
  std::string name = absl::StrCat("/muster.", ::getpid(), ".gpu.", next_channel_++);
  absl::StatusOr<std::unique_ptr<GpuChannel>> channel = GpuChannel::Create(name, slot.user);
  if (!channel.ok()) {
    MLOG(WARNING) << "no shared-memory channel for group " << slot.group << " rank "
                  << slot.global_rank << " (gRPC only): " << channel.status().message();
    return;
  }
  slot.channel = std::move(*channel);
}

void NcclEngine::ServeChannelRequest(Slot& slot, const std::string& bytes) {
  v1::GpuCollectiveRequest request;
  if (!request.ParseFromString(bytes)) {
    slot.channel->Complete(absl::InvalidArgumentError("malformed GPU collective request"), 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    ++slot.channel_requests;
  }
  // The channel speaks for its own communicator only.
  request.mutable_caller()->set_job_id(slot.job);
  request.mutable_caller()->set_global_rank(slot.global_rank);
  request.set_group(slot.group);
  GpuChannel* channel = slot.channel.get();
  RunCollective(slot, request, Deadline(request, slot.timeout),
                [channel](absl::StatusOr<uint64_t> launched) {
                  channel->Complete(launched.status(), launched.ok() ? *launched : 0);
                });
}

void NcclEngine::StartWorker(const std::shared_ptr<Slot>& slot) {
  Slot* s = slot.get();
  s->worker = std::thread([this, s] {
    absl::Time last_request = absl::InfinitePast();
    while (true) {
      std::function<void()> task;
      bool serve_channel = false;
      // Before looking for work: a Post between here and the sleep below
      // rings the doorbell, so it is not lost.
      const uint32_t bell = s->channel != nullptr ? s->channel->doorbell() : 0;
      {
        std::unique_lock<std::mutex> lock(s->mu);
        s->cv.wait(lock, [s] {
          return s->stopping || !s->tasks.empty() || (s->channel != nullptr && s->serving);
        });
        if (!s->tasks.empty()) {
          task = std::move(s->tasks.front());
          s->tasks.pop_front();
        } else if (s->stopping) {
          s->drained = true;  // later Posts are refused, not lost
          break;
        } else {
          serve_channel = s->channel != nullptr && s->serving;
        }
      }
      if (task) {
        task();
        continue;
      }
      if (!serve_channel) continue;
      // Requests on the channel: spin a little while the rank is busy
      // issuing collectives, sleep on the futex otherwise (Post wakes it).
      std::string request;
      const bool hot = absl::Now() - last_request < absl::Milliseconds(5);
      if (s->channel->Poll(&request, hot ? absl::Microseconds(200) : absl::ZeroDuration())) {
        ServeChannelRequest(*s, request);
        last_request = absl::Now();
        continue;
      }
      s->channel->WaitForRequest(bell, absl::Milliseconds(20));
    }
    if (s->channel != nullptr) s->channel->Close();
    // Teardown on the worker: the stream, scratch and events belong to it.
    void* comm = nullptr;
    std::vector<void*> events;
    bool failed;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      comm = s->comm;
      s->comm = nullptr;
      // A broken group's communicator is aborted, never finalized: its
      // peers may be gone.
      failed = s->failed || s->break_requested;
      for (auto& p : s->pending) events.push_back(p.event);
      s->pending.clear();
      for (void* e : s->spare_events) events.push_back(e);
      s->spare_events.clear();
    }
    if (comm != nullptr) {
      if (failed) {
        runtime_->AbortComm(comm);
      } else {
        runtime_->DestroyComm(comm);
      }
    }
    if (s->stream != nullptr && !failed) (void)runtime_->StreamSynchronize(s->stream);
    for (void* e : events) runtime_->DestroyEvent(e);
    if (s->scratch != nullptr) runtime_->DeviceFree(s->scratch);
    if (s->stream != nullptr) runtime_->DestroyStream(s->stream);
    std::lock_guard<std::mutex> lock(s->mu);
    s->state = failed ? s->state : "destroyed";
    s->exited = true;
  });
}

std::shared_ptr<NcclEngine::Slot> NcclEngine::FindOrCreateSlot(
    const v1::GpuCollectiveRequest& request, const GpuGroupView& view, int group_rank,
    bool* created) {
  SlotKey key{request.caller().job_id(), request.group(), request.caller().global_rank()};
  std::lock_guard<std::mutex> lock(mu_);
  *created = false;
  if (stopping_) return nullptr;
  auto it = slots_.find(key);
  if (it != slots_.end()) return it->second;
  auto slot = std::make_shared<Slot>();
  slot->job = request.caller().job_id();
  slot->group = request.group();
  slot->global_rank = request.caller().global_rank();
  slot->owner = Owner(slot->job, slot->global_rank);
  slot->group_rank = group_rank;
  slot->group_size = static_cast<int>(view.ranks.size());
  slot->generation = view.generation;
  slot->global_ranks = view.ranks;
  slot->local_group_ranks = LocalGroupRanks(view.ranks, view.local_ranks, group_rank);
  slot->timeout = view.timeout;
  slot->user = view.owner_uid;
  // Every member of a group re-formed under a later job epoch counts its
  // communicators afresh, survivors and replacements alike.
  slot->uid_group =
      view.job_epoch > 0 ? absl::StrCat("e", view.job_epoch, "/", slot->group) : slot->group;
  slot->epoch = epochs_[SlotKey{slot->job, slot->uid_group, slot->global_rank}]++;
  AttachChannel(*slot);
  StartWorker(slot);
  slots_[key] = slot;
  *created = true;
  return slot;
}

void NcclEngine::Collective(v1::GpuCollectiveRequest request, Done done) {
  if (std::string why = runtime_->Unavailable(); !why.empty()) {
    done(absl::FailedPreconditionError(
        absl::StrCat("GPU collectives are unavailable on this musterd: ", why)));
    return;
  }
  const std::string& job = request.caller().job_id();
  const int rank = request.caller().global_rank();
  absl::StatusOr<GpuGroupView> view = directory_->Lookup(job, request.group(), rank);
  if (!view.ok()) {
    done(view.status());
    return;
  }
  if (!HasNccl(view->backend)) {
    done(absl::InvalidArgumentError(
        absl::StrCat("group ", request.group(), " has no NCCL backend for CUDA buffers (backend '",
                     view->backend, "'; use e.g. \"cpu:gloo,cuda:nccl\")")));
    return;
  }
  auto pos = std::find(view->ranks.begin(), view->ranks.end(), rank);
  if (pos == view->ranks.end()) {
    done(absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " is not a member of group ", request.group())));
    return;
  }
  const absl::Time deadline = Deadline(request, view->timeout);
  bool created = false;
  std::shared_ptr<Slot> slot =
      FindOrCreateSlot(request, *view, static_cast<int>(pos - view->ranks.begin()), &created);
  if (slot == nullptr) {
    done(absl::AbortedError("musterd is shutting down"));
    return;
  }
  // The communicator is created by the first collective, once the node's
  // members agreed on it (a member that never comes fails at its deadline,
  // not at the end of the creation's timeout).
  // The slot may have been destroyed (group destroyed, rank gone, shutdown)
  // since it was found, its worker gone: then the caller is answered here.
  auto shared_done = std::make_shared<Done>(std::move(done));
  const std::string group = request.group();
  if (!Post(*slot, [this, s = slot.get(), request = std::move(request), deadline, shared_done] {
        RunCollective(*s, request, deadline, *shared_done);
      })) {
    (*shared_done)(absl::AbortedError(
        absl::StrCat("rank ", rank, "'s NCCL communicator for group ", group,
                     " was closed (group destroyed, rank gone or musterd shutting down)")));
  }
}

absl::Status NcclEngine::AwaitComm(Slot& slot, void* comm, absl::Time deadline,
                                   const std::string& what) {
  int spins = 0;
  while (true) {
    absl::Status s = runtime_->PollComm(comm);
    if (s.ok()) return s;
    if (!absl::IsUnavailable(s)) return s;
    {
      std::lock_guard<std::mutex> lock(slot.mu);
      if (slot.failed) return absl::AbortedError(slot.error);
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " did not complete within ", absl::FormatDuration(slot.timeout)));
    }
    if (++spins < 2000) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(absl::Microseconds(50));
    }
  }
}

void NcclEngine::InitComm(Slot& slot, const std::string& bus_id) {
  const absl::Time deadline = absl::Now() + slot.timeout;
  const std::string name = absl::StrCat("NCCL communicator of group ", slot.group, " (rank ",
                                        slot.group_rank, " of ", slot.group_size, ")");
  auto finish = [&](absl::Status status) {
    {
      std::lock_guard<std::mutex> lock(slot.mu);
      slot.initialized = true;
      slot.serving = true;
    }
    slot.init_status = status;
    if (!status.ok()) {
      Fail(slot, std::string(status.message()), /*break_group=*/!absl::IsAborted(status));
      return;
    }
    std::lock_guard<std::mutex> lock(slot.mu);
    if (!slot.failed) slot.state = "ready";
  };
  // A split slot's comm and device come from its parent's worker.
  bool from_split;
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    from_split = slot.origin == "split";
  }
  int device = -1;
  if (from_split) {
    std::unique_lock<std::mutex> lock(slot.mu);
    if (!slot.cv.wait_until(lock, absl::ToChronoTime(deadline),
                            [&] { return slot.comm_ready || slot.failed; })) {
      lock.unlock();
      return finish(absl::DeadlineExceededError(
          absl::StrCat(name, ": the split from the world communicator did not complete within ",
                       absl::FormatDuration(slot.timeout))));
    }
    if (slot.failed) {
      std::string error = slot.error;
      lock.unlock();
      return finish(absl::AbortedError(error));
    }
    if (!slot.comm_status.ok()) {
      absl::Status status = slot.comm_status;
      lock.unlock();
      return finish(status);
    }
    device = slot.device;
  } else {
    absl::StatusOr<int> d = runtime_->DeviceByPciBusId(bus_id);
    if (!d.ok()) {
      return finish(absl::InvalidArgumentError(
          absl::StrCat(name, ": no GPU with PCI bus id '", bus_id, "': ", d.status().message())));
    }
    device = *d;
    std::lock_guard<std::mutex> lock(slot.mu);
    slot.device = device;
    slot.bus_id = bus_id;
  }
  if (absl::Status s = runtime_->SetDevice(device); !s.ok()) return finish(s);
  absl::StatusOr<void*> stream = runtime_->CreateStream();
  if (!stream.ok()) return finish(stream.status());
  slot.stream = *stream;
  absl::StatusOr<void*> scratch = runtime_->DeviceAlloc(sizeof(float));
  if (!scratch.ok()) return finish(scratch.status());
  slot.scratch = *scratch;
  if (from_split) return finish(absl::OkStatus());

  // A new communicator: the unique id through the job's store.
  absl::StatusOr<std::shared_ptr<Store>> store = directory_->JobStore(slot.job);
  if (!store.ok()) return finish(store.status());
  const std::string key = UniqueIdKey(slot.job, slot.generation, slot.uid_group, slot.epoch);
  absl::StatusOr<std::string> id = ExchangeUniqueId(
      **store, key, slot.group_rank == 0, runtime_->UniqueIdBytes(),
      [this] { return runtime_->NewUniqueId(); }, deadline,
      [this, &slot] {
        std::string reason = directory_->BrokenReason(slot.job, slot.group);
        if (reason.empty()) {
          std::lock_guard<std::mutex> lock(slot.mu);
          if (slot.failed) reason = slot.error;
        }
        return reason;
      });
  if (!id.ok()) {
    return finish(
        absl::Status(id.status().code(), absl::StrCat(name, ": ", id.status().message())));
  }
  absl::StatusOr<void*> comm = runtime_->CommInit(slot.group_size, *id, slot.group_rank);
  if (!comm.ok()) {
    return finish(
        absl::Status(comm.status().code(), absl::StrCat(name, ": ", comm.status().message())));
  }
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    slot.comm = *comm;
    slot.comm_ready = true;
    slot.busy = true;
  }
  absl::Status ready = AwaitComm(slot, *comm, deadline, absl::StrCat("creating the ", name));
  void* abort = nullptr;
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    slot.busy = false;
    if (!ready.ok() || slot.failed) {
      abort = slot.comm;
      slot.comm = nullptr;
    }
  }
  if (abort != nullptr) runtime_->AbortComm(abort);
  finish(ready);
}

absl::Time NcclEngine::Deadline(const v1::GpuCollectiveRequest& request, absl::Duration timeout) {
  if (request.timeout_millis() > 0) {
    timeout = std::min(timeout, absl::Milliseconds(request.timeout_millis()));
  }
  return absl::Now() + timeout;
}

void NcclEngine::RunCollective(Slot& slot, const v1::GpuCollectiveRequest& request,
                               absl::Time deadline, const Done& done) {
  const std::string what = absl::StrCat("collective #", request.sequence(), " (",
                                        DescribeRequest(request), ") on group ", slot.group);
  // A communicator that could not be created says why (e.g. the timeout).
  if (!slot.init_status.ok()) return done(slot.init_status);
  bool initialized = false;
  std::string bus_id;
  absl::Status failed;  // done() runs after slot.mu is released, never under it
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    if (slot.failed) {
      failed = absl::AbortedError(slot.error);
    } else {
      initialized = slot.initialized;
      bus_id = slot.bus_id;
      slot.serving = true;
    }
  }
  if (!failed.ok()) return done(failed);
  // Allocations the rank freed: close them once the daemon's stream no
  // longer uses them.
  if (request.released_handles_size() > 0) {
    if (slot.stream != nullptr) (void)runtime_->StreamSynchronize(slot.stream);
    for (const std::string& handle : request.released_handles()) {
      mem_cache_->Release(slot.owner, handle);
    }
  }
  // This rank's own checks: their verdict is part of the agreement, so that
  // a request one member got wrong fails on every member.
  std::vector<char*> inputs, outputs, p2p;
  void* ready = nullptr;
  void* finished = nullptr;
  // Before the communicator exists a barrier is planned on a stand-in for
  // its scratch word (and planned again after).
  static char scratch_stand_in[sizeof(float)];
  auto plan_with = [&](void* scratch) {
    return PlanCollective(request, slot.group_rank, slot.group_size, inputs, outputs, p2p, scratch);
  };
  absl::StatusOr<std::vector<NcclPrimitive>> plan;
  auto check = [&]() -> absl::Status {
    if (initialized && request.op() != v1::GPU_BARRIER && request.pci_bus_id() != bus_id) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": buffers are on GPU ", request.pci_bus_id(),
                       " but this rank's communicator for the group is on GPU ", bus_id));
    }
    auto resolve = [&](const v1::GpuBuffer& buffer) -> absl::StatusOr<char*> {
      absl::StatusOr<IpcResource> base = mem_cache_->Get(slot.owner, buffer.ipc_handle());
      if (!base.ok()) return base.status();
      // Never let a request make NCCL touch memory outside the allocation
      // the rank exported (a fault would poison this GPU for every job).
      const size_t size = base->bytes;
      if (buffer.offset() > size || buffer.bytes() > size - buffer.offset()) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": a buffer of ", buffer.bytes(), " bytes at offset ",
                         buffer.offset(), " runs past the end of its ", size, "-byte allocation"));
      }
      return static_cast<char*>(base->ptr) + buffer.offset();
    };
    for (const auto& b : request.inputs()) {
      absl::StatusOr<char*> p = resolve(b);
      if (!p.ok()) return p.status();
      inputs.push_back(*p);
    }
    for (const auto& b : request.outputs()) {
      absl::StatusOr<char*> p = resolve(b);
      if (!p.ok()) return p.status();
      outputs.push_back(*p);
    }
    for (const auto& op : request.p2p()) {
      absl::StatusOr<char*> p = resolve(op.buffer());
      if (!p.ok()) return p.status();
      p2p.push_back(*p);
    }
    plan = plan_with(initialized ? slot.scratch : scratch_stand_in);
    if (!plan.ok()) {
      return absl::Status(plan.status().code(), absl::StrCat(what, ": ", plan.status().message()));
    }
    if (!request.ready_event().empty()) {
      absl::StatusOr<IpcResource> e = event_cache_->Get(slot.owner, request.ready_event());
      if (!e.ok()) return e.status();
      ready = e->ptr;
    }
    if (!request.done_event().empty()) {
      absl::StatusOr<IpcResource> e = event_cache_->Get(slot.owner, request.done_event());
      if (!e.ok()) return e.status();
      finished = e->ptr;
    }
    return absl::OkStatus();
  };
  absl::Status verdict = check();
  if (absl::Status agreed = Agree(slot, request, verdict, deadline); !agreed.ok()) {
    return done(std::move(agreed));
  }
  if (!initialized) {
    InitComm(slot, request.pci_bus_id());
    if (!slot.init_status.ok()) return done(slot.init_status);
    plan = plan_with(slot.scratch);
    if (!plan.ok()) return done(std::move(plan).status());
  }
  void* comm = nullptr;
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    if (slot.failed) failed = absl::AbortedError(slot.error);
    comm = slot.comm;
  }
  if (!failed.ok()) return done(failed);
  if (comm == nullptr) return done(absl::AbortedError(absl::StrCat(what, ": no communicator")));
  if (ready != nullptr) {
    if (absl::Status s = runtime_->StreamWaitEvent(slot.stream, ready); !s.ok()) return done(s);
  }
  // Launch, holding the comm against concurrent aborts.
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    if (slot.failed || slot.comm == nullptr) {
      failed = absl::AbortedError(slot.error.empty() ? what : slot.error);
    } else {
      slot.busy = true;
    }
  }
  if (!failed.ok()) return done(failed);
  absl::Status launched = runtime_->Launch(comm, *plan, slot.stream);
  if (launched.ok() || absl::IsUnavailable(launched)) {
    launched = AwaitComm(slot, comm, absl::Now() + slot.timeout, absl::StrCat("launching ", what));
  }
  void* abort = nullptr;
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    slot.busy = false;
    if (slot.failed && slot.comm != nullptr) {
      abort = slot.comm;
      slot.comm = nullptr;
    }
  }
  if (abort != nullptr) runtime_->AbortComm(abort);
  if (!launched.ok()) {
    // A peer's failure usually reaches NCCL before the registry names it:
    // give the registry a moment, its reason says which rank died and how.
    std::string broken;
    for (int i = 0; i < 50 && (broken = directory_->BrokenReason(slot.job, slot.group)).empty();
         ++i) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    std::string reason = !broken.empty()
                             ? broken
                             : absl::StrCat(what, " failed on rank ", slot.global_rank, ": ",
                                            launched.message(), "; NCCL communicator aborted");
    Fail(slot, reason, /*break_group=*/broken.empty());
    return done(absl::AbortedError(reason));
  }
  if (finished != nullptr) {
    if (absl::Status s = runtime_->RecordEvent(finished, slot.stream); !s.ok()) return done(s);
  }
  // The watchdog's marker.
  void* marker = nullptr;
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    if (!slot.spare_events.empty()) {
      marker = slot.spare_events.back();
      slot.spare_events.pop_back();
    }
  }
  if (marker == nullptr) {
    absl::StatusOr<void*> e = runtime_->CreateEvent();
    if (!e.ok()) return done(e.status());
    marker = *e;
  }
  if (absl::Status s = runtime_->RecordEvent(marker, slot.stream); !s.ok()) return done(s);
  uint64_t count;
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    slot.pending.push_back({marker, request.sequence(), absl::Now(), what});
    slot.last_launched_sequence = std::max(slot.last_launched_sequence, request.sequence());
    count = ++slot.launched;
  }
  done(count);
}

absl::Status NcclEngine::Agree(Slot& slot, const v1::GpuCollectiveRequest& request,
                               const absl::Status& verdict, absl::Time deadline) {
  std::optional<CollectiveKind> kind = KindOf(request.op());
  if (!kind.has_value()) return verdict;  // point to point: its pair only
  const int me = slot.group_rank;
  AgreementEntry mine;
  // A barrier has no dtype or count (whatever the request says); all_to_all's
  // counts are its splits, compared below.
  DType dtype = static_cast<DType>(request.dtype());
  uint64_t count = request.count();
  if (*kind == CollectiveKind::kBarrier) {
    dtype = DType::kUInt8;
    count = 0;
  } else if (*kind == CollectiveKind::kAllToAll) {
    count = static_cast<uint64_t>(slot.group_size);
  }
  mine.signature = MakeSignature(0, *kind, dtype, count, request.root(),
                                 static_cast<ReduceOp>(request.reduce_op()));
  mine.send.assign(request.send_counts().begin(), request.send_counts().end());
  mine.recv.assign(request.recv_counts().begin(), request.recv_counts().end());
  mine.verdict_code = verdict.code();
  mine.verdict_message = std::string(verdict.message());
  if (slot.local_group_ranks.size() <= 1) {
    // Nobody to wait for here (members on other nodes are not compared).
    return CompareRound({{me, mine}}, me, slot.group_size);
  }
  std::unique_lock<std::mutex> lock(table_mu_);
  std::shared_ptr<SignatureTable>& entry =
      tables_[TableKey{slot.job, slot.uid_group, slot.generation, slot.local_group_ranks.front()}];
  if (entry == nullptr) {
    entry = std::make_shared<SignatureTable>();
    entry->local = slot.local_group_ranks;
    entry->global_ranks = slot.global_ranks;
  }
  std::shared_ptr<SignatureTable> table = entry;
  if (!table->broken.empty()) return absl::AbortedError(table->broken);
  const uint64_t n = ++table->issued[me];
  mine.signature.sequence = n;
  SignatureTable::Round& round = table->rounds[n];
  round.entries[me] = mine;
  if (round.entries.size() == table->local.size()) {
    round.decided = true;
    table_cv_.notify_all();
  }
  const absl::Time spin_until = absl::Now() + absl::Microseconds(100);
  while (!round.decided && table->broken.empty()) {
    bool failed;
    std::string error;
    {
      std::lock_guard<std::mutex> slot_lock(slot.mu);
      failed = slot.failed;
      error = slot.error;
    }
    if (failed) return absl::AbortedError(error);
    if (absl::Now() >= deadline) {
      // Decided once, for every member: the waiters get this, the group
      // breaks, and whoever issues #n later gets ABORTED.
      std::vector<int> missing;
      for (int j : table->local) {
        if (round.entries.count(j) == 0) missing.push_back(table->global_ranks[j]);
      }
      const std::string message =
          absl::StrCat(DescribeSignature(mine.signature), " on group '", slot.group,
                       "' timed out waiting for ranks ", absl::StrJoin(missing, ", "),
                       " to issue it (GPU collectives launch once every member on the node "
                       "issued them)");
      round.decided = true;
      round.failure = message;
      const std::string reason = absl::StrCat("rank ", slot.global_rank, ": ", message);
      table->broken = reason;
      lock.unlock();
      table_cv_.notify_all();
      directory_->BreakGroup(slot.job, slot.group, reason);
      return absl::DeadlineExceededError(message);
    }
    // The others are usually a few microseconds away (ranks issue a
    // collective together): yield the CPU to them for a while before
    // sleeping, whose wake-up costs a scheduler round trip.
    if (absl::Now() < spin_until) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
      continue;
    }
    table_cv_.wait_until(lock, absl::ToChronoTime(deadline));
  }
  if (!round.failure.empty()) return absl::DeadlineExceededError(round.failure);
  if (!round.decided) return absl::AbortedError(table->broken);
  absl::Status outcome = CompareRound(round.entries, me, slot.group_size);
  if (++round.consumed == table->local.size()) table->rounds.erase(n);
  return outcome;
}

void NcclEngine::BreakTables(const std::string& job_id, const std::string& group, int global_rank,
                             const std::string& reason, bool drop, bool exact) {
  {
    std::lock_guard<std::mutex> lock(table_mu_);
    for (auto it = tables_.begin(); it != tables_.end();) {
      SignatureTable& table = *it->second;
      const std::string& name = std::get<1>(it->first);  // "g" or "e<epoch>/g"
      bool ours = std::get<0>(it->first) == job_id &&
                  (group.empty() || name == group ||
                   (!exact && name.size() > group.size() + 1 && name[0] == 'e' &&
                    absl::EndsWith(name, "/" + group)));
      if (ours && global_rank >= 0) {
        ours = false;
        for (int j : table.local) ours = ours || table.global_ranks[j] == global_rank;
      }
      if (!ours) {
        ++it;
        continue;
      }
      if (table.broken.empty()) table.broken = reason;
      if (drop && global_rank >= 0) table.gone.insert(global_rank);
      // Forgotten once every member here is gone: a group re-created under
      // its name starts again at #1.
      if (drop && (global_rank < 0 || table.gone.size() == table.local.size())) {
        it = tables_.erase(it);
      } else {
        ++it;
      }
    }
  }
  table_cv_.notify_all();
}

void NcclEngine::Fail(Slot& slot, const std::string& reason, bool break_group) {
  void* abort = nullptr;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    if (!slot.failed) {
      first = true;
      slot.failed = true;
      slot.state = "aborted";
      slot.error = reason;
    }
    if (!slot.busy && slot.comm != nullptr) {
      abort = slot.comm;
      slot.comm = nullptr;
    }
  }
  slot.cv.notify_all();
  // The rank's next call goes through gRPC, which says why.
  if (slot.channel != nullptr) slot.channel->Close();
  if (abort != nullptr) runtime_->AbortComm(abort);
  if (first) {
    MLOG(WARNING) << "NCCL communicator of group " << slot.group << " (job " << slot.job
                  << ", rank " << slot.global_rank << ") aborted: " << reason;
  }
  // Members waiting to agree with this one stop waiting.
  // Its own epoch's tables only: a slot of an earlier epoch failing late
  // must not break the group formed again meanwhile.
  if (first) BreakTables(slot.job, slot.uid_group, -1, reason, /*drop=*/false, /*exact=*/true);
  if (first && break_group) directory_->BreakGroup(slot.job, slot.group, reason);
}

void NcclEngine::Watchdog() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    watchdog_cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.watchdog_interval));
    if (stopping_) break;
    auto breaks = std::move(pending_breaks_);
    pending_breaks_.clear();
    std::vector<std::shared_ptr<Slot>> snapshot;
    for (auto& [key, slot] : slots_) snapshot.push_back(slot);
    // Breaks also reach slots already retired (their rank left or died, or
    // the group was destroyed) whose workers still drain: they must abort,
    // not finalize a communicator whose peers are gone.
    std::vector<std::shared_ptr<Slot>> breakable = snapshot;
    for (auto& slot : retired_) breakable.push_back(slot);
    // Join workers that finished draining.
    std::vector<std::shared_ptr<Slot>> exited;
    for (auto it = retired_.begin(); it != retired_.end();) {
      bool done;
      {
        std::lock_guard<std::mutex> slot_lock((*it)->mu);
        done = (*it)->exited;
      }
      if (done) {
        exited.push_back(*it);
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
    // Owners whose slots all exited: close their IPC handles.
    std::vector<std::string> releasable;
    for (auto it = pending_releases_.begin(); it != pending_releases_.end();) {
      bool busy = false;
      for (auto& slot : retired_) busy = busy || slot->owner == *it;
      for (auto& [key, slot] : slots_) busy = busy || slot->owner == *it;
      if (busy) {
        ++it;
      } else {
        releasable.push_back(*it);
        it = pending_releases_.erase(it);
      }
    }
    lock.unlock();
    for (auto& slot : exited) slot->worker.join();
    for (const std::string& owner : releasable) {
      mem_cache_->ReleaseOwner(owner);
      event_cache_->ReleaseOwner(owner);
    }
    for (auto& [job, group, reason] : breaks) {
      for (auto& slot : breakable) {
        if (slot->job != job || slot->group != group) continue;
        // Only the slots the break was meant for: a group formed again
        // (a later job epoch) already has new ones.
        bool requested;
        {
          std::lock_guard<std::mutex> slot_lock(slot->mu);
          requested = slot->break_requested;
        }
        if (requested) Fail(*slot, reason, /*break_group=*/false);
      }
    }
    for (auto& slot : snapshot) {
      Slot& s = *slot;
      std::string failure;
      {
        std::lock_guard<std::mutex> slot_lock(s.mu);
        if (s.failed) continue;
        // Not while the worker is inside an NCCL operation on the comm
        // (busy): NCCL allows one thread at a time on a communicator, and
        // the worker polls that operation itself.
        if (s.comm != nullptr && s.state == "ready" && !s.busy) {
          absl::Status async = runtime_->PollComm(s.comm);
          if (!async.ok() && !absl::IsUnavailable(async)) {
            failure = absl::StrCat("NCCL error on rank ", s.global_rank, " of group ", s.group,
                                   ": ", async.message());
          }
        }
        while (failure.empty() && !s.pending.empty()) {
          Slot::Pending& head = s.pending.front();
          absl::StatusOr<bool> finished = runtime_->EventDone(head.event);
          if (finished.ok() && *finished) {
            s.spare_events.push_back(head.event);
            s.pending.pop_front();
            ++s.completed;
            continue;
          }
          if (!finished.ok()) {
            failure = absl::StrCat(head.what, " failed on the GPU of rank ", s.global_rank, ": ",
                                   finished.status().message());
          } else if (absl::Now() - head.launched_at > s.timeout) {
            failure = absl::StrCat(head.what, " did not finish on the GPU of rank ", s.global_rank,
                                   " within ", absl::FormatDuration(s.timeout),
                                   "; NCCL communicator aborted");
          }
          break;
        }
      }
      if (!failure.empty()) Fail(s, failure, /*break_group=*/true);
    }
    lock.lock();
  }
}

void NcclEngine::GroupFormed(const std::string& job_id, const std::string& group,
                             const std::vector<int>& members, bool local_synchronization,
                             const std::string& backend, const std::vector<int>& local_ranks) {
  if (local_synchronization || group == "world" || !HasNccl(backend)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  for (int rank : local_ranks) {
    auto parent_it = slots_.find(SlotKey{job_id, "world", rank});
    if (parent_it == slots_.end()) continue;  // no world communicator: init lazily
    std::shared_ptr<Slot> parent = parent_it->second;
    {
      std::lock_guard<std::mutex> parent_lock(parent->mu);
      if (parent->failed || parent->state != "ready") continue;
    }
    auto pos = std::find(members.begin(), members.end(), rank);
    const bool member = pos != members.end();
    std::shared_ptr<Slot> child;
    if (member && slots_.count(SlotKey{job_id, group, rank}) == 0) {
      child = std::make_shared<Slot>();
      child->job = job_id;
      child->group = group;
      child->global_rank = rank;
      child->owner = Owner(job_id, rank);
      child->group_rank = static_cast<int>(pos - members.begin());
      child->group_size = static_cast<int>(members.size());
      child->generation = parent->generation;
      child->global_ranks = members;
      child->local_group_ranks = LocalGroupRanks(members, local_ranks, child->group_rank);
      child->timeout = parent->timeout;
      child->user = parent->user;
      child->origin = "split";
      // The parent's job epoch qualifies the child's name as it does the
      // parent's ("e<epoch>/" after the first).
      child->uid_group = absl::StrCat(
          parent->uid_group.substr(0, parent->uid_group.size() - parent->group.size()), group);
      child->epoch = epochs_[SlotKey{job_id, child->uid_group, rank}]++;
      AttachChannel(*child);
      StartWorker(child);
      slots_[SlotKey{job_id, group, rank}] = child;
      (void)Post(*child, [this, c = child.get()] { InitComm(*c, ""); });
    }
    const int color = member ? 0 : -1;
    const int key = member ? static_cast<int>(pos - members.begin()) : 0;
    // The parent is in slots_ (under mu_): its worker runs this.
    (void)Post(*parent, [this, p = parent.get(), child, color, key, group] {
      absl::Status status;
      void* new_comm = nullptr;
      void* comm = nullptr;
      {
        std::lock_guard<std::mutex> l(p->mu);
        if (p->failed || p->comm == nullptr) {
          status = absl::AbortedError(
              absl::StrCat("world communicator unavailable for split: ", p->error));
        } else {
          comm = p->comm;
          p->busy = true;
        }
      }
      // Whether the world communicator itself failed (or is stuck in the
      // split): no later collective may follow it, so it is aborted.
      bool parent_failed = false;
      if (comm != nullptr) {
        absl::StatusOr<void*> split = runtime_->CommSplit(comm, color, key);
        if (!split.ok() && !absl::IsUnavailable(split.status())) {
          status = split.status();
          parent_failed = true;
        } else {
          new_comm = split.ok() ? *split : nullptr;
          const absl::Time deadline = absl::Now() + p->timeout;
          status = AwaitComm(*p, comm, deadline, absl::StrCat("splitting group ", group));
          parent_failed = !status.ok();
          if (status.ok() && new_comm != nullptr && child != nullptr) {
            status = AwaitComm(*child, new_comm, deadline,
                               absl::StrCat("creating group ", group, " by split"));
          }
        }
        void* abort = nullptr;
        {
          std::lock_guard<std::mutex> l(p->mu);
          p->busy = false;
          if (p->failed && p->comm != nullptr) {
            abort = p->comm;
            p->comm = nullptr;
          }
        }
        if (abort != nullptr) runtime_->AbortComm(abort);
        if (parent_failed) {
          Fail(*p,
               absl::StrCat("splitting group ", group, " from the world communicator of rank ",
                            p->global_rank, " failed: ", status.message(),
                            "; NCCL communicator aborted"),
               /*break_group=*/true);
        }
      }
      if (!status.ok() && new_comm != nullptr) {
        runtime_->AbortComm(new_comm);
        new_comm = nullptr;
      }
      if (child == nullptr) {
        if (new_comm != nullptr) runtime_->DestroyComm(new_comm);
        return;
      }
      {
        std::lock_guard<std::mutex> l(child->mu);
        child->comm = new_comm;
        child->comm_status = status;
        child->comm_ready = true;
        child->device = p->device;
        child->bus_id = p->bus_id;
      }
      child->cv.notify_all();
    });
  }
}

void NcclEngine::GroupBroken(const std::string& job_id, const std::string& group,
                             const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_breaks_.emplace_back(job_id, group, reason);
    // Cheap and immediate (the abort itself waits for the watchdog): a slot
    // retired before the break is applied still aborts at teardown.
    auto mark = [&](const std::shared_ptr<Slot>& slot) {
      if (slot->job != job_id || slot->group != group) return;
      std::lock_guard<std::mutex> slot_lock(slot->mu);
      slot->break_requested = true;
    };
    for (auto& [key, slot] : slots_) mark(slot);
    for (auto& slot : retired_) mark(slot);
  }
  watchdog_cv_.notify_all();
  BreakTables(job_id, group, -1, reason, /*drop=*/false);
}

void NcclEngine::GroupDestroyed(const std::string& job_id, const std::string& group,
                                int global_rank) {
  // The members here that still wait for it to agree fail at once.
  BreakTables(job_id, group, global_rank,
              absl::StrCat("rank ", global_rank, " destroyed group '", group, "'"),
              /*drop=*/true);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(SlotKey{job_id, group, global_rank});
  if (it == slots_.end()) return;
  std::shared_ptr<Slot> slot = it->second;
  slots_.erase(it);
  retired_.push_back(slot);
  {
    std::lock_guard<std::mutex> slot_lock(slot->mu);
    slot->stopping = true;
  }
  slot->cv.notify_all();
  if (slot->channel != nullptr) slot->channel->Wake();
}

void NcclEngine::RankGone(const std::string& job_id, int global_rank) {
  BreakTables(job_id, "", global_rank, absl::StrCat("rank ", global_rank, " left the job"),
              /*drop=*/true);
  std::vector<std::shared_ptr<Slot>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = slots_.begin(); it != slots_.end();) {
      if (std::get<0>(it->first) == job_id && std::get<2>(it->first) == global_rank) {
        gone.push_back(it->second);
        retired_.push_back(it->second);
        it = slots_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& slot : gone) {
    {
      std::lock_guard<std::mutex> slot_lock(slot->mu);
      slot->stopping = true;
    }
    slot->cv.notify_all();
    if (slot->channel != nullptr) slot->channel->Wake();
  }
  // The rank's IPC handles close once its workers drained (the watchdog
  // checks; this call must not block).
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_releases_.push_back(Owner(job_id, global_rank));
  }
  watchdog_cv_.notify_all();
}

absl::Status NcclEngine::CollectiveStatus(const std::string& job_id, const std::string& group,
                                          int global_rank, uint64_t sequence, bool* finished) {
  *finished = false;
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(SlotKey{job_id, group, global_rank});
    if (it == slots_.end()) {
      return absl::NotFoundError(
          absl::StrCat("rank ", global_rank, " has no NCCL communicator for group ", group));
    }
    slot = it->second;
  }
  std::lock_guard<std::mutex> lock(slot->mu);
  for (const Slot::Pending& p : slot->pending) {
    if (p.sequence != sequence) continue;
    absl::StatusOr<bool> done = runtime_->EventDone(p.event);
    if (done.ok() && *done) {
      *finished = true;
      return absl::OkStatus();
    }
    if (slot->failed) return absl::AbortedError(slot->error);
    return absl::OkStatus();  // still running on a healthy communicator
  }
  // Not pending: it finished (the watchdog retired it), or was never
  // launched because the communicator had already failed.
  if (slot->failed && sequence > slot->last_launched_sequence) {
    return absl::AbortedError(slot->error);
  }
  *finished = sequence <= slot->last_launched_sequence;
  return absl::OkStatus();
}

std::string NcclEngine::ChannelName(const std::string& job_id, const std::string& group,
                                    int global_rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(SlotKey{job_id, group, global_rank});
  if (it == slots_.end() || it->second->channel == nullptr || it->second->channel->closed()) {
    return "";
  }
  return it->second->channel->name();
}

v1::ListCommunicatorsResponse NcclEngine::List(const std::string& job_id) {
  v1::ListCommunicatorsResponse response;
  response.set_unavailable(runtime_->Unavailable());
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, slot] : slots_) {
    if (!job_id.empty() && slot->job != job_id) continue;
    v1::GpuCommunicatorInfo* info = response.add_communicators();
    info->set_job_id(slot->job);
    info->set_generation(slot->generation);
    info->set_group(slot->group);
    info->set_global_rank(slot->global_rank);
    info->set_group_rank(slot->group_rank);
    info->set_group_size(slot->group_size);
    if (mem_cache_ != nullptr) info->set_open_buffers(mem_cache_->open_count(slot->owner));
    std::lock_guard<std::mutex> slot_lock(slot->mu);
    info->set_pci_bus_id(slot->bus_id);
    info->set_state(slot->state);
    info->set_error(slot->error);
    info->set_origin(slot->origin);
    info->set_launched(slot->launched);
    info->set_completed(slot->completed);
    info->set_channel_requests(slot->channel_requests);
  }
  return response;
}

}  // namespace muster
