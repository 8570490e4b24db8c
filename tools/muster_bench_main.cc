// muster-bench: benchmarks of muster against the peer it replaces.
// `muster-bench --help` lists every flag; today the only benchmark is
// `muster-bench store` (see tools/bench_store.h).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "tools/bench_store.h"

namespace {

// Parses "1,16,64" into positive integers.
bool ParseIntList(const std::string& text, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) return false;
    out->push_back(v);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  namespace bench = muster::bench;
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

  muster::FlagSet flags(
      "muster-bench",
      "muster-bench: benchmarks muster against the system it replaces.\n"
      "Usage: muster-bench store [flags]\n"
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
      "2 for bad usage.");
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
  flags.AddBool("json", &json, "Print one JSON object per line instead of a table.");
  flags.AddBool("no-torch", &no_torch, "Benchmark musterd alone (no PyTorch master).");
  flags.AddBool("quick", &quick,
                "Smoke mode: every workload briefly at small sizes, musterd only (implies\n"
                "--no-torch). Size flags left at their defaults get small values.");
  flags.AddString("musterd", &musterd,
                  "The musterd binary. Empty: bazel-bin/daemon/musterd next to this binary\n"
                  "(or in its runfiles).");
  flags.AddString("python", &python,
                  "Python that imports Debian's python3-torch (PyTorch 1.13), used to start\n"
                  "the TCPStore master.");
  flags.AddDouble("start-timeout-seconds", &start_timeout,
                  "How long each server may take to become ready.");
  std::vector<std::string> positional = flags.ParseOrExit(argc, argv);

  if (positional.empty()) {
    std::fprintf(stderr,
                 "muster-bench: name a benchmark: muster-bench store [flags] (see --help)\n");
    return 2;
  }
  if (positional[0] != "store" || positional.size() > 1) {
    std::fprintf(stderr, "muster-bench: unknown benchmark '%s' (known: store; see --help)\n",
                 positional.size() > 1 && positional[0] == "store" ? positional[1].c_str()
                                                                   : positional[0].c_str());
    return 2;
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
  if (!ParseIntList(clients, &o.clients)) {
    std::fprintf(stderr, "muster-bench: --clients wants positive integers like 1,16,64\n");
    return 2;
  }
  if (!ParseIntList(barrier, &o.barrier)) {
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
  std::vector<std::string> args(argv + 1, argv + argc);
  o.command_line = absl::StrCat("muster-bench ", absl::StrJoin(args, " "));
  return bench::RunStoreBench(o);
}
