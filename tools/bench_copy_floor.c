/* The copy floor of a collective on this machine: how fast one pass of
 * copies can move a collective's bytes between processes, with no protocol
 * around it. docs/benchmarks.md compares muster's and Open MPI's large
 * collectives with it ("Issue 19, 2026-12-03"): a collective over
 * ordinary (heap) buffers cannot move its bytes faster than one copy each.
 *
 *   cc -O2 -o bench_copy_floor tools/bench_copy_floor.c
 *   bench_copy_floor --world 2 --pattern gather --bytes 16M,64M --iters 20
 *
 * --world N forks N ranks (rank r pinned to CPU r modulo the CPUs this
 * process may use). Every rank owns a heap input and a heap output. Per
 * iteration, between two barriers (timed on every rank; the slowest rank's
 * time counts):
 *   --pattern gather     each rank copies every other rank's input (bytes/N
 *                        each: `bytes` is the gathered output, as in
 *                        nccl-tests) into its output: all_gather's data;
 *   --pattern broadcast  every rank but 0 copies rank 0's input (`bytes`);
 *   --pattern private    each rank copies its own input to its output
 *                        (`bytes`; no other core's data: the reference).
 * --method cma (default): the copies are process_vm_readv calls on the
 * peer's heap buffer, one kernel copy (what Open MPI's vader BTL and
 * muster's CMA path do); --method shared: the inputs live in one shared
 * mapping and the copies are memcpy (one user-space copy, no page pinning:
 * what AllocShared buffers allow). --touch: every rank rewrites one byte per
 * cache line of its input before each iteration, outside the timer.
 * --chunk B: copy in calls of B bytes (K/M suffixes; default: one call per
 * peer part), as a pipelined implementation does.
 * Prints one JSON line per size: p50_us (median of the slowest rank's
 * times), copied bytes per rank and their GB/s (1e9 B/s) at the p50.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_LIST 32
#define MAX_WORLD 16

enum { GATHER, BROADCAST, PRIVATE };

/* What the ranks share: a barrier, every rank's buffer addresses and pid,
 * and every rank's per-iteration times. */
struct Shared {
  _Atomic uint64_t arrived;
  _Atomic uint64_t generation;
  pid_t pid[MAX_WORLD];
  char* input[MAX_WORLD];
  double times[MAX_WORLD][4096];
};

static int parse_list(const char* text, long long* out) {
  int n = 0;
  const char* p = text;
  while (*p != 0 && n < MAX_LIST) {
    char* end = NULL;
    long long v = strtoll(p, &end, 10);
    if (end == p || v <= 0) return -1;
    if (*end == 'K' || *end == 'k') v <<= 10, ++end;
    else if (*end == 'M' || *end == 'm') v <<= 20, ++end;
    else if (*end == 'G' || *end == 'g') v <<= 30, ++end;
    out[n++] = v;
    if (*end == ',') ++end;
    else if (*end != 0) return -1;
    p = end;
  }
  return n;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* A sense-counting barrier: spins, then yields (ranks may share a CPU). */
static void barrier(struct Shared* s, int world) {
  uint64_t gen = atomic_load(&s->generation);
  if (atomic_fetch_add(&s->arrived, 1) + 1 == (uint64_t)world) {
    atomic_store(&s->arrived, 0);
    atomic_store(&s->generation, gen + 1);
    return;
  }
  for (int polls = 0; atomic_load(&s->generation) == gen; ++polls) {
    if (polls > 1000) sched_yield();
  }
}

/* Bytes per copy call (--chunk; 0: the whole part in one call). */
static size_t g_chunk = 0;

static int copy_from(int method, pid_t pid, char* remote, char* local, size_t n) {
  while (n > 0 && method == 1) {
    size_t step = g_chunk == 0 || g_chunk > n ? n : g_chunk;
    memcpy(local, remote, step);
    local += step, remote += step, n -= step;
  }
  /* The kernel caps one call's bytes; loop until all are copied. */
  while (n > 0) {
    size_t step = g_chunk == 0 || g_chunk > n ? n : g_chunk;
    struct iovec l = {local, step}, r = {remote, step};
    ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got <= 0) {
      perror("process_vm_readv");
      return -1;
    }
    local += got, remote += got, n -= (size_t)got;
  }
  return 0;
}

static int run_rank(struct Shared* s, int rank, int world, int pattern, int method, int touch,
                    long long bytes, int iters, int warmup, char* output) {
  char* mine = s->input[rank];
  size_t part = pattern == GATHER ? (size_t)(bytes / world) : (size_t)bytes;
  for (int it = 0; it < warmup + iters; ++it) {
    if (touch) {
      for (size_t i = 0; i < part; i += 64) mine[i] = (char)(it + i);
    }
    barrier(s, world);
    double t0 = now_us();
    int rc = 0;
    if (pattern == GATHER) {
      for (int k = 1; k < world && rc == 0; ++k) {
        int peer = (rank + k) % world;
        rc = copy_from(method, s->pid[peer], s->input[peer], output + part * peer, part);
      }
    } else if (pattern == BROADCAST) {
      if (rank != 0) rc = copy_from(method, s->pid[0], s->input[0], output, part);
    } else {
      memcpy(output, mine, part);
    }
    barrier(s, world);
    if (rc != 0) return rc;
    if (it >= warmup) s->times[rank][it - warmup] = now_us() - t0;
  }
  return 0;
}

int main(int argc, char** argv) {
  int world = 2, pattern = GATHER, method = 0, touch = 0;
  long long sizes[MAX_LIST], iters_list[MAX_LIST];
  int nsizes = parse_list("16M,64M", sizes), niters = parse_list("20", iters_list);
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (strcmp(a, "--world") == 0) world = atoi(v), ++i;
    else if (strcmp(a, "--pattern") == 0) {
      pattern = strcmp(v, "gather") == 0      ? GATHER
                : strcmp(v, "broadcast") == 0 ? BROADCAST
                : strcmp(v, "private") == 0   ? PRIVATE
                                              : -1;
      ++i;
    } else if (strcmp(a, "--method") == 0) {
      method = strcmp(v, "cma") == 0 ? 0 : strcmp(v, "shared") == 0 ? 1 : -1;
      ++i;
    } else if (strcmp(a, "--bytes") == 0) nsizes = parse_list(v, sizes), ++i;
    else if (strcmp(a, "--iters") == 0) niters = parse_list(v, iters_list), ++i;
    else if (strcmp(a, "--touch") == 0) touch = 1;
    else if (strcmp(a, "--chunk") == 0) {
      long long c[1];
      if (parse_list(v, c) != 1) c[0] = -1;
      g_chunk = c[0] > 0 ? (size_t)c[0] : 0;
      ++i;
    }
    else {
      fprintf(stderr,
              "usage: %s [--world N] [--pattern gather|broadcast|private] [--method cma|shared]\n"
              "          [--bytes LIST] [--iters LIST] [--touch] [--chunk BYTES]\n",
              argv[0]);
      return 2;
    }
  }
  if (world < 2 || world > MAX_WORLD || pattern < 0 || method < 0 || nsizes <= 0 || niters <= 0) {
    fprintf(stderr, "bench_copy_floor: bad --world (2..%d), --pattern, --method, --bytes or --iters\n",
            MAX_WORLD);
    return 2;
  }
  cpu_set_t allowed;
  sched_getaffinity(0, sizeof allowed, &allowed);
  int cpus[CPU_SETSIZE], ncpus = 0;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus[ncpus++] = c;
  }
  for (int si = 0; si < nsizes; ++si) {
    long long bytes = sizes[si];
    int iters = (int)iters_list[si < niters ? si : niters - 1];
    if (iters > 4096) iters = 4096;
    int warmup = iters / 10 > 2 ? iters / 10 : 2;
    struct Shared* s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    /* Inputs: one shared mapping for --method shared, else heap (private
     * after the fork: each rank's own pages at the same address). */
    char* shared_inputs = NULL;
    if (method == 1) {
      shared_inputs = mmap(NULL, (size_t)bytes * world, PROT_READ | PROT_WRITE,
                           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    }
    if (s == MAP_FAILED || shared_inputs == MAP_FAILED) {
      perror("mmap");
      return 1;
    }
    memset(s, 0, sizeof *s);
    pid_t children[MAX_WORLD];
    for (int r = 0; r < world; ++r) {
      pid_t pid = fork();
      if (pid < 0) {
        perror("fork");
        return 1;
      }
      if (pid > 0) {
        children[r] = pid;
        continue;
      }
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus[r % ncpus], &one);
      sched_setaffinity(0, sizeof one, &one);
      char* input = method == 1 ? shared_inputs + (size_t)bytes * r : malloc((size_t)bytes);
      char* output = malloc((size_t)bytes);
      if (input == NULL || output == NULL) _exit(1);
      memset(input, r + 1, (size_t)bytes);
      memset(output, 0, (size_t)bytes);
      s->pid[r] = getpid();
      s->input[r] = input;
      barrier(s, world);  /* every address published */
      int rc = run_rank(s, r, world, pattern, method, touch, bytes, iters, warmup, output);
      /* Check one byte of every peer part that was copied. */
      if (rc == 0 && pattern == GATHER) {
        size_t part = (size_t)(bytes / world);
        for (int p = 0; p < world; ++p) {
          if (p != r && !touch && output[part * p] != (char)(p + 1)) rc = 1;
        }
      }
      _exit(rc == 0 ? 0 : 1);
    }
    int failed = 0;
    for (int r = 0; r < world; ++r) {
      int status = 0;
      waitpid(children[r], &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
    }
    if (failed) {
      fprintf(stderr, "bench_copy_floor: a rank failed (%lld bytes)\n", bytes);
      return 1;
    }
    double slowest[4096];
    for (int it = 0; it < iters; ++it) {
      slowest[it] = 0;
      for (int r = 0; r < world; ++r) {
        if (s->times[r][it] > slowest[it]) slowest[it] = s->times[r][it];
      }
    }
    qsort(slowest, (size_t)iters, sizeof slowest[0], cmp_double);
    double p50 = slowest[iters / 2];
    long long copied = pattern == GATHER ? bytes / world * (world - 1) : bytes;
    static const char* kPatterns[] = {"gather", "broadcast", "private"};
    printf("{\"world\":%d,\"pattern\":\"%s\",\"method\":\"%s\",\"touch\":%s,\"bytes\":%lld,"
           "\"chunk\":%zu,\"iters\":%d,\"p50_us\":%.4g,\"copied_bytes_per_rank\":%lld,\"gbps_per_rank\":%.4g}\n",
           world, kPatterns[pattern], method == 1 ? "shared" : "cma", touch ? "true" : "false",
           bytes, g_chunk, iters, p50, copied, copied / p50 / 1e3);
    fflush(stdout);
    munmap(s, sizeof *s);
    if (shared_inputs != NULL) munmap(shared_inputs, (size_t)bytes * world);
  }
  return 0;
}
