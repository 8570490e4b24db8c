#include "tools/bench_collectives.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "backends/shm/reduce.h"
#include "backends/shm/segment.h"
#include "backends/shm/trace.h"
#include "common/cpus.h"
#include "common/json.h"
#include "muster/shared_buffer.h"
#include "muster/world.h"

namespace muster::bench {
namespace {

using Clock = std::chrono::steady_clock;

enum class Op { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kBarrier };

bool ParseOp(const std::string& name, Op* op) {
  static const std::pair<const char*, Op> kOps[] = {
      {"all_reduce", Op::kAllReduce}, {"broadcast", Op::kBroadcast},
      {"all_gather", Op::kAllGather}, {"reduce_scatter", Op::kReduceScatter},
      {"barrier", Op::kBarrier},
  };
  for (const auto& [n, o] : kOps) {
    if (name == n) {
      *op = o;
      return true;
    }
  }
  return false;
}

// nccl-tests' bus bandwidth factor.
double BusFactor(Op op, int n) {
  switch (op) {
    case Op::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Op::kAllGather:
    case Op::kReduceScatter:
      return static_cast<double>(n - 1) / n;
    case Op::kBroadcast:
      return 1.0;
    case Op::kBarrier:
      return 0;
  }
  return 0;
}

// A page-aligned buffer (large collectives stream through it): heap memory,
// or with --shared a muster::AllocShared buffer (zero-copy collectives).
class Buffer {
 public:
  Buffer(size_t bytes, bool shared) : bytes_(bytes) {
    size_t rounded = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
    if (shared) {
      auto b = AllocShared(rounded);
      if (b.ok()) {
        shared_ = std::move(*b);
        data_ = shared_.as<char>();
      }
    } else {
      data_ = static_cast<char*>(std::aligned_alloc(4096, rounded));
    }
    if (data_ != nullptr) std::memset(data_, 0, rounded);  // fault the pages in now
  }
  ~Buffer() {
    if (!shared_) std::free(data_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data() { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  char* data_ = nullptr;
  size_t bytes_;
  SharedBuffer shared_;
};

// Deterministic inputs: small positive integers, exact in every dtype and
// summed exactly (no overflow for the group sizes a node runs).
int64_t InputValue(int rank, size_t index) {
  return static_cast<int64_t>((index + 3 * rank) % 7) + 1;
}

void StoreValue(DType t, void* p, size_t i, int64_t v) {
  switch (t) {
    case DType::kFloat16:
      static_cast<uint16_t*>(p)[i] = FloatToHalf(static_cast<float>(v));
      return;
    case DType::kBFloat16:
      static_cast<uint16_t*>(p)[i] = FloatToBFloat16(static_cast<float>(v));
      return;
    case DType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      return;
    case DType::kFloat64:
      static_cast<double*>(p)[i] = static_cast<double>(v);
      return;
    case DType::kInt8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      return;
    case DType::kUInt8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      return;
    case DType::kInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      return;
    case DType::kInt64:
      static_cast<int64_t*>(p)[i] = v;
      return;
    default:
      return;
  }
}

double LoadValue(DType t, const void* p, size_t i) {
  switch (t) {
    case DType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DType::kFloat64:
      return static_cast<const double*>(p)[i];
    case DType::kInt8:
      return static_cast<const int8_t*>(p)[i];
    case DType::kUInt8:
      return static_cast<const uint8_t*>(p)[i];
    case DType::kInt32:
      return static_cast<const int32_t*>(p)[i];
    case DType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    default:
      return 0;
  }
}

// `v` as it reads back after a round trip through dtype `t` (integer types
// wrap as the reduction kernels do).
double AsDType(DType t, int64_t v) {
  alignas(16) char scratch[16];
  StoreValue(t, scratch, 0, v);
  return LoadValue(t, scratch, 0);
}

// One op at one size on this rank: buffers, inputs, the call, the check.
class Case {
 public:
  Case(ProcessGroup& group, Op op, int64_t requested_bytes, DType dtype, int root, bool shared)
      : group_(group), op_(op), dtype_(dtype), root_(root), n_(group.size()), rank_(group.rank()) {
    size_t es = DTypeSize(dtype);
    size_t req = static_cast<size_t>(requested_bytes);
    switch (op) {
      case Op::kAllReduce:
      case Op::kBroadcast:
        count_ = std::max<size_t>(1, req / es);
        total_bytes_ = count_ * es;
        in_ = std::make_unique<Buffer>(total_bytes_, shared);
        break;
      case Op::kAllGather:
        count_ = std::max<size_t>(1, req / (es * n_));  // per rank
        total_bytes_ = count_ * es * n_;
        in_ = std::make_unique<Buffer>(count_ * es, shared);
        out_ = std::make_unique<Buffer>(total_bytes_, shared);
        break;
      case Op::kReduceScatter:
        count_ = std::max<size_t>(1, req / (es * n_));  // per rank
        total_bytes_ = count_ * es * n_;
        in_ = std::make_unique<Buffer>(total_bytes_, shared);
        out_ = std::make_unique<Buffer>(count_ * es, shared);
        break;
      case Op::kBarrier:
        count_ = 0;
        total_bytes_ = 0;
        break;
    }
  }

  bool allocated() const {
    return (in_ == nullptr || in_->data() != nullptr) &&
           (out_ == nullptr || out_->data() != nullptr);
  }
  size_t total_bytes() const { return total_bytes_; }

  absl::Status Run() {
    std::shared_ptr<Work> work;
    switch (op_) {
      case Op::kAllReduce:
        work = group_.AllReduce({in_->data(), count_, dtype_}, ReduceOp::kSum);
        break;
      case Op::kBroadcast:
        work = group_.Broadcast({in_->data(), count_, dtype_}, root_);
        break;
      case Op::kAllGather:
        work = group_.AllGatherIntoTensor({out_->data(), count_ * n_, dtype_},
                                          {in_->data(), count_, dtype_});
        break;
      case Op::kReduceScatter:
        work = group_.ReduceScatterTensor({out_->data(), count_, dtype_},
                                          {in_->data(), count_ * n_, dtype_}, ReduceOp::kSum);
        break;
      case Op::kBarrier:
        work = group_.CollectiveBarrier();
        break;
    }
    return work->Wait();
  }

  // One byte of every cache line of this rank's input rewritten (--touch).
  void TouchInputs() {
    if (in_ == nullptr) return;
    char* bytes = in_->data();
    for (size_t b = 0; b < in_->bytes(); b += 64) bytes[b] ^= 1;
  }

  void FillInputs() {
    switch (op_) {
      case Op::kAllReduce:
        for (size_t i = 0; i < count_; ++i)
          StoreValue(dtype_, in_->data(), i, InputValue(rank_, i));
        break;
      case Op::kBroadcast:
        for (size_t i = 0; i < count_; ++i) {
          StoreValue(dtype_, in_->data(), i, rank_ == root_ ? InputValue(rank_, i) : 0);
        }
        break;
      case Op::kAllGather:
        for (size_t i = 0; i < count_; ++i)
          StoreValue(dtype_, in_->data(), i, InputValue(rank_, i));
        std::memset(out_->data(), 0, out_->bytes());
        break;
      case Op::kReduceScatter:
        for (size_t i = 0; i < count_ * n_; ++i) {
          StoreValue(dtype_, in_->data(), i, InputValue(rank_, i));
        }
        std::memset(out_->data(), 0, out_->bytes());
        break;
      case Op::kBarrier:
        break;
    }
  }

  // Number of wrong elements; the first is described in *first.
  int64_t Check(std::string* first) const {
    int64_t wrong = 0;
    auto expect = [&](const void* buf, size_t i, int64_t want) {
      double got = LoadValue(dtype_, buf, i);
      double w = AsDType(dtype_, want);
      if (got != w) {
        if (wrong == 0) {
          *first =
              absl::StrFormat("element %d is %g, expected %g", static_cast<int64_t>(i), got, w);
        }
        ++wrong;
      }
    };
    switch (op_) {
      case Op::kAllReduce:
        for (size_t i = 0; i < count_; ++i) {
          int64_t sum = 0;
          for (int r = 0; r < n_; ++r) sum += InputValue(r, i);
          expect(in_->data(), i, sum);
        }
        break;
      case Op::kBroadcast:
        for (size_t i = 0; i < count_; ++i) expect(in_->data(), i, InputValue(root_, i));
        break;
      case Op::kAllGather:
        for (int r = 0; r < n_; ++r) {
          for (size_t i = 0; i < count_; ++i) {
            expect(out_->data(), r * count_ + i, InputValue(r, i));
          }
        }
        break;
      case Op::kReduceScatter:
        for (size_t i = 0; i < count_; ++i) {
          int64_t sum = 0;
          for (int r = 0; r < n_; ++r) sum += InputValue(r, rank_ * count_ + i);
          expect(out_->data(), i, sum);
        }
        break;
      case Op::kBarrier:
        break;
    }
    return wrong;
  }

 private:
  ProcessGroup& group_;
  Op op_;
  DType dtype_;
  int root_;
  int n_;
  int rank_;
  size_t count_ = 0;  // elements of the tensor argument (per rank for gather/scatter)
  size_t total_bytes_ = 0;
  std::unique_ptr<Buffer> in_, out_;
};

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  size_t i = static_cast<size_t>(q * (sorted.size() - 1) + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

std::string SizeText(int64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return absl::StrCat(bytes >> 20, " MiB");
  if (bytes >= (1 << 10) && bytes % (1 << 10) == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

std::string JsonNumber(double v) {
  JsonWriter w;
  w.Double(v);
  return w.str();
}

// The recorder alone: what recording adds to one collective run at once
// (BeginStarted as it starts, Finished after it, and the one clock read it
// adds; Submit's and the start's clock reads existed before), on a private
// segment. Nanoseconds per collective, the best of 5 passes.
double RecorderNanosPerCollective() {
  std::string name = absl::StrCat("/muster-bench-trace.", ::getpid());
  auto segment = GroupSegment::Create(name, 1, 4096, 4096, -1, GroupSegment::kDefaultTraceRecords);
  GroupSegment::Unlink(name);
  if (!segment.ok()) return -1;
  TraceWriter writer(segment->get(), 0, GroupSegment::kDefaultTraceRecords);
  TraceCall call;
  call.op = TraceOp::kAllReduce;
  call.count = 1024;
  constexpr int kCalls = 1000000;
  double best = 1e18;
  const int64_t now = TraceClockNanos();
  for (int pass = 0; pass < 5; ++pass) {
    Clock::time_point t0 = Clock::now();
    for (int i = 1; i <= kCalls; ++i) {
      uint64_t id = writer.BeginStarted(static_cast<uint64_t>(i), call, now, now);
      writer.Finished(id, 0, TraceClockNanos());
    }
    Clock::time_point t1 = Clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / kCalls);
  }
  return best;
}

// --trace-compare (see bench_collectives.h).
int RunTraceCompare(const CollectivesBenchOptions& o, World& world, const std::vector<Op>& ops,
                    DType dtype) {
  const int n = world.world_group().size();
  const int rank = world.world_group().rank();
  const bool leader = rank == 0;
  std::vector<int> all(n);
  std::iota(all.begin(), all.end(), 0);
  GroupOptions on_options, off_options;
  on_options.name = "bench_trace_on";
  on_options.trace_records = std::getenv("MUSTER_BENCH_TRACE_AA")
                                 ? 0
                                 : static_cast<int64_t>(GroupSegment::kDefaultTraceRecords);
  off_options.name = "bench_trace_off";
  off_options.trace_records = 0;
  auto on = world.NewGroup(all, on_options);
  auto off = world.NewGroup(all, off_options);
  if (!on.ok() || !off.ok()) {
    std::fprintf(stderr, "muster-bench: rank %d: creating the groups: %s\n", rank,
                 (!on.ok() ? on.status() : off.status()).ToString().c_str());
    return 1;
  }
  if (leader) {
    std::printf("muster-bench collectives --trace-compare: world %d, dtype %s, %s\n", n,
                DTypeName(dtype), o.command_line.c_str());
    std::printf(
        "the same op and size on a recording group and a non-recording one, in 10 alternating "
        "blocks;\ntime per iteration: the slowest rank's; delta = on - off\n");
    std::printf("%-15s %10s %7s %11s %11s %11s %12s %12s %12s\n", "op", "bytes", "iters",
                "p50 off us", "p50 on us", "delta ns", "mean off us", "mean on us", "delta ns");
    std::fflush(stdout);
  }
  constexpr int kBlocks = 10;
  for (size_t oi = 0; oi < ops.size(); ++oi) {
    const Op op = ops[oi];
    size_t sizes = op == Op::kBarrier ? 1 : o.bytes.size();
    for (size_t si = 0; si < sizes; ++si) {
      int64_t iters = o.iters.size() == 1 ? o.iters[0] : o.iters[si];
      int64_t per_block = std::max<int64_t>(1, iters / kBlocks);
      Case c_on(**on, op, o.bytes[si], dtype, o.root, o.shared);
      Case c_off(**off, op, o.bytes[si], dtype, o.root, o.shared);
      if (!c_on.allocated() || !c_off.allocated()) return 1;
      c_on.FillInputs();
      c_off.FillInputs();
      int64_t warmup = o.warmup >= 0 ? o.warmup : std::max<int64_t>(2, iters / 10);
      for (int64_t i = 0; i < warmup; ++i) {
        if (!c_on.Run().ok() || !c_off.Run().ok()) return 1;
      }
      std::vector<double> t_on, t_off;
      for (int b = 0; b < kBlocks; ++b) {
        for (int k = 0; k < 2; ++k) {
          bool recording = (b + k) % 2 == 0;  // alternate which goes first
          Case& c = recording ? c_on : c_off;
          std::vector<double>& times = recording ? t_on : t_off;
          for (int64_t i = 0; i < per_block; ++i) {
            Clock::time_point t0 = Clock::now();
            absl::Status s = c.Run();
            Clock::time_point t1 = Clock::now();
            if (!s.ok()) {
              std::fprintf(stderr, "muster-bench: rank %d: %s\n", rank, s.ToString().c_str());
              return 1;
            }
            times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
          }
        }
      }
      for (std::vector<double>* times : {&t_on, &t_off}) {
        if (!world.world_group()
                 .AllReduce({times->data(), times->size(), DType::kFloat64}, ReduceOp::kMax)
                 ->Wait()
                 .ok()) {
          return 1;
        }
      }
      if (!leader) continue;
      auto stats = [](std::vector<double> t, double* mean) {
        *mean = std::accumulate(t.begin(), t.end(), 0.0) / std::max<size_t>(1, t.size());
        std::sort(t.begin(), t.end());
        return Percentile(t, 0.5);
      };
      double mean_on = 0, mean_off = 0;
      double p50_on = stats(t_on, &mean_on), p50_off = stats(t_off, &mean_off);
      const int64_t bytes = static_cast<int64_t>(c_on.total_bytes());
      if (o.json) {
        std::printf(
            "{\"system\":\"muster-trace-compare\",\"op\":%s,\"bytes\":%lld,\"world\":%d,"
            "\"iters\":%d,\"p50_off_us\":%s,\"p50_on_us\":%s,\"mean_off_us\":%s,"
            "\"mean_on_us\":%s}\n",
            JsonQuote(o.ops[oi]).c_str(), static_cast<long long>(bytes), n,
            static_cast<int>(t_on.size()), JsonNumber(p50_off).c_str(), JsonNumber(p50_on).c_str(),
            JsonNumber(mean_off).c_str(), JsonNumber(mean_on).c_str());
      } else {
        std::printf("%-15s %10s %7d %11.2f %11.2f %11.0f %12.2f %12.2f %12.0f\n", o.ops[oi].c_str(),
                    op == Op::kBarrier ? "-" : SizeText(bytes).c_str(),
                    static_cast<int>(t_on.size()), p50_off, p50_on, (p50_on - p50_off) * 1e3,
                    mean_off, mean_on, (mean_on - mean_off) * 1e3);
      }
      std::fflush(stdout);
    }
  }
  if (leader) {
    double ns = RecorderNanosPerCollective();
    if (o.json) {
      std::printf("{\"system\":\"muster-trace-recorder\",\"ns_per_collective\":%s}\n",
                  JsonNumber(ns).c_str());
    } else {
      std::printf(
          "recorder alone (BeginStarted + Finished + one clock read, 10^6 calls, best of 5): "
          "%.1f ns per collective\n",
          ns);
    }
  }
  return 0;
}

}  // namespace

const std::vector<std::string>& AllCollectiveOps() {
  static const auto* ops = new std::vector<std::string>{"all_reduce", "broadcast", "all_gather",
                                                        "reduce_scatter", "barrier"};
  return *ops;
}

int RunCollectivesBench(const CollectivesBenchOptions& o) {
  // Options (identical on every rank: every rank must run the same calls).
  std::vector<Op> ops;
  for (const std::string& name : o.ops) {
    Op op;
    if (!ParseOp(name, &op)) {
      std::fprintf(stderr, "muster-bench: --op: unknown op '%s'\n", name.c_str());
      return 2;
    }
    ops.push_back(op);
  }
  auto dtype = ParseDType(o.dtype.c_str());
  if (!dtype.ok() || *dtype == DType::kBool || *dtype == DType::kComplex64 ||
      *dtype == DType::kComplex128) {
    std::fprintf(stderr,
                 "muster-bench: --dtype: '%s' is not one of float32, float64, float16, bfloat16, "
                 "int8, uint8, int32, int64\n",
                 o.dtype.c_str());
    return 2;
  }
  if (o.iters.size() != 1 && o.iters.size() != o.bytes.size()) {
    std::fprintf(stderr, "muster-bench: --iters: give one count, or one per --bytes size\n");
    return 2;
  }
  if (o.pin != "none" && o.pin != "rank") {
    std::fprintf(stderr, "muster-bench: --pin must be none or rank\n");
    return 2;
  }

  auto options = InitOptionsFromEnv({});
  if (!options.ok()) {
    std::fprintf(stderr,
                 "muster-bench: %s\n(run it under the launcher: muster-run --nproc-per-node N -- "
                 "muster-bench collectives ...)\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  if (o.pin == "rank") {
    // Before Init, so that every thread of this rank inherits it.
    const std::vector<int> cpus = AllowedCpus();
    if (!cpus.empty() && cpus[options->local_rank % cpus.size()] < CPU_SETSIZE) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus[options->local_rank % cpus.size()], &one);
      ::sched_setaffinity(0, sizeof(one), &one);
    }
  }
  auto world = World::Init(*options);
  if (!world.ok()) {
    std::fprintf(stderr, "muster-bench: joining the job: %s\n", world.status().ToString().c_str());
    return 1;
  }
  ProcessGroup& group = (*world)->world_group();
  const int n = group.size();
  const int rank = group.rank();
  if (o.root < 0 || o.root >= n) {
    std::fprintf(stderr, "muster-bench: --root %d is outside the world of %d\n", o.root, n);
    return 2;
  }
  if (o.trace_compare) return RunTraceCompare(o, **world, ops, *dtype);
  const bool leader = rank == 0;
  auto fail = [&](const std::string& what, const absl::Status& s) {
    std::fprintf(stderr, "muster-bench: rank %d: %s: %s\n", rank, what.c_str(),
                 s.ToString().c_str());
    return 1;
  };

  if (leader && !o.json) {
    std::printf("muster-bench collectives: world %d, dtype %s, %s\n", n, DTypeName(*dtype),
                o.command_line.c_str());
    std::printf(
        "time per iteration: the slowest rank's, median (p50) / p99 / min / mean over the timed "
        "iterations; GB/s = 1e9 bytes/s;\ncsw/it: context switches per iteration, voluntary / "
        "involuntary, all ranks' threads together\n");
    std::printf("%-15s %10s %7s %7s %10s %10s %10s %10s %9s %9s %11s %s\n", "op", "bytes", "iters",
                "warmup", "p50 us", "p99 us", "min us", "mean us", "algbw", "busbw", "csw/it",
                "verified");
    std::fflush(stdout);
  }

  int exit_code = 0;
  for (size_t oi = 0; oi < ops.size(); ++oi) {
    const Op op = ops[oi];
    // barrier has no size: it runs once, with the first size's iterations.
    size_t sizes = op == Op::kBarrier ? 1 : o.bytes.size();
    for (size_t si = 0; si < sizes; ++si) {
      int64_t iters = o.iters.size() == 1 ? o.iters[0] : o.iters[si];
      if (op == Op::kBarrier) iters = *std::max_element(o.iters.begin(), o.iters.end());
      int64_t warmup = o.warmup >= 0 ? o.warmup : std::max<int64_t>(2, iters / 10);
      Case c(group, op, o.bytes[si], *dtype, o.root, o.shared);
      if (!c.allocated()) {
        std::fprintf(stderr, "muster-bench: rank %d: cannot allocate %s\n", rank,
                     SizeText(o.bytes[si]).c_str());
        return 1;
      }
      const std::string label =
          absl::StrCat(o.ops[oi], " of ", SizeText(static_cast<int64_t>(c.total_bytes())));

      // Verification: every rank checks its own result; the counts of wrong
      // elements are summed over ranks (one extra all_reduce, not timed).
      int64_t wrong = 0;
      auto verify = [&](const char* when) -> absl::Status {
        c.FillInputs();
        if (absl::Status s = c.Run(); !s.ok()) return s;
        std::string first;
        int64_t mine = c.Check(&first);
        if (mine > 0) {
          std::fprintf(stderr, "muster-bench: rank %d: %s (%s): %d wrong elements; %s\n", rank,
                       label.c_str(), when, static_cast<int>(mine), first.c_str());
        }
        int64_t total = mine;
        if (absl::Status s = group.AllReduce({&total, 1, DType::kInt64}, ReduceOp::kSum)->Wait();
            !s.ok()) {
          return s;
        }
        wrong += total;
        return absl::OkStatus();
      };
      if (o.verify) {
        if (absl::Status s = verify("before the timed loop"); !s.ok()) {
          return fail(label + " (verification)", s);
        }
      }
      c.FillInputs();
      for (int64_t i = 0; i < warmup; ++i) {
        if (absl::Status s = c.Run(); !s.ok()) return fail(label + " (warm-up)", s);
      }
      std::vector<double> times(static_cast<size_t>(iters));
      rusage before, after;
      ::getrusage(RUSAGE_SELF, &before);
      for (int64_t i = 0; i < iters; ++i) {
        if (o.touch) c.TouchInputs();
        Clock::time_point t0 = Clock::now();
        absl::Status s = c.Run();
        Clock::time_point t1 = Clock::now();
        if (!s.ok()) return fail(label, s);
        times[i] = std::chrono::duration<double, std::micro>(t1 - t0).count();
      }
      ::getrusage(RUSAGE_SELF, &after);
      // Context switches of this process's threads (voluntary: it slept,
      // e.g. on a futex; involuntary: preempted), summed over the ranks.
      int64_t switches[2] = {after.ru_nvcsw - before.ru_nvcsw, after.ru_nivcsw - before.ru_nivcsw};
      if (absl::Status s = group.AllReduce({switches, 2, DType::kInt64}, ReduceOp::kSum)->Wait();
          !s.ok()) {
        return fail(label + " (collecting context switches)", s);
      }
      // Per iteration, the slowest rank's time.
      if (absl::Status s =
              group.AllReduce({times.data(), times.size(), DType::kFloat64}, ReduceOp::kMax)
                  ->Wait();
          !s.ok()) {
        return fail(label + " (collecting times)", s);
      }
      if (o.verify) {
        if (absl::Status s = verify("after the timed loop"); !s.ok()) {
          return fail(label + " (verification)", s);
        }
        if (wrong > 0) exit_code = 1;
      }
      if (!leader) continue;

      double mean = 0;
      for (double t : times) mean += t;
      mean /= std::max<size_t>(1, times.size());
      std::vector<double> sorted = times;
      std::sort(sorted.begin(), sorted.end());
      double p50 = Percentile(sorted, 0.5), p99 = Percentile(sorted, 0.99);
      double min = sorted.empty() ? 0 : sorted.front();
      const int64_t bytes = static_cast<int64_t>(c.total_bytes());
      double algbw = op == Op::kBarrier || p50 <= 0 ? 0 : bytes / (p50 * 1e-6) / 1e9;
      double busbw = algbw * BusFactor(op, n);
      if (o.json) {
        std::string verified = o.verify ? (wrong == 0 ? "true" : "false") : "null";
        std::string bw_alg = op == Op::kBarrier ? "null" : JsonNumber(algbw);
        std::string bw_bus = op == Op::kBarrier ? "null" : JsonNumber(busbw);
        std::printf(
            "{\"system\":\"%s\",\"op\":%s,\"bytes\":%lld,\"world\":%d,\"dtype\":%s,"
            "\"iters\":%d,\"warmup\":%d,\"p50_us\":%s,\"p99_us\":%s,\"min_us\":%s,"
            "\"mean_us\":%s,\"algbw_gbps\":%s,\"busbw_gbps\":%s,\"verified\":%s,"
            "\"vol_csw_per_iter\":%s,\"invol_csw_per_iter\":%s}\n",
            o.shared ? "muster-shared" : "muster", JsonQuote(o.ops[oi]).c_str(),
            static_cast<long long>(bytes), n, JsonQuote(DTypeName(*dtype)).c_str(),
            static_cast<int>(iters), static_cast<int>(warmup), JsonNumber(p50).c_str(),
            JsonNumber(p99).c_str(), JsonNumber(min).c_str(), JsonNumber(mean).c_str(),
            bw_alg.c_str(), bw_bus.c_str(), verified.c_str(),
            JsonNumber(static_cast<double>(switches[0]) / iters).c_str(),
            JsonNumber(static_cast<double>(switches[1]) / iters).c_str());
      } else {
        std::string verified =
            o.verify ? (wrong == 0 ? "ok" : absl::StrCat("WRONG (", wrong, ")")) : "-";
        std::string bw_alg = op == Op::kBarrier ? "-" : absl::StrFormat("%.3f", algbw);
        std::string bw_bus = op == Op::kBarrier ? "-" : absl::StrFormat("%.3f", busbw);
        std::printf("%-15s %10s %7d %7d %10.2f %10.2f %10.2f %10.2f %9s %9s %5.2f/%-5.2f %s\n",
                    o.ops[oi].c_str(), op == Op::kBarrier ? "-" : SizeText(bytes).c_str(),
                    static_cast<int>(iters), static_cast<int>(warmup), p50, p99, min, mean,
                    bw_alg.c_str(), bw_bus.c_str(), static_cast<double>(switches[0]) / iters,
                    static_cast<double>(switches[1]) / iters, verified.c_str());
      }
      std::fflush(stdout);
    }
  }
  return exit_code;
}

}  // namespace muster::bench
