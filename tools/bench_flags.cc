#include "tools/bench_flags.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace muster::bench {

void AddCollectiveFlags(FlagSet& flags, CollectiveFlags* f) {
  flags.AddString("op", &f->op,
                  "collectives: comma-separated ops: all_reduce (SUM), broadcast (from --root),\n"
                  "all_gather (AllGatherIntoTensor), reduce_scatter (ReduceScatterTensor, SUM),\n"
                  "barrier (CollectiveBarrier; runs once, sizes do not apply). --device cuda:\n"
                  "all_reduce only.");
  flags.AddString("bytes", &f->bytes,
                  "collectives: comma-separated sizes in bytes; K, M, G (or KiB, MiB, GiB) are\n"
                  "powers of 1024, e.g. 4,4K,256K,4M,64M. Rounded down to whole elements (at\n"
                  "least one per rank); the size actually used is reported.");
  flags.AddString("iters", &f->iters,
                  "collectives: timed iterations: one count for every size, or one per --bytes\n"
                  "size (e.g. 1000,1000,200,50,10). barrier uses the largest. --device cuda\n"
                  "default: 1000 up to 1 MiB, 200 up to 16 MiB, 50 above.");
  flags.AddInt("warmup", &f->warmup,
               "collectives: untimed iterations before each size; -1: max(2, iters/10)\n"
               "(--device cuda: max(5, iters/10)).");
  flags.AddString("dtype", &f->dtype,
                  "collectives: element type: float32, float64, float16, bfloat16, int8, uint8,\n"
                  "int32, int64 (--device cuda: not int8/uint8).");
  flags.AddInt("root", &f->root, "collectives: broadcast's root rank.");
  flags.AddBool("verify", &f->verify,
                "collectives: fill deterministic inputs and check the result on every rank,\n"
                "once before and once after each timed loop (verified: true/false; else null;\n"
                "--device cuda always verifies).");
  flags.AddBool("touch", &f->touch,
                "collectives: before each timed iteration (outside the timer) every rank\n"
                "rewrites one byte of each cache line of its input, as a training step\n"
                "rewrites its gradients (without it the inputs of all_gather and broadcast\n"
                "stay the same, and in the caches, from one iteration to the next; CPU only).");
  flags.AddBool("shared", &f->shared,
                "collectives: buffers from muster::AllocShared (peers read them in place)\n"
                "instead of the heap (CPU buffers only).");
  flags.AddBool("trace-compare", &f->trace_compare,
                "collectives: the flight recorder's cost: every op and size on two groups of\n"
                "all ranks, one recording and one not, interleaved in one run; plus the\n"
                "recorder's own time per collective (CPU only).");
  flags.AddString("pin", &f->pin,
                  "collectives: none (the scheduler places the ranks) or rank (rank r runs on\n"
                  "allowed CPU local_rank mod #CPUs, all its threads included; CPU only).");
  flags.AddString("device", &f->device,
                  "collectives: cpu (muster-bench, under muster-run) or cuda (muster-bench-gpu,\n"
                  "run directly: in-process NCCL and musterd side by side).");
}

bool ParseByteSizes(const std::string& text, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::string p = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(part));
    int64_t mult = 1;
    if (absl::EndsWith(p, "IB")) p.resize(p.size() - 2);  // 4KiB
    if (absl::EndsWith(p, "B")) p.resize(p.size() - 1);   // 4KB, 4B
    if (!p.empty()) {
      char s = p.back();
      if (s == 'K') mult = int64_t{1} << 10;
      if (s == 'M') mult = int64_t{1} << 20;
      if (s == 'G') mult = int64_t{1} << 30;
      if (mult != 1) p.pop_back();
    }
    int64_t v = 0;
    if (!absl::SimpleAtoi(p, &v) || v <= 0 || v > (int64_t{1} << 40) / mult) return false;
    out->push_back(v * mult);
  }
  return !out->empty();
}

bool ParseCounts(const std::string& text, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &v) || v <= 0) return false;
    out->push_back(v);
  }
  return true;
}

}  // namespace muster::bench
