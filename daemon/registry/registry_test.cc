// The registry driven directly, over an in-process store (a real
// StoreServer reached through LocalStore, no TCP): registration, group
// formation and barriers, failures and aborts that end pending waits at
// once, and the Validate* helpers.
#include "daemon/registry/registry.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "backends/shm/trace.h"
#include "common/cpus.h"
#include "daemon/store/local_store.h"
#include "daemon/store/store_server.h"
#include "muster/types.h"

namespace muster {
namespace {

class RecordingSink : public SessionSink {
 public:
  void Push(const v1::SessionServerMessage& message) override {
    absl::MutexLock lock(&mu_);
    pushed_.push_back(message);
  }
  void End(const std::string& reason) override {
    absl::MutexLock lock(&mu_);
    ended_ = reason;
  }
  int rank_failures() {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const auto& m : pushed_) n += m.has_rank_failed();
    return n;
  }
  // "rank R: reason" of every RankFailed pushed.
  std::vector<std::string> failures() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& m : pushed_) {
      if (m.has_rank_failed()) {
        out.push_back(absl::StrCat("rank ", m.rank_failed().rank().rank().global_rank(), ": ",
                                   m.rank_failed().rank().failure()));
      }
    }
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::SessionServerMessage> pushed_;
  std::string ended_;
};

template <typename T>
struct Result {
  absl::Notification done;
  T value = T(absl::UnknownError("unset"));
  std::function<void(T)> callback() {
    return [this](T v) {
      value = std::move(v);
      done.Notify();
    };
  }
  const T& Await() {
    REQUIRE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    return value;
  }
};

bool Eventually(const std::function<bool()>& condition) {
  for (int i = 0; i < 500; ++i) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

// A temporary directory; the registry writes dumps into its dumps/.
struct DumpDir {
  std::string root;
  std::string dumps;
  DumpDir() {
    char tmpl[] = "/tmp/registry-dumps-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    root = tmpl;
    dumps = root + "/dumps";
  }
  ~DumpDir() { std::filesystem::remove_all(root); }
};

// Liveness keys kept in a map, and the lost-key watches' callbacks, so a
// test can play "this node's lease expired" (the etcd implementation is
// tested with real etcd in //test:etcd_liveness_test).
struct FakeLiveness {
  absl::Mutex mu;
  std::map<std::string, std::string> held ABSL_GUARDED_BY(mu);
  std::vector<std::function<void(const std::vector<LostKey>&)>> watches ABSL_GUARDED_BY(mu);
  std::shared_ptr<NodeLiveness> For(const std::string& node) {
    auto l = std::make_shared<NodeLiveness>();
    l->node = node;
    l->ttl = absl::Seconds(5);
    l->hold = l->release = [this](const std::string& key, const std::string& value) {
      absl::MutexLock lock(&mu);
      held[key] = value;
      return absl::OkStatus();
    };
    l->watch_lost = [this](const std::string&,
                           std::function<void(const std::vector<LostKey>&)> lost) {
      absl::MutexLock lock(&mu);
      watches.push_back(std::move(lost));
      return NodeLiveness::Cancel([] {});  // the test calls the watches before shutdown
    };
    return l;
  }
};

// A registry whose job store is a StoreServer in this process.
struct Fixture {
  static constexpr unsigned kNodeCpus = 3;  // RegistryOptions::node_cpus
  std::unique_ptr<StoreServer> store;
  std::unique_ptr<Registry> registry;
  std::string master;
  Caller caller;
  std::vector<std::unique_ptr<RecordingSink>> sinks;
  std::map<int, std::string> sessions;

  // `shared`: another fixture's store (a second daemon of the same job).
  explicit Fixture(std::string dump_dir = "", std::shared_ptr<NodeLiveness> liveness = nullptr,
                   Fixture* shared = nullptr, std::string hostname = "node-a",
                   unsigned node_cpus = kNodeCpus,
                   std::function<void(RegistryOptions*)> configure = nullptr) {
    if (shared == nullptr) {
      StoreServerOptions store_options;
      store_options.listen_address = "127.0.0.1";
      store_options.port = 0;
      auto started = StoreServer::Start(store_options);
      REQUIRE(started.ok());
      store = std::move(*started);
    }
    StoreServer* server = shared != nullptr ? shared->store.get() : store.get();
    master = absl::StrCat("127.0.0.1:", server->port());
    RegistryOptions options;
    options.hostname = hostname;
    options.node_cpus = node_cpus;
    options.fallback_cpus = 64;
    options.job_grace = absl::Seconds(60);
    options.dump_dir = dump_dir;
    options.job_store = [server, liveness](const std::string&) {
      JobStoreAccess access;
      access.connect = [server]() -> absl::StatusOr<std::unique_ptr<Store>> {
        return std::unique_ptr<Store>(std::make_unique<LocalStore>(server));
      };
      access.watch = [server](std::vector<std::string> keys,
                              std::function<void(absl::Status)> ready) {
        return LocalStore::Watch(server, std::move(keys), std::move(ready));
      };
      access.liveness = liveness;
      return access;
    };
    if (configure) configure(&options);
    registry = std::make_unique<Registry>(options);
    caller.via = Caller::Via::kUnixSocket;
    caller.uid = ::getuid();
    caller.pid = ::getpid();
    caller.description = "test rank";
  }
  ~Fixture() {
    registry->Shutdown();
    if (store != nullptr) store->Stop();
  }

  v1::RegisterRequest Request(int rank, int world_size) {
    v1::RegisterRequest req;
    req.mutable_rank()->set_job_id("job");
    req.mutable_rank()->set_global_rank(rank);
    req.set_world_size(world_size);
    req.set_local_rank(rank);
    req.set_local_world_size(world_size);
    req.set_pid(::getpid());
    req.set_master_store_address(master);
    return req;
  }

  absl::StatusOr<v1::Registered> Register(int rank, int world_size) {
    sinks.push_back(std::make_unique<RecordingSink>());
    Result<absl::StatusOr<v1::Registered>> r;
    registry->Register(Request(rank, world_size), caller, sinks.back().get(), r.callback());
    auto result = r.Await();
    if (result.ok()) sessions[rank] = result->session_id();
    return result;
  }

  v1::CreateGroupRequest Group(int caller_rank, std::vector<int> ranks, const std::string& name,
                               absl::Duration timeout, bool local_sync = true) {
    v1::CreateGroupRequest req;
    req.mutable_caller()->set_job_id("job");
    req.mutable_caller()->set_global_rank(caller_rank);
    for (int r : ranks) req.add_ranks(r);
    req.set_name(name);
    req.mutable_options()->set_backend("gloo");
    req.mutable_options()->mutable_timeout()->set_millis(absl::ToInt64Milliseconds(timeout));
    req.mutable_options()->set_local_synchronization(local_sync);
    return req;
  }

  // Ranks 0 and 1 of a world of 2 register and form "pair"; its segment,
  // opened as a rank opens it.
  std::unique_ptr<GroupSegment> PairSegment() {
    REQUIRE(Register(0, 2).ok());
    REQUIRE(Register(1, 2).ok());
    auto pair = FormPair("pair");
    REQUIRE(pair.ok());
    auto segment = GroupSegment::Open(pair->shm_name(), 2);
    REQUIRE(segment.ok());
    return std::move(*segment);
  }

  // Registered ranks 0 and 1 form `name` (both ask at once): rank 0's
  // GroupInfo, or rank 0's error, else rank 1's.
  absl::StatusOr<v1::GroupInfo> FormPair(const std::string& name, bool local_sync = true) {
    Result<absl::StatusOr<v1::GroupInfo>> g0, g1;
    registry->CreateGroup(Group(0, {0, 1}, name, absl::Seconds(30), local_sync), caller,
                          g0.callback());
    registry->CreateGroup(Group(1, {0, 1}, name, absl::Seconds(30), local_sync), caller,
                          g1.callback());
    const absl::StatusOr<v1::GroupInfo>& info = g0.Await();
    const absl::StatusOr<v1::GroupInfo>& other = g1.Await();
    if (info.ok() && !other.ok()) return other.status();
    return info;
  }
};

TEST_CASE("ranks register and form a group through the in-process store") {
  Fixture f;
  REQUIRE(f.Register(0, 2).ok());
  REQUIRE(f.Register(1, 2).ok());
  Result<absl::StatusOr<v1::GroupInfo>> g0, g1;
  f.registry->CreateGroup(f.Group(0, {0, 1}, "world", absl::Seconds(30), false), f.caller,
                          g0.callback());
  f.registry->CreateGroup(f.Group(1, {0, 1}, "world", absl::Seconds(30), false), f.caller,
                          g1.callback());
  REQUIRE(g0.Await().ok());
  REQUIRE(g1.Await().ok());
  CHECK(g0.value->members_size() == 2);
  CHECK(g0.value->state() == v1::GROUP_STATE_READY);
  CHECK(g1.value->members(1).pid() == ::getpid());

  // What the registry published is in the store, under the job attempt.
  LocalStore store(f.store.get());
  CHECK(*store.Get("muster/job/0/world_size", absl::Seconds(1)) == "2");
  CHECK(*store.Check({"muster/job/0/rank/0", "muster/job/0/rank/1",
                      "muster/job/0/group/world/arrived/0", "muster/job/0/group/world/arrived/1"}));

  Result<absl::Status> b0, b1;
  auto barrier = [](int rank) {
    v1::BarrierRequest req;
    req.mutable_caller()->set_job_id("job");
    req.mutable_caller()->set_global_rank(rank);
    req.set_name("world");
    req.set_sequence(1);
    return req;
  };
  f.registry->Barrier(barrier(0), f.caller, b0.callback());
  CHECK_FALSE(b0.done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  f.registry->Barrier(barrier(1), f.caller, b1.callback());
  CHECK(b0.Await().ok());
  CHECK(b1.Await().ok());
}

TEST_CASE("a member's failure ends a pending formation at once, naming it") {
  Fixture f;
  REQUIRE(f.Register(0, 3).ok());
  REQUIRE(f.Register(1, 3).ok());
  Result<absl::StatusOr<v1::GroupInfo>> g;
  // Rank 1 never creates the group; its 10-minute timeout is not what ends it.
  f.registry->CreateGroup(f.Group(0, {0, 1}, "pair", absl::Minutes(10)), f.caller, g.callback());
  CHECK_FALSE(g.done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  absl::Time failed_at = absl::Now();
  f.registry->Disconnected(f.sessions[1], f.sinks[1].get());
  const auto& result = g.Await();
  CHECK(absl::Now() - failed_at < absl::Seconds(5));
  REQUIRE(result.status().code() == absl::StatusCode::kAborted);
  CHECK(result.status().message().find("rank 1") != std::string::npos);
  CHECK(f.sinks[0]->rank_failures() == 1);
}

TEST_CASE("a failure record whose key first held only a queue item still counts") {
  Fixture f;
  REQUIRE(f.Register(0, 2).ok());
  REQUIRE(f.Register(1, 2).ok());
  REQUIRE(f.FormPair("world").ok());
  // A store client pushes a queue item at the next failure record's key: it
  // is present for the watcher's wait but has no value (musterd crashed on
  // reading it).
  absl::Notification pushed;
  REQUIRE(f.store->Post([&](StoreServer::Loop& loop) {
    REQUIRE(loop.kv().QueuePush("muster/job/0/failure/1", "junk").ok());
    pushed.Notify();
  }));
  pushed.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(300));
  // The real record comes (within the watcher's 5 s) and is acted on.
  LocalStore store(f.store.get());
  REQUIRE(store.Add("muster/job/0/failures", 1).ok());
  REQUIRE(store
              .Set("muster/job/0/failure/1",
                   absl::StrCat("1\tnode-a\t", ::getpid(), "\t0\tkilled by the test"))
              .ok());
  CHECK(Eventually([&] {
    auto g = f.registry->GetGroup("job", "world", Caller::InProcess());
    return g.ok() && g->state() == v1::GROUP_STATE_BROKEN;
  }));
  CHECK(f.sinks[0]->rank_failures() == 1);
}

TEST_CASE("a node whose liveness keys vanished: one failure record per rank, all ranks told") {
  FakeLiveness keys;
  Fixture a("", keys.For("node-a"));
  Fixture b("", keys.For("node-b"), &a, "node-b");
  REQUIRE(a.Register(0, 6).ok());
  REQUIRE(a.Register(1, 6).ok());
  REQUIRE(b.Register(2, 6).ok());
  // Node c's coordinator (its daemon is about to vanish) holds ranks 4, 5;
  // rank 3 of node c left in order (released).
  JobStoreAccess c_access;
  StoreServer* server = a.store.get();
  c_access.connect = [server]() -> absl::StatusOr<std::unique_ptr<Store>> {
    return std::unique_ptr<Store>(std::make_unique<LocalStore>(server));
  };
  c_access.liveness = keys.For("node-c/10.0.0.3");
  {
    JobCoordinator c("job", 0, c_access);
    for (int r : {3, 4, 5}) {
      REQUIRE(c.PublishRank(6, RemoteRank{r, "host-c", 1000 + r, "daemon-c", ""}).ok());
    }
    REQUIRE(c.MarkGone(RemoteRank{3, "host-c", 1003, "daemon-c", ""}).ok());
  }
  std::vector<LostKey> lost;
  std::vector<std::function<void(const std::vector<LostKey>&)>> watches;
  {
    absl::MutexLock lock(&keys.mu);
    CHECK(absl::EndsWith(keys.held["muster/job/0/alive/0"], "\tnode-a\t5"));
    CHECK(keys.held["muster/job/0/alive/3"] == "-");
    for (int r : {3, 4, 5}) {
      std::string key = absl::StrCat("muster/job/0/alive/", r);
      lost.push_back(LostKey{key, keys.held[key], 42});
    }
    watches = keys.watches;
  }
  REQUIRE(watches.size() == 2);  // one per daemon with local ranks of the job
  // Both daemons see the same deletion at once, and one sees it twice (a
  // resumed watch).
  std::thread other([&] { watches[1](lost); });
  watches[0](lost);
  other.join();
  watches[0](lost);
  const std::string reason =
      "node node-c/10.0.0.3 (musterd lease expired after 5 s): ranks 4, 5 lost";
  std::vector<std::string> want = {absl::StrCat("rank 4: ", reason),
                                   absl::StrCat("rank 5: ", reason)};
  for (RecordingSink* sink : {a.sinks[0].get(), a.sinks[1].get(), b.sinks[0].get()}) {
    REQUIRE(Eventually([&] { return sink->rank_failures() >= 2; }));
  }
  LocalStore store(a.store.get());
  // The records come back through every daemon's failure watcher: no repeat.
  REQUIRE(store.Wait({"muster/job/0/failure/1", "muster/job/0/failure/2"}, absl::Seconds(5)).ok());
  absl::SleepFor(absl::Milliseconds(300));
  for (RecordingSink* sink : {a.sinks[0].get(), a.sinks[1].get(), b.sinks[0].get()}) {
    std::vector<std::string> told = sink->failures();  // in either order
    std::sort(told.begin(), told.end());
    CHECK(told == want);
  }
  CHECK(*store.Add("muster/job/0/failures", 0) == 2);
  CHECK_FALSE(*store.Check({"muster/job/0/failure/3"}));
  CHECK(*store.Get("muster/job/0/gone/4", absl::Seconds(1)) == "host-c\t1004\tdaemon-c\t");
  CHECK(*store.Get("muster/job/0/gone/5", absl::Seconds(1)) == "host-c\t1005\tdaemon-c\t");
}

TEST_CASE("an aborted group ends its pending formation; a timeout names who never came") {
  Fixture f;
  REQUIRE(f.Register(0, 2).ok());
  REQUIRE(f.Register(1, 2).ok());
  Result<absl::StatusOr<v1::GroupInfo>> aborted;
  f.registry->CreateGroup(f.Group(0, {0, 1}, "g1", absl::Minutes(10)), f.caller,
                          aborted.callback());
  CHECK_FALSE(aborted.done.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  REQUIRE(f.registry->AbortGroup("job", "g1", "operator says stop", Caller::InProcess()).ok());
  CHECK(aborted.Await().status().code() == absl::StatusCode::kAborted);
  CHECK(aborted.value.status().message().find("operator says stop") != std::string::npos);

  Result<absl::StatusOr<v1::GroupInfo>> late;
  f.registry->CreateGroup(f.Group(0, {0, 1}, "g2", absl::Milliseconds(200)), f.caller,
                          late.callback());
  REQUIRE(late.Await().status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(late.value.status().message().find("never arrived: 1") != std::string::npos);
}

TEST_CASE("shutdown ends pending formations") {
  Fixture f;
  REQUIRE(f.Register(0, 2).ok());
  Result<absl::StatusOr<v1::GroupInfo>> g;
  f.registry->CreateGroup(f.Group(0, {0, 1}, "g", absl::Minutes(10)), f.caller, g.callback());
  CHECK_FALSE(g.done.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  absl::Time start = absl::Now();
  f.registry->Shutdown();
  CHECK_FALSE(g.Await().ok());
  CHECK(absl::Now() - start < absl::Seconds(5));
}

TEST_CASE("registrations are checked against the job") {
  Fixture f;
  REQUIRE(f.Register(0, 2).ok());
  auto other_size = f.Register(1, 3);
  CHECK(other_size.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(other_size.status().message().find("world size 3") != std::string::npos);
  auto twice = f.Register(0, 2);
  CHECK(twice.status().code() == absl::StatusCode::kAlreadyExists);
  Caller stranger = f.caller;
  stranger.uid = f.caller.uid + 1;
  stranger.description = "uid other";
  Result<absl::StatusOr<v1::Registered>> r;
  RecordingSink sink;
  f.registry->Register(f.Request(1, 2), stranger, &sink, r.callback());
  CHECK(r.Await().status().code() == absl::StatusCode::kPermissionDenied);
}

v1::ReconfigureRequest Reconfigure(int rank, int64_t epoch, absl::Duration timeout) {
  v1::ReconfigureRequest req;
  req.mutable_caller()->set_job_id("job");
  req.mutable_caller()->set_global_rank(rank);
  req.set_epoch(epoch);
  req.mutable_timeout()->set_millis(absl::ToInt64Milliseconds(timeout));
  return req;
}

TEST_CASE(
    "elastic: a new process takes over a failed rank, both join epoch 1 and the group forms "
    "again under it; stale failures break nothing") {
  Fixture f;
  REQUIRE(f.Register(0, 2).ok());
  REQUIRE(f.Register(1, 2).ok());
  REQUIRE(f.FormPair("world", /*local_sync=*/false).ok());

  // Rank 1's process ends without leaving: its group breaks.
  f.registry->Disconnected(f.sessions[1], f.sinks[1].get());
  REQUIRE(Eventually([&] {
    auto g = f.registry->GetGroup("job", "world", Caller::InProcess());
    return g.ok() && g->state() == v1::GROUP_STATE_BROKEN;
  }));
  // A live rank cannot be taken over; rank 1 (failed) can, by another process.
  CHECK(f.Register(0, 2).status().code() == absl::StatusCode::kAlreadyExists);
  Caller replacement = f.caller;
  replacement.pid = ::getpid() + 1000000;  // another process than the one that failed
  f.sinks.push_back(std::make_unique<RecordingSink>());
  Result<absl::StatusOr<v1::Registered>> joined;
  f.registry->Register(f.Request(1, 2), replacement, f.sinks.back().get(), joined.callback());
  REQUIRE(joined.Await().ok());
  CHECK(joined.value->rejoin_epoch() == 1);

  Result<absl::StatusOr<v1::ReconfigureResponse>> wrong;
  f.registry->Reconfigure(Reconfigure(0, 2, absl::Seconds(1)), f.caller, wrong.callback());
  CHECK(wrong.Await().status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(wrong.value.status().message().find("can join epoch 1, not 2") != std::string::npos);

  Result<absl::StatusOr<v1::ReconfigureResponse>> e0, e1;
  f.registry->Reconfigure(Reconfigure(0, 1, absl::Seconds(30)), f.caller, e0.callback());
  CHECK_FALSE(e0.done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));  // waits for 1
  f.registry->Reconfigure(Reconfigure(1, 1, absl::Seconds(30)), replacement, e1.callback());
  REQUIRE(e0.Await().ok());
  REQUIRE(e1.Await().ok());
  CHECK(e0.value->epoch() == 1);

  // The group forms again, under epoch 1's keys.
  Result<absl::StatusOr<v1::GroupInfo>> h0, h1;
  f.registry->CreateGroup(f.Group(0, {0, 1}, "world", absl::Seconds(30), false), f.caller,
                          h0.callback());
  f.registry->CreateGroup(f.Group(1, {0, 1}, "world", absl::Seconds(30), false), replacement,
                          h1.callback());
  REQUIRE(h0.Await().ok());
  REQUIRE(h1.Await().ok());
  CHECK(h0.value->epoch() == 1);
  CHECK(h0.value->state() == v1::GROUP_STATE_READY);
  CHECK(h1.value->members(1).pid() == replacement.pid);
  LocalStore store(f.store.get());
  CHECK(*store.Check({"muster/job/0/epoch/1/arrived/0", "muster/job/0/e1/group/world/arrived/1"}));
  CHECK(*store.Get("muster/job/0/epoch", absl::Seconds(1)) == "1");

  // A failure record of epoch 0 seen again (another daemon's late report)
  // breaks nothing in epoch 1.
  REQUIRE(store.Add("muster/job/0/failures", 1).ok());
  auto n = store.Add("muster/job/0/failures", 0);
  REQUIRE(n.ok());
  REQUIRE(store
              .Set(absl::StrCat("muster/job/0/failure/", *n),
                   absl::StrCat("1\tnode-a\t", ::getpid(), "\t0\tan old death"))
              .ok());
  absl::SleepFor(absl::Milliseconds(300));
  CHECK(f.registry->GetGroup("job", "world", Caller::InProcess())->state() ==
        v1::GROUP_STATE_READY);

  std::vector<v1::JobInfo> jobs = f.registry->ListJobs(Caller::InProcess());
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].epoch() == 1);
  REQUIRE(jobs[0].reconfigurations_size() == 1);
  CHECK(jobs[0].reconfigurations(0).replaced_size() == 1);
  CHECK(jobs[0].reconfigurations(0).replaced(0) == 1);
  CHECK(jobs[0].reconfigurations(0).failed(0).find("rank 1") != std::string::npos);

  // The next epoch cannot form without rank 1: the timeout names it.
  Result<absl::StatusOr<v1::ReconfigureResponse>> alone;
  f.registry->Reconfigure(Reconfigure(0, 2, absl::Milliseconds(200)), f.caller, alone.callback());
  REQUIRE(alone.Await().status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(alone.value.status().message().find("epoch 2 of job 'job' timed out; ranks that never "
                                            "arrived: 1") != std::string::npos);
}

TEST_CASE(
    "elastic start: a rank that failed after registering is not waited for; the others form "
    "epoch 1 without it") {
  Fixture f;
  REQUIRE(f.Register(0, 4).ok());
  REQUIRE(f.Register(1, 4).ok());
  REQUIRE(f.Register(2, 4).ok());
  // Rank 2's process ends before it joins the first epoch; rank 3 never came.
  f.registry->Disconnected(f.sessions[2], f.sinks[2].get());
  auto start = [](int rank) {
    v1::ReconfigureRequest req = Reconfigure(rank, 1, absl::Seconds(30));
    req.set_allow_shrink(true);
    req.set_start_min_size(2);
    return req;
  };
  Result<absl::StatusOr<v1::ReconfigureResponse>> e0, e1;
  f.registry->Reconfigure(start(0), f.caller, e0.callback());
  f.registry->Reconfigure(start(1), f.caller, e1.callback());
  const auto& r0 = e0.Await();
  const auto& r1 = e1.Await();
  REQUIRE(r0.ok());
  REQUIRE(r1.ok());
  CHECK(r0->world_size() == 2);
  CHECK(std::vector<int>(r0->members().begin(), r0->members().end()) == std::vector<int>{0, 1});
  CHECK(std::vector<int>(r1->members().begin(), r1->members().end()) == std::vector<int>{0, 1});
}

TEST_CASE(
    "elastic start: a rank still waiting when another rank formed epoch 1 takes that epoch's "
    "members") {
  Fixture f;
  REQUIRE(f.Register(0, 3).ok());
  REQUIRE(f.Register(1, 3).ok());
  // Rank 1 (here: its record) fixed epoch 1 as {0, 1} while rank 0's wait
  // for stable arrivals had not ended; rank 1 never shows up in this wait.
  LocalStore store(f.store.get());
  REQUIRE(store.Set("muster/job/0/epoch/1/members", "0,1").ok());
  v1::ReconfigureRequest req = Reconfigure(0, 1, absl::Seconds(3));
  req.set_allow_shrink(true);
  req.set_start_min_size(2);
  Result<absl::StatusOr<v1::ReconfigureResponse>> e0;
  f.registry->Reconfigure(req, f.caller, e0.callback());
  const auto& r0 = e0.Await();
  REQUIRE(r0.ok());
  CHECK(std::vector<int>(r0->members().begin(), r0->members().end()) == std::vector<int>{0, 1});
}

TEST_CASE("elastic: more local ranks join an epoch at once than the daemon has blocking threads") {
  // 6 workers, 4 kept for short tasks: 2 blocking threads for 5 ranks' waits.
  // The waits queued behind the first two must still have arrived.
  Fixture f("", nullptr, nullptr, "node-a", Fixture::kNodeCpus,
            [](RegistryOptions* o) { o->max_workers = 6; });
  constexpr int kRanks = 5;
  for (int r = 0; r < kRanks; ++r) REQUIRE(f.Register(r, kRanks).ok());
  Result<absl::StatusOr<v1::ReconfigureResponse>> joined[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    f.registry->Reconfigure(Reconfigure(r, 1, absl::Seconds(10)), f.caller, joined[r].callback());
  }
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    const auto& got = joined[r].Await();
    REQUIRE(got.ok());
    CHECK(got->epoch() == 1);
    CHECK(got->world_size() == kRanks);
  }
}

TEST_CASE("a group's segment carries the CPUs the node's ranks share") {
  Fixture f;
  auto segment = f.PairSegment();
  CHECK(segment->node_cpus() == Fixture::kNodeCpus);
}

TEST_CASE("without --node-cpus a group's segment counts its ranks' CPUs") {
  // Both "ranks" are this process (the caller's pid): narrowed to one CPU,
  // the group counts 1, not musterd's fallback (64 here).
  cpu_set_t all;
  CPU_ZERO(&all);
  REQUIRE(::sched_getaffinity(0, sizeof(all), &all) == 0);
  const std::vector<int> allowed = AllowedCpus();
  REQUIRE(!allowed.empty());
  REQUIRE(allowed[0] < CPU_SETSIZE);  // `one` is a cpu_set_t
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(allowed[0], &one);
  Fixture f("", nullptr, nullptr, "node-a", /*node_cpus=*/0);
  REQUIRE(f.Register(0, 2).ok());
  REQUIRE(f.Register(1, 2).ok());
  REQUIRE(::sched_setaffinity(0, sizeof(one), &one) == 0);
  auto pair = f.FormPair("pair");
  REQUIRE(::sched_setaffinity(0, sizeof(all), &all) == 0);
  REQUIRE(pair.ok());
  auto segment = GroupSegment::Open(pair->shm_name(), 2);
  REQUIRE(segment.ok());
  CHECK((*segment)->node_cpus() == 1);
}

TEST_CASE("Trace reads the members' rings; an aborted group's recorder is dumped once") {
  DumpDir dir;
  const std::string& dumps = dir.dumps;
  Fixture f(dumps);
  REQUIRE(f.Register(0, 2).ok());
  REQUIRE(f.Register(1, 2).ok());
  auto pair = f.FormPair("pair");
  REQUIRE(pair.ok());
  const v1::GroupInfo& info = *pair;
  REQUIRE(!info.shm_name().empty());
  // What the ranks' SDK does: write records into their rings.
  auto segment = GroupSegment::Open(info.shm_name(), 2);
  REQUIRE(segment.ok());
  for (int r = 0; r < 2; ++r) {
    TraceWriter w(segment->get(), r, 2048);
    TraceCall call;
    call.op = TraceOp::kAllReduce;
    call.dtype = static_cast<uint8_t>(DType::kFloat32);
    call.count = 10 + r;
    w.Finished(w.Begin(1, call, 100), 0, 200);
    w.Started(w.Begin(2, call, 300), 400);
  }
  v1::TraceRequest req;
  req.set_job_id("job");
  req.set_group("pair");
  auto trace = f.registry->Trace(req, f.caller);
  REQUIRE(trace.ok());
  REQUIRE(trace->groups_size() == 1);
  const v1::GroupTrace& g = trace->groups(0);
  REQUIRE(g.ranks_size() == 2);
  CHECK(g.ranks(1).global_rank() == 1);
  REQUIRE(g.ranks(1).records_size() == 2);
  CHECK(g.ranks(1).records(0).op() == "all_reduce");
  CHECK(g.ranks(1).records(0).dtype() == "float32");
  CHECK(g.ranks(1).records(0).count() == 11);
  CHECK(g.ranks(1).records(0).state() == "completed");
  CHECK(g.ranks(1).records(1).state() == "started");
  req.set_rank(0);
  req.set_last(1);
  trace = f.registry->Trace(req, f.caller);
  REQUIRE(trace.ok());
  REQUIRE(trace->groups(0).ranks_size() == 1);
  REQUIRE(trace->groups(0).ranks(0).records_size() == 1);
  CHECK(trace->groups(0).ranks(0).records(0).seq() == 2);

  // Another user sees nothing of the job.
  Caller other = f.caller;
  other.uid = f.caller.uid + 1;
  CHECK(f.registry->Trace(req, other).status().code() == absl::StatusCode::kPermissionDenied);
  v1::TraceRequest everything;
  auto none = f.registry->Trace(everything, other);
  REQUIRE(none.ok());
  CHECK(none->groups_size() == 0);

  // Aborting the group writes its recorder (once, however often it breaks).
  REQUIRE(f.registry->AbortGroup("job", "pair", "testing", f.caller).ok());
  REQUIRE(f.registry->AbortGroup("job", "pair", "again", f.caller).ok());
  auto aborted = f.registry->GetGroup("job", "pair", f.caller);
  REQUIRE(aborted.ok());
  const std::string path = aborted->dump_path();
  CHECK(path.rfind(dumps + "/trace-job-pair-e0-", 0) == 0);
  REQUIRE(Eventually([&] { return ::access(path.c_str(), F_OK) == 0; }));
  // Only the job's user reads it; the directory lists nothing to others.
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(st.st_uid == static_cast<uid_t>(f.caller.uid));
  REQUIRE(::stat(dumps.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0711);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("\"reason\":\"group aborted: testing\"") != std::string::npos);
  CHECK(text.find("\"rank\":1,\"group_rank\":1") != std::string::npos);
  CHECK(text.find("\"count\":11") != std::string::npos);
  auto jobs = f.registry->ListJobs(f.caller);
  REQUIRE(jobs.size() == 1);
  REQUIRE(jobs[0].dumps_size() == 1);
  CHECK(jobs[0].dumps(0) == path);
}

TEST_CASE("a job removed while a formation waits answers the waiter") {
  // Its rank leaving ends the wait before the job is removed: no
  // completion is dropped with the job.
  Fixture f("", nullptr, nullptr, "node-a", Fixture::kNodeCpus,
            [](RegistryOptions* o) { o->job_grace = absl::Milliseconds(50); });
  REQUIRE(f.Register(0, 2).ok());
  Result<absl::StatusOr<v1::GroupInfo>> pending;
  f.registry->CreateGroup(f.Group(0, {0, 1}, "g", absl::Seconds(60)), f.caller,
                          pending.callback());  // rank 1 never comes
  f.registry->Leave(f.sessions[0]);             // the job is idle, then removed
  const absl::StatusOr<v1::GroupInfo>& answer = pending.Await();
  INFO(answer.status().ToString());
  CHECK(answer.status().code() == absl::StatusCode::kAborted);
  CHECK(Eventually([&] { return f.registry->ListJobs(f.caller).empty(); }));
}

TEST_CASE("a group its ranks destroy right after their collective timed out is still dumped") {
  // Before: the reaper looks for aborted segments once a second; ranks that
  // exited at once destroyed the group first, and no recorder was written.
  DumpDir dir;
  Fixture f(dir.dumps);
  auto segment = f.PairSegment();
  // What a member's SDK does when its all_reduce times out, then both exit.
  segment->Abort("all_reduce #7 timed out after 100ms");
  for (int rank : {0, 1}) {
    v1::DestroyGroupRequest destroy;
    destroy.mutable_caller()->set_job_id("job");
    destroy.mutable_caller()->set_global_rank(rank);
    destroy.set_name("pair");
    REQUIRE(f.registry->DestroyGroup(destroy, f.caller).ok());
  }
  auto jobs = f.registry->ListJobs(f.caller);
  REQUIRE(jobs.size() == 1);
  REQUIRE(jobs[0].dumps_size() == 1);
  const std::string path = jobs[0].dumps(0);
  REQUIRE(Eventually([&] { return ::access(path.c_str(), F_OK) == 0; }));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("timed out after 100ms") != std::string::npos);
}

TEST_CASE("Trace(gather) asks only the peer addresses their daemon signed with the cluster key") {
  // Two daemons of one job (ranks 0 on a, 1 on b). Gathering sends the
  // cluster credentials to b's address, which b published in the job's
  // store; the job's user can rewrite that record, so an address counts
  // only with b's signature under the key the daemons share.
  std::mutex mu;
  std::vector<std::string> asked;
  auto configure = [&](const std::string& daemon) {
    return [&, daemon](RegistryOptions* o) {
      o->daemon_address = daemon;
      o->peer_address_key = "the cluster token";
      o->peer_trace = [&](const std::string& peer, const std::string& address,
                          const v1::TraceRequest&,
                          absl::Time) -> absl::StatusOr<v1::TraceResponse> {
        std::lock_guard<std::mutex> lock(mu);
        asked.push_back(peer + "@" + address);
        return v1::TraceResponse();
      };
    };
  };
  Fixture a("", nullptr, nullptr, "node-a", Fixture::kNodeCpus, configure("daemon-a"));
  Fixture b("", nullptr, &a, "node-b", Fixture::kNodeCpus, configure("daemon-b"));
  a.registry->SetControlAddress("10.0.0.1:7001");
  b.registry->SetControlAddress("10.0.0.2:7002");
  REQUIRE(a.Register(0, 2).ok());
  REQUIRE(b.Register(1, 2).ok());
  auto form = [&](const std::string& name) {
    Result<absl::StatusOr<v1::GroupInfo>> g0, g1;
    a.registry->CreateGroup(a.Group(0, {0, 1}, name, absl::Seconds(30)), a.caller, g0.callback());
    b.registry->CreateGroup(b.Group(1, {0, 1}, name, absl::Seconds(30)), b.caller, g1.callback());
    REQUIRE(g1.Await().ok());
    return g0.Await();
  };
  auto gather = [&](const std::string& group) {
    v1::TraceRequest req;
    req.set_job_id("job");
    req.set_group(group);
    req.set_gather(true);
    Result<absl::StatusOr<v1::TraceResponse>> r;
    a.registry->TraceGathered(req, a.caller, r.callback());
    return r.Await();
  };
  auto world = form("world");
  REQUIRE(world.ok());
  CHECK(world->members(1).daemon_grpc() == "10.0.0.2:7002");
  REQUIRE(gather("world").ok());
  {
    std::lock_guard<std::mutex> lock(mu);
    CHECK(asked == std::vector<std::string>{"daemon-b@10.0.0.2:7002"});
  }

  // The user points rank 1's record at a listener of its own: unsigned, then
  // with b's signature of b's address.
  LocalStore store(a.store.get());
  auto record = store.Get("muster/job/0/rank/1", absl::Seconds(1));
  REQUIRE(record.ok());
  std::vector<std::string> fields = absl::StrSplit(*record, '\t');
  REQUIRE(fields.size() == 4);
  const std::string proof = fields[3].substr(fields[3].find('#') + 1);
  CHECK(fields[3] == "10.0.0.2:7002#" + proof);
  // The signature binds the daemon's id and its address, under the key.
  CHECK(a.registry->TrustedPeerAddress("daemon-b", fields[3]) == "10.0.0.2:7002");
  CHECK(a.registry->TrustedPeerAddress("daemon-x", fields[3]).empty());
  CHECK(a.registry->TrustedPeerAddress("daemon-b", "10.0.0.2:7002#00").empty());
  CHECK(a.registry->TrustedPeerAddress("daemon-b", "10.0.0.2:7002").empty());
  int round = 0;
  for (const std::string& forged : {std::string("attacker:9999"), "attacker:9999#" + proof}) {
    INFO(forged);
    fields[3] = forged;
    REQUIRE(store.Set("muster/job/0/rank/1", absl::StrJoin(fields, "\t")).ok());
    const std::string name = absl::StrCat("evil", round++);
    auto evil = form(name);
    REQUIRE(evil.ok());
    CHECK(evil->members(1).daemon_grpc().empty());
    auto trace = gather(name);
    REQUIRE(trace.ok());
    REQUIRE(trace->unreachable_size() == 1);
    CHECK(absl::StrContains(trace->unreachable(0), "daemon-b: serves no TCP gRPC"));
    CHECK(absl::StrContains(trace->unreachable(0), "not signed with this daemon's cluster token"));
    std::lock_guard<std::mutex> lock(mu);
    CHECK(asked.size() == 1);  // nobody asked but the signed address, above
  }
}

TEST_CASE("one user's waits for other ranks, and a job's groups, are bounded on a daemon") {
  // Each formation or barrier that waits for ranks elsewhere holds one of
  // the daemon's blocking threads: one user's jobs may hold only so many.
  Fixture f("", nullptr, nullptr, "node-a", Fixture::kNodeCpus, [](RegistryOptions* o) {
    o->max_waits_per_user = 2;
    o->max_groups_per_job = 4;
  });
  REQUIRE(f.Register(0, 2).ok());
  REQUIRE(f.Register(1, 2).ok());
  auto world = f.FormPair("world");
  REQUIRE(world.ok());
  // The formation's thread ends its wait just after it told the ranks.
  auto waits_are = [&](int n) {
    return Eventually([&] { return f.registry->counts().waits == n; });
  };
  REQUIRE(waits_are(0));
  // Rank 1 never comes to these: rank 0's creation starts each wait.
  Result<absl::StatusOr<v1::GroupInfo>> a, b, c;
  f.registry->CreateGroup(f.Group(0, {0, 1}, "a", absl::Milliseconds(300)), f.caller, a.callback());
  f.registry->CreateGroup(f.Group(0, {0, 1}, "b", absl::Seconds(30)), f.caller, b.callback());
  f.registry->CreateGroup(f.Group(0, {0, 1}, "c", absl::Seconds(30)), f.caller, c.callback());
  REQUIRE(c.Await().status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(c.value.status().message() ==
        absl::StrCat("forming group 'c' of job 'job' would be wait 3 for other ranks of uid ",
                     ::getuid(),
                     " on this daemon (at most 2 at once: group formations and barriers)"));
  // A barrier waits too (rank 1 is not in it yet).
  v1::BarrierRequest barrier;
  barrier.mutable_caller()->set_job_id("job");
  barrier.mutable_caller()->set_global_rank(0);
  barrier.set_name("world");
  barrier.set_sequence(1);
  Result<absl::Status> refused;
  f.registry->Barrier(barrier, f.caller, refused.callback());
  CHECK(refused.Await().code() == absl::StatusCode::kResourceExhausted);

  // Once "a" timed out its wait is free again, and the refusals left
  // nothing behind: "c" waits now, and the barrier too once "b" is aborted.
  CHECK(a.Await().status().code() == absl::StatusCode::kDeadlineExceeded);
  REQUIRE(waits_are(1));
  Result<absl::StatusOr<v1::GroupInfo>> c2;
  f.registry->CreateGroup(f.Group(0, {0, 1}, "c", absl::Seconds(30)), f.caller, c2.callback());
  CHECK_FALSE(c2.done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  REQUIRE(f.registry->AbortGroup("job", "b", "make room", Caller::InProcess()).ok());
  CHECK(b.Await().status().code() == absl::StatusCode::kAborted);
  REQUIRE(waits_are(1));
  Result<absl::Status> waits;
  f.registry->Barrier(barrier, f.caller, waits.callback());
  CHECK_FALSE(waits.done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));

  // The job holds world, a, b and c now: a fifth name is refused.
  Result<absl::StatusOr<v1::GroupInfo>> d;
  f.registry->CreateGroup(f.Group(0, {0, 1}, "d", absl::Seconds(30)), f.caller, d.callback());
  REQUIRE(d.Await().status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(d.value.status().message() ==
        "job 'job' holds 4 groups on this daemon (at most 4); destroy those it no longer uses");
  // A destroyed group makes room: "d" passes that check now (and meets the
  // limit of waits, which c2 and the barrier hold).
  v1::DestroyGroupRequest destroy;
  destroy.mutable_caller()->set_job_id("job");
  destroy.mutable_caller()->set_global_rank(0);
  destroy.set_name("a");
  REQUIRE(f.registry->DestroyGroup(destroy, f.caller).ok());
  Result<absl::StatusOr<v1::GroupInfo>> d2;
  f.registry->CreateGroup(f.Group(0, {0, 1}, "d", absl::Seconds(30)), f.caller, d2.callback());
  REQUIRE(d2.Await().status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StartsWith(d2.value.status().message(), "forming group 'd'"));
  // The waits still pending end now, while their results are alive.
  f.registry->Shutdown();
  CHECK_FALSE(c2.Await().ok());
  CHECK_FALSE(waits.Await().ok());
}

// Runs `call` on a thread of its own and waits 10 s for it to return. A call
// that never returns has deadlocked its thread for good, so the test
// process ends at once with the reason (instead of hanging until Bazel's
// timeout).
void ReturnsWithin10s(const std::string& what, std::function<void()> call) {
  auto returned = std::make_shared<absl::Notification>();
  std::thread([call = std::move(call), returned] {
    call();
    returned->Notify();
  }).detach();
  if (!returned->WaitForNotificationWithTimeout(absl::Seconds(10))) {
    std::fprintf(stderr,
                 "FAILED: %s did not return within 10 s: its callback ran under the "
                 "registry's lock and re-entered it\n",
                 what.c_str());
    std::_Exit(1);
  }
}

TEST_CASE("refusals reach their callback outside the registry's lock") {
  // The services' completions ask stopping(), which takes the registry's
  // lock: a callback called under it deadlocked the registry (any local
  // user could freeze musterd with one PendingJoins naming no job).
  Fixture f;
  REQUIRE(f.Register(0, 1).ok());
  Caller stranger = f.caller;
  stranger.uid = 54321;  // not the job's user, not privileged
  struct Case {
    std::string job;
    const Caller* who;
    absl::StatusCode code;
  };
  for (const Case& c : {Case{"nojob", &f.caller, absl::StatusCode::kNotFound},
                        Case{"job", &stranger, absl::StatusCode::kPermissionDenied}}) {
    INFO("job '" << c.job << "', uid " << c.who->uid);
    v1::RankId rank;
    rank.set_job_id(c.job);
    rank.set_global_rank(0);
    std::vector<absl::Status> seen;
    std::mutex seen_mu;
    auto answer = [&](const absl::Status& s) {
      (void)f.registry->stopping();  // what the services' completions do
      std::lock_guard<std::mutex> lock(seen_mu);
      seen.push_back(s);
    };
    v1::PendingJoinsRequest pending;
    *pending.mutable_caller() = rank;
    ReturnsWithin10s("PendingJoins", [&] {
      f.registry->PendingJoins(pending, *c.who, [&](auto r) { answer(r.status()); });
    });
    v1::ReconfigureRequest reconfigure;
    *reconfigure.mutable_caller() = rank;
    reconfigure.set_epoch(1);
    ReturnsWithin10s("Reconfigure", [&] {
      f.registry->Reconfigure(reconfigure, *c.who, [&](auto r) { answer(r.status()); });
    });
    v1::CreateGroupRequest create = f.Group(0, {0}, "g", absl::Seconds(5));
    *create.mutable_caller() = rank;
    ReturnsWithin10s("CreateGroup", [&] {
      f.registry->CreateGroup(create, *c.who, [&](auto r) { answer(r.status()); });
    });
    v1::BarrierRequest barrier;
    *barrier.mutable_caller() = rank;
    barrier.set_name("world");
    barrier.set_sequence(1);
    ReturnsWithin10s("Barrier", [&] {
      f.registry->Barrier(barrier, *c.who, [&](absl::Status s) { answer(s); });
    });
    v1::TraceRequest trace;
    trace.set_job_id(c.job);
    trace.set_gather(true);
    ReturnsWithin10s("TraceGathered", [&] {
      f.registry->TraceGathered(trace, *c.who, [&](auto r) { answer(r.status()); });
    });
    REQUIRE(Eventually([&] {
      std::lock_guard<std::mutex> lock(seen_mu);
      return seen.size() == 5;
    }));
    for (const absl::Status& s : seen) {
      INFO(s.ToString());
      CHECK(s.code() == c.code);
    }
  }
  // The registry still serves.
  CHECK_FALSE(f.registry->stopping());
  CHECK(f.registry->ListRanks("job", f.caller).size() == 1);
}

TEST_CASE("ValidateRegisterRequest and ValidateGroupRanks name what is wrong") {
  RegistryOptions options;
  options.max_world_size = 8;
  v1::RegisterRequest req;
  req.mutable_rank()->set_job_id("job");
  req.mutable_rank()->set_global_rank(1);
  req.set_world_size(2);
  req.set_pid(42);
  req.set_master_store_address("host:29500");
  CHECK(ValidateRegisterRequest(req, options).ok());
  auto bad = [&](auto mutate, const std::string& says) {
    v1::RegisterRequest r = req;
    mutate(r);
    absl::Status s = ValidateRegisterRequest(r, options);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(says) != std::string::npos);
  };
  bad([](v1::RegisterRequest& r) { r.mutable_rank()->set_job_id("a/b"); }, "job id");
  bad([](v1::RegisterRequest& r) { r.set_world_size(0); }, "world size must be >= 1");
  bad([](v1::RegisterRequest& r) { r.set_world_size(9); }, "--max-world-size=8");
  bad([](v1::RegisterRequest& r) { r.mutable_rank()->set_global_rank(2); }, "outside the world");
  bad(
      [](v1::RegisterRequest& r) {
        r.set_local_world_size(2);
        r.set_local_rank(5);
      },
      "local rank 5");
  bad([](v1::RegisterRequest& r) { r.set_pid(0); }, "pid");
  bad([](v1::RegisterRequest& r) { r.set_master_store_address("nohost"); }, "HOST:PORT");

  CHECK(ValidateGroupRanks({0, 2}, 3, "g").ok());
  CHECK(ValidateGroupRanks({}, 3, "g").message().find("at least one") != std::string::npos);
  CHECK(ValidateGroupRanks({0, 3}, 3, "g").message().find("rank 3") != std::string::npos);
  CHECK(ValidateGroupRanks({1, 1}, 3, "g").message().find("twice") != std::string::npos);
}

}  // namespace
}  // namespace muster
