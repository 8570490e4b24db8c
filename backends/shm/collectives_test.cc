// Rank-per-thread tests of ShmCommunicator: every collective at world sizes
// 1-4 with odd sizes and a tiny slot (so large buffers take many rounds),
// every dtype x reduce op through all_reduce, desync, timeout and abort.
#include "backends/shm/collectives.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "backends/shm/shared_memory.h"

namespace muster {
namespace {

std::string UniqueName() {
  static std::atomic<int> n{0};
  return absl::StrCat("/muster-test.", ::getpid(), ".", n++);
}

// Runs `body(comm)` on `world` threads sharing one segment.
void RunRanks(int world, uint64_t slot_bytes, const std::function<void(ShmCommunicator&)>& body) {
  std::string name = UniqueName();
  auto owner = GroupSegment::Create(name, world, slot_bytes);
  REQUIRE(owner.ok());
  std::vector<std::unique_ptr<GroupSegment>> maps;
  std::vector<std::unique_ptr<ShmCommunicator>> comms;
  std::vector<int> globals(world);
  std::iota(globals.begin(), globals.end(), 10);  // global ranks 10, 11, ...
  for (int r = 0; r < world; ++r) {
    auto seg = GroupSegment::Open(name, world);
    REQUIRE(seg.ok());
    comms.push_back(std::make_unique<ShmCommunicator>(seg->get(), r, "g", globals));
    maps.push_back(std::move(*seg));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { body(*comms[r]); });
  for (auto& t : threads) t.join();
  GroupSegment::Unlink(name);
}

absl::Time Soon() { return absl::Now() + absl::Seconds(20); }

// Sizes that exercise one element, partial rounds and many rounds with a
// 4 KiB slot.
const size_t kCounts[] = {0, 1, 7, 1000, 3001};

TEST_CASE("all_reduce, broadcast and reduce at world 1-4 with multi-round buffers") {
  for (int world = 1; world <= 4; ++world) {
    for (size_t count : kCounts) {
      INFO("world " << world << " count " << count);
      std::atomic<int> failures{0};
      RunRanks(world, 4096, [&](ShmCommunicator& c) {
        int r = c.rank();
        std::vector<int32_t> v(count);
        for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(i * 3 + r);
        if (!c.AllReduce(v.data(), count, DType::kInt32, ReduceOp::kSum, 1, Soon()).ok())
          ++failures;
        for (size_t i = 0; i < count; ++i) {
          int32_t want = static_cast<int32_t>(world * i * 3 + world * (world - 1) / 2);
          if (v[i] != want) ++failures;
        }
        std::vector<double> b(count, r == world - 1 ? 2.5 : -1.0);
        if (!c.Broadcast(b.data(), count, DType::kFloat64, world - 1, Soon()).ok()) ++failures;
        for (double x : b) failures += x != 2.5;
        std::vector<int64_t> m(count, r + 1);
        if (!c.Reduce(m.data(), count, DType::kInt64, ReduceOp::kMax, 1, 0, Soon()).ok())
          ++failures;
        for (int64_t x : m) failures += x != (r == 0 ? world : r + 1);
      });
      CHECK(failures == 0);
    }
  }
}

TEST_CASE("all_gather, gather, scatter, reduce_scatter and all_to_all move every element") {
  for (int world = 1; world <= 4; ++world) {
    for (size_t count : kCounts) {
      INFO("world " << world << " count " << count);
      std::atomic<int> failures{0};
      RunRanks(world, 4096, [&](ShmCommunicator& c) {
        int r = c.rank(), n = c.size();
        auto value = [](int rank, size_t i) { return static_cast<float>(rank * 100000 + i); };
        std::vector<float> in(count), all(count * n, -1);
        for (size_t i = 0; i < count; ++i) in[i] = value(r, i);
        failures += !c.AllGather(in.data(), all.data(), count, DType::kFloat32, Soon()).ok();
        for (int j = 0; j < n; ++j) {
          for (size_t i = 0; i < count; ++i) failures += all[j * count + i] != value(j, i);
        }
        std::vector<float> gathered(count * n, -1);
        failures +=
            !c.Gather(in.data(), gathered.data(), count, DType::kFloat32, n - 1, Soon()).ok();
        if (r == n - 1) failures += gathered != all;
        std::vector<float> piece(count, -1);
        failures += !c.Scatter(all.data(), piece.data(), count, DType::kFloat32, 0, Soon()).ok();
        failures += piece != in;  // rank 0 scatters everyone's original input back
        // reduce_scatter: block i of every rank's input summed into rank i.
        std::vector<int32_t> blocks(count * n), mine(count, -1);
        for (int j = 0; j < n; ++j) {
          for (size_t i = 0; i < count; ++i)
            blocks[j * count + i] = static_cast<int32_t>(j * 7 + i + r);
        }
        failures += !c.ReduceScatter(blocks.data(), mine.data(), count, DType::kInt32,
                                     ReduceOp::kSum, 1, Soon())
                         .ok();
        for (size_t i = 0; i < count; ++i) {
          failures += mine[i] != static_cast<int32_t>(n * (r * 7 + i) + n * (n - 1) / 2);
        }
        // all_to_all with uneven splits: rank r sends r+j+count%3 elements to j.
        std::vector<size_t> send(n), recv(n);
        for (int j = 0; j < n; ++j) {
          send[j] = r + j + count % 3;
          recv[j] = j + r + count % 3;
        }
        std::vector<int16_t> out_data;  // unused type guard
        std::vector<uint8_t> src, dst;
        for (int j = 0; j < n; ++j) {
          for (size_t i = 0; i < send[j]; ++i) src.push_back(static_cast<uint8_t>(r * 16 + j + i));
        }
        size_t total = 0;
        for (size_t x : recv) total += x;
        dst.assign(total, 0xEE);
        failures += !c.AllToAll(src.data(), send, dst.data(), recv, DType::kUInt8, Soon()).ok();
        size_t off = 0;
        for (int j = 0; j < n; ++j) {
          for (size_t i = 0; i < recv[j]; ++i)
            failures += dst[off + i] != static_cast<uint8_t>(j * 16 + r + i);
          off += recv[j];
        }
        failures += !c.Barrier(Soon()).ok();
      });
      CHECK(failures == 0);
    }
  }
}

TEST_CASE("every dtype x reduce op goes through all_reduce identically on all ranks") {
  for (int d = 0; d < kNumDTypes; ++d) {
    for (int o = 0; o < kNumReduceOps; ++o) {
      DType dtype = static_cast<DType>(d);
      ReduceOp op = static_cast<ReduceOp>(o);
      bool supported = CheckReduce(dtype, op).ok();
      INFO(DTypeName(dtype) << " " << ReduceOpName(op));
      const int world = 3;
      // 37 elements take the one-round path; 1500 (over half a 4 KiB slot
      // for all but 1-byte types) the reduce-scatter + all-gather path.
      for (const size_t count : {size_t{37}, size_t{1500}}) {
        size_t bytes = count * DTypeSize(dtype);
        std::vector<std::string> inputs(world), outputs(world);
        for (int r = 0; r < world; ++r) {
          inputs[r].resize(bytes);
          for (size_t i = 0; i < bytes; ++i) {
            // Small values, valid for every type (bools 0/1, no float NaNs).
            uint8_t v = static_cast<uint8_t>((i * 7 + r * 3) % 5);
            inputs[r][i] = dtype == DType::kBool ? (v & 1) : v;
          }
          if (DTypeSize(dtype) >= 2 && dtype != DType::kBool) {
            // Keep 16-bit floats finite: clear the top byte of each element.
            for (size_t i = DTypeSize(dtype) - 1; i < bytes; i += DTypeSize(dtype))
              inputs[r][i] = 0;
          }
        }
        std::atomic<int> errors{0};
        RunRanks(world, 4096, [&](ShmCommunicator& c) {
          std::string buf = inputs[c.rank()];
          absl::Status s = c.AllReduce(buf.data(), count, dtype, op, 0.5, Soon());
          if (s.ok() != supported) ++errors;
          if (!supported && s.code() != absl::StatusCode::kInvalidArgument) ++errors;
          outputs[c.rank()] = buf;
        });
        CHECK(errors == 0);
        if (!supported) continue;
        std::string want = inputs[0];
        ReduceInit(want.data(), inputs[0].data(), count, dtype, op, 0.5);
        for (int r = 1; r < world; ++r)
          ReduceInto(want.data(), inputs[r].data(), count, dtype, op, 0.5);
        ReduceFinish(want.data(), count, dtype, op, world);
        for (int r = 0; r < world; ++r) CHECK(outputs[r] == want);
      }
    }
  }
}

// The ways a collective moves data, forced by thresholds: through the
// slots, reading peers' shared allocations in place, or reading peers'
// ordinary buffers with process_vm_readv; kExchange: ordinary buffers over
// the mapped threshold, so the slots after a round that exchanges the
// buffers' addresses and doubles as the slot path's first round.
enum class Path { kSlots, kMapped, kCma, kExchange };
const char* PathName(Path p) {
  return p == Path::kMapped ? "mapped" : p == Path::kCma ? "cma" : "slots";
}

DirectOptions Force(Path p) {
  DirectOptions o;
  o.mapped_min_bytes = p == Path::kMapped || p == Path::kExchange ? 1 : SIZE_MAX;
  o.cma_min_bytes = p == Path::kCma ? 1 : SIZE_MAX;
  o.cma_oversubscribed = true;  // world 3 and 4 on small machines too
  return o;
}

// A rank's buffer of `bytes` starting `skew` bytes into a shared allocation
// or into heap memory (so buffers are not 64-byte aligned when skew > 0).
class Buffer {
 public:
  Buffer(bool shared, size_t bytes, size_t skew) {
    if (shared) {
      auto a = SharedAllocation::Create(bytes + skew);
      if (a.ok()) {
        alloc_ = std::move(*a);
        data_ = alloc_->data() + skew;
      }
    } else {
      heap_.resize(bytes + skew + 1);
      data_ = heap_.data() + skew;
    }
  }
  char* data() { return data_; }
  bool ok() const { return data_ != nullptr; }

 private:
  std::unique_ptr<SharedAllocation> alloc_;
  std::string heap_;
  char* data_ = nullptr;
};

// Small values valid for every dtype (bools 0/1, finite 16-bit floats).
std::string Fill(DType dtype, int rank, size_t count, int salt) {
  size_t es = DTypeSize(dtype), bytes = count * es;
  std::string out(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) {
    uint8_t v = static_cast<uint8_t>((i * 7 + rank * 3 + salt) % 5);
    out[i] = dtype == DType::kBool ? (v & 1) : v;
  }
  if (es >= 2) {
    for (size_t i = es - 1; i < bytes; i += es) out[i] = 0;
  }
  return out;
}

// Records the first few mismatches of rank threads (Catch2 is not
// thread-safe): checked on the test thread.
struct Errors {
  std::mutex mu;
  int count = 0;
  std::string first;
  void Add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (count++ < 5) first += what + "\n";
  }
};

TEST_CASE(
    "every reducing op x dtype x reduce op, broadcast and all_gather at world 1-4 match a "
    "reference over the slots, shared buffers and cross-memory attach") {
  for (Path path : {Path::kSlots, Path::kMapped, Path::kCma, Path::kExchange}) {
    for (int world = 1; world <= 4; ++world) {
      INFO(PathName(path) << " world " << world);
      Errors errors;
      RunRanks(world, 4096, [&](ShmCommunicator& c) {
        c.set_direct_options(Force(path));
        int r = c.rank(), n = c.size();
        bool shared = path == Path::kMapped;
        // Direct paths need a peer to read; at world 1 everything is local.
        std::string want_path = n == 1 ? "slots" : PathName(path);
        int salt = 0;
        for (size_t count : {size_t{1}, size_t{37}, size_t{1500}}) {
          for (int d = 0; d < kNumDTypes; ++d) {
            DType dtype = static_cast<DType>(d);
            size_t es = DTypeSize(dtype), bytes = count * es;
            size_t skew = count == 37 ? es : 0;  // unaligned buffers
            ++salt;
            std::string tag = absl::StrCat("rank ", r, " ", DTypeName(dtype), " count ", count);
            // broadcast from the last rank, all_gather.
            Buffer b(shared, bytes, skew);
            if (!b.ok()) return errors.Add("allocation failed");
            std::string root_data = Fill(dtype, n - 1, count, salt);
            std::string mine = Fill(dtype, r, count, salt);
            std::memcpy(b.data(), r == n - 1 ? root_data.data() : mine.data(), bytes);
            absl::Status s = c.Broadcast(b.data(), count, dtype, n - 1, Soon());
            if (!s.ok() || std::memcmp(b.data(), root_data.data(), bytes) != 0 ||
                c.last_path() != want_path) {
              errors.Add(tag + " broadcast " + s.ToString() + " path " + c.last_path());
            }
            Buffer in(shared, bytes, skew);
            std::string gathered(bytes * n, '\xee');
            std::memcpy(in.data(), mine.data(), bytes);
            s = c.AllGather(in.data(), gathered.data(), count, dtype, Soon());
            std::string want;
            for (int j = 0; j < n; ++j) want += Fill(dtype, j, count, salt);
            if (!s.ok() || gathered != want || c.last_path() != want_path) {
              errors.Add(tag + " all_gather " + s.ToString() + " path " + c.last_path());
            }
            for (int o = 0; o < kNumReduceOps; ++o) {
              ReduceOp op = static_cast<ReduceOp>(o);
              if (!CheckReduce(dtype, op).ok()) continue;
              std::string otag = tag + " " + ReduceOpName(op);
              ++salt;
              // all_reduce, in place; reference in rank order.
              std::vector<std::string> inputs(n);
              for (int j = 0; j < n; ++j) inputs[j] = Fill(dtype, j, count, salt);
              std::string ref = inputs[0];
              ReduceInit(ref.data(), inputs[0].data(), count, dtype, op, 0.5);
              for (int j = 1; j < n; ++j)
                ReduceInto(ref.data(), inputs[j].data(), count, dtype, op, 0.5);
              ReduceFinish(ref.data(), count, dtype, op, n);
              Buffer ar(shared, bytes, skew);
              std::memcpy(ar.data(), inputs[r].data(), bytes);
              s = c.AllReduce(ar.data(), count, dtype, op, 0.5, Soon());
              if (!s.ok() || std::memcmp(ar.data(), ref.data(), bytes) != 0 ||
                  c.last_path() != want_path) {
                errors.Add(otag + " all_reduce " + s.ToString() + " path " + c.last_path());
              }
              // reduce to the last rank (always through the slots).
              std::memcpy(ar.data(), inputs[r].data(), bytes);
              s = c.Reduce(ar.data(), count, dtype, op, 0.5, n - 1, Soon());
              if (!s.ok() ||
                  std::memcmp(ar.data(), (r == n - 1 ? ref : inputs[r]).data(), bytes) != 0) {
                errors.Add(otag + " reduce " + s.ToString());
              }
              // reduce_scatter: block r of every rank's input into rank r.
              std::vector<std::string> blocks(n);
              for (int j = 0; j < n; ++j) blocks[j] = Fill(dtype, j, count * n, salt);
              std::string rs_ref(bytes, '\0');
              ReduceInit(rs_ref.data(), blocks[0].data() + r * bytes, count, dtype, op, 0.5);
              for (int j = 1; j < n; ++j)
                ReduceInto(rs_ref.data(), blocks[j].data() + r * bytes, count, dtype, op, 0.5);
              ReduceFinish(rs_ref.data(), count, dtype, op, n);
              Buffer rs_in(shared, bytes * n, skew);
              std::memcpy(rs_in.data(), blocks[r].data(), bytes * n);
              std::string rs_out(bytes, '\xee');
              s = c.ReduceScatter(rs_in.data(), rs_out.data(), count, dtype, op, 0.5, Soon());
              if (!s.ok() || rs_out != rs_ref || c.last_path() != want_path) {
                errors.Add(otag + " reduce_scatter " + s.ToString() + " path " + c.last_path());
              }
            }
          }
        }
      });
      INFO(errors.first);
      CHECK(errors.count == 0);
    }
  }
}

TEST_CASE("mixed shared and ordinary buffers fall back: CMA when allowed, else the slots") {
  for (bool cma : {false, true}) {
    INFO("cma " << cma);
    Errors errors;
    RunRanks(3, 4096, [&](ShmCommunicator& c) {
      DirectOptions o;
      o.mapped_min_bytes = 1;
      o.cma_min_bytes = cma ? 1 : SIZE_MAX;
      o.cma_oversubscribed = true;
      c.set_direct_options(o);
      int r = c.rank();
      const size_t count = 5000;         // several slot rounds
      Buffer buf(r != 1, count * 8, 8);  // rank 1's buffer is ordinary memory
      auto* v = reinterpret_cast<int64_t*>(buf.data());
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<int64_t>(i * 10 + r);
      absl::Status s = c.AllReduce(v, count, DType::kInt64, ReduceOp::kSum, 1, Soon());
      std::string want_path = cma ? "cma" : "slots";
      if (!s.ok() || c.last_path() != want_path) {
        errors.Add(absl::StrCat("rank ", r, " all_reduce ", s.ToString(), " ", c.last_path()));
      }
      for (size_t i = 0; i < count; ++i) {
        if (v[i] != static_cast<int64_t>(i * 30 + 3)) {
          errors.Add(absl::StrCat("rank ", r, " element ", i, " = ", v[i]));
          break;
        }
      }
      // broadcast needs only the root's buffer shared: in place from rank 0.
      for (size_t i = 0; i < count; ++i) v[i] = r == 0 ? static_cast<int64_t>(i) : -1;
      s = c.Broadcast(v, count, DType::kInt64, 0, Soon());
      if (!s.ok() || std::string(c.last_path()) != "mapped") {
        errors.Add(absl::StrCat("rank ", r, " broadcast ", s.ToString(), " ", c.last_path()));
      }
      for (size_t i = 0; i < count; ++i) {
        if (v[i] != static_cast<int64_t>(i)) {
          errors.Add(absl::StrCat("rank ", r, " broadcast element ", i, " = ", v[i]));
          break;
        }
      }
      // ... and from rank 1 it cannot be mapped.
      s = c.Broadcast(v, count, DType::kInt64, 1, Soon());
      if (!s.ok() || c.last_path() != want_path) {
        errors.Add(
            absl::StrCat("rank ", r, " broadcast from 1 ", s.ToString(), " ", c.last_path()));
      }
    });
    INFO(errors.first);
    CHECK(errors.count == 0);
  }
}

TEST_CASE("in-place reduce_scatter (output = own block of the input) is right on every path") {
  for (Path path : {Path::kSlots, Path::kMapped, Path::kCma}) {
    for (int world = 2; world <= 4; ++world) {
      INFO(PathName(path) << " world " << world);
      Errors errors;
      RunRanks(world, 4096, [&](ShmCommunicator& c) {
        c.set_direct_options(Force(path));
        int r = c.rank(), n = c.size();
        const size_t count = 1500;
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          Buffer in(path == Path::kMapped, count * n * 8, 0);
          if (!in.ok()) return errors.Add("allocation failed");
          auto* v = reinterpret_cast<int64_t*>(in.data());
          auto value = [](int rank, size_t i) { return static_cast<int64_t>(i * 3 + rank * 7); };
          for (size_t i = 0; i < count * n; ++i) v[i] = value(r, i);
          int64_t* out = v + r * count;  // aliases this rank's own block
          absl::Status s = c.ReduceScatter(v, out, count, DType::kInt64, op, 1, Soon());
          if (!s.ok() || c.last_path() != std::string(PathName(path))) {
            errors.Add(absl::StrCat("rank ", r, " ", s.ToString(), " path ", c.last_path()));
          }
          for (size_t i = 0; i < count; ++i) {
            int64_t want = value(0, r * count + i);
            for (int j = 1; j < n; ++j) {
              int64_t x = value(j, r * count + i);
              want = op == ReduceOp::kSum ? want + x : std::max(want, x);
            }
            if (out[i] != want) {
              errors.Add(absl::StrCat("rank ", r, " ", ReduceOpName(op), " element ", i, " = ",
                                      out[i], ", want ", want));
              break;
            }
          }
        }
      });
      INFO(errors.first);
      CHECK(errors.count == 0);
    }
  }
}

TEST_CASE(
    "ranks with different direct-path thresholds fail with FAILED_PRECONDITION, not garbage") {
  std::vector<absl::Status> results(2);
  std::vector<char> usable(2);
  RunRanks(2, 4096, [&](ShmCommunicator& c) {
    if (c.rank() == 0) c.set_direct_options(Force(Path::kCma));
    if (c.rank() == 1) c.set_direct_options(Force(Path::kSlots));
    std::vector<float> v(1000, 1);
    results[c.rank()] = c.AllReduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, 1, Soon());
    usable[c.rank()] = c.Barrier(Soon()).ok();
  });
  CHECK(results[0].code() == absl::StatusCode::kFailedPrecondition);
  CHECK(results[1].code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(results[0].message()) ==
        "all_reduce #1(float32, count 1000, SUM) on group 'g': rank 10 takes the direct path but "
        "rank 11 the slot path (MUSTER_SHM_MAPPED_MIN_BYTES / MUSTER_SHM_CMA_MIN_BYTES differ "
        "between ranks)");
  CHECK(usable[0]);
  CHECK(usable[1]);
}

TEST_CASE("mismatched collectives fail on every rank naming both ranks and signatures") {
  // Catch2 assertions are not thread-safe: ranks record, the test checks.
  std::vector<absl::Status> results(2);
  std::vector<char> usable(2);  // not vector<bool>: ranks write concurrently
  RunRanks(2, 4096, [&](ShmCommunicator& c) {
    std::vector<float> v(16, 1);
    results[c.rank()] = c.rank() == 0
                            ? c.AllReduce(v.data(), 16, DType::kFloat32, ReduceOp::kSum, 1, Soon())
                            : c.Broadcast(v.data(), 16, DType::kFloat32, 0, Soon());
    usable[c.rank()] = c.Barrier(Soon()).ok();  // the group stays usable afterwards
  });
  CHECK(results[0].code() == absl::StatusCode::kFailedPrecondition);
  CHECK(results[1].code() == absl::StatusCode::kFailedPrecondition);
  CHECK(usable[0]);
  CHECK(usable[1]);
  CHECK(std::string(results[0].message()) ==
        "collectives on group 'g' do not match: rank 10 called all_reduce #1(float32, count 16, "
        "SUM) but rank 11 called broadcast #1(float32, count 16, root 0)");
  CHECK(std::string(results[1].message()).find("rank 11 called broadcast #1") != std::string::npos);
}

TEST_CASE("a rank that never joins fails the others with DEADLINE_EXCEEDED naming it") {
  std::vector<absl::Status> results(2), after(2);
  std::vector<absl::Duration> took(2);
  RunRanks(3, 4096, [&](ShmCommunicator& c) {
    if (c.rank() == 2) return;  // never calls
    std::vector<int32_t> v(4, 1);
    absl::Time start = absl::Now();
    results[c.rank()] = c.AllReduce(v.data(), 4, DType::kInt32, ReduceOp::kSum, 1,
                                    absl::Now() + absl::Milliseconds(300));
    took[c.rank()] = absl::Now() - start;
    after[c.rank()] = c.Barrier(Soon());  // the group is aborted now
  });
  int deadline_errors = 0;
  for (int r = 0; r < 2; ++r) {
    INFO(results[r].ToString());
    CHECK((results[r].code() == absl::StatusCode::kDeadlineExceeded ||
           results[r].code() == absl::StatusCode::kAborted));
    CHECK(took[r] < absl::Seconds(5));
    CHECK(after[r].code() == absl::StatusCode::kAborted);
    if (results[r].code() == absl::StatusCode::kDeadlineExceeded) {
      ++deadline_errors;
      CHECK(std::string(results[r].message()) ==
            "all_reduce #1(int32, count 4, SUM) on group 'g' timed out waiting for ranks 12 to "
            "arrive");
    }
  }
  CHECK(deadline_errors >= 1);
}

TEST_CASE("a rank arriving after the others gave up fails too, at once, naming why") {
  // Rank 0 gives up after 300 ms; rank 1 arrives after 800 ms (its own
  // deadline far away). Every rank must fail the collective: none returns
  // OK for one another member failed.
  std::vector<absl::Status> results(2), after(2);
  std::vector<absl::Duration> took(2);
  std::vector<int32_t> got(2, 0);
  RunRanks(2, 4096, [&](ShmCommunicator& c) {
    std::vector<int32_t> v(4, c.rank() + 1);
    absl::Time deadline = absl::Now() + absl::Milliseconds(300);
    if (c.rank() == 1) {
      absl::SleepFor(absl::Milliseconds(800));
      deadline = Soon();
    }
    absl::Time start = absl::Now();
    results[c.rank()] = c.AllReduce(v.data(), 4, DType::kInt32, ReduceOp::kSum, 1, deadline);
    took[c.rank()] = absl::Now() - start;
    got[c.rank()] = v[0];
    after[c.rank()] = c.Barrier(Soon());
  });
  CHECK(results[0].code() == absl::StatusCode::kDeadlineExceeded);
  INFO(results[1].ToString());
  CHECK(results[1].code() == absl::StatusCode::kAborted);
  CHECK(std::string(results[1].message()) ==
        "all_reduce #1(int32, count 4, SUM) on group 'g' aborted: rank 10: all_reduce #1(int32, "
        "count 4, SUM) on group 'g' timed out waiting for ranks 11 to arrive");
  CHECK(took[1] < absl::Milliseconds(200));  // at once, not at its own deadline
  for (int r = 0; r < 2; ++r) CHECK(after[r].code() == absl::StatusCode::kAborted);
}

TEST_CASE("with a timeout racing the last arrival, the ranks agree on the outcome") {
  // Rank 2 arrives at about the moment ranks 0 and 1 give up, many times:
  // either everyone completes the collective or no one does.
  int disagreements = 0, failed_runs = 0;
  for (int run = 0; run < 30; ++run) {
    std::vector<absl::Status> results(3);
    RunRanks(3, 4096, [&](ShmCommunicator& c) {
      std::vector<int32_t> v(4, 1);
      absl::Time deadline = absl::Now() + absl::Milliseconds(20);
      if (c.rank() == 2) {
        absl::SleepFor(absl::Microseconds(19000 + 100 * (run % 20)));
        deadline = Soon();
      }
      results[c.rank()] = c.AllReduce(v.data(), 4, DType::kInt32, ReduceOp::kSum, 1, deadline);
    });
    int ok = 0;
    for (const absl::Status& s : results) ok += s.ok();
    if (ok != 0 && ok != 3) ++disagreements;
    if (ok == 0) ++failed_runs;
  }
  CHECK(disagreements == 0);
  INFO("runs where the collective failed everywhere: " << failed_runs);
}

TEST_CASE("an abort from outside wakes sleeping ranks with the reason") {
  std::string name = UniqueName();
  auto seg = GroupSegment::Create(name, 2, 4096);
  REQUIRE(seg.ok());
  ShmCommunicator c(seg->get(), 0, "g", {0, 1});
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    (*seg)->Abort("rank 1 (host n1, pid 42) failed: its process exited");
  });
  absl::Time start = absl::Now();
  absl::Status s = c.Barrier(Soon());
  aborter.join();
  CHECK(s.code() == absl::StatusCode::kAborted);
  CHECK(std::string(s.message()) ==
        "barrier #1 on group 'g' aborted: rank 1 (host n1, pid 42) failed: its process exited");
  CHECK(absl::Now() - start < absl::Seconds(2));
  GroupSegment::Unlink(name);
}

TEST_CASE("a segment aborted because its daemon goes away fails waiters with UNAVAILABLE") {
  std::string name = UniqueName();
  auto seg = GroupSegment::Create(name, 2, 4096);
  REQUIRE(seg.ok());
  ShmCommunicator c(seg->get(), 0, "g", {0, 1});
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    (*seg)->Abort("musterd (pid 7) is shutting down", AbortKind::kUnavailable);
  });
  absl::Status s = c.Barrier(Soon());
  aborter.join();
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(s.message()) ==
        "barrier #1 on group 'g' aborted: musterd (pid 7) is shutting down");
  GroupSegment::Unlink(name);
}

TEST_CASE("a local abort wakes this process's waiting rank at once and tells no other member") {
  std::string name = UniqueName();
  auto owner = GroupSegment::Create(name, 2, 4096);
  REQUIRE(owner.ok());
  auto mine = GroupSegment::Open(name, 2);
  auto theirs = GroupSegment::Open(name, 2);
  REQUIRE(mine.ok());
  REQUIRE(theirs.ok());
  ShmCommunicator c(mine->get(), 0, "g", {0, 1});
  const absl::Status gone = absl::UnavailableError("musterd (pid 7, unix:/x.sock) is gone");
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(200));  // rank 0 sleeps on the futex by now
    c.Abort(gone);
  });
  std::vector<int32_t> v(4, 1);
  absl::Time start = absl::Now();
  absl::Status s = c.AllReduce(v.data(), 4, DType::kInt32, ReduceOp::kSum, 1, Soon());
  absl::Duration took = absl::Now() - start;
  aborter.join();
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(s.message()) ==
        "all_reduce #1(int32, count 4, SUM) on group 'g': musterd (pid 7, unix:/x.sock) is gone");
  CHECK(took < absl::Milliseconds(200) + absl::Milliseconds(500));
  // Later collectives fail the same way; the other member's view is intact.
  CHECK(c.Barrier(Soon()).code() == absl::StatusCode::kUnavailable);
  CHECK((*mine)->locally_aborted());
  CHECK((*mine)->local_abort_status() == gone);
  CHECK_FALSE((*theirs)->locally_aborted());
  CHECK_FALSE((*theirs)->aborted());
  GroupSegment::Unlink(name);
}

TEST_CASE("a shared allocation too large for the header page is refused, not wrapped around") {
  for (size_t bytes : {SIZE_MAX, SIZE_MAX - SharedAllocation::kHeaderBytes + 1}) {
    auto a = SharedAllocation::Create(bytes);
    INFO(bytes << ": " << (a.ok() ? "ok" : a.status().ToString()));
    REQUIRE_FALSE(a.ok());
    CHECK(a.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(std::string(a.status().message()).find(std::to_string(bytes)) != std::string::npos);
  }
}

TEST_CASE("bad roots and dtype/op pairs are rejected before any data moves") {
  std::string name = UniqueName();
  auto seg = GroupSegment::Create(name, 1, 4096);
  REQUIRE(seg.ok());
  ShmCommunicator c(seg->get(), 0, "g", {0});
  float x = 1;
  CHECK(c.Broadcast(&x, 1, DType::kFloat32, 3, Soon()).message() ==
        "root 3 is outside group 'g' of size 1");
  CHECK(c.AllReduce(&x, 1, DType::kFloat32, ReduceOp::kBxor, 1, Soon()).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(c.sequence() == 0);
  GroupSegment::Unlink(name);
}

TEST_CASE("a segment for another user's ranks belongs to that user, mode 0600") {
  if (::geteuid() != 0) {
    WARN("SKIPPED: giving a segment to another user needs root");
    return;
  }
  std::string name = absl::StrCat("/muster-test-owner-", ::getpid());
  auto seg = GroupSegment::Create(name, 2, 4096, 4096, 65534);
  REQUIRE(seg.ok());
  struct stat st;
  REQUIRE(::stat(("/dev/shm" + name).c_str(), &st) == 0);
  CHECK(st.st_uid == 65534);
  CHECK((st.st_mode & 0777) == 0600);
  GroupSegment::Unlink(name);
}

}  // namespace
}  // namespace muster
