#include "common/fast_clock.h"

#include <time.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace muster {
namespace {

constexpr int64_t kCalibrateNanos = 10'000'000;  // the rate's first baseline
constexpr int64_t kAnchorNanos = 20'000'000;     // between anchors
constexpr int64_t kStepNanos = 100'000;          // an anchor this far off: the clock was set

int64_t RealtimeNanos() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

bool KernelKeepsTimeWithTsc() {
#if defined(__x86_64__)
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  return static_cast<bool>(f >> name) && name == "tsc";
#else
  return false;
#endif
}

uint64_t ReadTsc() {
#if defined(__x86_64__)
  return __builtin_ia32_rdtsc();
#else
  return 0;
#endif
}

// One thread's mapping from the counter to Unix time (trivially
// destructible: usable until the thread's very end).
struct TscMapping {
  uint64_t base_tsc = 0;  // the rate's baseline: the first exact read
  int64_t base_ns = 0;
  uint64_t anchor_tsc = 0;  // the latest anchor
  int64_t anchor_ns = 0;
  uint64_t next_anchor_tsc = 0;  // 0: not calibrated (exact reads)
  double ns_per_tick = 0;
  int64_t last_ns = 0;  // the last value returned (never decreases)
};
thread_local TscMapping mapping;

// A counter value and clock_gettime read together: of three tries, the
// one with the shortest span between two counter reads around the clock.
void ReadPair(uint64_t* tsc, int64_t* ns) {
  uint64_t best_span = UINT64_MAX;
  for (int i = 0; i < 3; ++i) {
    uint64_t before = ReadTsc();
    int64_t now = RealtimeNanos();
    uint64_t after = ReadTsc();
    if (after >= before && after - before < best_span) {
      best_span = after - before;
      *tsc = before + (after - before) / 2;
      *ns = now;
    }
  }
  if (best_span == UINT64_MAX) {  // the counter went back within the tries
    *tsc = ReadTsc();
    *ns = RealtimeNanos();
  }
}

// Small steps back (a new anchor, a thread moving to a CPU whose counter
// is a few ticks behind) are held at the last value; a large one is the
// clock being set back, which is followed.
int64_t Monotone(TscMapping& m, int64_t ns) {
  if (ns >= m.last_ns || m.last_ns - ns > kStepNanos) m.last_ns = ns;
  return m.last_ns;
}

// Off the fast path: exact reads while calibrating, and each anchor.
int64_t Reanchor(TscMapping& m) {
  if (m.base_tsc != 0 && m.next_anchor_tsc == 0) {  // calibrating: exact reads
    int64_t ns = RealtimeNanos();
    if (ns >= m.base_ns && ns - m.base_ns < kCalibrateNanos) return Monotone(m, ns);
  }
  uint64_t tsc;
  int64_t ns;
  ReadPair(&tsc, &ns);
  bool restart = m.base_tsc == 0 || tsc < m.anchor_tsc || ns < m.base_ns;
  if (!restart && m.next_anchor_tsc != 0) {
    // Where the mapping had the counter against the clock: far off means
    // the clock was set (or the counter jumped): calibrate anew.
    int64_t predicted =
        m.anchor_ns + static_cast<int64_t>(static_cast<double>(tsc - m.anchor_tsc) * m.ns_per_tick);
    restart = predicted - ns > kStepNanos || ns - predicted > kStepNanos;
  }
  if (restart) {
    m = TscMapping{tsc, ns, tsc, ns, 0, 0, m.last_ns};
    return Monotone(m, ns);
  }
  m.anchor_tsc = tsc;
  m.anchor_ns = ns;
  if (ns - m.base_ns >= kCalibrateNanos && tsc > m.base_tsc) {
    m.ns_per_tick = static_cast<double>(ns - m.base_ns) / static_cast<double>(tsc - m.base_tsc);
    m.next_anchor_tsc =
        tsc + static_cast<uint64_t>(static_cast<double>(kAnchorNanos) / m.ns_per_tick);
  }
  return Monotone(m, ns);
}

}  // namespace

bool FastClockUsesTsc() {
  static const bool uses_tsc = KernelKeepsTimeWithTsc();
  return uses_tsc;
}

int64_t FastRealtimeNanos() {
  if (!FastClockUsesTsc()) return RealtimeNanos();
  TscMapping& m = mapping;
  uint64_t tsc = ReadTsc();
  if (tsc < m.anchor_tsc || tsc >= m.next_anchor_tsc) return Reanchor(m);
  return Monotone(m, m.anchor_ns + static_cast<int64_t>(static_cast<double>(tsc - m.anchor_tsc) *
                                                        m.ns_per_tick));
}

}  // namespace muster
