// The flags of `muster-bench collectives`, shared by muster-bench (CPU
// buffers, every rank under muster-run) and muster-bench-gpu (--device
// cuda; muster-bench execs it with the same command line), and the parsing
// of the lists they take.
//
// Not thread-safe: use from main().
#ifndef MUSTER_TOOLS_BENCH_FLAGS_H_
#define MUSTER_TOOLS_BENCH_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/flags.h"

namespace muster::bench {

struct CollectiveFlags {
  // Each binary sets its own defaults before AddCollectiveFlags.
  std::string op;
  std::string bytes;
  std::string iters;
  int64_t warmup = -1;  // -1: automatic
  std::string dtype = "float32";
  int64_t root = 0;
  bool verify = false;
  bool touch = false;
  bool shared = false;
  bool trace_compare = false;
  std::string pin = "none";
  std::string device = "cpu";
};

// Registers --op --bytes --iters --warmup --dtype --root --verify --touch
// --shared --pin --device, bound to `f`.
void AddCollectiveFlags(FlagSet& flags, CollectiveFlags* f);

// "4,4K,256K,4M,64M": K/M/G (or KiB/MiB/GiB, KB/MB/GB) are powers of 1024;
// plain numbers are bytes. False on a malformed or non-positive entry.
bool ParseByteSizes(const std::string& text, std::vector<int64_t>* out);
// "100" or "1000,200,50": positive integers (empty text: an empty list).
bool ParseCounts(const std::string& text, std::vector<int64_t>* out);

}  // namespace muster::bench

#endif  // MUSTER_TOOLS_BENCH_FLAGS_H_
