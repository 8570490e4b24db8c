/* What the standalone C benchmarks share (tools/bench_mpi_collectives.c,
 * tools/bench_copy_floor.c; each is built with one compiler command, so
 * this header holds static functions only): size lists, a monotonic clock
 * in microseconds and the comparison for qsort of doubles. Thread-safe:
 * no state. */
#ifndef MUSTER_TOOLS_BENCH_C_UTIL_H_
#define MUSTER_TOOLS_BENCH_C_UTIL_H_

#include <stdlib.h>
#include <time.h>

/* Parses "4,4K,256K,4M" (K/M/G suffixes, powers of two) into out[0..max).
 * Returns the count, or -1 for anything else: an empty or non-positive
 * entry, an unknown suffix, more than `max` entries. */
static inline int bench_parse_list(const char* text, long long* out, int max) {
  int n = 0;
  const char* p = text;
  while (*p != 0) {
    char* end = NULL;
    long long v = strtoll(p, &end, 10);
    if (end == p || v <= 0 || n == max) return -1;
    if (*end == 'K' || *end == 'k')
      v <<= 10, ++end;
    else if (*end == 'M' || *end == 'm')
      v <<= 20, ++end;
    else if (*end == 'G' || *end == 'g')
      v <<= 30, ++end;
    out[n++] = v;
    if (*end == ',')
      ++end;
    else if (*end != 0)
      return -1;
    p = end;
  }
  return n > 0 ? n : -1;
}

static inline double bench_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static inline int bench_cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

#endif /* MUSTER_TOOLS_BENCH_C_UTIL_H_ */
