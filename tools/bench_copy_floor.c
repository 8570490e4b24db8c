/* The copy floor of a collective on this machine: how fast one pass of
 * copies can move a collective's bytes between processes, with no protocol
 * around it. docs/benchmarks.md compares muster's and Open MPI's large
 * collectives with it ("Issue 19, 2026-12-03"): a collective over
 * ordinary (heap) buffers cannot move its bytes faster than one copy each.
 *
 *   cc -O2 -o bench_copy_floor tools/bench_copy_floor.c   (or bazel build
 *   -c opt //tools:bench-copy-floor)
 *   bench_copy_floor --world 2 --pattern gather --bytes 16M,64M --iters 20
 *
 * --world N forks N ranks (rank r pinned to CPU r modulo the CPUs this
 * process may use). Every rank owns a heap input and a heap output. Per
 * iteration, between two barriers (timed on every rank; the slowest rank's
 * time counts):
 *   --pattern gather     each rank copies every other rank's input (bytes/N
 *                        each: `bytes` is the gathered output, as in
 *                        nccl-tests) into its output: all_gather's data;
 *   --pattern allgather  the same, and each rank also copies its own input
 *                        into its part of the output (memcpy): all of an
 *                        all_gather's output, with separate buffers;
 *   --pattern allgather-push  the same output, pushed: each rank copies its
 *                        own input into its part of its output in --chunk
 *                        pieces (default 256 KiB) and writes each piece,
 *                        still in cache, into its part of every peer's
 *                        output with process_vm_writev (--method cma only);
 *                        --nt: the own copy with non-temporal stores (past
 *                        the caches; x86-64 only), each piece then pushed
 *                        from the input, which the copy just read;
 *   --pattern allreduce  a uint32 sum all_reduce (wrapping) in place, as
 *                        muster's CMA path makes it: rank r owns part r of
 *                        the buffer (bytes/N); per --chunk block (default
 *                        256 KiB) it reads every peer's block with
 *                        process_vm_readv into a cached buffer, adds it
 *                        into its own, and writes the sum into every
 *                        peer's buffer with process_vm_writev (--method
 *                        cma); --method shared: as AllocShared buffers
 *                        allow (muster's mapped path): the buffers live in
 *                        one shared mapping, each rank sums part r of
 *                        every buffer in place (--chunk blocks, default 64
 *                        KiB) into its own, and after a barrier copies
 *                        every other part from the rank that summed it;
 *   --pattern broadcast  every rank but 0 copies rank 0's input (`bytes`);
 *   --pattern private    each rank copies its own input to its output
 *                        (`bytes`; no other core's data: the reference, and
 *                        the least memory traffic any all_gather of `bytes`
 *                        into a separate output has per rank); --nt: with
 *                        non-temporal stores (x86-64 only).
 * --nt with --pattern allgather (--method cma): each peer's part read in
 * --chunk blocks (default 256 KiB) into a cached buffer, then copied into
 * the output with non-temporal stores, and the own part copied with them.
 * --method cma (default): the copies are process_vm_readv calls on the
 * peer's heap buffer, one kernel copy (what Open MPI's vader BTL and
 * muster's CMA path do); --method shared: the inputs live in one shared
 * mapping and the copies are memcpy (one user-space copy, no page pinning:
 * what AllocShared buffers allow). --touch: every rank rewrites one byte per
 * cache line of its input before each iteration, outside the timer.
 * --chunk B: copy in calls of B bytes (K/M suffixes; default: one call per
 * peer part), as a pipelined implementation does.
 * --iters: one count for every size, or one per size; at most 4096.
 * Prints one JSON line per size: p50_us (median of the slowest rank's
 * times), copied bytes per rank and their GB/s (1e9 B/s) at the p50. Each
 * rank checks bytes of what it received (allreduce: the sums at both ends
 * of every part); a wrong byte or a failed copy
 * fails the run (exit 1; the other ranks are killed), bad usage exits 2.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_c_util.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#define HAVE_NT_STORES 1
#else
#define HAVE_NT_STORES 0
#endif

#define MAX_LIST 32
#define MAX_WORLD 16
#define MAX_ITERS 4096

enum { GATHER, BROADCAST, PRIVATE, ALLGATHER, ALLGATHER_PUSH, ALLREDUCE };

/* What the ranks share: a barrier, every rank's buffer addresses and pid,
 * and every rank's per-iteration times. */
struct Shared {
  _Atomic uint64_t arrived;
  _Atomic uint64_t generation;
  pid_t pid[MAX_WORLD];
  char* input[MAX_WORLD];
  char* output[MAX_WORLD];
  double times[MAX_WORLD][MAX_ITERS];
};

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
/* --nt: allgather-push's own copy, or the private copy, with non-temporal
 * stores. */
static int g_nt = 0;

/* memcpy with non-temporal stores from the first 16-byte aligned byte of
 * `dst` (--nt; the caller checked HAVE_NT_STORES). */
static void copy_nt(char* dst, const char* src, size_t n) {
#if HAVE_NT_STORES
  size_t i = (16 - ((uintptr_t)dst & 15)) & 15;
  if (i > n) i = n;
  memcpy(dst, src, i);
  for (; i + 16 <= n; i += 16) {
    _mm_stream_si128((__m128i*)(dst + i), _mm_loadu_si128((const __m128i*)(src + i)));
  }
  memcpy(dst + i, src + i, n - i);
  _mm_sfence();
#else
  memcpy(dst, src, n);
#endif
}

static int copy_from(int method, pid_t pid, char* remote, char* local, size_t n) {
  if (g_nt && method == 0) { /* --pattern allgather --nt: through the cache */
    static char block[256 << 10];
    size_t step_max = g_chunk == 0 || g_chunk > sizeof block ? sizeof block : g_chunk;
    while (n > 0) {
      size_t step = step_max > n ? n : step_max;
      struct iovec l = {block, step}, r = {remote, step};
      ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
      if (got <= 0) {
        perror("process_vm_readv");
        return -1;
      }
      copy_nt(local, block, (size_t)got);
      local += got, remote += got, n -= (size_t)got;
    }
    return 0;
  }
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

/* allgather-push: copy the own input into the own output in --chunk pieces
 * (256 KiB by default) and write each piece, still in cache, into every
 * peer's output with process_vm_writev. */
static int push_own_part(struct Shared* s, int rank, int world, size_t part, char* output) {
  size_t step = g_chunk == 0 ? 256 << 10 : g_chunk;
  char* to = output + part * rank;
  for (size_t done = 0; done < part; done += step) {
    size_t n = part - done < step ? part - done : step;
    const char* in = s->input[rank] + done;
    if (g_nt) {
      copy_nt(to + done, in, n);
    } else {
      memcpy(to + done, in, n);
    }
    const char* from = g_nt ? in : to + done; /* what is in cache */
    for (int k = 1; k < world; ++k) {
      int peer = (rank + k) % world;
      for (size_t sent = 0; sent < n;) {
        struct iovec l = {(char*)from + sent, n - sent},
                     r = {s->output[peer] + part * rank + done + sent, n - sent};
        ssize_t put = process_vm_writev(s->pid[peer], &l, 1, &r, 1, 0);
        if (put <= 0) {
          perror("process_vm_writev");
          return -1;
        }
        sent += (size_t)put;
      }
    }
  }
  return 0;
}

/* CMA in full: the kernel caps one call's bytes. */
static int cma_all(int write, pid_t pid, char* local, char* remote, size_t n) {
  while (n > 0) {
    struct iovec l = {local, n}, r = {remote, n};
    ssize_t done =
        write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (done <= 0) {
      perror(write ? "process_vm_writev" : "process_vm_readv");
      return -1;
    }
    local += done, remote += done, n -= (size_t)done;
  }
  return 0;
}

/* own[i] += add[i] (wrapping), 16 bytes at a time where SSE2 allows. */
static void add_u32(uint32_t* own, const uint32_t* add, size_t n) {
  size_t i = 0;
#if HAVE_NT_STORES
  for (; i + 4 <= n; i += 4) {
    __m128i sum = _mm_add_epi32(_mm_loadu_si128((const __m128i*)(own + i)),
                                _mm_loadu_si128((const __m128i*)(add + i)));
    _mm_storeu_si128((__m128i*)(own + i), sum);
  }
#endif
  for (; i < n; ++i) own[i] += add[i];
}

/* allreduce: sum part `rank` of every rank's buffer block by block into the
 * own buffer and write each summed block into every peer's buffer. */
static int allreduce_own_part(struct Shared* s, int rank, int world, size_t part) {
  static uint32_t peer_block[(256 << 10) / sizeof(uint32_t)];
  size_t step = g_chunk == 0 || g_chunk > sizeof peer_block ? sizeof peer_block : g_chunk;
  step -= step % sizeof(uint32_t);
  size_t off = part * rank;
  for (size_t done = 0; done < part; done += step) {
    size_t n = part - done < step ? part - done : step;
    uint32_t* own = (uint32_t*)(s->input[rank] + off + done);
    for (int k = 1; k < world; ++k) {
      int peer = (rank + k) % world;
      if (cma_all(0, s->pid[peer], (char*)peer_block, s->input[peer] + off + done, n) != 0) {
        return -1;
      }
      add_u32(own, peer_block, n / sizeof(uint32_t));
    }
    for (int k = 1; k < world; ++k) {
      int peer = (rank + k) % world;
      if (cma_all(1, s->pid[peer], (char*)own, s->input[peer] + off + done, n) != 0) return -1;
    }
  }
  return 0;
}

/* allreduce --method shared: what AllocShared buffers allow (muster's
 * mapped path): every buffer lives in one shared mapping; rank r sums part
 * r of every rank's buffer, reading the peers' memory in place block by
 * block, into its own buffer; after a barrier it copies every other part
 * from the buffer of the rank that summed it. */
static void allreduce_shared(struct Shared* s, int rank, int world, size_t part) {
  size_t step = g_chunk == 0 ? (size_t)64 << 10 : g_chunk;
  step -= step % sizeof(uint32_t);
  size_t off = part * rank;
  for (size_t done = 0; done < part; done += step) {
    size_t n = part - done < step ? part - done : step;
    uint32_t* own = (uint32_t*)(s->input[rank] + off + done);
    for (int k = 1; k < world; ++k) {
      int peer = (rank + k) % world;
      add_u32(own, (const uint32_t*)(s->input[peer] + off + done), n / sizeof(uint32_t));
    }
  }
  barrier(s, world);
  for (int k = 1; k < world; ++k) {
    int peer = (rank + k) % world;
    memcpy(s->input[rank] + part * peer, s->input[peer] + part * peer, part);
  }
}

static int run_rank(struct Shared* s, int rank, int world, int pattern, int method, int touch,
                    long long bytes, int iters, int warmup, char* output) {
  char* mine = s->input[rank];
  int gathers = pattern == GATHER || pattern == ALLGATHER || pattern == ALLGATHER_PUSH;
  size_t part = gathers || pattern == ALLREDUCE ? (size_t)(bytes / world) : (size_t)bytes;
  for (int it = 0; it < warmup + iters; ++it) {
    if (touch) {
      for (size_t i = 0; i < part; i += 64) mine[i] = (char)(it + i);
    }
    barrier(s, world);
    double t0 = bench_now_us();
    int rc = 0;
    if (pattern == ALLGATHER_PUSH) {
      rc = push_own_part(s, rank, world, part, output);
    } else if (pattern == ALLREDUCE && method == 1) {
      allreduce_shared(s, rank, world, part);
    } else if (pattern == ALLREDUCE) {
      rc = allreduce_own_part(s, rank, world, part);
    } else if (gathers) {
      for (int k = 1; k < world && rc == 0; ++k) {
        int peer = (rank + k) % world;
        rc = copy_from(method, s->pid[peer], s->input[peer], output + part * peer, part);
      }
      if (pattern == ALLGATHER && g_nt) {
        copy_nt(output + part * rank, mine, part);
      } else if (pattern == ALLGATHER) {
        memcpy(output + part * rank, mine, part);
      }
    } else if (pattern == BROADCAST) {
      if (rank != 0) rc = copy_from(method, s->pid[0], s->input[0], output, part);
    } else if (g_nt) {
      copy_nt(output, mine, part);
    } else {
      memcpy(output, mine, part);
    }
    barrier(s, world);
    if (rc != 0) return rc;
    if (it >= warmup) s->times[rank][it - warmup] = bench_now_us() - t0;
  }
  return 0;
}

int main(int argc, char** argv) {
  int world = 2, pattern = GATHER, method = 0, touch = 0;
  long long sizes[MAX_LIST], iters_list[MAX_LIST];
  int nsizes = bench_parse_list("16M,64M", sizes, MAX_LIST),
      niters = bench_parse_list("20", iters_list, MAX_LIST);
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (strcmp(a, "--world") == 0)
      world = atoi(v), ++i;
    else if (strcmp(a, "--pattern") == 0) {
      pattern = strcmp(v, "gather") == 0           ? GATHER
                : strcmp(v, "broadcast") == 0      ? BROADCAST
                : strcmp(v, "private") == 0        ? PRIVATE
                : strcmp(v, "allgather") == 0      ? ALLGATHER
                : strcmp(v, "allgather-push") == 0 ? ALLGATHER_PUSH
                : strcmp(v, "allreduce") == 0      ? ALLREDUCE
                                                   : -1;
      ++i;
    } else if (strcmp(a, "--method") == 0) {
      method = strcmp(v, "cma") == 0 ? 0 : strcmp(v, "shared") == 0 ? 1 : -1;
      ++i;
    } else if (strcmp(a, "--bytes") == 0)
      nsizes = bench_parse_list(v, sizes, MAX_LIST), ++i;
    else if (strcmp(a, "--iters") == 0)
      niters = bench_parse_list(v, iters_list, MAX_LIST), ++i;
    else if (strcmp(a, "--nt") == 0)
      g_nt = 1;
    else if (strcmp(a, "--touch") == 0)
      touch = 1;
    else if (strcmp(a, "--chunk") == 0) {
      long long c[1];
      if (bench_parse_list(v, c, 1) != 1) {
        fprintf(stderr, "bench_copy_floor: --chunk wants one size like 64K, not '%s'\n", v);
        return 2;
      }
      g_chunk = (size_t)c[0];
      ++i;
    } else {
      fprintf(stderr,
              "usage: %s [--world N] [--pattern "
              "gather|allgather|allgather-push|allreduce|broadcast|private] "
              "[--method cma|shared]\n"
              "          [--bytes LIST] [--iters LIST] [--touch] [--chunk BYTES] [--nt]\n",
              argv[0]);
      return 2;
    }
  }
  if (g_nt && ((pattern != ALLGATHER_PUSH && pattern != PRIVATE && pattern != ALLGATHER) ||
               (pattern == ALLGATHER && method == 1) || !HAVE_NT_STORES)) {
    fprintf(stderr,
            "bench_copy_floor: --nt is for --pattern allgather-push, private or allgather "
            "--method cma on x86-64\n");
    return 2;
  }
  if (pattern == ALLGATHER_PUSH && method == 1) {
    fprintf(stderr, "bench_copy_floor: --pattern allgather-push writes with CMA: --method cma\n");
    return 2;
  }
  if (pattern == ALLREDUCE && touch) {
    fprintf(stderr, "bench_copy_floor: --touch would change the sums --pattern allreduce checks\n");
    return 2;
  }
  if (world < 2 || world > MAX_WORLD || pattern < 0 || method < 0 || nsizes <= 0 || niters <= 0 ||
      (niters != 1 && niters != nsizes)) {
    fprintf(
        stderr,
        "bench_copy_floor: bad --world (2..%d), --pattern, --method, --bytes (up to %d sizes) or "
        "--iters (one count, or one per size)\n",
        MAX_WORLD, MAX_LIST);
    return 2;
  }
  for (int k = 0; pattern == ALLREDUCE && k < nsizes; ++k) {
    if (sizes[k] % (4 * world) != 0) {
      fprintf(stderr, "bench_copy_floor: --pattern allreduce wants --bytes a multiple of 4 x %d\n",
              world);
      return 2;
    }
  }
  for (int k = 0; k < niters; ++k) {
    if (iters_list[k] > MAX_ITERS) {
      fprintf(stderr, "bench_copy_floor: --iters %lld is over the %d timed iterations kept\n",
              iters_list[k], MAX_ITERS);
      return 2;
    }
  }
  cpu_set_t allowed;
  sched_getaffinity(0, sizeof allowed, &allowed);
  int cpus[CPU_SETSIZE], ncpus = 0;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus[ncpus++] = c;
  }
  for (int si = 0; si < nsizes; ++si) {
    long long bytes = sizes[si];
    int iters = (int)iters_list[niters == 1 ? 0 : si];
    int warmup = iters / 10 > 2 ? iters / 10 : 2;
    struct Shared* s =
        mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
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
      /* Yama's ptrace_scope 1 lets only ancestors read a process: the
       * ranks are siblings, so each allows any reader of its buffer. */
      prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
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
      s->output[r] = output;
      barrier(s, world); /* every address published */
      int rc = run_rank(s, r, world, pattern, method, touch, bytes, iters, warmup, output);
      /* Check what was copied: the first and last byte of every part
       * received (bytes --touch never rewrites: it writes offsets that are
       * multiples of 64). */
      int gathers = pattern == GATHER || pattern == ALLGATHER || pattern == ALLGATHER_PUSH;
      size_t part = gathers ? (size_t)(bytes / world) : (size_t)bytes;
      int nparts = gathers ? world : 1;
      if (pattern == ALLREDUCE) {
        /* Every element starts as 0x01010101 x (r + 1) on rank r: after the
         * first all_reduce it is their sum, after each later one world
         * times the last (wrapping). Check the ends of every rank's part. */
        uint32_t want = 0;
        for (int q = 0; q < world; ++q) want += 0x01010101u * (uint32_t)(q + 1);
        for (int it = 1; it < warmup + iters; ++it) want *= (uint32_t)world;
        const uint32_t* sums = (const uint32_t*)input;
        size_t per_part = (size_t)bytes / world / sizeof(uint32_t);
        for (int p = 0; p < world && rc == 0; ++p) {
          if (sums[per_part * p] != want || sums[per_part * (p + 1) - 1] != want) {
            fprintf(stderr, "bench_copy_floor: rank %d: the sums of part %d are wrong\n", r, p);
            rc = 1;
          }
        }
        nparts = 0;
      }
      for (int p = 0; p < nparts && rc == 0 && part >= 2; ++p) {
        if (pattern == GATHER && p == r) continue; /* its own part: not copied */
        if (pattern == BROADCAST && r == 0) break; /* the root copies nothing */
        int from = gathers ? p : pattern == BROADCAST ? 0 : r;
        const char* got = output + (gathers ? part * p : 0);
        size_t last = part - 1;
        if (got[1] != (char)(from + 1) || (last % 64 != 0 && got[last] != (char)(from + 1))) {
          fprintf(stderr, "bench_copy_floor: rank %d: the bytes from rank %d are wrong\n", r, from);
          rc = 1;
        }
      }
      _exit(rc == 0 ? 0 : 1);
    }
    /* A rank that fails leaves the others in the barrier: end them. */
    int failed = 0;
    for (int left = world; left > 0; --left) {
      int status = 0;
      if (waitpid(-1, &status, 0) < 0) break;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (!failed) {
          for (int r = 0; r < world; ++r) kill(children[r], SIGKILL);
        }
        failed = 1;
      }
    }
    if (failed) {
      fprintf(stderr, "bench_copy_floor: a rank failed (%lld bytes)\n", bytes);
      return 1;
    }
    double slowest[MAX_ITERS];
    for (int it = 0; it < iters; ++it) {
      slowest[it] = 0;
      for (int r = 0; r < world; ++r) {
        if (s->times[r][it] > slowest[it]) slowest[it] = s->times[r][it];
      }
    }
    qsort(slowest, (size_t)iters, sizeof slowest[0], bench_cmp_double);
    double p50 = slowest[iters / 2];
    /* allreduce: what each rank reads and writes with CMA. */
    long long copied = pattern == GATHER      ? bytes / world * (world - 1)
                       : pattern == ALLREDUCE ? 2 * (bytes / world) * (world - 1)
                                              : bytes;
    static const char* kPatterns[] = {"gather",    "broadcast",      "private",
                                      "allgather", "allgather-push", "allreduce"};
    printf(
        "{\"world\":%d,\"pattern\":\"%s\",\"method\":\"%s\",\"touch\":%s,\"bytes\":%lld,"
        "\"chunk\":%zu,\"iters\":%d,\"p50_us\":%.4g,\"copied_bytes_per_rank\":%lld,\"gbps_per_"
        "rank\":%.4g,\"nt\":%s}\n",
        world, kPatterns[pattern], method == 1 ? "shared" : "cma", touch ? "true" : "false", bytes,
        g_chunk, iters, p50, copied, copied / p50 / 1e3, g_nt ? "true" : "false");
    fflush(stdout);
    munmap(s, sizeof *s);
    if (shared_inputs != NULL) munmap(shared_inputs, (size_t)bytes * world);
  }
  return 0;
}
