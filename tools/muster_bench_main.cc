// muster-bench: benchmarks of muster against the peer it replaces.
// `muster-bench --help` lists every flag. Benchmarks: `muster-bench store`
// (see tools/bench_store.h) and `muster-bench collectives`, run under
// muster-run (see tools/bench_collectives.h).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "tools/bench_collectives.h"
#include "tools/bench_flags.h"
#include "tools/bench_store.h"

namespace {

// Parses "1,16,64" into positive integers.
// `collectives --device cuda` runs in muster-bench-gpu (it links CUDA and
// NCCL; muster-bench never does): $MUSTER_BENCH_GPU, else next to this
// binary (both are in tools/).
std::string FindBenchGpu() {
  if (const char* env = std::getenv("MUSTER_BENCH_GPU"); env != nullptr && *env != '\0') {
    return env;
  }
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  std::filesystem::path beside = self.parent_path() / "muster-bench-gpu";
  if (::access(beside.c_str(), X_OK) == 0) return beside.lexically_normal().string();
  return "";
}

// True when the arguments ask for --device cuda (either spelling).
bool WantsCuda(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a == "--device=cuda" ||
        (a == "--device" && i + 1 < argc && std::string(argv[i + 1]) == "cuda")) {
      return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  namespace bench = muster::bench;
  if (WantsCuda(argc, argv)) {
    const std::string gpu = FindBenchGpu();
    if (gpu.empty()) {
      std::fprintf(stderr,
                   "muster-bench: --device cuda runs muster-bench-gpu, which was not found next "
                   "to muster-bench; build it (bazel build //tools:muster-bench-gpu) or "
                   "set MUSTER_BENCH_GPU\n");
      return 2;
    }
    std::vector<char*> args = {const_cast<char*>(gpu.c_str())};
    for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    ::execv(gpu.c_str(), args.data());
    std::fprintf(stderr, "muster-bench: cannot run %s: %s\n", gpu.c_str(), std::strerror(errno));
    return 2;
  }
  bench::StoreBenchOptions defaults;
  std::string ops = absl::StrJoin(bench::AllLatencyOps(), ",");
  std::string clients = "1,16,64,256";
  std::string barrier = "64,256,1024";
  int64_t connections = defaults.connections;
  double duration = defaults.duration_seconds;
  int64_t iterations = defaults.latency_iterations;
  int64_t warmup = defaults.warmup_iterations;
  std::string pin = defaults.latency_pin;
  int64_t repeats = defaults.barrier_repeats;
  int64_t value_bytes = defaults.value_bytes;
  bool json = false;
  bool no_torch = false;
  bool quick = false;
  std::string musterd;
  std::string python = defaults.python_path;
  double start_timeout = defaults.server_start_timeout_seconds;
  // collectives
  bench::CollectivesBenchOptions cdefaults;
  bench::CollectiveFlags coll;
  coll.op = absl::StrJoin(bench::AllCollectiveOps(), ",");
  coll.bytes = "4,4K,256K,4M";
  coll.iters = "100";
  coll.warmup = cdefaults.warmup;
  coll.root = cdefaults.root;
  coll.dtype = cdefaults.dtype;
  coll.pin = cdefaults.pin;
  std::string client = "native";

  muster::FlagSet flags(
      "muster-bench",
      "muster-bench: benchmarks muster against the system it replaces.\n"
      "Usage: muster-bench store [flags]\n"
      "       muster-run --nproc-per-node N -- muster-bench collectives [flags]\n"
      "\n"
      "store: runs the same workloads with the same C++ client (muster::TcpStore)\n"
      "against musterd's store (native protocol) and a PyTorch 1.13 TCPStore master\n"
      "(torch 1.13 protocol), both started here as child processes and stopped at the\n"
      "end: per-op latency from one client, set+get throughput at several client\n"
      "counts (one thread and one connection per client), a rendezvous barrier of N\n"
      "clients, and N simultaneous connections with one add each. Prints a table (or\n"
      "JSON lines with --json) with both systems and their ratio (> 1: musterd is\n"
      "better), then whether the issue's targets are met. Progress goes to stderr.\n"
      "Exit status: 0 when every step ran and musterd had no errors, 1 otherwise,\n"
      "2 for bad usage.\n"
      "\n"
      "store --client torch: PyTorch's own TCPStore client processes (the torch of\n"
      "--python: 1.13, or 2.x from a venv) against musterd, against that torch's\n"
      "TCPStore master and against a minimal floor server (tools/store_floor_server.cc:\n"
      "no logging, no durability), in one run: set+get throughput and server CPU per\n"
      "operation at each --clients count (default 16,64), and the ratios to torch's\n"
      "(goals for musterd: throughput >= 1.2x, CPU per op <= 0.5x; the floor's show\n"
      "what any server pays on the machine). Runs tools/bench_store_torch.py (next to\n"
      "this binary in its runfiles, or $MUSTER_BENCH_STORE_TORCH).\n"
      "\n"
      "collectives: every rank of a job started by muster-run runs it. Each joins with\n"
      "muster::World::Init and, for every --op and --bytes size, runs --warmup untimed\n"
      "and --iters timed iterations of the op on the world group (submit, Wait(); no\n"
      "barrier between iterations). Per iteration the slowest rank's time counts\n"
      "(all_reduce MAX of every rank's times); rank 0 prints p50/p99/min/mean and the\n"
      "bus bandwidth as nccl-tests defines it (all_reduce algbw*2(n-1)/n, all_gather and\n"
      "reduce_scatter algbw*(n-1)/n, broadcast algbw; algbw = bytes / p50). --bytes is\n"
      "the whole buffer of all_reduce/broadcast, the gathered output of all_gather and\n"
      "the input of reduce_scatter. Exit status: 0, 1 if a collective failed or\n"
      "--verify found a wrong element, 2 for bad usage.\n"
      "\n"
      "collectives --device cuda (run it directly, not under muster-run): all_reduce on\n"
      "CUDA buffers through in-process NCCL and through musterd side by side, one rank\n"
      "process per GPU; muster-bench execs muster-bench-gpu (next to it in bazel-bin, or\n"
      "$MUSTER_BENCH_GPU) with the same flags: see muster-bench-gpu --help.\n"
      "\n"
      "Flags of collectives: --op --bytes --iters --warmup --dtype --root --verify --touch "
      "--shared\n"
      "--pin --json --quick --device. The others are store's.");
  flags.AddString("ops", &ops,
                  "Latency workload: comma-separated ops, each timed from one client.\n"
                  "Known: set, get, add, compare_set, check, wait, delete_key, num_keys.\n"
                  "Empty: no latency workload.");
  flags.AddInt("latency-iterations", &iterations, "Timed calls per latency op.");
  flags.AddInt("warmup-iterations", &warmup, "Untimed calls before each latency op.");
  flags.AddString("latency-pin", &pin,
                  "CPU placement for the latency workload only: split (the client thread on\n"
                  "one CPU, the servers on another: every call crosses CPUs), same (all on one\n"
                  "CPU) or none (the scheduler decides; on a small VM the p50 then depends on\n"
                  "where the threads happen to land).");
  flags.AddString("clients", &clients,
                  "Throughput workload: comma-separated client counts (each client is a\n"
                  "thread with its own connection doing set+get on its own keys).\n"
                  "Empty: no throughput workload.");
  flags.AddDouble("duration-seconds", &duration, "How long each throughput row runs.");
  flags.AddInt("value-bytes", &value_bytes, "Size of the values set and read.");
  flags.AddString("barrier", &barrier,
                  "Barrier workload: comma-separated client counts N (N threads, each with\n"
                  "its own connection, Add(\"barrier\", 1); the last sets \"release\", the\n"
                  "others Get it). Empty: no barrier workload.");
  flags.AddInt("barrier-repeats", &repeats, "Runs per barrier size (the median is reported).");
  flags.AddInt("connections", &connections,
               "Connections workload: how many simultaneous client connections to open\n"
               "and hold, with one add on each. 0: skipped.");
  flags.AddString("client", &client,
                  "store: native (the C++ client, every workload) or torch (PyTorch's own\n"
                  "client processes, throughput and server CPU; see above).");
  flags.AddBool("json", &json, "Print one JSON object per line instead of a table.");
  flags.AddBool("no-torch", &no_torch, "Benchmark musterd alone (no PyTorch master).");
  flags.AddBool("quick", &quick,
                "Smoke mode: every workload briefly at small sizes, musterd only (implies\n"
                "--no-torch). Size flags left at their defaults get small values.\n"
                "collectives: every op at 4,4K,256K,5M+4 bytes (5M+4 spans several shared-\n"
                "memory slots), 10 iterations, 2 warm-up, unless those flags are given.");
  flags.AddString("musterd", &musterd,
                  "The musterd binary. Empty: bazel-bin/daemon/musterd next to this binary\n"
                  "(or in its runfiles).");
  flags.AddString("python", &python,
                  "Python that imports Debian's python3-torch (PyTorch 1.13), used to start\n"
                  "the TCPStore master.");
  flags.AddDouble("start-timeout-seconds", &start_timeout,
                  "How long each server may take to become ready.");
  bench::AddCollectiveFlags(flags, &coll);
  std::vector<std::string> positional = flags.ParseOrExit(argc, argv);
  if (coll.device != "cpu") {
    std::fprintf(stderr, "muster-bench: --device must be cpu or cuda\n");
    return 2;
  }

  if (positional.empty()) {
    std::fprintf(stderr,
                 "muster-bench: name a benchmark: muster-bench store|collectives [flags] (see "
                 "--help)\n");
    return 2;
  }
  if ((positional[0] != "store" && positional[0] != "collectives") || positional.size() > 1) {
    std::fprintf(
        stderr, "muster-bench: unknown benchmark '%s' (known: store, collectives; see --help)\n",
        positional.size() > 1 && (positional[0] == "store" || positional[0] == "collectives")
            ? positional[1].c_str()
            : positional[0].c_str());
    return 2;
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  const std::string command_line = absl::StrCat("muster-bench ", absl::StrJoin(args, " "));

  if (positional[0] == "collectives") {
    bench::CollectivesBenchOptions c;
    if (quick) {
      if (coll.bytes == "4,4K,256K,4M") coll.bytes = "4,4K,256K,5242884";
      if (coll.iters == "100") coll.iters = "10";
      if (coll.warmup == cdefaults.warmup) coll.warmup = 2;
    }
    c.ops = std::vector<std::string>(absl::StrSplit(coll.op, ',', absl::SkipWhitespace()));
    if (c.ops.empty()) {
      std::fprintf(stderr, "muster-bench: --op names no op\n");
      return 2;
    }
    if (!bench::ParseByteSizes(coll.bytes, &c.bytes)) {
      std::fprintf(stderr, "muster-bench: --bytes wants positive sizes like 4,4K,256K,4M\n");
      return 2;
    }
    if (!bench::ParseCounts(coll.iters, &c.iters) || c.iters.empty()) {
      std::fprintf(stderr, "muster-bench: --iters wants positive integers like 100 or 1000,50\n");
      return 2;
    }
    if (coll.warmup < -1) {
      std::fprintf(stderr, "muster-bench: --warmup must be >= 0 (or -1: automatic)\n");
      return 2;
    }
    if (coll.touch && coll.trace_compare) {
      std::fprintf(stderr,
                   "muster-bench: --touch and --trace-compare do not go together (the "
                   "recorder comparison keeps its inputs)\n");
      return 2;
    }
    c.warmup = coll.warmup;
    c.dtype = coll.dtype;
    c.root = static_cast<int>(coll.root);
    c.verify = coll.verify;
    c.touch = coll.touch;
    c.json = json;
    c.pin = coll.pin;
    c.shared = coll.shared;
    c.trace_compare = coll.trace_compare;
    c.command_line = command_line;
    return bench::RunCollectivesBench(c);
  }

  if (client != "native" && client != "torch") {
    std::fprintf(stderr, "muster-bench: --client must be native or torch\n");
    return 2;
  }
  if (client == "torch") {
    return bench::RunStoreBenchWithTorchClients(
        bench::FindMusterd(musterd, argv[0]), python, clients == "1,16,64,256" ? "16,64" : clients,
        duration == defaults.duration_seconds ? 3.0 : duration, value_bytes, json, argv[0]);
  }

  if (quick) {
    no_torch = true;
    if (clients == "1,16,64,256") clients = "1,8";
    if (barrier == "64,256,1024") barrier = "8,64";
    if (connections == defaults.connections) connections = 256;
    if (duration == defaults.duration_seconds) duration = 0.3;
    if (iterations == defaults.latency_iterations) iterations = 200;
    if (warmup == defaults.warmup_iterations) warmup = 20;
    if (repeats == defaults.barrier_repeats) repeats = 1;
  }

  bench::StoreBenchOptions o;
  o.ops = std::vector<std::string>(absl::StrSplit(ops, ',', absl::SkipWhitespace()));
  for (const std::string& op : o.ops) {
    bool known = false;
    for (const std::string& k : bench::AllLatencyOps()) known = known || k == op;
    if (!known) {
      std::fprintf(stderr, "muster-bench: --ops: unknown op '%s' (known: %s)\n", op.c_str(),
                   absl::StrJoin(bench::AllLatencyOps(), ", ").c_str());
      return 2;
    }
  }
  if (!bench::ParseCounts(clients, &o.clients)) {
    std::fprintf(stderr, "muster-bench: --clients wants positive integers like 1,16,64\n");
    return 2;
  }
  if (!bench::ParseCounts(barrier, &o.barrier)) {
    std::fprintf(stderr, "muster-bench: --barrier wants positive integers like 64,256,1024\n");
    return 2;
  }
  if (pin != "split" && pin != "same" && pin != "none") {
    std::fprintf(stderr, "muster-bench: --latency-pin must be split, same or none\n");
    return 2;
  }
  if (connections < 0 || iterations <= 0 || warmup < 0 || repeats <= 0 || value_bytes < 0 ||
      !(duration > 0) || !(start_timeout > 0)) {
    std::fprintf(stderr,
                 "muster-bench: --connections, --warmup-iterations and --value-bytes must be "
                 ">= 0; --latency-iterations, --barrier-repeats, --duration-seconds and "
                 "--start-timeout-seconds > 0\n");
    return 2;
  }
  o.latency_iterations = iterations;
  o.warmup_iterations = warmup;
  o.latency_pin = pin;
  o.duration_seconds = duration;
  o.value_bytes = value_bytes;
  o.barrier_repeats = repeats;
  o.connections = connections;
  o.json = json;
  o.torch = !no_torch;
  o.python_path = python;
  o.server_start_timeout_seconds = start_timeout;
  o.musterd_path = bench::FindMusterd(musterd, argv[0]);
  o.command_line = command_line;
  return bench::RunStoreBench(o);
}
