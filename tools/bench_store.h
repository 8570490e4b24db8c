// `muster-bench store`: the same workloads, with the same C++ client
// (muster::TcpStore), against musterd's store (native protocol) and against a
// PyTorch 1.13 TCPStore master (TcpStoreOptions::Protocol::kTorch113). Both
// servers are started by the benchmark as child processes and stopped at the
// end.
//
// Workloads: per-op latency from one client, set+get throughput at several
// client counts (one thread and one connection per client), a rendezvous
// barrier of N clients, and N simultaneous connections held open.
//
// Not thread-safe: call RunStoreBench once, from main().
#ifndef MUSTER_TOOLS_BENCH_STORE_H_
#define MUSTER_TOOLS_BENCH_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace muster::bench {

struct StoreBenchOptions {
  // Latency workload: these ops, `latency_iterations` timed calls each after
  // `warmup_iterations` untimed ones. Empty: no latency workload.
  std::vector<std::string> ops;
  int64_t latency_iterations = 5000;
  int64_t warmup_iterations = 500;
  // Where the latency workload runs (the other workloads are not pinned):
  // "split": the client thread on one CPU, every server thread on another
  // (the ping-pong always crosses CPUs); "same": all on one CPU; "none": the
  // scheduler decides (on a 2-vCPU VM this makes p50 bimodal, see
  // docs/benchmarks.md).
  std::string latency_pin = "split";
  // Throughput workload: one row per client count. Empty: skipped.
  std::vector<int64_t> clients;
  double duration_seconds = 2;
  int64_t value_bytes = 64;
  // Barrier workload: one row per N. Empty: skipped.
  std::vector<int64_t> barrier;
  int64_t barrier_repeats = 3;
  // Connections workload: how many; 0: skipped.
  int64_t connections = 4096;

  bool json = false;
  bool torch = true;  // also run against PyTorch 1.13
  std::string musterd_path;
  std::string python_path = "/usr/bin/python3";
  double server_start_timeout_seconds = 120;
  // Printed in the report (what was run).
  std::string command_line;
};

// The ops the latency workload knows, in their default order.
const std::vector<std::string>& AllLatencyOps();

// Where musterd is: `flag` if set, else next to this binary in bazel-bin or
// in its runfiles. Empty if not found.
std::string FindMusterd(const std::string& flag, const char* argv0);

// `muster-bench store --client torch`: execs tools/bench_store_torch.py
// (PyTorch's own client processes against musterd and torch's master) with
// these settings; returns its exit status (127 if it cannot be started).
int RunStoreBenchWithTorchClients(const std::string& musterd, const std::string& python,
                                  const std::string& clients, double duration_seconds,
                                  int64_t value_bytes, bool json, const char* argv0);

// Runs every selected workload and prints the results to stdout (progress to
// stderr). Returns the exit status: 0 when every step ran and musterd had no
// errors, 1 otherwise. PyTorch's errors are reported, not fatal.
int RunStoreBench(const StoreBenchOptions& options);

}  // namespace muster::bench

#endif  // MUSTER_TOOLS_BENCH_STORE_H_
