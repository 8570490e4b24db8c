// The communicator conformance suite (see communicator_conformance.h).
//
// Inputs are small integers (-2..3; 0..3 unsigned; 0/1 bool) encoded in
// each dtype, so sums, products and averages are exact or rounded once in
// every dtype, and transports that combine contributions in another order
// (rings, per-node stages) must still give the reference's bits. The
// reference is one function, Expected(), over the kernels of
// backends/shm/reduce.h (tested on their own in reduce_test.cc) combining
// contributions in rank order.
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
#include "backends/shm/reduce.h"

namespace muster {
namespace {

enum class Kind {
  kBarrier,
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kGather,
  kScatter,
  kReduceScatter,
  kAllToAll,
};

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kBarrier:
      return "barrier";
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kReduce:
      return "reduce";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kGather:
      return "gather";
    case Kind::kScatter:
      return "scatter";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

bool Reduces(Kind k) {
  return k == Kind::kAllReduce || k == Kind::kReduce || k == Kind::kReduceScatter;
}
bool Rooted(Kind k) {
  return k == Kind::kBroadcast || k == Kind::kReduce || k == Kind::kGather || k == Kind::kScatter;
}

constexpr double kScale = 0.5;  // PREMUL_SUM's factor: exact in every float type
// Elements that cross the shared-memory slot (4 KiB in the transports'
// set-up) several times over.
constexpr size_t kLarge = 3001;

// One collective call, the same on every rank.
struct Case {
  Kind kind;
  DType dtype = DType::kInt32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  int root = 0;
  int salt = 0;  // varies the inputs from case to case

  std::string Describe() const {
    std::string s = absl::StrCat(KindName(kind), "(", DTypeName(dtype), ", count ", count);
    if (Reduces(kind)) absl::StrAppend(&s, ", ", ReduceOpName(op));
    if (Rooted(kind)) absl::StrAppend(&s, ", root ", root);
    return s + ")";
  }
};

// ---------------------------------------------------------------- reference

// Scalar element i of `rank`'s buffer.
int Value(DType dtype, int rank, size_t i, int salt) {
  int v =
      static_cast<int>((i * 7 + static_cast<size_t>(rank) * 3 + static_cast<size_t>(salt) * 5) % 6);
  if (dtype == DType::kBool) return v & 1;
  if (dtype == DType::kUInt8) return v % 4;
  return v - 2;
}

// `count` elements of `dtype` (complex: two scalars each).
std::string Values(DType dtype, size_t count, int rank, int salt) {
  std::string out(count * DTypeSize(dtype), '\0');
  char* p = out.data();
  size_t scalars = dtype == DType::kComplex64 || dtype == DType::kComplex128 ? 2 * count : count;
  for (size_t i = 0; i < scalars; ++i) {
    int v = Value(dtype, rank, i, salt);
    auto put = [&](auto x) { std::memcpy(p + i * sizeof(x), &x, sizeof(x)); };
    switch (dtype) {
      case DType::kFloat16:
        put(FloatToHalf(static_cast<float>(v)));
        break;
      case DType::kBFloat16:
        put(FloatToBFloat16(static_cast<float>(v)));
        break;
      case DType::kFloat32:
      case DType::kComplex64:
        put(static_cast<float>(v));
        break;
      case DType::kFloat64:
      case DType::kComplex128:
        put(static_cast<double>(v));
        break;
      case DType::kInt8:
        put(static_cast<int8_t>(v));
        break;
      case DType::kUInt8:
      case DType::kBool:
        put(static_cast<uint8_t>(v));
        break;
      case DType::kInt32:
        put(static_cast<int32_t>(v));
        break;
      case DType::kInt64:
        put(static_cast<int64_t>(v));
        break;
    }
  }
  return out;
}

// all_to_all: elements rank `from` sends to rank `to` (uneven, some zero).
size_t Split(const Case& c, int from, int to) {
  return (c.count * static_cast<size_t>(from + 1) + static_cast<size_t>(to) * 5) % (c.count + 3);
}

// What `rank` contributes: the buffer it passes (in place: its data).
std::string Input(const Case& c, int world, int rank) {
  size_t n = c.count;
  if (c.kind == Kind::kScatter || c.kind == Kind::kReduceScatter) n = c.count * world;
  if (c.kind == Kind::kAllToAll) {
    n = 0;
    for (int j = 0; j < world; ++j) n += Split(c, rank, j);
  }
  return Values(c.dtype, n, rank, c.salt);
}

// Elements [offset, offset + n) of every rank's input reduced in rank order.
std::string Reduced(const Case& c, int world, size_t offset, size_t n) {
  size_t es = DTypeSize(c.dtype);
  std::string acc(n * es, '\0');
  for (int j = 0; j < world; ++j) {
    std::string in = Input(c, world, j);
    const char* from = in.data() + offset * es;
    if (j == 0) {
      ReduceInit(acc.data(), from, n, c.dtype, c.op, kScale);
    } else {
      ReduceInto(acc.data(), from, n, c.dtype, c.op, kScale);
    }
  }
  ReduceFinish(acc.data(), n, c.dtype, c.op, world);
  return acc;
}

// What `rank`'s output buffer holds after `c` (c10d's semantics), or
// nothing where c10d leaves it unspecified (reduce and gather off the
// root). The output of in-place collectives is their data buffer.
std::optional<std::string> Expected(const Case& c, int world, int rank) {
  switch (c.kind) {
    case Kind::kBarrier:
      return std::string();
    case Kind::kAllReduce:
      return Reduced(c, world, 0, c.count);
    case Kind::kReduce:
      if (rank != c.root) return std::nullopt;
      return Reduced(c, world, 0, c.count);
    case Kind::kReduceScatter:
      return Reduced(c, world, rank * c.count, c.count);
    case Kind::kBroadcast:
      return Input(c, world, c.root);
    case Kind::kGather:
      if (rank != c.root) return std::nullopt;
      [[fallthrough]];
    case Kind::kAllGather: {
      std::string all;
      for (int j = 0; j < world; ++j) all += Input(c, world, j);
      return all;
    }
    case Kind::kScatter: {
      size_t bytes = c.count * DTypeSize(c.dtype);
      return Input(c, world, c.root).substr(rank * bytes, bytes);
    }
    case Kind::kAllToAll: {
      size_t es = DTypeSize(c.dtype);
      std::string out;
      for (int j = 0; j < world; ++j) {
        size_t offset = 0;
        for (int k = 0; k < rank; ++k) offset += Split(c, j, k);
        out += Input(c, world, j).substr(offset * es, Split(c, j, rank) * es);
      }
      return out;
    }
  }
  return std::nullopt;
}

// Runs `c` on `comm` with the reference's inputs; `out` gets the output
// buffer (see Expected).
absl::Status RunCase(Communicator& comm, const Case& c, absl::Time deadline, std::string* out) {
  int world = comm.size(), rank = comm.rank();
  size_t es = DTypeSize(c.dtype);
  std::string in = Input(c, world, rank);
  const std::string kFill(1, '\xee');
  auto sized = [&](size_t elements) { return std::string(elements * es, kFill[0]); };
  switch (c.kind) {
    case Kind::kBarrier:
      out->clear();
      return comm.Barrier(deadline);
    case Kind::kAllReduce:
      *out = in;
      return comm.AllReduce(out->data(), c.count, c.dtype, c.op, kScale, deadline);
    case Kind::kBroadcast:
      *out = rank == c.root ? in : sized(c.count);
      return comm.Broadcast(out->data(), c.count, c.dtype, c.root, deadline);
    case Kind::kReduce:
      *out = in;
      return comm.Reduce(out->data(), c.count, c.dtype, c.op, kScale, c.root, deadline);
    case Kind::kAllGather:
      *out = sized(c.count * world);
      return comm.AllGather(in.data(), out->data(), c.count, c.dtype, deadline);
    case Kind::kGather:
      *out = sized(c.count * world);
      return comm.Gather(in.data(), out->data(), c.count, c.dtype, c.root, deadline);
    case Kind::kScatter:
      *out = sized(c.count);
      if (rank != c.root) in = sized(c.count * world);  // read at the root only
      return comm.Scatter(in.data(), out->data(), c.count, c.dtype, c.root, deadline);
    case Kind::kReduceScatter:
      *out = sized(c.count);
      return comm.ReduceScatter(in.data(), out->data(), c.count, c.dtype, c.op, kScale, deadline);
    case Kind::kAllToAll: {
      std::vector<size_t> send(world), recv(world);
      size_t total = 0;
      for (int j = 0; j < world; ++j) {
        send[j] = Split(c, rank, j);
        recv[j] = Split(c, j, rank);
        total += recv[j];
      }
      *out = sized(total);
      return comm.AllToAll(in.data(), send, out->data(), recv, c.dtype, deadline);
    }
  }
  return absl::InternalError("unknown case");
}

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

// Failures seen on rank threads (Catch2 is not thread-safe), checked on
// the test's thread.
struct Errors {
  std::mutex mu;
  int count = 0;
  std::string first;
  void Add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (count++ < 8) first += what + "\n";
  }
};

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
  ForEachGroup(t, 1, [&](int world, int variant) {
    std::vector<Case> cases = SweepCases(world);
    Errors errors;
    std::atomic<int> checked{0};
    OnGroup(t, world, variant, errors, [&](int r, std::unique_ptr<Communicator>& comm) {
      for (const Case& c : cases) {
        bool valid = !Reduces(c.kind) || CheckReduce(c.dtype, c.op).ok();
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

CONFORMANCE_CASE(BadArguments,
                 "bad roots, counts and splits are INVALID_ARGUMENT on every rank; the group "
                 "stays usable") {
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
      // Rank 0 sends 2 elements to rank 1, which expects 1.
      std::vector<size_t> send(world, 1), recv(world, 1);
      if (r == 0) send[1] = 2;
      want_invalid(c.AllToAll(in.data(), send, out.data(), recv, DType::kInt64, Soon()),
                   "all_to_all with splits that do not match");
      absl::Status after = c.Barrier(Soon());
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
        if (t.traits().timeout_names_ranks && world == 2) {
          CHECK(absl::StrContains(result[r].message(), absl::StrCat("ranks ", 100 + missing)));
        }
      }
    }
    INFO(GroupName(t, world, variant) << ": rank 0 " << result[0] << "; rank " << missing - 1
                                      << " " << result[missing - 1]);
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
