// FastRealtimeNanos: Unix time in nanoseconds, as clock_gettime(CLOCK_REALTIME)
// gives it, for timestamps taken on every collective (the flight
// recorder's). Within a collective on the 2-vCPU VM of docs/benchmarks.md
// each clock_gettime cost ~60 ns (it reads the time-stamp counter with a
// fence, then the kernel's shared time page), two of them ~10% of a
// world-2 all_reduce.
//
// Where the kernel keeps time with the CPU's time-stamp counter itself
// (clocksource "tsc": the kernel checked that it is invariant and in step
// on every CPU; x86-64 only), this reads the counter without a fence and
// scales it: each thread anchors the counter to clock_gettime, calibrates
// its rate over its first 10 ms (exact reads until then) and re-anchors
// every 20 ms of the counter, so it follows clock adjustments (a step of
// the clock is caught at the next anchor); between anchors it is within
// about a microsecond of clock_gettime. Elsewhere it is clock_gettime.
// Never decreases within a thread.
//
// Thread-safe (the state is per thread).
#ifndef MUSTER_COMMON_FAST_CLOCK_H_
#define MUSTER_COMMON_FAST_CLOCK_H_

#include <cstdint>

namespace muster {

int64_t FastRealtimeNanos();

// Whether FastRealtimeNanos reads the time-stamp counter on this machine.
bool FastClockUsesTsc();

}  // namespace muster

#endif  // MUSTER_COMMON_FAST_CLOCK_H_
