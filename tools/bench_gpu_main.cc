// muster-bench-gpu: `muster-bench collectives --device cuda` (muster-bench
// execs this binary with the same flags; it never links CUDA itself).
//
// In one run it times all_reduce on CUDA buffers two ways over the same
// visible GPUs (world = --nproc, default every visible GPU), size by size:
//
//   nccl    in-process NCCL: ncclCommInitAll over the GPUs, one thread per
//           GPU, each with its own cudaMalloc'd buffer and stream.
//   muster  through musterd: one rank process per GPU started with the
//           launcher muster-run uses (an embedded musterd unless --socket
//           names one); each rank joins with backend "cpu:gloo,cuda:nccl"
//           and calls ProcessGroup::AllReduce on its CUDA tensor.
//
// Per iteration, on every GPU: launch, then cudaStreamSynchronize; the
// iteration's time is the slowest GPU's. Both run in place, with --warmup
// untimed iterations first, after one verified all_reduce (every element is
// checked on the host). Output: one JSON line per size and implementation
//   {"op","bytes","world","dtype","iters","warmup","p50_us","p99_us",
//    "algbw_gbps","busbw_gbps","verified","impl"}
// then a Markdown table with both side by side and their ratio
// (nccl p50 / muster p50: 1.0 is parity, equal to the busbw ratio) and the
// issue's targets: at >= 64 MiB muster's busbw within 3% of NCCL's; for a
// 4-byte all_reduce at most 15 us added. Exit status: 0 when every run
// completed and verified (targets are reported, not enforced), 1 otherwise,
// 2 for bad usage or no GPU.
//
// Internally, the rank processes run this binary with --worker-results FILE
// (rank 0 appends its JSON lines there).
//
// Not thread-safe: main() runs it once.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "backends/nccl/nccl_errors.h"
#include "backends/nccl/nccl_mapping.h"
#include "backends/shm/reduce.h"
#include "common/flags.h"
#include "common/status_macros.h"
#include "muster/world.h"
#include "tools/bench_flags.h"
#include "tools/launcher.h"

namespace muster {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int64_t> bytes;
  std::vector<int64_t> iters;  // one per size
  int64_t warmup = -1;
  DType dtype = DType::kFloat32;
  std::string dtype_name = "float32";
  int nproc = 0;
  std::string impl = "both";
};

// Default iterations: many for small sizes, fewer for large ones.
int64_t DefaultIters(int64_t bytes) {
  if (bytes <= (1 << 20)) return 1000;
  if (bytes <= (16 << 20)) return 200;
  return 50;
}

int64_t Warmup(int64_t iters, int64_t flag) {
  return flag >= 0 ? flag : std::max<int64_t>(5, iters / 10);
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::lround(q * (v.size() - 1)));
  return v[std::min(i, v.size() - 1)];
}

// One size's result.
struct Result {
  int64_t bytes = 0;
  int world = 0;
  int64_t iters = 0, warmup = 0;
  double p50 = 0, p99 = 0;
  bool verified = false;
  std::string error;  // non-empty: the run failed
};

double AlgBw(const Result& r) { return r.p50 > 0 ? r.bytes / (r.p50 * 1e-6) / 1e9 : 0; }
double BusBw(const Result& r) { return AlgBw(r) * 2.0 * (r.world - 1) / r.world; }

std::string JsonLine(const Result& r, const std::string& dtype, const std::string& impl) {
  return absl::StrFormat(
      "{\"op\":\"all_reduce\",\"bytes\":%d,\"world\":%d,\"dtype\":\"%s\",\"iters\":%d,"
      "\"warmup\":%d,\"p50_us\":%.3f,\"p99_us\":%.3f,\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,"
      "\"verified\":%s,\"impl\":\"%s\"%s}",
      r.bytes, r.world, dtype, r.iters, r.warmup, r.p50, r.p99, AlgBw(r), BusBw(r),
      r.verified ? "true" : "false", impl,
      r.error.empty()
          ? ""
          : absl::StrCat(",\"error\":\"",
                         absl::StrReplaceAll(r.error, {{"\"", "'"}, {"\\", "/"}, {"\n", " "}}),
                         "\""));
}

absl::Status Cuda(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

// Fills `count` elements with rank+1 (exact in every dtype used here).
std::string RankFill(DType dtype, size_t count, int rank) {
  const size_t es = DTypeSize(dtype);
  std::string out(count * es, '\0');
  std::string one(es, '\0');
  const double v = rank + 1;
  switch (dtype) {
    case DType::kFloat16: {
      uint16_t h = FloatToHalf(static_cast<float>(v));
      std::memcpy(one.data(), &h, 2);
      break;
    }
    case DType::kBFloat16: {
      uint16_t h = FloatToBFloat16(static_cast<float>(v));
      std::memcpy(one.data(), &h, 2);
      break;
    }
    case DType::kFloat32: {
      float f = static_cast<float>(v);
      std::memcpy(one.data(), &f, 4);
      break;
    }
    case DType::kFloat64:
      std::memcpy(one.data(), &v, 8);
      break;
    case DType::kInt32: {
      int32_t x = rank + 1;
      std::memcpy(one.data(), &x, 4);
      break;
    }
    case DType::kInt64: {
      int64_t x = rank + 1;
      std::memcpy(one.data(), &x, 8);
      break;
    }
    default:
      break;
  }
  for (size_t i = 0; i < count; ++i) std::memcpy(out.data() + i * es, one.data(), es);
  return out;
}

// Uploads rank+1 everywhere, runs `launch` once, checks every element is
// 1+2+...+world.
absl::Status VerifyOnce(DType dtype, void* buf, size_t count, int rank, int world,
                        cudaStream_t stream, const std::function<absl::Status()>& launch) {
  const std::string in = RankFill(dtype, count, rank);
  RETURN_IF_ERROR(
      Cuda(cudaMemcpyAsync(buf, in.data(), in.size(), cudaMemcpyHostToDevice, stream), "upload"));
  RETURN_IF_ERROR(launch());
  std::string out(in.size(), '\0');
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(out.data(), buf, out.size(), cudaMemcpyDeviceToHost, stream),
                       "download"));
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  // The expected value, encoded like the input (world*(world+1)/2 is exact).
  const int sum = world * (world + 1) / 2;
  const std::string want = RankFill(dtype, 1, sum - 1);
  const size_t es = DTypeSize(dtype);
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(out.data() + i * es, want.data(), es) != 0) {
      return absl::DataLossError(
          absl::StrCat("element ", i, " of ", count, " is wrong after all_reduce"));
    }
  }
  return absl::OkStatus();
}

// Runs warmup + iters of `launch` (which must leave the work on `stream`),
// timing launch + cudaStreamSynchronize.
absl::Status TimeLoop(int64_t warmup, int64_t iters, cudaStream_t stream,
                      const std::function<absl::Status()>& launch, std::vector<double>* times) {
  for (int64_t i = 0; i < warmup; ++i) {
    RETURN_IF_ERROR(launch());
    RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
  }
  times->assign(static_cast<size_t>(iters), 0);
  for (int64_t i = 0; i < iters; ++i) {
    Clock::time_point t0 = Clock::now();
    RETURN_IF_ERROR(launch());
    RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    (*times)[i] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  return absl::OkStatus();
}

// (a) In-process NCCL, one thread per GPU.
std::vector<Result> RunNccl(const Options& o, int world) {
  std::vector<Result> results(o.bytes.size());
  for (size_t s = 0; s < o.bytes.size(); ++s) {
    results[s].bytes = o.bytes[s];
    results[s].world = world;
  }
  absl::StatusOr<ncclDataType_t> type = NcclReduceType(o.dtype);
  std::vector<int> devs(world);
  for (int d = 0; d < world; ++d) devs[d] = d;
  std::vector<ncclComm_t> comms(world);
  ncclResult_t init = type.ok() ? ncclCommInitAll(comms.data(), world, devs.data()) : ncclSuccess;
  if (!type.ok() || init != ncclSuccess) {
    std::string why =
        type.ok() ? NcclStatus(init, "ncclCommInitAll").ToString() : type.status().ToString();
    for (Result& r : results) r.error = why;
    return results;
  }
  const size_t es = DTypeSize(o.dtype);
  const int64_t largest = *std::max_element(o.bytes.begin(), o.bytes.end());
  // times[size][gpu][iteration]
  std::vector<std::vector<std::vector<double>>> times(o.bytes.size(),
                                                      std::vector<std::vector<double>>(world));
  std::vector<std::vector<std::string>> errors(o.bytes.size(), std::vector<std::string>(world));
  std::vector<std::thread> threads;
  for (int d = 0; d < world; ++d) {
    threads.emplace_back([&, d] {
      void* buf = nullptr;
      cudaStream_t stream = nullptr;
      absl::Status setup = Cuda(cudaSetDevice(d), "cudaSetDevice");
      if (setup.ok()) setup = Cuda(cudaMalloc(&buf, largest), "cudaMalloc");
      if (setup.ok()) {
        setup = Cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      }
      for (size_t s = 0; s < o.bytes.size(); ++s) {
        if (!setup.ok()) {
          errors[s][d] = setup.ToString();
          continue;
        }
        const size_t count = std::max<size_t>(1, o.bytes[s] / es);
        auto launch = [&]() {
          return NcclStatus(ncclAllReduce(buf, buf, count, *type, ncclSum, comms[d], stream),
                            "ncclAllReduce");
        };
        absl::Status st = VerifyOnce(o.dtype, buf, count, d, world, stream, launch);
        if (st.ok()) {
          st = TimeLoop(Warmup(o.iters[s], o.warmup), o.iters[s], stream, launch, &times[s][d]);
        }
        if (!st.ok()) {
          errors[s][d] = st.ToString();
          setup = st;  // a failed collective leaves the communicator unusable
        }
      }
      if (stream != nullptr) cudaStreamDestroy(stream);
      if (buf != nullptr) cudaFree(buf);
    });
  }
  for (auto& t : threads) t.join();
  for (int d = 0; d < world; ++d) ncclCommDestroy(comms[d]);
  for (size_t s = 0; s < o.bytes.size(); ++s) {
    Result& r = results[s];
    r.bytes = static_cast<int64_t>(std::max<size_t>(1, o.bytes[s] / es) * es);
    r.iters = o.iters[s];
    r.warmup = Warmup(o.iters[s], o.warmup);
    for (int d = 0; d < world; ++d) {
      if (!errors[s][d].empty() && r.error.empty())
        r.error = absl::StrCat("GPU ", d, ": ", errors[s][d]);
    }
    if (!r.error.empty()) continue;
    std::vector<double> slowest(r.iters, 0);
    for (int d = 0; d < world; ++d) {
      for (int64_t i = 0; i < r.iters; ++i) slowest[i] = std::max(slowest[i], times[s][d][i]);
    }
    r.p50 = Percentile(slowest, 0.5);
    r.p99 = Percentile(slowest, 0.99);
    r.verified = true;
  }
  return results;
}

// A rank of (b): joins the job, runs every size, rank 0 appends JSON lines
// to `results_path`. Returns the exit status.
int RunWorker(const Options& o, const std::string& results_path) {
  absl::StatusOr<InitOptions> init = InitOptionsFromEnv();
  if (!init.ok()) {
    std::fprintf(stderr, "muster-bench-gpu: %s\n", init.status().ToString().c_str());
    return 2;
  }
  init->backend = "cpu:gloo,cuda:nccl";
  init->timeout = absl::Minutes(5);
  const int rank = init->rank;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "muster-bench-gpu: rank %d: no CUDA device\n", rank);
    return 2;
  }
  const int local = init->local_rank >= 0 ? init->local_rank : rank;
  const int device = local % devices;
  cudaStream_t stream = nullptr;
  void* buf = nullptr;
  const size_t es = DTypeSize(o.dtype);
  const int64_t largest = *std::max_element(o.bytes.begin(), o.bytes.end());
  absl::Status setup = Cuda(cudaSetDevice(device), "cudaSetDevice");
  if (setup.ok()) {
    setup = Cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  if (setup.ok()) setup = Cuda(cudaMalloc(&buf, largest), "cudaMalloc");
  if (!setup.ok()) {
    std::fprintf(stderr, "muster-bench-gpu: rank %d: %s\n", rank, setup.ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<World>> world = World::Init(*init);
  if (!world.ok()) {
    std::fprintf(stderr, "muster-bench-gpu: rank %d: joining: %s\n", rank,
                 world.status().ToString().c_str());
    return 1;
  }
  ProcessGroup& group = (*world)->world_group();
  const int n = group.size();
  int exit_code = 0;
  for (size_t s = 0; s < o.bytes.size(); ++s) {
    Result r;
    const size_t count = std::max<size_t>(1, o.bytes[s] / es);
    r.bytes = static_cast<int64_t>(count * es);
    r.world = n;
    r.iters = o.iters[s];
    r.warmup = Warmup(o.iters[s], o.warmup);
    Tensor t{buf, count, o.dtype, Device::kCuda, static_cast<void*>(stream)};
    auto launch = [&]() -> absl::Status {
      std::shared_ptr<Work> w = group.AllReduce(t, ReduceOp::kSum);
      return w->status();  // complete once enqueued on the stream
    };
    std::vector<double> times;
    absl::Status st = VerifyOnce(o.dtype, buf, count, rank, n, stream, launch);
    if (st.ok()) st = TimeLoop(r.warmup, r.iters, stream, launch, &times);
    // Every rank reports whether it succeeded, then the slowest time per
    // iteration (CPU collectives on the same group).
    int64_t failed = st.ok() ? 0 : 1;
    absl::Status agree =
        group.AllReduce({&failed, 1, DType::kInt64}, ReduceOp::kMax)->Wait(absl::Minutes(2));
    if (!st.ok()) {
      std::fprintf(stderr, "muster-bench-gpu: rank %d: %d bytes: %s\n", rank,
                   static_cast<int>(r.bytes), st.ToString().c_str());
    }
    if (!agree.ok() || failed != 0) {
      r.error = !st.ok() ? st.ToString() : !agree.ok() ? agree.ToString() : "another rank failed";
      exit_code = 1;
    } else {
      absl::Status max =
          group.AllReduce({times.data(), times.size(), DType::kFloat64}, ReduceOp::kMax)
              ->Wait(absl::Minutes(2));
      if (!max.ok()) {
        r.error = max.ToString();
        exit_code = 1;
      } else {
        r.p50 = Percentile(times, 0.5);
        r.p99 = Percentile(times, 0.99);
        r.verified = true;
      }
    }
    if (rank == 0) {
      std::ofstream f(results_path, std::ios::app);
      f << JsonLine(r, o.dtype_name, "muster") << "\n";
    }
    if (!agree.ok()) break;  // the group is unusable
  }
  world->reset();
  cudaFree(buf);
  cudaStreamDestroy(stream);
  return exit_code;
}

bool Executable(const std::filesystem::path& p) { return ::access(p.c_str(), X_OK) == 0; }

std::string SelfPath() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "" : self.string();
}

// musterd for an embedded daemon: the flag, next to this binary in
// bazel-bin (backends/nccl/ -> daemon/), in its runfiles, or in the same
// folder (prebuilt binaries side by side).
std::string FindMusterd(const std::string& flag) {
  if (!flag.empty()) return flag;
  std::filesystem::path self = SelfPath();
  std::filesystem::path dir = self.parent_path();
  for (const std::filesystem::path& c :
       {dir / "../../daemon/musterd",
        std::filesystem::path(self.string() + ".runfiles/muster/daemon/musterd"),
        dir / "musterd"}) {
    if (Executable(c)) return c.lexically_normal().string();
  }
  return "";  // the launcher then looks on PATH
}

// Parses one JSON line of ours back (only the fields the table needs).
bool ParseLine(const std::string& line, Result* r) {
  auto field = [&](const std::string& key) -> std::string {
    size_t at = line.find("\"" + key + "\":");
    if (at == std::string::npos) return "";
    size_t start = at + key.size() + 3;
    size_t end = line.find_first_of(",}", start);
    return line.substr(start, end - start);
  };
  double bytes = 0, world = 0, iters = 0, warmup = 0;
  if (!absl::SimpleAtod(field("bytes"), &bytes) || !absl::SimpleAtod(field("world"), &world)) {
    return false;
  }
  absl::SimpleAtod(field("iters"), &iters);
  absl::SimpleAtod(field("warmup"), &warmup);
  absl::SimpleAtod(field("p50_us"), &r->p50);
  absl::SimpleAtod(field("p99_us"), &r->p99);
  r->bytes = static_cast<int64_t>(bytes);
  r->world = static_cast<int>(world);
  r->iters = static_cast<int64_t>(iters);
  r->warmup = static_cast<int64_t>(warmup);
  r->verified = field("verified") == "true";
  size_t e = line.find("\"error\":\"");
  if (e != std::string::npos) {
    r->error = line.substr(e + 9, line.rfind('"') - (e + 9));
  }
  return true;
}

std::string Size(int64_t b) {
  if (b >= (1 << 30) && b % (1 << 30) == 0) return absl::StrCat(b >> 30, " GiB");
  if (b >= (1 << 20) && b % (1 << 20) == 0) return absl::StrCat(b >> 20, " MiB");
  if (b >= (1 << 10) && b % (1 << 10) == 0) return absl::StrCat(b >> 10, " KiB");
  return absl::StrCat(b, " B");
}

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bench::CollectiveFlags coll;
  coll.device = "cuda";
  coll.op = "all_reduce";
  coll.bytes = "4,4K,256K,4M,64M,256M";
  std::string impl = "both", socket, musterd, worker_results;
  int64_t nproc = 0;
  bool json = false, quick = false;
  FlagSet flags(
      "muster-bench-gpu",
      "muster-bench collectives --device cuda: all_reduce on CUDA buffers, in-process NCCL vs\n"
      "through musterd, in one run (run it directly, not under muster-run).\n"
      "Usage: muster-bench collectives --device cuda [--bytes 4,4K,256K,4M,64M,256M]\n"
      "       [--iters N|N,N,..] [--warmup N] [--dtype float32] [--nproc G] [--impl both]\n"
      "       [--socket S | --musterd PATH]\n"
      "\n"
      "(a) nccl: ncclCommInitAll over the first --nproc visible GPUs, one thread per GPU.\n"
      "(b) muster: one rank process per GPU (the muster-run launcher; an embedded musterd\n"
      "unless --socket names one) calling ProcessGroup::AllReduce on a CUDA tensor.\n"
      "Per iteration: launch + cudaStreamSynchronize; the slowest GPU's time counts. One\n"
      "verified all_reduce precedes each size. Prints one JSON line per size and\n"
      "implementation {op, bytes, world, dtype, iters, p50_us, busbw_gbps, verified, impl, ...}\n"
      "and a Markdown table with the ratio (nccl p50 / muster p50) and the targets: busbw\n"
      "within 3% at >= 64 MiB, at most 15 us added at 4 B. Exit status: 0 when everything\n"
      "ran and verified, 1 otherwise, 2 for bad usage or no GPU.");
  bench::AddCollectiveFlags(flags, &coll);
  flags.AddInt("nproc", &nproc, "GPUs (and ranks) to use; 0: every visible GPU.");
  flags.AddString("impl", &impl, "both, nccl or muster.");
  flags.AddString("socket", &socket,
                  "Use the musterd at this socket (default: $MUSTER_SOCKET or the default socket\n"
                  "if one answers, else an embedded musterd).");
  flags.AddString("musterd", &musterd,
                  "musterd for the embedded daemon (default: bazel-bin/daemon/musterd next to\n"
                  "this binary, or the same folder).");
  flags.AddBool("quick", &quick, "Sizes 4,4K,256K,4M with 20 iterations unless given.");
  flags.AddBool("json", &json, "Accepted for muster-bench compatibility (JSON lines always).");
  flags.AddString("worker-results", &worker_results, "Internal: run as a rank of (b).");
  std::vector<std::string> positional = flags.ParseOrExit(argc, argv);

  if (!(positional.empty() || (positional.size() == 1 && positional[0] == "collectives"))) {
    std::fprintf(stderr, "muster-bench-gpu: only the collectives benchmark runs on CUDA\n");
    return 2;
  }
  if (coll.device != "cuda") {
    std::fprintf(stderr, "muster-bench-gpu: --device must be cuda\n");
    return 2;
  }
  if (coll.op != "all_reduce") {
    std::fprintf(stderr, "muster-bench-gpu: --op: only all_reduce on --device cuda (got '%s')\n",
                 coll.op.c_str());
    return 2;
  }
  if (coll.shared || coll.touch) {
    std::fprintf(stderr, "muster-bench-gpu: --%s is for CPU buffers, not --device cuda\n",
                 coll.shared ? "shared" : "touch");
    return 2;
  }
  Options o;
  if (quick && coll.bytes == "4,4K,256K,4M,64M,256M") coll.bytes = "4,4K,256K,4M";
  if (quick && coll.iters.empty()) coll.iters = "20";
  if (!bench::ParseByteSizes(coll.bytes, &o.bytes)) {
    std::fprintf(stderr, "muster-bench-gpu: --bytes wants positive sizes like 4,4K,256K,4M\n");
    return 2;
  }
  if (coll.iters.empty()) {
    for (int64_t b : o.bytes) o.iters.push_back(DefaultIters(b));
  } else {
    if (!bench::ParseCounts(coll.iters, &o.iters)) {
      std::fprintf(stderr, "muster-bench-gpu: --iters wants positive integers\n");
      return 2;
    }
    if (o.iters.size() == 1) o.iters.assign(o.bytes.size(), o.iters[0]);
    if (o.iters.size() != o.bytes.size()) {
      std::fprintf(stderr, "muster-bench-gpu: --iters: give one count, or one per --bytes size\n");
      return 2;
    }
  }
  o.warmup = coll.warmup;
  absl::StatusOr<DType> dt = ParseDType(coll.dtype.c_str());
  if (!dt.ok() || !NcclReduceType(*dt).ok() || *dt == DType::kBool || DTypeSize(*dt) > 8 ||
      *dt == DType::kInt8 || *dt == DType::kUInt8) {
    std::fprintf(stderr,
                 "muster-bench-gpu: --dtype: one of float32, float64, float16, bfloat16, int32, "
                 "int64\n");
    return 2;
  }
  o.dtype = *dt;
  o.dtype_name = DTypeName(*dt);
  if (impl != "both" && impl != "nccl" && impl != "muster") {
    std::fprintf(stderr, "muster-bench-gpu: --impl must be both, nccl or muster\n");
    return 2;
  }
  o.impl = impl;

  if (!worker_results.empty()) return RunWorker(o, worker_results);

  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "muster-bench-gpu: no CUDA device (%s)\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices visible");
    return 2;
  }
  const int world = nproc > 0 ? static_cast<int>(std::min<int64_t>(nproc, devices)) : devices;
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  std::fprintf(stderr, "muster-bench-gpu: %d GPU(s) visible, world %d, NCCL %d, dtype %s\n",
               devices, world, nccl_version, o.dtype_name.c_str());

  std::vector<Result> nccl, mus;
  int exit_code = 0;
  if (impl != "muster") {
    std::fprintf(stderr, "muster-bench-gpu: (a) in-process NCCL\n");
    nccl = RunNccl(o, world);
    for (const Result& r : nccl) {
      std::printf("%s\n", JsonLine(r, o.dtype_name, "nccl").c_str());
      if (!r.error.empty() || !r.verified) exit_code = 1;
    }
  }
  if (impl != "nccl") {
    std::fprintf(stderr, "muster-bench-gpu: (b) through musterd, %d rank process(es)\n", world);
    char tmpl[] = "/tmp/muster-bench-gpu-XXXXXX";
    int fd = ::mkstemp(tmpl);
    if (fd >= 0) ::close(fd);
    const std::string results = tmpl;
    LaunchOptions l;
    l.nproc_per_node = world;
    l.socket = socket;
    l.musterd_path = FindMusterd(musterd);
    l.job_id = absl::StrCat("bench-gpu-", ::getpid());
    std::vector<std::string> iter_text;
    for (int64_t v : o.iters) iter_text.push_back(absl::StrCat(v));
    l.command = {SelfPath(),
                 "collectives",
                 "--worker-results=" + results,
                 "--bytes=" + absl::StrJoin(o.bytes, ","),
                 "--iters=" + absl::StrJoin(iter_text, ","),
                 absl::StrCat("--warmup=", o.warmup),
                 "--dtype=" + o.dtype_name};
    int launch = RunLaunch(l);
    std::ifstream f(results);
    std::string line;
    while (std::getline(f, line)) {
      Result r;
      if (!ParseLine(line, &r)) continue;
      std::printf("%s\n", line.c_str());
      mus.push_back(r);
      if (!r.error.empty() || !r.verified) exit_code = 1;
    }
    std::remove(results.c_str());
    if (launch != 0) {
      std::fprintf(stderr, "muster-bench-gpu: the muster ranks failed (launcher exit %d)\n",
                   launch);
      exit_code = 1;
    }
    if (mus.size() != o.bytes.size()) exit_code = 1;
  }

  // The side-by-side table.
  std::printf(
      "\nall_reduce on %d GPU(s), %s, in place; p50 of launch + stream sync per "
      "iteration\n\n",
      world, o.dtype_name.c_str());
  std::printf(
      "| bytes | iters | nccl p50 us | muster p50 us | added us | nccl busbw GB/s | "
      "muster busbw GB/s | nccl/muster | target |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  bool latency_met = true, bw_met = true, any_latency = false, any_bw = false;
  for (size_t s = 0; s < o.bytes.size(); ++s) {
    const Result* a = s < nccl.size() ? &nccl[s] : nullptr;
    const Result* b = s < mus.size() ? &mus[s] : nullptr;
    auto ok = [](const Result* r) { return r != nullptr && r->error.empty() && r->p50 > 0; };
    const int64_t size = ok(a) ? a->bytes : ok(b) ? b->bytes : o.bytes[s];
    std::string target = "-";
    if (ok(a) && ok(b)) {
      const double ratio = a->p50 / b->p50, added = b->p50 - a->p50;
      if (size <= 4) {
        any_latency = true;
        latency_met = latency_met && added <= 15.0;
        target = absl::StrFormat("added <= 15 us: %s", added <= 15.0 ? "met" : "MISSED");
      } else if (size >= (64 << 20)) {
        any_bw = true;
        bw_met = bw_met && ratio >= 0.97;
        target = absl::StrFormat("within 3%%: %s", ratio >= 0.97 ? "met" : "MISSED");
      }
      std::printf("| %s | %lld | %.2f | %.2f | %.2f | %.2f | %.2f | %.3f | %s |\n",
                  Size(size).c_str(), static_cast<long long>(b->iters), a->p50, b->p50, added,
                  BusBw(*a), BusBw(*b), ratio, target.c_str());
    } else {
      auto cell = [&](const Result* r, bool bw) -> std::string {
        if (r == nullptr) return "-";
        if (!ok(r)) return "failed";
        return bw ? absl::StrFormat("%.2f", BusBw(*r)) : absl::StrFormat("%.2f", r->p50);
      };
      std::printf("| %s | %lld | %s | %s | - | %s | %s | - | - |\n", Size(size).c_str(),
                  static_cast<long long>(o.iters[s]), cell(a, false).c_str(),
                  cell(b, false).c_str(), cell(a, true).c_str(), cell(b, true).c_str());
    }
  }
  std::printf("\n");
  if (world == 1) {
    std::printf("world 1: busbw is 0 by definition (2(n-1)/n); compare p50 times.\n");
  }
  if (any_latency) {
    std::printf("target 4-byte added latency <= 15 us: %s\n", latency_met ? "met" : "MISSED");
  }
  if (any_bw)
    std::printf("target busbw >= 64 MiB within 3%% of NCCL: %s\n", bw_met ? "met" : "MISSED");
  return exit_code;
}

}  // namespace
}  // namespace muster

int main(int argc, char** argv) { return muster::Main(argc, argv); }
