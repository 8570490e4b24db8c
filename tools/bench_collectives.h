// `muster-bench collectives`: times muster's CPU collectives on the world
// group of a job started by muster-run (every rank runs the benchmark):
//
//   muster-run --nproc-per-node 4 -- muster-bench collectives --op all_reduce
//       --bytes 4,4K,4M --iters 100 --verify --json
//
// Each rank joins with muster::World::Init({}). For every op and size it runs
// `warmup` untimed and then `iters` timed iterations of the op on the world
// group (submit, then Work::Wait()), back to back with no barrier in between:
// each collective synchronizes the ranks by itself. Every rank records the
// time of each iteration; after the loop one all_reduce(MAX) of those times
// gives, per iteration, the slowest rank's time, and rank 0 reports their
// median (p50_us) and the bus bandwidth derived from it.
//
// Sizes follow nccl-tests: `bytes` is the whole buffer of all_reduce and
// broadcast, the gathered output of all_gather and the input of
// reduce_scatter (each rank contributes / receives bytes/world). Sizes are
// rounded down to whole elements (at least one per rank); the reported
// `bytes` is the size actually used. algbw = bytes / time; busbw = algbw *
// 2(n-1)/n (all_reduce), * (n-1)/n (all_gather, reduce_scatter), * 1
// (broadcast); barrier has neither.
//
// Not thread-safe: call RunCollectivesBench once, from main().
#ifndef MUSTER_TOOLS_BENCH_COLLECTIVES_H_
#define MUSTER_TOOLS_BENCH_COLLECTIVES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace muster::bench {

struct CollectivesBenchOptions {
  // all_reduce, broadcast, all_gather, reduce_scatter, barrier (in this order
  // of the list given).
  std::vector<std::string> ops;
  // Sizes in bytes (see above). barrier ignores them and runs once.
  std::vector<int64_t> bytes;
  // Timed iterations: one value for every size, or one per size.
  std::vector<int64_t> iters;
  // Untimed iterations before each size; -1: max(2, iters/10).
  int64_t warmup = -1;
  std::string dtype = "float32";
  int root = 0;  // broadcast's root
  // Check every rank's result with deterministic inputs, once before and once
  // after the timed loop.
  bool verify = false;
  // Rewrite one byte per cache line of every rank's input before each
  // timed iteration (outside the timer), as a training step rewrites its
  // gradients.
  bool touch = false;
  bool json = false;
  // Buffers from muster::AllocShared (zero-copy collectives) instead of the
  // heap; JSON lines then say "system":"muster-shared".
  bool shared = false;
  // "none", or "rank": pin each rank to CPU local_rank % (allowed CPUs).
  std::string pin = "none";
  // The flight recorder's cost (backends/shm/trace.h): each op and size runs
  // on two groups of all ranks, "bench_trace_on" (recording) and
  // "bench_trace_off" (GroupOptions::trace_records = 0), in alternating
  // blocks of iterations, and rank 0 reports both medians and means and
  // their difference; then the recorder alone (Begin, Started, Finished
  // and a clock read per collective, on a private segment) is timed. With
  // MUSTER_BENCH_TRACE_AA=1 neither group records (an A/A run: the noise
  // of the method).
  bool trace_compare = false;
  std::string command_line;  // printed in the table header
};

// The known ops, in their default order.
const std::vector<std::string>& AllCollectiveOps();

// Runs the benchmark on this rank; rank 0 prints the results to stdout
// (errors go to stderr, prefixed with the rank). Returns the exit status: 0,
// 1 if a collective failed or verification found a wrong result, 2 for bad
// options.
int RunCollectivesBench(const CollectivesBenchOptions& options);

}  // namespace muster::bench

#endif  // MUSTER_TOOLS_BENCH_COLLECTIVES_H_
