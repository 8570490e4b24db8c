// The communicator conformance suite (see communicator_conformance.h); its
// inputs and the one reference are communicator_testing.h's.
#include "backends/communicator_conformance.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "backends/communicator_testing.h"

namespace muster {
namespace {

using conformance::Case;
using conformance::Errors;
using conformance::Expected;
using conformance::Kind;
using conformance::Reduces;
using conformance::Rooted;
using conformance::RunCase;

// Elements that cross the shared-memory slot (4 KiB in the transports'
// set-up) several times over.
constexpr size_t kLarge = 3001;

// Every collective x dtype x reduce op (invalid pairs included) at small
// counts, each root, empty buffers, and once per collective a buffer over
// the slot size.
std::vector<Case> SweepCases(int world) {
  const Kind kAll[] = {Kind::kBarrier, Kind::kAllReduce,     Kind::kBroadcast,
                       Kind::kReduce,  Kind::kAllGather,     Kind::kGather,
                       Kind::kScatter, Kind::kReduceScatter, Kind::kAllToAll};
  std::vector<Case> cases;
  int salt = 0;
  for (Kind kind : kAll) {
    if (kind == Kind::kBarrier) {
      cases.push_back({kind});
      continue;
    }
    for (int d = 0; d < kNumDTypes; ++d) {
      DType dtype = static_cast<DType>(d);
      for (int o = 0; o < (Reduces(kind) ? kNumReduceOps : 1); ++o) {
        for (size_t count : {size_t{1}, size_t{7}}) {
          ++salt;
          cases.push_back({kind, dtype, static_cast<ReduceOp>(o), count, salt % world, salt});
        }
      }
    }
    for (int root = 0; root < (Rooted(kind) ? world : 1); ++root) {
      cases.push_back({kind, DType::kInt32, ReduceOp::kSum, 3, root, ++salt});
    }
    cases.push_back({kind, DType::kFloat32, ReduceOp::kSum, 0, world - 1, ++salt});
    cases.push_back({kind, DType::kInt32, ReduceOp::kSum, kLarge, world - 1, ++salt});
    if (Reduces(kind)) {
      cases.push_back({kind, DType::kBFloat16, ReduceOp::kAvg, kLarge, 0, ++salt});
    }
  }
  return cases;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

// Runs `body(rank, comm)` on one thread per member of a new group; the
// communicators are destroyed after every thread ended (a body may reset
// its own earlier: a member that dies).
void OnGroup(ConformanceTransport& t, int world, int variant, Errors& errors,
             const std::function<void(int, std::unique_ptr<Communicator>&)>& body) {
  absl::Status started = t.NewGroup(world, variant);
  if (!started.ok()) return errors.Add("NewGroup: " + started.ToString());
  std::vector<std::unique_ptr<Communicator>> comms(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = t.Connect(r);
      if (!comm.ok())
        return errors.Add(absl::StrCat("rank ", r, " connect: ", comm.status().ToString()));
      comms[r] = std::move(*comm);
      body(r, comms[r]);
    });
  }
  for (auto& th : threads) th.join();
}

std::string GroupName(ConformanceTransport& t, int world, int variant) {
  std::string v = t.VariantName(world, variant);
  return absl::StrCat("world ", world, v.empty() ? "" : " (", v, v.empty() ? "" : ")");
}

// Calls `f` for every world size 1-4 (from `min_world`) and variant.
void ForEachGroup(ConformanceTransport& t, int min_world, const std::function<void(int, int)>& f) {
  for (int world = min_world; world <= 4; ++world) {
    for (int v = 0; v < t.variants(world); ++v) f(world, v);
  }
}

// ------------------------------------------------------------------ suite

// Defines suite case `id` (a function of the transport) as a test case
// named `name`, and its "[!mayfail]" twin that runs instead for transports
// listing `id` in Traits::known_bugs.
#define CONFORMANCE_CASE(id, name)                                              \
  void id(ConformanceTransport& t);                                             \
  TEST_CASE(name, "[conformance]") {                                            \
    auto t = MakeConformanceTransport();                                        \
    if (!t->traits().KnownBug(#id)) id(*t);                                     \
  }                                                                             \
  TEST_CASE(name " (known bug of this transport)", "[conformance][!mayfail]") { \
    auto t = MakeConformanceTransport();                                        \
    if (t->traits().KnownBug(#id)) id(*t);                                      \
  }                                                                             \
  void id(ConformanceTransport& t)

CONFORMANCE_CASE(Sweep, "every collective x dtype x reduce op matches the reference at world 1-4") {
  const ConformanceTransport::Traits traits = t.traits();
  ForEachGroup(t, 1, [&](int world, int variant) {
    std::vector<Case> cases = SweepCases(world);
    Errors errors;
    std::atomic<int> checked{0};
    OnGroup(t, world, variant, errors, [&](int r, std::unique_ptr<Communicator>& comm) {
      for (const Case& c : cases) {
        bool valid = c.Valid();
        if (valid && Reduces(c.kind) && traits.check_reduce) {
          valid = traits.check_reduce(c.dtype, c.op).ok();
        }
        std::string out;
        absl::Status s = RunCase(*comm, c, Soon(), &out);
        std::string what = absl::StrCat("rank ", r, " ", c.Describe(), ": ");
        if (!valid) {
          if (s.code() != absl::StatusCode::kInvalidArgument) {
            errors.Add(what + "want INVALID_ARGUMENT, got " + s.ToString());
          }
          continue;
        }
        if (!s.ok()) {
          errors.Add(what + s.ToString());
          continue;
        }
        std::optional<std::string> want = Expected(c, world, r);
        if (want.has_value() && out != *want) {
          errors.Add(what + "wrong result");
        } else {
          ++checked;
        }
      }
    });
    INFO(GroupName(t, world, variant)
         << ": " << cases.size() << " cases per rank, " << checked << " checked\n"
         << errors.first);
    CHECK(errors.count == 0);
  });
}

CONFORMANCE_CASE(
    BadArguments,
    "bad roots and counts are INVALID_ARGUMENT on every rank; the group stays usable") {
  ForEachGroup(t, 2, [&](int world, int variant) {
    Errors errors;
    OnGroup(t, world, variant, errors, [&](int r, std::unique_ptr<Communicator>& comm) {
      Communicator& c = *comm;
      std::vector<int64_t> in(4 * world, 1), out(4 * world, 0);
      auto want_invalid = [&](const absl::Status& s, const std::string& what) {
        if (s.code() != absl::StatusCode::kInvalidArgument) {
          errors.Add(absl::StrCat("rank ", r, " ", what, ": ", s.ToString()));
        }
      };
      for (int root : {-1, world}) {
        std::string at = absl::StrCat(" root ", root);
        want_invalid(c.Broadcast(out.data(), 1, DType::kInt64, root, Soon()), "broadcast" + at);
        want_invalid(c.Reduce(out.data(), 1, DType::kInt64, ReduceOp::kSum, 1, root, Soon()),
                     "reduce" + at);
        want_invalid(c.Gather(in.data(), out.data(), 1, DType::kInt64, root, Soon()),
                     "gather" + at);
        want_invalid(c.Scatter(in.data(), out.data(), 1, DType::kInt64, root, Soon()),
                     "scatter" + at);
      }
      want_invalid(c.AllToAll(in.data(), {1}, out.data(), {1}, DType::kInt64, Soon()),
                   "all_to_all with one count");
      absl::Status after = c.Barrier(Soon());
      if (!after.ok()) errors.Add(absl::StrCat("rank ", r, " barrier after: ", after.ToString()));
    });
    INFO(GroupName(t, world, variant) << "\n" << errors.first);
    CHECK(errors.count == 0);
  });
}

CONFORMANCE_CASE(SplitMismatch,
                 "all_to_all splits that do not match are INVALID_ARGUMENT on every rank; the "
                 "group stays usable") {
  ForEachGroup(t, 2, [&](int world, int variant) {
    Errors errors;
    OnGroup(t, world, variant, errors, [&](int r, std::unique_ptr<Communicator>& comm) {
      std::vector<int64_t> in(2 * world, 1), out(2 * world, 0);
      // Rank 0 sends 2 elements to rank 1, which expects 1.
      std::vector<size_t> send(world, 1), recv(world, 1);
      if (r == 0) send[1] = 2;
      absl::Status s = comm->AllToAll(in.data(), send, out.data(), recv, DType::kInt64, Soon());
      if (!absl::IsInvalidArgument(s)) errors.Add(absl::StrCat("rank ", r, ": ", s.ToString()));
      absl::Status after = comm->Barrier(Soon());
      if (!after.ok()) errors.Add(absl::StrCat("rank ", r, " barrier after: ", after.ToString()));
    });
    INFO(GroupName(t, world, variant) << "\n" << errors.first);
    CHECK(errors.count == 0);
  });
}

CONFORMANCE_CASE(Desync,
                 "ranks calling different collectives all fail FAILED_PRECONDITION naming both "
                 "calls") {
  ForEachGroup(t, 2, [&](int world, int variant) {
    Errors errors;
    OnGroup(t, world, variant, errors, [&](int r, std::unique_ptr<Communicator>& comm) {
      Communicator& c = *comm;
      bool odd = r == world - 1;  // the last rank disagrees
      std::vector<float> v(16, 1), out(16 * world);
      auto want = [&](const absl::Status& s, const std::string& what,
                      const std::vector<std::string>& named) {
        std::string tag = absl::StrCat("rank ", r, " ", what, ": ", s.ToString());
        if (s.code() != absl::StatusCode::kFailedPrecondition) return errors.Add(tag);
        for (const std::string& n : named) {
          if (!absl::StrContains(s.message(), n)) errors.Add(tag + " does not name " + n);
        }
      };
      // The group's first collective, so both are #1.
      want(odd ? c.Broadcast(v.data(), 16, DType::kFloat32, 0, Soon())
               : c.AllReduce(v.data(), 16, DType::kFloat32, ReduceOp::kSum, 1, Soon()),
           "all_reduce vs broadcast",
           {"all_reduce #1(float32, count 16, SUM)", "broadcast #1(float32, count 16, root 0)"});
      want(c.AllReduce(v.data(), odd ? 8 : 16, DType::kFloat32, ReduceOp::kSum, 1, Soon()),
           "counts", {"count 8", "count 16"});
      want(c.AllReduce(v.data(), 4, odd ? DType::kInt32 : DType::kFloat32, ReduceOp::kMax, 1,
                       Soon()),
           "dtypes", {"int32", "float32"});
      want(c.AllReduce(v.data(), 4, DType::kFloat32, odd ? ReduceOp::kMin : ReduceOp::kMax, 1,
                       Soon()),
           "reduce ops", {"MIN", "MAX"});
      want(c.Broadcast(v.data(), 4, DType::kFloat32, odd ? 1 : 0, Soon()), "roots",
           {"root 0", "root 1"});
      want(odd ? c.Barrier(Soon()) : c.AllGather(v.data(), out.data(), 16, DType::kFloat32, Soon()),
           "barrier vs all_gather", {"barrier", "all_gather"});
      absl::Status after = c.AllReduce(v.data(), 16, DType::kFloat32, ReduceOp::kSum, 1, Soon());
      if (!after.ok()) errors.Add(absl::StrCat("rank ", r, " usable after: ", after.ToString()));
    });
    INFO(GroupName(t, world, variant) << "\n" << errors.first);
    CHECK(errors.count == 0);
  });
}

CONFORMANCE_CASE(Timeout, "a member that never joins fails the others with DEADLINE_EXCEEDED") {
  ForEachGroup(t, 2, [&](int world, int variant) {
    const int missing = world - 1;
    std::vector<absl::Status> result(world), after(world);
    std::vector<absl::Duration> took(world);
    Errors errors;
    OnGroup(t, world, variant, errors, [&](int r, std::unique_ptr<Communicator>& comm) {
      if (r == missing) return;  // never calls
      std::vector<int32_t> v(4, 1);
      absl::Time start = absl::Now();
      result[r] = comm->AllReduce(v.data(), 4, DType::kInt32, ReduceOp::kSum, 1,
                                  absl::Now() + absl::Milliseconds(500));
      took[r] = absl::Now() - start;
      after[r] = comm->Barrier(absl::Now() + absl::Milliseconds(500));
    });
    INFO(GroupName(t, world, variant) << "\n" << errors.first);
    CHECK(errors.count == 0);
    int timed_out = 0;
    for (int r = 0; r < missing; ++r) {
      INFO("rank " << r << ": " << result[r] << " after " << took[r] << "; then " << after[r]);
      // A member that learns of the timeout from another (shared memory
      // aborts the segment) fails ABORTED.
      CHECK((absl::IsDeadlineExceeded(result[r]) || absl::IsAborted(result[r])));
      CHECK(took[r] < absl::Seconds(5));
      CHECK_FALSE(after[r].ok());
      if (absl::IsDeadlineExceeded(result[r])) {
        ++timed_out;
        if (t.traits().timeout_names_ranks) {
          CHECK(absl::StrContains(result[r].message(), absl::StrCat("ranks ", 100 + missing)));
        }
      }
    }
    INFO(GroupName(t, world, variant)
         << ": rank 0 " << result[0] << "; rank " << missing - 1 << " " << result[missing - 1]);
    CHECK(timed_out >= 1);
  });
}

// Issue 14 item 5: "a collective that timed out or failed on one member
// fails on every member" -- a member arriving after the others gave up
// must not get OK.
CONFORMANCE_CASE(LateArrival, "a member arriving after the others timed out fails too") {
  ForEachGroup(t, 2, [&](int world, int variant) {
    const int late = world - 1;
    std::vector<absl::Status> result(world);
    Errors errors;
    OnGroup(t, world, variant, errors, [&](int r, std::unique_ptr<Communicator>& comm) {
      std::vector<int32_t> v(4, 1);
      if (r == late) absl::SleepFor(absl::Milliseconds(1500));
      absl::Duration timeout = r == late ? absl::Seconds(3) : absl::Milliseconds(300);
      result[r] =
          comm->AllReduce(v.data(), 4, DType::kInt32, ReduceOp::kSum, 1, absl::Now() + timeout);
    });
    INFO(GroupName(t, world, variant) << "\n" << errors.first);
    CHECK(errors.count == 0);
    for (int r = 0; r < world; ++r) {
      INFO("rank " << r << ": " << result[r]);
      CHECK_FALSE(result[r].ok());
    }
  });
}

CONFORMANCE_CASE(
    Abort, "Abort from another thread fails the rank's wait and later calls with its reason") {
  const absl::Status gone = absl::UnavailableError("musterd (pid 7, unix:/x.sock) is gone");
  ForEachGroup(t, 2, [&](int world, int variant) {
    absl::Status result, again;
    absl::Duration took, again_took;
    Errors errors;
    std::atomic<bool> done{false};
    OnGroup(t, world, variant, errors, [&](int r, std::unique_ptr<Communicator>& comm) {
      std::vector<float> v(100, 1.0f);
      if (r != 0) {
        // The other members stay idle (not in a collective) until rank 0
        // is done: what Abort does to peers is the transport's business.
        while (!done.load()) absl::SleepFor(absl::Milliseconds(10));
        return;
      }
      std::thread aborter([&] {
        absl::SleepFor(absl::Milliseconds(200));
        comm->Abort(gone);
      });
      absl::Time start = absl::Now();
      result = comm->AllReduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, 1,
                               absl::Now() + absl::Seconds(2));
      took = absl::Now() - start;
      aborter.join();
      start = absl::Now();
      again = comm->Barrier(absl::Now() + absl::Seconds(2));
      again_took = absl::Now() - start;
      done = true;
    });
    INFO(GroupName(t, world, variant) << ": " << result << " after " << took << "; then " << again
                                      << " after " << again_took << "\n"
                                      << errors.first);
    CHECK(errors.count == 0);
    CHECK(result.code() == gone.code());
    CHECK(absl::StrContains(result.message(), gone.message()));
    CHECK(took < (t.traits().abort_wakes_own_wait ? absl::Seconds(1) : absl::Seconds(3)));
    CHECK(again.code() == gone.code());
    CHECK(absl::StrContains(again.message(), gone.message()));
    CHECK(again_took < absl::Milliseconds(500));
  });
}

CONFORMANCE_CASE(MemberDeath,
                 "a member that dies fails every other member's collective, for good") {
  ForEachGroup(t, 2, [&](int world, int variant) {
    const int dead = world - 1;
    const std::string reason =
        absl::StrCat("rank ", 100 + dead, " (host n1, pid 42) failed: killed by signal 9");
    std::vector<absl::Status> result(world), after(world);
    std::vector<absl::Duration> took(world);
    Errors errors;
    OnGroup(t, world, variant, errors, [&](int r, std::unique_ptr<Communicator>& comm) {
      std::vector<float> v(1000, 1.0f);
      absl::Status first =
          comm->AllReduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, 1, Soon());
      if (!first.ok()) return errors.Add(absl::StrCat("rank ", r, " first: ", first.ToString()));
      if (r == dead) {
        absl::SleepFor(absl::Milliseconds(200));  // the others wait for it by now
        t.MemberDied(r, reason);
        comm.reset();  // its process is gone: so are its connections
        return;
      }
      absl::Time start = absl::Now();
      result[r] = comm->AllReduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, 1,
                                  absl::Now() + absl::Seconds(10));
      took[r] = absl::Now() - start;
      after[r] = comm->Barrier(absl::Now() + absl::Seconds(5));
    });
    INFO(GroupName(t, world, variant) << "\n" << errors.first);
    CHECK(errors.count == 0);
    for (int r = 0; r < dead; ++r) {
      INFO("rank " << r << ": " << result[r] << " after " << took[r] << "; then " << after[r]);
      CHECK(absl::IsAborted(result[r]));
      CHECK(took[r] < absl::Seconds(5));
      CHECK_FALSE(after[r].ok());
      if (t.traits().death_names_reason) CHECK(absl::StrContains(result[r].message(), reason));
    }
  });
}

}  // namespace
}  // namespace muster
