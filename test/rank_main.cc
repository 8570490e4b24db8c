// muster-test-rank: a scripted rank process for multi-process tests. It
// joins the job from the environment (RANK, WORLD_SIZE, MASTER_ADDR, …) and
// runs the ';'-separated steps of its first argument, printing one line per
// step: "rank R: STEP ok [details]" or "rank R: STEP error CODE: message".
//
// Steps:
//   init                       World::Init (exit 3 if it fails)
//   group NAME R,R,..[,local]  NewGroup with that name (",local": local sync)
//   autogroup R,R,..           NewGroup with an automatic name
//   subgroups K                NewSubgroups(K)
//   enumerate A,B/C,D          NewSubgroupsByEnumeration
//   barrier NAME [TIMEOUT_MS]  Barrier on a group ("world" is the world)
//   destroy NAME               DestroyProcessGroup
//   keepwork NAME              all_reduce on NAME, drop the group (destroying
//                              it), then Wait() and IsCompleted() on the Work
//   droprecvs NAME N           N receives from the next member of NAME (tag
//                              77, never sent), then drop the group
//                              (destroying it): prints cancelled= (Works
//                              failed CANCELLED "... was destroyed") and
//                              destroy_ms= (how long the drop took)
//   backend NAME               register a third-party backend NAME (cpu)
//   groupb NAME R,R,.. BACKEND NewGroup with a backend config
//   store                      set/get through World::store()
//   failures                   print the failures this rank was told about
//   storeloop GROUP N          N rounds of: set wl/<rank>/<i>, get the next
//                              group member's wl/<peer>/<i> (checked), all_reduce
//                              on GROUP (checked); "storeloop GROUP running"
//                              after the first round
//   awaitlost MS N             waits up to MS for N failure reports that say a
//                              node's musterd lease expired; prints them with at_us=
//   storecheck                 set after/<rank>, read wl/0/0 (written earlier)
//   xops GROUP                 every collective + send/recv, checked (one line each)
//   arloop GROUP               all_reduce in a loop until one fails ("arloop GROUP
//                              running" after the first); reports the failure with
//                              iters= and at_us= (wall clock, µs since the epoch)
//   artime GROUP               one all_reduce, reported with at_us=
//   tagorder GROUP             pairs (0,1), (2,3), ...: the even rank sends tags 1
//                              then 2, the odd one receives 2 then 1 (checked)
//   anysrc GROUP               group rank 0 receives one message from every
//                              other member from any source (tag 3); prints
//                              the senders it was told, in arrival order
//   timedwait GROUP MS MODE    all_reduce, Wait(MS) (expected to time out; its
//                              elapsed_ms), then Wait() for the result. MODE:
//                              plain; inline (another thread waits without a
//                              timeout first: it runs the collective itself);
//                              callback (an OnComplete callback is registered
//                              first: the executor runs it at once)
//   mark TEXT                  prints "rank R: mark TEXT"
//   waitfile PATH              waits (up to 60 s) until PATH exists
//   sleep MS | crash | exit CODE
// With MUSTER_TEST_EXIT_ON_ERROR=1 the first failed step exits 1 (a rank
// that does not handle errors).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "backends/backend.h"
#include "muster/shared_buffer.h"
#include "muster/world.h"

namespace {

// A third-party backend, as a user would write one: its collectives go
// through the group's store (each rank publishes its buffer, then reads all
// of them). Only barrier and int32/float32 SUM all_reduce; it counts its
// calls so the tests can see that it, not a built-in, ran.
std::atomic<int> echo_calls{0};

class EchoCommunicator : public muster::Communicator {
 public:
  explicit EchoCommunicator(const muster::BackendOptions& o) : o_(o) {}
  int rank() const override { return o_.group_rank; }
  int size() const override { return o_.group_size; }
  absl::Status Barrier(absl::Time deadline) override {
    int32_t none = 0;
    return AllReduce(&none, 1, muster::DType::kInt32, muster::ReduceOp::kSum, 1.0, deadline);
  }
  absl::Status AllReduce(void* data, size_t count, muster::DType dtype, muster::ReduceOp op, double,
                         absl::Time deadline) override {
    ++echo_calls;
    if (op != muster::ReduceOp::kSum ||
        (dtype != muster::DType::kInt32 && dtype != muster::DType::kFloat32)) {
      return absl::UnimplementedError("echo: SUM of int32/float32 only");
    }
    if (store_ == nullptr) {
      auto store = o_.connect_store();
      if (!store.ok()) return store.status();
      store_ = *store;
    }
    const size_t bytes = count * 4;
    std::string seq = std::to_string(++sequence_);
    absl::Status s = store_->Set(seq + "/" + std::to_string(rank()),
                                 std::string(static_cast<const char*>(data), bytes));
    if (!s.ok()) return s;
    std::vector<std::string> keys;
    for (int r = 0; r < size(); ++r) keys.push_back(seq + "/" + std::to_string(r));
    auto all = store_->MultiGet(keys, std::max(absl::Milliseconds(1), deadline - absl::Now()));
    if (!all.ok()) return all.status();
    for (size_t i = 0; i < count; ++i) {
      if (dtype == muster::DType::kInt32) {
        int32_t sum = 0;
        for (const std::string& v : *all) sum += reinterpret_cast<const int32_t*>(v.data())[i];
        static_cast<int32_t*>(data)[i] = sum;
      } else {
        float sum = 0;
        for (const std::string& v : *all) sum += reinterpret_cast<const float*>(v.data())[i];
        static_cast<float*>(data)[i] = sum;
      }
    }
    return absl::OkStatus();
  }
  absl::Status Broadcast(void*, size_t, muster::DType, int, absl::Time) override {
    return Unsupported();
  }
  absl::Status Reduce(void*, size_t, muster::DType, muster::ReduceOp, double, int,
                      absl::Time) override {
    return Unsupported();
  }
  absl::Status AllGather(const void*, void*, size_t, muster::DType, absl::Time) override {
    return Unsupported();
  }
  absl::Status Gather(const void*, void*, size_t, muster::DType, int, absl::Time) override {
    return Unsupported();
  }
  absl::Status Scatter(const void*, void*, size_t, muster::DType, int, absl::Time) override {
    return Unsupported();
  }
  absl::Status ReduceScatter(const void*, void*, size_t, muster::DType, muster::ReduceOp, double,
                             absl::Time) override {
    return Unsupported();
  }
  absl::Status AllToAll(const void*, const std::vector<size_t>&, void*, const std::vector<size_t>&,
                        muster::DType, absl::Time) override {
    return Unsupported();
  }

 private:
  static absl::Status Unsupported() { return absl::UnimplementedError("echo: not supported"); }
  muster::BackendOptions o_;
  std::shared_ptr<muster::Store> store_;
  uint64_t sequence_ = 0;
};

class EchoBackend : public muster::Backend {
 public:
  EchoBackend(std::string name, muster::BackendOptions o)
      : name_(std::move(name)), o_(o), comm_(o_) {}
  const std::string& name() const override { return name_; }
  const muster::BackendOptions& options() const override { return o_; }
  muster::Communicator* communicator() override { return &comm_; }

 private:
  std::string name_;
  muster::BackendOptions o_;
  EchoCommunicator comm_;
};

std::vector<int> Ranks(const std::string& text, bool* local) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int r;
    if (part == "local") {
      *local = true;
    } else if (absl::SimpleAtoi(part, &r)) {
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string script = argc > 1 ? argv[1] : "init";
  const char* rank_env = std::getenv("RANK");
  std::string me = rank_env ? rank_env : "?";
  std::unique_ptr<muster::World> world;
  std::map<std::string, std::shared_ptr<muster::ProcessGroup>> groups;
  const char* exit_env = std::getenv("MUSTER_TEST_EXIT_ON_ERROR");
  const bool exit_on_error = exit_env != nullptr && std::string(exit_env) == "1";
  auto report = [&](const std::string& step, const absl::Status& s, const std::string& detail) {
    if (s.ok()) {
      std::printf("rank %s: %s ok%s%s\n", me.c_str(), step.c_str(), detail.empty() ? "" : " ",
                  detail.c_str());
    } else {
      std::printf("rank %s: %s error %s: %s%s%s\n", me.c_str(), step.c_str(),
                  absl::StatusCodeToString(s.code()).c_str(), std::string(s.message()).c_str(),
                  detail.empty() ? "" : " ", detail.c_str());
      if (exit_on_error) {
        std::fflush(stdout);
        ::_exit(1);
      }
    }
  };
  auto at_us = [] { return absl::StrCat("at_us=", absl::ToUnixMicros(absl::Now())); };
  auto describe = [](const muster::ProcessGroup& g) {
    return absl::StrCat("name=", g.name(), " rank=", g.rank(), " size=", g.size(),
                        " ranks=", absl::StrJoin(g.ranks(), ","), " backend=", g.backend());
  };
  for (absl::string_view raw : absl::StrSplit(script, ';', absl::SkipWhitespace())) {
    std::vector<std::string> words = absl::StrSplit(raw, ' ', absl::SkipEmpty());
    const std::string& cmd = words[0];
    std::string step(raw);
    absl::Time start = absl::Now();
    if (cmd == "init") {
      muster::InitOptions options;
      if (const char* t = std::getenv("MUSTER_TEST_INIT_TIMEOUT_MS")) {
        int ms = 0;
        if (absl::SimpleAtoi(t, &ms)) options.timeout = absl::Milliseconds(ms);
      }
      auto w = muster::World::Init(options);
      report(step, w.status(), w.ok() ? describe((*w)->world_group()) : "");
      if (!w.ok()) return 3;
      world = std::move(*w);
      groups["world"] = std::shared_ptr<muster::ProcessGroup>(&world->world_group(), [](auto*) {});
    } else if (cmd == "xinit") {
      // xinit RANK WORLD MASTER_PORT SOCKET JOB: explicit options, no env.
      muster::InitOptions options;
      options.rank = std::stoi(words[1]);
      options.world_size = std::stoi(words[2]);
      options.master_addr = "127.0.0.1";
      options.master_port = std::stoi(words[3]);
      options.socket = words[4];
      options.job_id = words[5];
      me = words[1];
      auto w = muster::World::Init(options);
      report(step, w.status(), w.ok() ? describe((*w)->world_group()) : "");
      if (!w.ok()) return 3;
      world = std::move(*w);
      groups["world"] = std::shared_ptr<muster::ProcessGroup>(&world->world_group(), [](auto*) {});
    } else if (cmd == "cinit") {
      // The c10d-style process-wide API.
      absl::Status s = muster::InitProcessGroup();
      std::string detail;
      if (s.ok()) {
        world.reset(muster::DefaultWorld());
        s = muster::InitProcessGroup();
        detail = absl::StrCat("second call: ", s.ToString());
        s = absl::OkStatus();
        groups["world"] =
            std::shared_ptr<muster::ProcessGroup>(&world->world_group(), [](auto*) {});
      }
      report(step, s, detail);
      if (!s.ok()) return 3;
    } else if (cmd == "tagged") {
      muster::GroupOptions o;
      o.name = words[1];
      o.tag = words[2];
      bool unused;
      auto g = world->NewGroup(Ranks(words[3], &unused), o);
      report(step, g.status(), g.ok() ? absl::StrCat(describe(**g), " tag=", (*g)->tag()) : "");
      if (g.ok()) groups[(*g)->name()] = *g;
    } else if (cmd == "lookup") {
      auto it = groups.find(words[1]);
      int global = 0;
      (void)absl::SimpleAtoi(words[2], &global);
      auto gr = it->second->GroupRank(global);
      auto back = gr.ok() ? it->second->GlobalRank(*gr) : gr;
      report(step, back.status(),
             back.ok() ? absl::StrCat("group_rank=", *gr, " global_rank=", *back) : "");
    } else if (cmd == "group" || cmd == "autogroup" || cmd == "groupb") {
      muster::GroupOptions o;
      bool local = false;
      std::vector<int> ranks = Ranks(words[cmd == "autogroup" ? 1 : 2], &local);
      o.local_synchronization = local;
      if (cmd != "autogroup") o.name = words[1];
      if (cmd == "groupb") o.backend = words[3];
      auto g = world->NewGroup(ranks, o);
      report(step, g.status(), g.ok() ? describe(**g) : "");
      if (g.ok()) groups[(*g)->name()] = *g;
    } else if (cmd == "subgroups" || cmd == "enumerate") {
      absl::StatusOr<std::pair<std::shared_ptr<muster::ProcessGroup>,
                               std::vector<std::shared_ptr<muster::ProcessGroup>>>>
          r;
      if (cmd == "subgroups") {
        int k = 0;
        (void)absl::SimpleAtoi(words[1], &k);
        r = world->NewSubgroups(k);
      } else {
        std::vector<std::vector<int>> lists;
        bool unused;
        for (absl::string_view l : absl::StrSplit(words[1], '/')) {
          lists.push_back(Ranks(std::string(l), &unused));
        }
        r = world->NewSubgroupsByEnumeration(lists);
      }
      std::string detail;
      if (r.ok()) {
        detail = absl::StrCat("count=", r->second.size(),
                              " mine: ", r->first ? describe(*r->first) : "none");
        for (auto& g : r->second) groups[g->name()] = g;
      }
      report(step, r.status(), detail);
    } else if (cmd == "barrier") {
      int ms = 0;
      if (words.size() > 2) (void)absl::SimpleAtoi(words[2], &ms);
      auto it = groups.find(words[1]);
      absl::Status s = it == groups.end() ? absl::NotFoundError("no such group in this rank")
                                          : it->second->Barrier(absl::Milliseconds(ms));
      report(step, s, absl::StrCat("elapsed_ms=", absl::ToInt64Milliseconds(absl::Now() - start)));
    } else if (cmd == "keepwork") {
      auto it = groups.find(words[1]);
      if (it == groups.end()) {
        report(step, absl::NotFoundError("no such group"), "");
        continue;
      }
      std::vector<float> data(4, 1.0f);
      std::shared_ptr<muster::Work> work =
          it->second->AllReduce({data.data(), data.size(), muster::DType::kFloat32});
      absl::Status first = work->Wait();
      groups.erase(it);  // the last reference: the ProcessGroup is destroyed
      absl::Status again = work->Wait(absl::Seconds(1));
      report(step, first.ok() ? again : first,
             absl::StrCat("completed=", work->IsCompleted(), " sum=", data[0]));
    } else if (cmd == "droprecvs") {
      auto it = groups.find(words[1]);
      int n = 0;
      if (it == groups.end() || words.size() < 3 || !absl::SimpleAtoi(words[2], &n)) {
        report(step, absl::InvalidArgumentError("usage: droprecvs NAME N"), "");
        continue;
      }
      const int peer = (it->second->rank() + 1) % it->second->size();
      std::vector<std::vector<float>> buffers(n, std::vector<float>(4));
      std::vector<std::shared_ptr<muster::Work>> works;
      for (auto& b : buffers) {
        works.push_back(it->second->IRecv({b.data(), b.size(), muster::DType::kFloat32}, peer, 77));
      }
      absl::Time start = absl::Now();
      groups.erase(it);  // the last reference: the ProcessGroup is destroyed
      const int64_t destroy_ms = absl::ToInt64Milliseconds(absl::Now() - start);
      int cancelled = 0;
      absl::Status other;
      for (auto& w : works) {
        absl::Status s = w->Wait(absl::Seconds(5));
        if (s.code() == absl::StatusCode::kCancelled &&
            absl::StrContains(s.message(), "was destroyed")) {
          ++cancelled;
        } else if (other.ok()) {
          other = s.ok() ? absl::InternalError("a receive completed") : s;
        }
      }
      report(step, other, absl::StrCat("cancelled=", cancelled, " destroy_ms=", destroy_ms));
    } else if (cmd == "destroy") {
      auto it = groups.find(words[1]);
      report(step,
             it == groups.end() ? absl::NotFoundError("no such group")
                                : world->DestroyProcessGroup(*it->second),
             "");
    } else if (cmd == "backend") {
      std::string name = words[1];
      report(step,
             muster::RegisterBackend(name,
                                     [name](const muster::BackendOptions& o)
                                         -> absl::StatusOr<std::unique_ptr<muster::Backend>> {
                                       return std::make_unique<EchoBackend>(name, o);
                                     },
                                     {"cpu"}),
             "");
    } else if (cmd == "store") {
      auto store = world->store();
      absl::Status s = store.status();
      std::string detail;
      if (s.ok()) s = (*store)->Set(absl::StrCat("from/", me), me);
      if (s.ok()) {
        auto v = (*store)->Get("from/0");
        s = v.status();
        if (v.ok()) detail = absl::StrCat("from0=", *v);
      }
      report(step, s, detail);
    } else if (cmd == "allreduce") {
      // allreduce GROUP COUNT: int32 SUM of (rank+1)*(i+1); checks the result.
      auto g = groups.at(words[1]);
      size_t count = std::stoul(words[2]);
      std::vector<int32_t> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>((world->rank() + 1) * (i + 1));
      auto work = g->AllReduce({v.data(), count, muster::DType::kInt32});
      absl::Status st = work->Wait();
      int64_t sum_ranks = 0;
      for (int r : g->ranks()) sum_ranks += r + 1;
      bool right = true;
      for (size_t i = 0; st.ok() && i < count; ++i)
        right &= v[i] == static_cast<int32_t>(sum_ranks * (i + 1));
      if (st.ok() && !right) st = absl::InternalError("wrong all_reduce result");
      report(step, st,
             absl::StrCat("seq=", work->sequence(),
                          " elapsed_ms=", absl::ToInt64Milliseconds(absl::Now() - start)));
    } else if (cmd == "bcast") {
      // bcast GROUP COUNT ROOT (group rank)
      auto g = groups.at(words[1]);
      size_t count = std::stoul(words[2]);
      int root = std::stoi(words[3]);
      std::vector<float> v(count, g->rank() == root ? 3.5f : 0.f);
      absl::Status st = g->Broadcast({v.data(), count, muster::DType::kFloat32}, root)->Wait();
      for (float x : v) {
        if (st.ok() && x != 3.5f) st = absl::InternalError("wrong broadcast result");
      }
      report(step, st, absl::StrCat("elapsed_ms=", absl::ToInt64Milliseconds(absl::Now() - start)));
    } else if (cmd == "gatherobj") {
      // gatherobj GROUP: all_gather of a string of rank+1 letters.
      auto g = groups.at(words[1]);
      std::vector<std::string> all;
      absl::Status st =
          g->AllGatherBytes(std::string(world->rank() + 1, 'a' + world->rank()), &all)->Wait();
      report(step, st, absl::StrJoin(all, ","));
    } else if (cmd == "gatherbytes" || cmd == "scatterbytes") {
      // gatherbytes GROUP ROOT: gather_object of rank+1 letters (rank 1's
      // blob is empty); the root prints them. scatterbytes GROUP ROOT: the
      // root sends group rank i a blob of 2i+1 letters (i == 1: empty).
      auto g = groups.at(words[1]);
      int root = std::stoi(words[2]);
      absl::Status st;
      std::string detail;
      if (cmd == "gatherbytes") {
        std::vector<std::string> all;
        int r = world->rank();
        st = g->GatherBytes(r == 1 ? "" : std::string(r + 1, 'a' + r),
                            g->rank() == root ? &all : nullptr, root)
                 ->Wait();
        detail = absl::StrCat("n=", all.size(), " [", absl::StrJoin(all, ","), "]");
      } else {
        std::vector<std::string> blobs;
        for (int i = 0; g->rank() == root && i < g->size(); ++i) {
          blobs.push_back(i == 1 ? "" : std::string(2 * i + 1, 'A' + i));
        }
        std::string mine = "unset";
        st = g->ScatterBytes(blobs, &mine, root)->Wait();
        detail = absl::StrCat("[", mine, "]");
      }
      report(step, st, detail);
    } else if (cmd == "agcoal") {
      // agcoal GROUP: all_gather_coalesced of an int32[3] = rank+1, a
      // float64[5] = rank/2 and an empty uint8 tensor; checks every output.
      auto g = groups.at(words[1]);
      int n = g->size(), me = g->rank();
      std::vector<int32_t> a(3, me + 1);
      std::vector<double> b(5, me * 0.5);
      std::vector<std::vector<int32_t>> aout(n, std::vector<int32_t>(3, -1));
      std::vector<std::vector<double>> bout(n, std::vector<double>(5, -1));
      std::vector<std::vector<muster::Tensor>> outs(3);
      for (int j = 0; j < n; ++j) {
        outs[0].push_back({aout[j].data(), 3, muster::DType::kInt32});
        outs[1].push_back({bout[j].data(), 5, muster::DType::kFloat64});
        outs[2].push_back({nullptr, 0, muster::DType::kUInt8});
      }
      absl::Status st = g->AllGatherCoalesced(outs, {{a.data(), 3, muster::DType::kInt32},
                                                     {b.data(), 5, muster::DType::kFloat64},
                                                     {nullptr, 0, muster::DType::kUInt8}})
                            ->Wait();
      for (int j = 0; j < n && st.ok(); ++j) {
        for (int32_t x : aout[j]) {
          if (x != j + 1) st = absl::InternalError("wrong all_gather_coalesced int32 result");
        }
        for (double x : bout[j]) {
          if (x != j * 0.5) st = absl::InternalError("wrong all_gather_coalesced float64 result");
        }
      }
      report(step, st, "");
    } else if (cmd == "bigcoll") {
      // bigcoll GROUP COUNT shared|plain: all_reduce (int64 SUM), broadcast
      // from group rank 0, all_gather and reduce_scatter of COUNT elements
      // per rank in AllocShared or ordinary buffers; checks every result and
      // reports how many peers' shared allocations this process mapped.
      auto g = groups.at(words[1]);
      size_t count = std::stoul(words[2]);
      bool shared = words[3] == "shared";
      int n = g->size(), me = g->rank();
      std::vector<muster::SharedBuffer> keep;
      std::vector<std::vector<int64_t>> heap;
      auto buffer = [&](size_t elements) -> int64_t* {
        if (!shared) {
          heap.emplace_back(elements);
          return heap.back().data();
        }
        auto b = muster::AllocShared(elements * sizeof(int64_t));
        if (!b.ok()) return nullptr;
        keep.push_back(std::move(*b));
        return keep.back().as<int64_t>();
      };
      int64_t* ar = buffer(count);
      int64_t* bc = buffer(count);
      int64_t* ag_in = buffer(count);
      int64_t* rs_in = buffer(count * n);
      absl::Status st = ar && bc && ag_in && rs_in ? absl::OkStatus()
                                                   : absl::ResourceExhaustedError("AllocShared");
      std::vector<int64_t> ag_out(count * n), rs_out(count);
      for (size_t i = 0; st.ok() && i < count; ++i) {
        ar[i] = (me + 1) * static_cast<int64_t>(i + 1);
        bc[i] = me == 0 ? static_cast<int64_t>(i) * 3 : -1;
        ag_in[i] = me * 1000000 + static_cast<int64_t>(i);
        for (int j = 0; j < n; ++j) rs_in[j * count + i] = me + j + static_cast<int64_t>(i);
      }
      using muster::DType;
      if (st.ok()) st = g->AllReduce({ar, count, DType::kInt64})->Wait();
      if (st.ok()) st = g->Broadcast({bc, count, DType::kInt64}, 0)->Wait();
      if (st.ok()) {
        st = g->AllGatherIntoTensor({ag_out.data(), count * n, DType::kInt64},
                                    {ag_in, count, DType::kInt64})
                 ->Wait();
      }
      if (st.ok()) {
        st = g->ReduceScatterTensor({rs_out.data(), count, DType::kInt64},
                                    {rs_in, count * n, DType::kInt64})
                 ->Wait();
      }
      for (size_t i = 0; st.ok() && i < count; ++i) {
        int64_t k = static_cast<int64_t>(i);
        bool right = ar[i] == n * (n + 1) / 2 * (k + 1) && bc[i] == 3 * k &&
                     rs_out[i] == n * (me + k) + n * (n - 1) / 2;
        for (int j = 0; j < n; ++j) right &= ag_out[j * count + i] == j * 1000000 + k;
        if (!right) st = absl::InternalError(absl::StrCat("wrong result at element ", i));
      }
      // Peers' allocations show in /proc/self/maps as "/memfd:muster.<pid>".
      std::set<std::string> peers;
      std::ifstream maps("/proc/self/maps");
      std::string line, self = absl::StrCat("memfd:muster.", ::getpid(), " ");
      while (std::getline(maps, line)) {
        size_t at = line.find("memfd:muster.");
        if (at != std::string::npos && (line + " ").find(self) == std::string::npos) {
          peers.insert(line.substr(at, line.find(' ', at) - at));
        }
      }
      report(step, st, absl::StrCat("mapped_peers=", peers.size()));
    } else if (cmd == "a2a") {
      // a2a GROUP: all_to_all_single with splits; receive (i+1) from each i.
      auto g = groups.at(words[1]);
      int n = g->size(), me = g->rank();
      std::vector<size_t> in_splits(n), out_splits(n);
      std::vector<int32_t> in, out;
      for (int j = 0; j < n; ++j) {
        in_splits[j] = me + 1;
        out_splits[j] = j + 1;
        for (int k = 0; k <= me; ++k) in.push_back(me * 100 + j);
      }
      size_t total = 0;
      for (size_t x : out_splits) total += x;
      out.assign(total, -1);
      absl::Status st =
          g->AllToAllSingle({out.data(), total, muster::DType::kInt32},
                            {in.data(), in.size(), muster::DType::kInt32}, out_splits, in_splits)
              ->Wait();
      size_t off = 0;
      for (int j = 0; j < n && st.ok(); ++j) {
        for (size_t k = 0; k < out_splits[j]; ++k) {
          if (out[off + k] != static_cast<int32_t>(j * 100 + me))
            st = absl::InternalError("wrong all_to_all result");
        }
        off += out_splits[j];
      }
      report(step, st, "");
    } else if (cmd == "xops") {
      // xops GROUP: every collective and point to point on GROUP, each
      // checked against a reference computed here; one line per operation,
      // "xops GROUP OP ok". Point to point pairs group rank i with
      // i + size/2 (even sizes).
      auto g = groups.at(words[1]);
      int n = g->size(), me = g->rank();
      auto line = [&](const std::string& op, absl::Status st, bool right) {
        if (st.ok() && !right) st = absl::InternalError("wrong result");
        report(absl::StrCat(step, " ", op), st, "");
      };
      using muster::DType;
      using muster::ReduceOp;
      for (int o = 0; o < muster::kNumReduceOps; ++o) {
        auto op = static_cast<ReduceOp>(o);
        bool floating = op == ReduceOp::kAvg || op == ReduceOp::kPremulSum;
        constexpr size_t kCount = 1003;
        auto value = [](int r, size_t i) { return static_cast<int64_t>((r + 1) * (i % 3 + 1)); };
        std::vector<int64_t> iv(kCount);
        std::vector<double> fv(kCount);
        for (size_t i = 0; i < kCount; ++i) {
          iv[i] = value(me, i);
          fv[i] = value(me, i) + 0.5;
        }
        absl::Status st = floating
                              ? g->AllReduce({fv.data(), kCount, DType::kFloat64}, op, 0.25)->Wait()
                              : g->AllReduce({iv.data(), kCount, DType::kInt64}, op)->Wait();
        bool right = true;
        for (size_t i = 0; i < kCount; ++i) {
          int64_t want = value(0, i);
          double fwant = value(0, i) + 0.5;
          for (int j = 1; j < n; ++j) {
            int64_t x = value(j, i);
            switch (op) {
              case ReduceOp::kSum:
                want += x;
                break;
              case ReduceOp::kProduct:
                want *= x;
                break;
              case ReduceOp::kMin:
                want = std::min(want, x);
                break;
              case ReduceOp::kMax:
                want = std::max(want, x);
                break;
              case ReduceOp::kBand:
                want &= x;
                break;
              case ReduceOp::kBor:
                want |= x;
                break;
              case ReduceOp::kBxor:
                want ^= x;
                break;
              default:
                fwant += x + 0.5;
            }
          }
          if (op == ReduceOp::kAvg) fwant /= n;
          if (op == ReduceOp::kPremulSum) fwant *= 0.25;
          right &= floating ? std::abs(fv[i] - fwant) < 1e-9 : iv[i] == want;
        }
        line(absl::StrCat("all_reduce ", muster::ReduceOpName(op)), st, right);
      }
      {
        int root = n - 1;
        std::vector<int32_t> v(5000, me == root ? 77 : -1);
        absl::Status st = g->Broadcast({v.data(), v.size(), DType::kInt32}, root)->Wait();
        line("broadcast", st, v[0] == 77 && v[4999] == 77);
      }
      {
        int root = 1 % n;
        std::vector<int32_t> v(100, me + 1);
        absl::Status st = g->Reduce({v.data(), v.size(), DType::kInt32}, root)->Wait();
        line("reduce", st, v[99] == (me == root ? n * (n + 1) / 2 : me + 1));
      }
      {
        std::vector<int64_t> in(3, me * 10), out(3 * n, -1);
        absl::Status st = g->AllGatherIntoTensor({out.data(), out.size(), DType::kInt64},
                                                 {in.data(), in.size(), DType::kInt64})
                              ->Wait();
        bool right = true;
        for (int j = 0; j < n; ++j) right &= out[3 * j] == j * 10 && out[3 * j + 2] == j * 10;
        line("all_gather", st, right);
      }
      {
        int root = n - 1;
        int32_t in = me * 3 + 1;
        std::vector<int32_t> outs(n, -1);
        std::vector<muster::Tensor> list;
        for (int j = 0; j < n; ++j) list.push_back({&outs[j], 1, DType::kInt32});
        absl::Status st = g->Gather(list, {&in, 1, DType::kInt32}, root)->Wait();
        bool right = true;
        for (int j = 0; me == root && j < n; ++j) right &= outs[j] == j * 3 + 1;
        line("gather", st, right);
      }
      {
        int root = 0;
        std::vector<float> pieces(2 * n);
        for (int j = 0; j < 2 * n; ++j) pieces[j] = j * 1.5f;
        std::vector<muster::Tensor> list;
        for (int j = 0; j < n; ++j) list.push_back({&pieces[2 * j], 2, DType::kFloat32});
        float got[2] = {-1, -1};
        absl::Status st = g->Scatter({got, 2, DType::kFloat32}, list, root)->Wait();
        line("scatter", st, got[0] == 2 * me * 1.5f && got[1] == (2 * me + 1) * 1.5f);
      }
      {
        std::vector<int32_t> in(2 * n);
        for (int j = 0; j < 2 * n; ++j) in[j] = (me + 1) * (j + 1);
        int32_t out[2] = {-1, -1};
        absl::Status st =
            g->ReduceScatterTensor({out, 2, DType::kInt32}, {in.data(), in.size(), DType::kInt32})
                ->Wait();
        int sum = n * (n + 1) / 2;
        line("reduce_scatter", st, out[0] == sum * (2 * me + 1) && out[1] == sum * (2 * me + 2));
      }
      {
        // all_to_all: rank i sends j+1 elements "i*100+j" to rank j.
        std::vector<std::vector<int32_t>> ins(n), outs(n);
        std::vector<muster::Tensor> in_list, out_list;
        for (int j = 0; j < n; ++j) {
          ins[j].assign(j + 1, me * 100 + j);
          outs[j].assign(me + 1, -1);
        }
        for (int j = 0; j < n; ++j) {
          in_list.push_back({ins[j].data(), ins[j].size(), DType::kInt32});
          out_list.push_back({outs[j].data(), outs[j].size(), DType::kInt32});
        }
        absl::Status st = g->AllToAll(out_list, in_list)->Wait();
        bool right = true;
        for (int j = 0; j < n; ++j) {
          for (int32_t x : outs[j]) right &= x == j * 100 + me;
        }
        line("all_to_all", st, right);
        std::vector<int64_t> in(4 * n), out(4 * n, -1);
        for (int j = 0; j < 4 * n; ++j) in[j] = me * 1000 + j;
        st = g->AllToAllSingle({out.data(), out.size(), DType::kInt64},
                               {in.data(), in.size(), DType::kInt64})
                 ->Wait();
        right = true;
        for (int j = 0; j < n; ++j) {
          for (int k = 0; k < 4; ++k) right &= out[4 * j + k] == j * 1000 + 4 * me + k;
        }
        line("all_to_all_single", st, right);
      }
      line("barrier", g->CollectiveBarrier()->Wait(), true);
      if (n % 2 == 0) {
        int partner = g->ranks()[(me + n / 2) % n];
        // Blocking send/recv of 4 MiB, the lower rank sending first.
        std::vector<uint8_t> out(4 << 20), in(4 << 20, 0);
        for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i + world->rank());
        muster::Tensor tout{out.data(), out.size(), DType::kUInt8};
        muster::Tensor tin{in.data(), in.size(), DType::kUInt8};
        absl::Status st;
        if (world->rank() < partner) {
          st = g->Send(tout, partner, 4);
          if (st.ok()) st = g->Recv(tin, partner, 4);
        } else {
          st = g->Recv(tin, partner, 4);
          if (st.ok()) st = g->Send(tout, partner, 4);
        }
        bool right = true;
        for (size_t i = 0; i < in.size(); ++i) right &= in[i] == static_cast<uint8_t>(i + partner);
        line("send_recv", st, right);
        // Two tags: received in the opposite order (matched by tag).
        int64_t a = world->rank() * 10 + 1, b = world->rank() * 10 + 2, ra = -1, rb = -1;
        auto sa = g->ISend({&a, 1, DType::kInt64}, partner, 1);
        auto sb = g->ISend({&b, 1, DType::kInt64}, partner, 2);
        st = g->Recv({&rb, 1, DType::kInt64}, partner, 2);
        if (st.ok()) st = g->Recv({&ra, 1, DType::kInt64}, partner, 1);
        if (st.ok()) st = sa->Wait();
        if (st.ok()) st = sb->Wait();
        line("isend_irecv_tags", st, ra == partner * 10 + 1 && rb == partner * 10 + 2);
      }
    } else if (cmd == "arlat") {
      // arlat GROUP ITERS BYTES: time per all_reduce (float32 SUM), waited one by one.
      auto g = groups.at(words[1]);
      int iters = std::stoi(words[2]);
      size_t count = std::max<size_t>(1, std::stoul(words[3]) / 4);
      std::vector<float> v(count, 1.0f);
      absl::Status st;
      for (int i = 0; i < 10 && st.ok(); ++i) {
        st = g->AllReduce({v.data(), count, muster::DType::kFloat32})->Wait();
      }
      absl::Time t0 = absl::Now();
      for (int i = 0; i < iters && st.ok(); ++i) {
        st = g->AllReduce({v.data(), count, muster::DType::kFloat32})->Wait();
      }
      double us = absl::ToDoubleMicroseconds(absl::Now() - t0) / iters;
      report(step, st, absl::StrCat("us_per_op=", us));
    } else if (cmd == "ring") {
      // ring GROUP BYTES: every member sends BYTES to the next global member
      // and receives from the previous one (batch_isend_irecv).
      auto g = groups.at(words[1]);
      size_t bytes = std::stoul(words[2]);
      int n = g->size(), me = g->rank();
      int next = g->ranks()[(me + 1) % n], prev = g->ranks()[(me + n - 1) % n];
      std::vector<uint8_t> out(bytes), in(bytes);
      for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(world->rank() + i);
      auto works =
          g->BatchISendIRecv({{true, {out.data(), bytes, muster::DType::kUInt8}, next, 9},
                              {false, {in.data(), bytes, muster::DType::kUInt8}, prev, 9}});
      absl::Status st;
      for (auto& w : works) {
        if (absl::Status s2 = w->Wait(); !s2.ok() && st.ok()) st = s2;
      }
      for (size_t i = 0; st.ok() && i < bytes; ++i) {
        if (in[i] != static_cast<uint8_t>(prev + i)) st = absl::InternalError("wrong p2p data");
      }
      report(step, st, "");
    } else if (cmd == "async") {
      // async GROUP N: submit N all_reduces, never call Wait; poll until the
      // executor completed them all.
      auto g = groups.at(words[1]);
      int n = std::stoi(words[2]);
      std::vector<std::vector<int32_t>> bufs(n, std::vector<int32_t>(16, 1));
      std::vector<std::shared_ptr<muster::Work>> works;
      for (auto& b : bufs)
        works.push_back(g->AllReduce({b.data(), b.size(), muster::DType::kInt32}));
      absl::Time deadline = absl::Now() + absl::Seconds(10);
      absl::Status st;
      for (auto& w : works) {
        while (!w->IsCompleted() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
        st = w->IsCompleted() ? w->status() : absl::DeadlineExceededError("never completed");
        if (!st.ok()) break;
      }
      for (auto& b : bufs) {
        if (st.ok() && b[0] != g->size()) st = absl::InternalError("wrong async result");
      }
      report(step, st, "");
    } else if (cmd == "pending") {
      // pending GROUP: an all_reduce nobody waits for (it stays queued, or
      // stuck, while later steps run).
      auto g = groups.at(words[1]);
      static std::vector<std::vector<int32_t>> buffers;
      static std::vector<std::shared_ptr<muster::Work>> pending;
      buffers.emplace_back(16, 1);
      pending.push_back(g->AllReduce({buffers.back().data(), 16, muster::DType::kInt32}));
      report(step, absl::OkStatus(), "");
    } else if (cmd == "mbarrier") {
      // mbarrier GROUP TIMEOUT_MS
      // (The status first: arguments are evaluated in no particular order.)
      auto g = groups.at(words[1]);
      absl::Status st = g->MonitoredBarrier(absl::Milliseconds(std::stoi(words[2])));
      report(step, st, absl::StrCat("elapsed_ms=", absl::ToInt64Milliseconds(absl::Now() - start)));
    } else if (cmd == "cbarrier") {
      auto g = groups.at(words[1]);
      absl::Status st = g->CollectiveBarrier()->Wait();
      report(step, st, absl::StrCat("elapsed_ms=", absl::ToInt64Milliseconds(absl::Now() - start)));
    } else if (cmd == "arloop" || cmd == "artime") {
      auto g = groups.at(words[1]);
      std::vector<int32_t> v(256, 1);
      absl::Status st;
      int64_t iters = 0;
      do {
        st = g->AllReduce({v.data(), v.size(), muster::DType::kInt32})->Wait();
        if (st.ok() && ++iters == 1 && cmd == "arloop") {
          std::printf("rank %s: arloop %s running\n", me.c_str(), words[1].c_str());
        }
      } while (st.ok() && cmd == "arloop");
      std::string when = at_us();
      report(step, st, absl::StrCat("iters=", iters, " ", when));
    } else if (cmd == "tagorder") {
      auto g = groups.at(words[1]);
      int me = g->rank(), partner_group = me ^ 1;
      absl::Status st;
      if (partner_group >= g->size()) {
        report(step, st, "no partner");
        continue;
      }
      int partner = g->ranks()[partner_group];
      int64_t a = 1000 + world->rank(), b = 2000 + world->rank(), ra = -1, rb = -1;
      if (me % 2 == 0) {
        auto sa = g->ISend({&a, 1, muster::DType::kInt64}, partner, 1);
        auto sb = g->ISend({&b, 1, muster::DType::kInt64}, partner, 2);
        st = sa->Wait();
        if (st.ok()) st = sb->Wait();
      } else {
        st = g->Recv({&rb, 1, muster::DType::kInt64}, partner, 2);
        if (st.ok()) st = g->Recv({&ra, 1, muster::DType::kInt64}, partner, 1);
        if (st.ok() && (ra != 1000 + partner || rb != 2000 + partner)) {
          st = absl::InternalError(absl::StrCat("wrong messages: tag 1 ", ra, ", tag 2 ", rb));
        }
      }
      report(step, st, "");
    } else if (cmd == "anysrc") {
      auto g = groups.at(words[1]);
      absl::Status st;
      std::vector<std::string> senders;
      if (g->rank() == 0) {
        for (int i = 1; i < g->size() && st.ok(); ++i) {
          int64_t v = -1;
          auto w = g->IRecvAnySource({&v, 1, muster::DType::kInt64}, 3);
          st = w->Wait();
          if (st.ok() && v != 100 + w->source_rank()) {
            st = absl::InternalError(absl::StrCat("rank ", w->source_rank(), " sent ", v));
          }
          senders.push_back(std::to_string(w->source_rank()));
        }
      } else {
        int64_t v = 100 + world->rank();
        st = g->Send({&v, 1, muster::DType::kInt64}, g->ranks()[0], 3);
      }
      report(step, st, absl::StrCat("senders=", absl::StrJoin(senders, ",")));
    } else if (cmd == "timedwait") {
      auto g = groups.at(words[1]);
      int ms = std::stoi(words[2]);
      const std::string& mode = words[3];
      std::vector<int32_t> v(8, 1);
      auto work = g->AllReduce({v.data(), v.size(), muster::DType::kInt32});
      std::thread other;
      absl::Notification callback_ran;
      if (mode == "inline") {
        other = std::thread([work] { (void)work->Wait(); });
        absl::SleepFor(absl::Milliseconds(50));  // it is running the collective now
      } else if (mode == "callback") {
        work->OnComplete([&callback_ran](const absl::Status&) { callback_ran.Notify(); });
      }
      absl::Time t0 = absl::Now();
      absl::Status first = work->Wait(absl::Milliseconds(ms));
      int64_t first_ms = absl::ToInt64Milliseconds(absl::Now() - t0);
      absl::Status st = work->Wait();
      if (other.joinable()) other.join();
      if (mode == "callback" && !callback_ran.WaitForNotificationWithTimeout(absl::Seconds(5))) {
        st = absl::InternalError("the callback never ran");
      }
      if (st.ok() && v[0] != g->size()) st = absl::InternalError("wrong all_reduce result");
      report(
          step, st,
          absl::StrCat("first=", absl::StatusCodeToString(first.code()), " first_ms=", first_ms));
    } else if (cmd == "mark") {
      std::printf("rank %s: mark %s\n", me.c_str(), words.size() > 1 ? words[1].c_str() : "");
    } else if (cmd == "waitfile") {
      absl::Time give_up = absl::Now() + absl::Seconds(60);
      while (::access(words[1].c_str(), F_OK) != 0 && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      report(step,
             ::access(words[1].c_str(), F_OK) == 0 ? absl::OkStatus()
                                                   : absl::DeadlineExceededError("no such file"),
             "");
    } else if (cmd == "echocalls") {
      report(step, absl::OkStatus(), absl::StrCat("calls=", echo_calls.load()));
    } else if (cmd == "failures") {
      // The report comes on the session stream, which may lag the reply
      // of a call that failed because of it: give it up to 2 s.
      absl::Time until = absl::Now() + absl::Seconds(2);
      while (world->failures().empty() && absl::Now() < until) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      report(step, absl::OkStatus(), absl::StrJoin(world->failures(), " | "));
    } else if (cmd == "storeloop") {
      auto g = groups.at(words[1]);
      int n = std::stoi(words[2]);
      auto store = world->store();
      absl::Status st = store.status();
      int done = 0;
      int peer = g->ranks()[(g->rank() + 1) % g->size()];
      for (int i = 0; st.ok() && i < n; ++i) {
        st = (*store)->Set(absl::StrCat("wl/", me, "/", i), absl::StrCat(me, ":", i));
        if (st.ok()) {
          auto v = (*store)->Get(absl::StrCat("wl/", peer, "/", i));
          st = v.status();
          if (v.ok() && *v != absl::StrCat(peer, ":", i)) {
            st = absl::InternalError(absl::StrCat("wl/", peer, "/", i, " holds '", *v, "'"));
          }
        }
        std::vector<int32_t> v(256, 1);
        if (st.ok()) st = g->AllReduce({v.data(), v.size(), muster::DType::kInt32})->Wait();
        if (st.ok() && v[0] != g->size()) st = absl::InternalError("wrong all_reduce result");
        if (st.ok() && ++done == 1) {
          std::printf("rank %s: storeloop %s running\n", me.c_str(), words[1].c_str());
          std::fflush(stdout);
        }
      }
      report(step, st, absl::StrCat("iters=", done));
    } else if (cmd == "awaitlost") {
      // The report comes on the session stream; checked every 5 ms.
      absl::Time until = absl::Now() + absl::Milliseconds(std::stoi(words[1]));
      size_t want = words.size() > 2 ? std::stoul(words[2]) : 1, found = 0;
      while (absl::Now() < until) {
        found = 0;
        for (const std::string& f : world->failures()) {
          found += f.find("lease expired") != std::string::npos;
        }
        if (found >= want) break;
        absl::SleepFor(absl::Milliseconds(5));
      }
      std::string when = at_us();
      report(step,
             found < want
                 ? absl::DeadlineExceededError(absl::StrCat(
                       found, " of ", want,
                       " lost-node reports; failures: ", absl::StrJoin(world->failures(), " | ")))
                 : absl::OkStatus(),
             absl::StrCat(when, " failures=", absl::StrJoin(world->failures(), " | ")));
    } else if (cmd == "storecheck") {
      auto store = world->store();
      absl::Status st = store.status();
      std::string detail;
      if (st.ok()) st = (*store)->Set(absl::StrCat("after/", me), "1");
      if (st.ok()) {
        auto v = (*store)->Get("wl/0/0", absl::Seconds(5));
        st = v.status();
        if (v.ok()) detail = absl::StrCat("wl/0/0=", *v);
      }
      report(step, st, detail);
    } else if (cmd == "sleep") {
      int ms = 0;
      (void)absl::SimpleAtoi(words[1], &ms);
      absl::SleepFor(absl::Milliseconds(ms));
    } else if (cmd == "crash") {
      std::fflush(stdout);
      ::kill(::getpid(), SIGKILL);
    } else if (cmd == "exit") {
      int code = 0;
      (void)absl::SimpleAtoi(words[1], &code);
      std::fflush(stdout);
      ::_exit(code);
    } else {
      std::printf("rank %s: unknown step '%s'\n", me.c_str(), step.c_str());
      return 2;
    }
  }
  return 0;
}
