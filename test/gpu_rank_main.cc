// muster-gpu-rank: a scripted rank that runs muster's GPU collectives on
// CUDA buffers and checks every result against a reference computed on the
// host. It runs like any rank (under muster-run or the test harness: RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, MUSTER_SOCKET, …),
// selects GPU LOCAL_RANK % device_count and joins the job with the backend
// "cpu:gloo,cuda:nccl". One line per step on stdout:
//
//   rank R: STEP PASS [detail]
//   rank R: STEP FAIL: what went wrong
//   rank R: STEP SKIP: why (e.g. send/recv between two ranks at world 1)
//
// and a last line "rank R: SUMMARY passed=P failed=F skipped=S". Exit status:
// 0 when no step failed, 1 otherwise, 2 for bad usage or no usable GPU,
// 3 when joining the job failed.
//
// Modes (first argument, default "all"):
//   all    every collective (several dtypes and reduce ops, in-place and
//          out-of-place, list and contiguous forms), send/recv, subgroups
//          (split from the world communicator), a user stream, the legacy
//          default stream, Work::Synchronize, and the error cases.
//   abort  forms group "victim", runs one all_reduce, prints "victim_ready",
//          then keeps running all_reduce on it until one fails (someone
//          aborts the group from outside: musterctl abort JOB victim); the
//          failure must be ABORTED and mention MUSTER_GPU_EXPECT (if set).
//          Then a new group "fresh" must work.
//   kill   (world >= 2) like abort, but the last rank kills itself
//          (SIGKILL) after "victim_ready"; the others' next GPU collectives
//          must fail ABORTED naming it.
//
// Single-threaded (one World, one stream at a time).
#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/shm/reduce.h"
#include "common/status_macros.h"
#include "muster/world.h"

namespace muster {
namespace {

constexpr absl::Duration kStepTimeout = absl::Seconds(120);

absl::Status Cuda(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

// Device memory from cudaMalloc, freed with the object. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  DeviceBuffer(const DeviceBuffer&) = delete;

  static absl::StatusOr<DeviceBuffer> Alloc(size_t bytes) {
    DeviceBuffer b;
    RETURN_IF_ERROR(
        Cuda(cudaMalloc(&b.ptr_, std::max<size_t>(bytes, 1)), absl::StrCat("cudaMalloc ", bytes)));
    b.bytes_ = bytes;
    return b;
  }
  char* data() const { return static_cast<char*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Host values as doubles, encoded to / decoded from a dtype's bytes.
std::string Encode(DType dtype, const std::vector<double>& v) {
  std::string out(v.size() * DTypeSize(dtype), '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    char* p = out.data() + i * DTypeSize(dtype);
    switch (dtype) {
      case DType::kFloat16: {
        uint16_t h = FloatToHalf(static_cast<float>(v[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kBFloat16: {
        uint16_t h = FloatToBFloat16(static_cast<float>(v[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kFloat32: {
        float f = static_cast<float>(v[i]);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::kFloat64:
        std::memcpy(p, &v[i], 8);
        break;
      case DType::kInt32: {
        int32_t x = static_cast<int32_t>(std::llround(v[i]));
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::kInt64: {
        int64_t x = std::llround(v[i]);
        std::memcpy(p, &x, 8);
        break;
      }
      case DType::kUInt8: {
        uint8_t x = static_cast<uint8_t>(std::llround(v[i]));
        std::memcpy(p, &x, 1);
        break;
      }
      default:
        break;  // not used by the steps
    }
  }
  return out;
}

std::vector<double> Decode(DType dtype, const std::string& bytes) {
  const size_t es = DTypeSize(dtype);
  std::vector<double> v(bytes.size() / es);
  for (size_t i = 0; i < v.size(); ++i) {
    const char* p = bytes.data() + i * es;
    switch (dtype) {
      case DType::kFloat16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        v[i] = HalfToFloat(h);
        break;
      }
      case DType::kBFloat16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        v[i] = BFloat16ToFloat(h);
        break;
      }
      case DType::kFloat32: {
        float f;
        std::memcpy(&f, p, 4);
        v[i] = f;
        break;
      }
      case DType::kFloat64:
        std::memcpy(&v[i], p, 8);
        break;
      case DType::kInt32: {
        int32_t x;
        std::memcpy(&x, p, 4);
        v[i] = x;
        break;
      }
      case DType::kInt64: {
        int64_t x;
        std::memcpy(&x, p, 8);
        v[i] = static_cast<double>(x);
        break;
      }
      case DType::kUInt8: {
        uint8_t x;
        std::memcpy(&x, p, 1);
        v[i] = x;
        break;
      }
      default:
        break;
    }
  }
  return v;
}

// Relative tolerance of a dtype (integers are exact).
double Tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 4e-3;
    case DType::kBFloat16:
      return 2e-2;
    case DType::kFloat32:
      return 1e-5;
    case DType::kFloat64:
      return 1e-12;
    default:
      return 0;
  }
}

// OK when `got` matches `want` within the dtype's tolerance; otherwise
// names the first wrong element and how many are wrong.
absl::Status Compare(DType dtype, const std::vector<double>& got, const std::vector<double>& want,
                     absl::string_view what) {
  if (got.size() != want.size()) {
    return absl::InternalError(
        absl::StrCat(what, ": ", got.size(), " elements, expected ", want.size()));
  }
  const double tol = Tolerance(dtype);
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double diff = std::fabs(got[i] - want[i]);
    if (!(diff <= tol * std::max(1.0, std::fabs(want[i])))) {
      if (wrong++ == 0) first = i;
    }
  }
  if (wrong == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", wrong, " of ", got.size(),
                                          " elements wrong; first at ", first, ": got ", got[first],
                                          ", expected ", want[first]));
}

// The input pattern: small integers, exact in every dtype used.
double Value(int rank, size_t i) { return rank + 1 + static_cast<double>(i % 7); }

struct Context {
  World* world = nullptr;
  int rank = 0;  // global
  int n = 1;     // world size
  int device = 0;
  cudaStream_t stream = nullptr;  // the user stream (non-blocking)
  int passed = 0, failed = 0, skipped = 0;
};

void Report(Context& c, absl::string_view step, const absl::Status& s,
            absl::string_view detail = "") {
  if (s.ok()) {
    ++c.passed;
    std::printf("rank %d: %s PASS%s%s\n", c.rank, std::string(step).c_str(),
                detail.empty() ? "" : " ", std::string(detail).c_str());
  } else {
    ++c.failed;
    std::printf("rank %d: %s FAIL: %s\n", c.rank, std::string(step).c_str(), s.ToString().c_str());
  }
  std::fflush(stdout);
}

void Skip(Context& c, absl::string_view step, absl::string_view why) {
  ++c.skipped;
  std::printf("rank %d: %s SKIP: %s\n", c.rank, std::string(step).c_str(),
              std::string(why).c_str());
  std::fflush(stdout);
}

void Run(Context& c, absl::string_view step, const std::function<absl::Status()>& body) {
  Report(c, step, body());
}

// Host -> device on `stream` (ordered before what is enqueued after it).
absl::Status Upload(const DeviceBuffer& b, size_t offset, const std::string& host,
                    cudaStream_t stream) {
  return Cuda(
      cudaMemcpyAsync(b.data() + offset, host.data(), host.size(), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync to the device");
}

// Device -> host on `stream`, then waits for the stream.
absl::StatusOr<std::string> Download(const DeviceBuffer& b, size_t offset, size_t bytes,
                                     cudaStream_t stream) {
  std::string out(bytes, '\0');
  RETURN_IF_ERROR(
      Cuda(cudaMemcpyAsync(out.data(), b.data() + offset, bytes, cudaMemcpyDeviceToHost, stream),
           "cudaMemcpyAsync to the host"));
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  return out;
}

// Waits for the work (enqueued on the GPU) and returns its status.
absl::Status Enqueued(const std::shared_ptr<Work>& work, absl::string_view what) {
  return Annotate(work->Wait(kStepTimeout), what);
}

Tensor Cu(const DeviceBuffer& b, size_t offset, size_t count, DType dtype, cudaStream_t stream) {
  return Tensor{b.data() + offset, count, dtype, Device::kCuda, static_cast<void*>(stream)};
}

// all_reduce of `count` elements at `offset` bytes into an allocation.
absl::Status AllReduceCheck(Context& c, ProcessGroup& g, DType dtype, ReduceOp op, double scale,
                            size_t count, size_t offset, cudaStream_t stream) {
  const int n = g.size(), me = g.rank();
  std::vector<double> in(count), want(count);
  for (size_t i = 0; i < count; ++i) {
    in[i] = Value(me, i);
    double acc = 0;
    for (int r = 0; r < n; ++r) {
      double v = Value(r, i);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          acc += v;
          break;
        case ReduceOp::kPremulSum:
          acc += scale * v;
          break;
        case ReduceOp::kMax:
          acc = r == 0 ? v : std::max(acc, v);
          break;
        case ReduceOp::kMin:
          acc = r == 0 ? v : std::min(acc, v);
          break;
        default:
          return absl::InvalidArgumentError("unsupported op in the rank tool");
      }
    }
    want[i] = op == ReduceOp::kAvg ? acc / n : acc;
    if (dtype == DType::kInt32 || dtype == DType::kInt64) want[i] = std::trunc(want[i]);
  }
  const size_t bytes = count * DTypeSize(dtype);
  ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Alloc(offset + bytes));
  RETURN_IF_ERROR(Upload(buf, offset, Encode(dtype, in), stream));
  RETURN_IF_ERROR(
      Enqueued(g.AllReduce(Cu(buf, offset, count, dtype, stream), op, scale), "all_reduce"));
  ASSIGN_OR_RETURN(std::string out, Download(buf, offset, bytes, stream));
  return Compare(dtype, Decode(dtype, out), want, "all_reduce result");
}

// Allocates and fills `count` elements of `dtype` from `values`.
absl::StatusOr<DeviceBuffer> Filled(DType dtype, const std::vector<double>& values,
                                    cudaStream_t stream) {
  ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Alloc(values.size() * DTypeSize(dtype)));
  RETURN_IF_ERROR(Upload(b, 0, Encode(dtype, values), stream));
  return b;
}

absl::StatusOr<std::vector<double>> Read(const DeviceBuffer& b, DType dtype, cudaStream_t stream) {
  ASSIGN_OR_RETURN(std::string out, Download(b, 0, b.bytes(), stream));
  return Decode(dtype, out);
}

std::vector<double> Pattern(size_t count, const std::function<double(size_t)>& f) {
  std::vector<double> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = f(i);
  return v;
}

void RunAll(Context& c) {
  ProcessGroup& w = c.world->world_group();
  const int n = c.n, me = c.rank;
  cudaStream_t s = c.stream;

  struct ArCase {
    const char* name;
    DType dtype;
    ReduceOp op;
    double scale;
    size_t count;
  };
  const ArCase cases[] = {
      {"all_reduce_sum_float32", DType::kFloat32, ReduceOp::kSum, 1, 4099},
      {"all_reduce_sum_float64", DType::kFloat64, ReduceOp::kSum, 1, 1031},
      {"all_reduce_sum_int32", DType::kInt32, ReduceOp::kSum, 1, 1000},
      {"all_reduce_sum_int64", DType::kInt64, ReduceOp::kSum, 1, 777},
      {"all_reduce_sum_float16", DType::kFloat16, ReduceOp::kSum, 1, 2048},
      {"all_reduce_sum_bfloat16", DType::kBFloat16, ReduceOp::kSum, 1, 2049},
      {"all_reduce_avg_float32", DType::kFloat32, ReduceOp::kAvg, 1, 1000},
      {"all_reduce_avg_bfloat16", DType::kBFloat16, ReduceOp::kAvg, 1, 1000},
      {"all_reduce_premul_sum_float32", DType::kFloat32, ReduceOp::kPremulSum, 0.5, 1000},
      {"all_reduce_premul_sum_float16", DType::kFloat16, ReduceOp::kPremulSum, 0.25, 1000},
      {"all_reduce_max_int32", DType::kInt32, ReduceOp::kMax, 1, 1000},
      {"all_reduce_max_bfloat16", DType::kBFloat16, ReduceOp::kMax, 1, 1000},
      {"all_reduce_min_float32", DType::kFloat32, ReduceOp::kMin, 1, 1000},
      {"all_reduce_sum_float32_8MiB", DType::kFloat32, ReduceOp::kSum, 1, 2 << 20},
      {"all_reduce_sum_float32_1elem", DType::kFloat32, ReduceOp::kSum, 1, 1},
  };
  for (const ArCase& k : cases) {
    Run(c, k.name, [&] { return AllReduceCheck(c, w, k.dtype, k.op, k.scale, k.count, 0, s); });
  }
  // A tensor that starts inside its allocation (the IPC handle's offset).
  Run(c, "all_reduce_offset_in_allocation", [&] {
    return AllReduceCheck(c, w, DType::kFloat32, ReduceOp::kSum, 1, 1000, 4096 + 256, s);
  });
  // The legacy default stream instead of the user stream.
  Run(c, "all_reduce_default_stream",
      [&] { return AllReduceCheck(c, w, DType::kFloat32, ReduceOp::kSum, 1, 1000, 0, nullptr); });

  const DType f32 = DType::kFloat32;
  const size_t cnt = 513;

  Run(c, "broadcast", [&]() -> absl::Status {
    const int root = n - 1;
    ASSIGN_OR_RETURN(DeviceBuffer b,
                     Filled(f32, Pattern(cnt, [&](size_t i) { return Value(me, i); }), s));
    RETURN_IF_ERROR(Enqueued(w.Broadcast(Cu(b, 0, cnt, f32, s), root), "broadcast"));
    ASSIGN_OR_RETURN(auto got, Read(b, f32, s));
    return Compare(f32, got, Pattern(cnt, [&](size_t i) { return Value(root, i); }), "broadcast");
  });

  Run(c, "reduce", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(DeviceBuffer b,
                     Filled(f32, Pattern(cnt, [&](size_t i) { return Value(me, i); }), s));
    RETURN_IF_ERROR(Enqueued(w.Reduce(Cu(b, 0, cnt, f32, s), 0, ReduceOp::kSum), "reduce"));
    ASSIGN_OR_RETURN(auto got, Read(b, f32, s));
    if (me != 0) return absl::OkStatus();  // only the root's buffer is defined
    return Compare(f32, got,
                   Pattern(cnt,
                           [&](size_t i) {
                             double a = 0;
                             for (int r = 0; r < n; ++r) a += Value(r, i);
                             return a;
                           }),
                   "reduce at the root");
  });

  auto gathered = [&](size_t per) {
    return Pattern(per * n, [&](size_t k) { return Value(static_cast<int>(k / per), k % per); });
  };
  Run(c, "all_gather_into_tensor", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(DeviceBuffer in,
                     Filled(f32, Pattern(cnt, [&](size_t i) { return Value(me, i); }), s));
    ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Alloc(cnt * n * 4));
    RETURN_IF_ERROR(
        Enqueued(w.AllGatherIntoTensor(Cu(out, 0, cnt * n, f32, s), Cu(in, 0, cnt, f32, s)),
                 "all_gather_into_tensor"));
    ASSIGN_OR_RETURN(auto got, Read(out, f32, s));
    return Compare(f32, got, gathered(cnt), "all_gather_into_tensor");
  });

  Run(c, "all_gather", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(DeviceBuffer in,
                     Filled(f32, Pattern(cnt, [&](size_t i) { return Value(me, i); }), s));
    std::vector<DeviceBuffer> outs;
    std::vector<Tensor> ts;
    for (int r = 0; r < n; ++r) {
      ASSIGN_OR_RETURN(DeviceBuffer o, DeviceBuffer::Alloc(cnt * 4));
      outs.push_back(std::move(o));
      ts.push_back(Cu(outs.back(), 0, cnt, f32, s));
    }
    RETURN_IF_ERROR(Enqueued(w.AllGather(ts, Cu(in, 0, cnt, f32, s)), "all_gather"));
    for (int r = 0; r < n; ++r) {
      ASSIGN_OR_RETURN(auto got, Read(outs[r], f32, s));
      RETURN_IF_ERROR(Compare(f32, got, Pattern(cnt, [&](size_t i) { return Value(r, i); }),
                              absl::StrCat("all_gather output ", r)));
    }
    return absl::OkStatus();
  });

  // reduce_scatter: element k of rank r's input is Value(r, k).
  auto scattered_sum = [&](size_t per) {
    return Pattern(per, [&](size_t i) {
      double a = 0;
      for (int r = 0; r < n; ++r) a += Value(r, me * per + i);
      return a;
    });
  };
  Run(c, "reduce_scatter_tensor", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(DeviceBuffer in,
                     Filled(f32, Pattern(cnt * n, [&](size_t k) { return Value(me, k); }), s));
    ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Alloc(cnt * 4));
    RETURN_IF_ERROR(Enqueued(
        w.ReduceScatterTensor(Cu(out, 0, cnt, f32, s), Cu(in, 0, cnt * n, f32, s), ReduceOp::kSum),
        "reduce_scatter_tensor"));
    ASSIGN_OR_RETURN(auto got, Read(out, f32, s));
    return Compare(f32, got, scattered_sum(cnt), "reduce_scatter_tensor");
  });

  Run(c, "reduce_scatter", [&]() -> absl::Status {
    std::vector<DeviceBuffer> ins;
    std::vector<Tensor> ts;
    for (int j = 0; j < n; ++j) {
      ASSIGN_OR_RETURN(
          DeviceBuffer b,
          Filled(f32, Pattern(cnt, [&](size_t i) { return Value(me, j * cnt + i); }), s));
      ins.push_back(std::move(b));
      ts.push_back(Cu(ins.back(), 0, cnt, f32, s));
    }
    ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Alloc(cnt * 4));
    RETURN_IF_ERROR(
        Enqueued(w.ReduceScatter(Cu(out, 0, cnt, f32, s), ts, ReduceOp::kSum), "reduce_scatter"));
    ASSIGN_OR_RETURN(auto got, Read(out, f32, s));
    return Compare(f32, got, scattered_sum(cnt), "reduce_scatter");
  });

  // all_to_all: element k of the block rank r sends to rank j is
  // r*1000 + j*10 + k (int32).
  const DType i32 = DType::kInt32;
  auto a2a_value = [](int from, int to, size_t k) {
    return from * 1000.0 + to * 10.0 + static_cast<double>(k % 10);
  };
  auto a2a_single = [&](const std::function<size_t(int, int)>& split) -> absl::Status {
    std::vector<size_t> in_splits(n), out_splits(n);
    std::vector<double> in, want;
    for (int j = 0; j < n; ++j) {
      in_splits[j] = split(me, j);
      out_splits[j] = split(j, me);
      for (size_t k = 0; k < in_splits[j]; ++k) in.push_back(a2a_value(me, j, k));
      for (size_t k = 0; k < out_splits[j]; ++k) want.push_back(a2a_value(j, me, k));
    }
    ASSIGN_OR_RETURN(DeviceBuffer ib, Filled(i32, in, s));
    ASSIGN_OR_RETURN(DeviceBuffer ob, DeviceBuffer::Alloc(want.size() * 4));
    RETURN_IF_ERROR(Enqueued(w.AllToAllSingle(Cu(ob, 0, want.size(), i32, s),
                                              Cu(ib, 0, in.size(), i32, s), out_splits, in_splits),
                             "all_to_all_single"));
    ASSIGN_OR_RETURN(auto got, Read(ob, i32, s));
    return Compare(i32, got, want, "all_to_all_single");
  };
  Run(c, "all_to_all_single", [&] { return a2a_single([](int, int) { return size_t{64}; }); });
  Run(c, "all_to_all_single_splits",
      [&] { return a2a_single([](int from, int to) { return size_t(1 + (from + 2 * to) % 4); }); });

  Run(c, "all_to_all", [&]() -> absl::Status {
    auto count = [](int from, int to) { return size_t(3 + (2 * from + to) % 5); };
    std::vector<DeviceBuffer> ins, outs;
    std::vector<Tensor> ti, to;
    for (int j = 0; j < n; ++j) {
      ASSIGN_OR_RETURN(
          DeviceBuffer b,
          Filled(i32, Pattern(count(me, j), [&](size_t k) { return a2a_value(me, j, k); }), s));
      ins.push_back(std::move(b));
      ti.push_back(Cu(ins.back(), 0, count(me, j), i32, s));
      ASSIGN_OR_RETURN(DeviceBuffer o, DeviceBuffer::Alloc(count(j, me) * 4));
      outs.push_back(std::move(o));
      to.push_back(Cu(outs.back(), 0, count(j, me), i32, s));
    }
    RETURN_IF_ERROR(Enqueued(w.AllToAll(to, ti), "all_to_all"));
    for (int j = 0; j < n; ++j) {
      ASSIGN_OR_RETURN(auto got, Read(outs[j], i32, s));
      RETURN_IF_ERROR(Compare(i32, got,
                              Pattern(count(j, me), [&](size_t k) { return a2a_value(j, me, k); }),
                              absl::StrCat("all_to_all output from rank ", j)));
    }
    return absl::OkStatus();
  });

  Run(c, "gather", [&]() -> absl::Status {
    const int root = 0;
    ASSIGN_OR_RETURN(DeviceBuffer in,
                     Filled(f32, Pattern(cnt, [&](size_t i) { return Value(me, i); }), s));
    std::vector<DeviceBuffer> outs;
    std::vector<Tensor> ts;
    if (me == root) {
      for (int r = 0; r < n; ++r) {
        ASSIGN_OR_RETURN(DeviceBuffer o, DeviceBuffer::Alloc(cnt * 4));
        outs.push_back(std::move(o));
        ts.push_back(Cu(outs.back(), 0, cnt, f32, s));
      }
    }
    RETURN_IF_ERROR(Enqueued(w.Gather(ts, Cu(in, 0, cnt, f32, s), root), "gather"));
    for (size_t r = 0; r < outs.size(); ++r) {
      ASSIGN_OR_RETURN(auto got, Read(outs[r], f32, s));
      RETURN_IF_ERROR(Compare(f32, got,
                              Pattern(cnt, [&](size_t i) { return Value(static_cast<int>(r), i); }),
                              absl::StrCat("gather output ", r)));
    }
    // Non-roots: the collective must still have run (the stream passed it).
    return Cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize after gather");
  });

  Run(c, "scatter", [&]() -> absl::Status {
    const int root = n - 1;
    auto block = [](int r, size_t i) { return r * 100.0 + static_cast<double>(i % 50); };
    std::vector<DeviceBuffer> ins;
    std::vector<Tensor> ts;
    if (me == root) {
      for (int r = 0; r < n; ++r) {
        ASSIGN_OR_RETURN(DeviceBuffer b,
                         Filled(f32, Pattern(cnt, [&](size_t i) { return block(r, i); }), s));
        ins.push_back(std::move(b));
        ts.push_back(Cu(ins.back(), 0, cnt, f32, s));
      }
    }
    ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Alloc(cnt * 4));
    RETURN_IF_ERROR(Enqueued(w.Scatter(Cu(out, 0, cnt, f32, s), ts, root), "scatter"));
    ASSIGN_OR_RETURN(auto got, Read(out, f32, s));
    return Compare(f32, got, Pattern(cnt, [&](size_t i) { return block(me, i); }), "scatter");
  });

  // A ring of sends and receives in one batch (at world 1: to itself).
  Run(c, "batch_isend_irecv_ring", [&]() -> absl::Status {
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    ASSIGN_OR_RETURN(DeviceBuffer sb,
                     Filled(f32, Pattern(cnt, [&](size_t i) { return Value(me, i); }), s));
    ASSIGN_OR_RETURN(DeviceBuffer rb, DeviceBuffer::Alloc(cnt * 4));
    std::vector<ProcessGroup::P2PRequest> reqs = {{true, Cu(sb, 0, cnt, f32, s), next, 0},
                                                  {false, Cu(rb, 0, cnt, f32, s), prev, 0}};
    std::vector<std::shared_ptr<Work>> works = w.BatchISendIRecv(reqs);
    for (auto& wk : works) RETURN_IF_ERROR(Enqueued(wk, "batch_isend_irecv"));
    ASSIGN_OR_RETURN(auto got, Read(rb, f32, s));
    return Compare(f32, got, Pattern(cnt, [&](size_t i) { return Value(prev, i); }),
                   absl::StrCat("received from rank ", prev));
  });

  if (n < 2) {
    Skip(c, "send_recv", "needs two ranks (world 1)");
  } else if (me > 1) {
    Skip(c, "send_recv", "only ranks 0 and 1 take part");
  } else {
    Run(c, "send_recv", [&]() -> absl::Status {
      ASSIGN_OR_RETURN(
          DeviceBuffer b,
          Filled(f32, Pattern(cnt, [&](size_t i) { return me == 0 ? 7.0 + i % 5 : -1.0; }), s));
      std::shared_ptr<Work> wk =
          me == 0 ? w.ISend(Cu(b, 0, cnt, f32, s), 1) : w.IRecv(Cu(b, 0, cnt, f32, s), 0);
      RETURN_IF_ERROR(Enqueued(wk, me == 0 ? "send" : "recv"));
      ASSIGN_OR_RETURN(auto got, Read(b, f32, s));
      return Compare(f32, got, Pattern(cnt, [](size_t i) { return 7.0 + i % 5; }),
                     "send/recv buffer");
    });
  }

  Run(c, "all_reduce_coalesced", [&]() -> absl::Status {
    const size_t counts[] = {3, 100, 1000};
    std::vector<DeviceBuffer> bufs;
    std::vector<Tensor> ts;
    for (size_t k : counts) {
      ASSIGN_OR_RETURN(DeviceBuffer b,
                       Filled(f32, Pattern(k, [&](size_t i) { return Value(me, i); }), s));
      bufs.push_back(std::move(b));
      ts.push_back(Cu(bufs.back(), 0, k, f32, s));
    }
    RETURN_IF_ERROR(Enqueued(w.AllReduceCoalesced(ts, ReduceOp::kSum), "all_reduce_coalesced"));
    for (size_t t = 0; t < bufs.size(); ++t) {
      ASSIGN_OR_RETURN(auto got, Read(bufs[t], f32, s));
      RETURN_IF_ERROR(Compare(f32, got,
                              Pattern(counts[t],
                                      [&](size_t i) {
                                        double a = 0;
                                        for (int r = 0; r < n; ++r) a += Value(r, i);
                                        return a;
                                      }),
                              absl::StrCat("all_reduce_coalesced tensor ", t)));
    }
    return absl::OkStatus();
  });

  // Ordering: 8 in-place all_reduces enqueued back to back with no host
  // synchronization; each must see the previous one's result (n^8).
  Run(c, "stream_ordering", [&]() -> absl::Status {
    const size_t k = 4096;
    ASSIGN_OR_RETURN(DeviceBuffer b, Filled(f32, std::vector<double>(k, 1.0), s));
    for (int it = 0; it < 8; ++it) {
      RETURN_IF_ERROR(Enqueued(w.AllReduce(Cu(b, 0, k, f32, s)), absl::StrCat("all_reduce ", it)));
    }
    ASSIGN_OR_RETURN(auto got, Read(b, f32, s));
    return Compare(f32, got, std::vector<double>(k, std::pow(static_cast<double>(n), 8)),
                   "after 8 chained all_reduces");
  });

  // Work::Synchronize: the CPU waits for the GPU; the result is then read on
  // another stream that has no ordering with the collective's.
  Run(c, "work_synchronize", [&]() -> absl::Status {
    const size_t k = 1 << 20;
    ASSIGN_OR_RETURN(DeviceBuffer b,
                     Filled(f32, Pattern(k, [&](size_t i) { return Value(me, i); }), s));
    std::shared_ptr<Work> wk = w.AllReduce(Cu(b, 0, k, f32, s));
    RETURN_IF_ERROR(Enqueued(wk, "all_reduce"));
    RETURN_IF_ERROR(Annotate(wk->Synchronize(kStepTimeout), "Work::Synchronize"));
    cudaStream_t other = nullptr;
    RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking),
                         "cudaStreamCreateWithFlags"));
    absl::StatusOr<std::vector<double>> got = Read(b, f32, other);
    cudaStreamDestroy(other);
    if (!got.ok()) return got.status();
    return Compare(f32, *got,
                   Pattern(k,
                           [&](size_t i) {
                             double a = 0;
                             for (int r = 0; r < n; ++r) a += Value(r, i);
                             return a;
                           }),
                   "read on another stream after Synchronize");
  });

  // Subgroups: every world rank forms them, so musterd splits their
  // communicators from the world's.
  std::vector<int> all, even;
  for (int r = 0; r < n; ++r) {
    all.push_back(r);
    if (r % 2 == 0) even.push_back(r);
  }
  {
    GroupOptions o;
    o.name = "gpu_all";
    absl::StatusOr<std::shared_ptr<ProcessGroup>> g = c.world->NewGroup(all, o);
    if (!g.ok()) {
      Report(c, "subgroup_all", g.status());
    } else {
      Run(c, "subgroup_all",
          [&] { return AllReduceCheck(c, **g, DType::kFloat32, ReduceOp::kSum, 1, 1000, 0, s); });
      Run(c, "subgroup_all_again",
          [&] { return AllReduceCheck(c, **g, DType::kBFloat16, ReduceOp::kMax, 1, 1000, 0, s); });
    }
  }
  {
    GroupOptions o;
    o.name = "gpu_even";
    absl::StatusOr<std::shared_ptr<ProcessGroup>> g = c.world->NewGroup(even, o);
    if (!g.ok()) {
      Report(c, "subgroup_even", g.status());
    } else if (!(*g)->is_member()) {
      Skip(c, "subgroup_even", "not a member (odd rank)");
    } else {
      Run(c, "subgroup_even",
          [&] { return AllReduceCheck(c, **g, DType::kFloat32, ReduceOp::kSum, 1, 1000, 0, s); });
    }
  }
  // The world group still works after the splits.
  Run(c, "world_after_subgroups",
      [&] { return AllReduceCheck(c, w, DType::kFloat32, ReduceOp::kSum, 1, 1000, 0, s); });

  // Errors.
  auto expect_invalid = [](const absl::Status& s, absl::string_view what) -> absl::Status {
    if (s.code() == absl::StatusCode::kInvalidArgument) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat(what, ": expected INVALID_ARGUMENT, got ", s.ToString()));
  };
  {
    GroupOptions o;
    o.name = "cpu_only";
    o.backend = "gloo";
    absl::StatusOr<std::shared_ptr<ProcessGroup>> g = c.world->NewGroup(all, o);
    if (!g.ok()) {
      Report(c, "error_cuda_tensor_on_cpu_group", g.status());
    } else {
      Run(c, "error_cuda_tensor_on_cpu_group", [&]() -> absl::Status {
        ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Alloc(64));
        std::shared_ptr<Work> wk = (*g)->AllReduce(Cu(b, 0, 16, f32, s));
        return expect_invalid(wk->Wait(kStepTimeout), "all_reduce of a CUDA tensor on 'cpu:gloo'");
      });
    }
  }
  Run(c, "error_mixed_cpu_cuda", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(DeviceBuffer out, DeviceBuffer::Alloc(16 * n * 4));
    std::vector<float> host(16, 1.0f);
    std::shared_ptr<Work> wk = w.AllGatherIntoTensor(Cu(out, 0, 16 * n, f32, s),
                                                     Tensor{host.data(), 16, f32, Device::kCpu});
    return expect_invalid(wk->Wait(kStepTimeout), "all_gather_into_tensor of CPU into CUDA");
  });
  Run(c, "error_host_memory_as_cuda", [&]() -> absl::Status {
    std::vector<float> host(16, 1.0f);
    std::shared_ptr<Work> wk =
        w.AllReduce(Tensor{host.data(), 16, f32, Device::kCuda, static_cast<void*>(s)});
    return expect_invalid(wk->Wait(kStepTimeout), "all_reduce of host memory marked CUDA");
  });
  // After the errors, the world group still works.
  Run(c, "world_after_errors",
      [&] { return AllReduceCheck(c, w, DType::kFloat32, ReduceOp::kSum, 1, 1000, 0, s); });
}

// Modes abort and kill: see the file comment.
void RunFailure(Context& c, bool kill_last) {
  std::vector<int> all;
  for (int r = 0; r < c.n; ++r) all.push_back(r);
  GroupOptions o;
  o.name = "victim";
  absl::StatusOr<std::shared_ptr<ProcessGroup>> victim = c.world->NewGroup(all, o);
  if (!victim.ok()) {
    Report(c, "victim_ready", victim.status());
    return;
  }
  absl::Status first =
      AllReduceCheck(c, **victim, DType::kFloat32, ReduceOp::kSum, 1, 1024, 0, c.stream);
  Report(c, "victim_ready", first);
  if (!first.ok()) return;
  if (kill_last && c.rank == c.n - 1) {
    std::printf("rank %d: killing myself\n", c.rank);
    std::fflush(stdout);
    ::kill(::getpid(), SIGKILL);
  }
  // Keep the group busy until someone breaks it.
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  absl::Status failure;
  int rounds = 0;
  {
    absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Alloc(4096);
    if (!b.ok()) {
      Report(c, "victim_aborted", b.status());
      return;
    }
    while (absl::Now() < deadline) {
      ++rounds;
      std::shared_ptr<Work> wk =
          (*victim)->AllReduce(Cu(*b, 0, 1024, DType::kFloat32, c.stream), ReduceOp::kSum);
      failure = wk->Wait(kStepTimeout);
      if (!failure.ok()) break;
      // A collective stuck behind a dead peer finishes once musterd aborts
      // the communicator; the next enqueue then reports why.
      (void)wk->Synchronize(absl::Seconds(10));
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  absl::Status verdict;
  const char* expect = std::getenv("MUSTER_GPU_EXPECT");
  std::string want = expect != nullptr ? expect : "";
  if (kill_last && want.empty()) want = absl::StrCat("rank ", c.n - 1);
  if (failure.ok()) {
    verdict = absl::DeadlineExceededError("the victim group never failed within 90 s");
  } else if (failure.code() != absl::StatusCode::kAborted) {
    verdict = absl::InternalError(absl::StrCat("expected ABORTED, got ", failure.ToString()));
  } else if (!want.empty() && !absl::StrContains(failure.message(), want)) {
    verdict = absl::InternalError(
        absl::StrCat("the error does not mention '", want, "': ", failure.ToString()));
  }
  Report(c, "victim_aborted", verdict,
         absl::StrCat("after ", rounds, " all_reduces: ", failure.ToString()));
  if (kill_last) return;  // the world lost a rank: no new group over all of it
  GroupOptions fo;
  fo.name = "fresh";
  absl::StatusOr<std::shared_ptr<ProcessGroup>> fresh = c.world->NewGroup(all, fo);
  if (!fresh.ok()) {
    Report(c, "fresh_group", fresh.status());
    return;
  }
  // A new stream: the victim's stream may hold a collective that never ran.
  cudaStream_t stream = nullptr;
  if (absl::Status s = Cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags");
      !s.ok()) {
    Report(c, "fresh_group", s);
    return;
  }
  Run(c, "fresh_group", [&] {
    return AllReduceCheck(c, **fresh, DType::kFloat32, ReduceOp::kSum, 1, 1024, 0, stream);
  });
  cudaStreamDestroy(stream);
}

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "all";
  if (mode != "all" && mode != "abort" && mode != "kill") {
    std::fprintf(stderr, "usage: muster-gpu-rank [all|abort|kill]\n");
    return 2;
  }
  absl::StatusOr<InitOptions> options = InitOptionsFromEnv();
  if (!options.ok()) {
    std::fprintf(stderr, "muster-gpu-rank: %s\n", options.status().ToString().c_str());
    return 2;
  }
  options->backend = "cpu:gloo,cuda:nccl";
  options->timeout = absl::Seconds(120);
  Context c;
  c.rank = options->rank;
  c.n = options->world_size;
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("rank %d: no CUDA device (%s)\n", c.rank,
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 2;
  }
  const int local_rank = options->local_rank >= 0 ? options->local_rank : options->rank;
  c.device = local_rank % devices;
  if (absl::Status s = Cuda(cudaSetDevice(c.device), "cudaSetDevice"); !s.ok()) {
    std::printf("rank %d: %s\n", c.rank, s.ToString().c_str());
    return 2;
  }
  if (absl::Status s = Cuda(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags");
      !s.ok()) {
    std::printf("rank %d: %s\n", c.rank, s.ToString().c_str());
    return 2;
  }
  if (mode == "kill" && c.n < 2) {
    std::printf("rank %d: kill mode needs world >= 2\n", c.rank);
    return 2;
  }
  char bus[32] = {0};
  cudaDeviceGetPCIBusId(bus, sizeof(bus), c.device);
  std::printf("rank %d: device %d of %d (%s), world %d, mode %s\n", c.rank, c.device, devices, bus,
              c.n, mode.c_str());
  absl::StatusOr<std::unique_ptr<World>> world = World::Init(*options);
  if (!world.ok()) {
    std::printf("rank %d: init FAIL: %s\n", c.rank, world.status().ToString().c_str());
    return 3;
  }
  c.world = world->get();
  if (mode == "all") {
    RunAll(c);
  } else {
    RunFailure(c, mode == "kill");
  }
  std::printf("rank %d: SUMMARY passed=%d failed=%d skipped=%d\n", c.rank, c.passed, c.failed,
              c.skipped);
  std::fflush(stdout);
  world->reset();
  cudaStreamDestroy(c.stream);
  return c.failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace muster

int main(int argc, char** argv) { return muster::Main(argc, argv); }
