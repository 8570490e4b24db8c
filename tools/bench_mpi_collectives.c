/* The Open MPI peer of `muster-bench collectives` (tools/bench_collectives.sh
 * compiles it with mpicc -O2 and runs it under mpirun). Same ops, sizes,
 * iterations, timing and JSON fields:
 *
 *   mpirun -np 2 bench_mpi_collectives --op all_reduce,barrier \
 *       --bytes 4,4096 --iters 1000,1000 [--warmup N] [--verify] [--dtype float32]
 *       [--touch]
 *
 * For every op and size: `warmup` untimed and `iters` timed iterations, back
 * to back (no barrier in between). Per iteration the slowest rank's time
 * counts (MPI_Allreduce MAX of every rank's times); rank 0 prints one JSON
 * line per size with the median (p50_us) and nccl-tests' bus bandwidth.
 * Sizes as in nccl-tests: `bytes` is the whole buffer of all_reduce and
 * broadcast, the gathered output of all_gather and the input of
 * reduce_scatter, rounded down to whole elements (at least one per rank).
 * all_reduce is in place (MPI_IN_PLACE), like muster's and torch's.
 * --touch: before each timed iteration (outside the timer) the rank writes
 * one byte of every cache line of its input, as a training step rewrites
 * its gradients; without it the inputs of all_gather and broadcast stay
 * the same from one iteration to the next (and stay in the caches).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_c_util.h"

enum { ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER, BARRIER };
static const char* kOpNames[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                 "barrier"};

#define MAX_LIST 64

static double percentile(const double* sorted, long long n, double q) {
  if (n <= 0) return 0;
  long long i = (long long)(q * (n - 1) + 0.5);
  if (i >= n) i = n - 1;
  return sorted[i];
}

/* Deterministic inputs, as in muster-bench: small positive integers. */
static long long input_value(int rank, size_t i) {
  return (long long)((i + 3 * (size_t)rank) % 7) + 1;
}

typedef struct {
  MPI_Datatype type;
  size_t size;
  const char* name;
} DType;

static void store(const DType* t, void* p, size_t i, long long v) {
  if (t->type == MPI_FLOAT)
    ((float*)p)[i] = (float)v;
  else if (t->type == MPI_DOUBLE)
    ((double*)p)[i] = (double)v;
  else if (t->type == MPI_INT32_T)
    ((int32_t*)p)[i] = (int32_t)v;
  else
    ((int64_t*)p)[i] = (int64_t)v;
}

static double load(const DType* t, const void* p, size_t i) {
  if (t->type == MPI_FLOAT) return ((const float*)p)[i];
  if (t->type == MPI_DOUBLE) return ((const double*)p)[i];
  if (t->type == MPI_INT32_T) return ((const int32_t*)p)[i];
  return (double)((const int64_t*)p)[i];
}

typedef struct {
  int op, n, rank;
  DType dt;
  size_t count; /* elements of the op's per-rank argument */
  size_t total_bytes;
  char *in, *out;
} Case;

static void* alloc_touched(size_t bytes) {
  size_t rounded = bytes < 4096 ? 4096 : (bytes + 4095) / 4096 * 4096;
  void* p = aligned_alloc(4096, rounded);
  if (p != NULL) memset(p, 0, rounded);
  return p;
}

static int case_init(Case* c, int op, long long req, const DType* dt, int n, int rank) {
  memset(c, 0, sizeof(*c));
  c->op = op, c->n = n, c->rank = rank, c->dt = *dt;
  size_t es = dt->size;
  switch (op) {
    case ALL_REDUCE:
    case BROADCAST:
      c->count = (size_t)req / es ? (size_t)req / es : 1;
      c->total_bytes = c->count * es;
      c->in = alloc_touched(c->total_bytes);
      return c->in != NULL;
    case ALL_GATHER:
      c->count = (size_t)req / (es * n) ? (size_t)req / (es * n) : 1;
      c->total_bytes = c->count * es * n;
      c->in = alloc_touched(c->count * es);
      c->out = alloc_touched(c->total_bytes);
      return c->in != NULL && c->out != NULL;
    case REDUCE_SCATTER:
      c->count = (size_t)req / (es * n) ? (size_t)req / (es * n) : 1;
      c->total_bytes = c->count * es * n;
      c->in = alloc_touched(c->total_bytes);
      c->out = alloc_touched(c->count * es);
      return c->in != NULL && c->out != NULL;
    default:
      return 1;
  }
}

/* --touch: one byte per cache line of the rank's input rewritten. */
static void case_touch(Case* c) {
  size_t in_bytes = c->op == ALL_GATHER ? c->count * c->dt.size : c->total_bytes;
  for (size_t b = 0; c->in != NULL && b < in_bytes; b += 64) c->in[b] ^= 1;
}

static void case_free(Case* c) {
  free(c->in);
  free(c->out);
}

static int case_run(Case* c) {
  switch (c->op) {
    case ALL_REDUCE:
      return MPI_Allreduce(MPI_IN_PLACE, c->in, (int)c->count, c->dt.type, MPI_SUM, MPI_COMM_WORLD);
    case BROADCAST:
      return MPI_Bcast(c->in, (int)c->count, c->dt.type, 0, MPI_COMM_WORLD);
    case ALL_GATHER:
      return MPI_Allgather(c->in, (int)c->count, c->dt.type, c->out, (int)c->count, c->dt.type,
                           MPI_COMM_WORLD);
    case REDUCE_SCATTER:
      return MPI_Reduce_scatter_block(c->in, c->out, (int)c->count, c->dt.type, MPI_SUM,
                                      MPI_COMM_WORLD);
    default:
      return MPI_Barrier(MPI_COMM_WORLD);
  }
}

static void case_fill(Case* c) {
  size_t i;
  switch (c->op) {
    case ALL_REDUCE:
      for (i = 0; i < c->count; ++i) store(&c->dt, c->in, i, input_value(c->rank, i));
      break;
    case BROADCAST:
      for (i = 0; i < c->count; ++i) store(&c->dt, c->in, i, c->rank == 0 ? input_value(0, i) : 0);
      break;
    case ALL_GATHER:
      for (i = 0; i < c->count; ++i) store(&c->dt, c->in, i, input_value(c->rank, i));
      memset(c->out, 0, c->total_bytes);
      break;
    case REDUCE_SCATTER:
      for (i = 0; i < c->count * c->n; ++i) store(&c->dt, c->in, i, input_value(c->rank, i));
      memset(c->out, 0, c->count * c->dt.size);
      break;
  }
}

static long long case_check(Case* c) {
  long long wrong = 0;
  size_t i;
  int r;
  for (i = 0; i < c->count; ++i) {
    switch (c->op) {
      case ALL_REDUCE: {
        long long sum = 0;
        for (r = 0; r < c->n; ++r) sum += input_value(r, i);
        wrong += load(&c->dt, c->in, i) != (double)sum;
        break;
      }
      case BROADCAST:
        wrong += load(&c->dt, c->in, i) != (double)input_value(0, i);
        break;
      case ALL_GATHER:
        for (r = 0; r < c->n; ++r) {
          wrong += load(&c->dt, c->out, r * c->count + i) != (double)input_value(r, i);
        }
        break;
      case REDUCE_SCATTER: {
        long long sum = 0;
        for (r = 0; r < c->n; ++r) sum += input_value(r, c->rank * c->count + i);
        wrong += load(&c->dt, c->out, i) != (double)sum;
        break;
      }
    }
  }
  return wrong;
}

static double bus_factor(int op, int n) {
  switch (op) {
    case ALL_REDUCE:
      return 2.0 * (n - 1) / n;
    case ALL_GATHER:
    case REDUCE_SCATTER:
      return (double)(n - 1) / n;
    case BROADCAST:
      return 1.0;
    default:
      return 0;
  }
}

static void usage(void) {
  fprintf(stderr,
          "usage: bench_mpi_collectives [--op all_reduce,broadcast,all_gather,reduce_scatter,"
          "barrier] [--bytes 4,4K,...] [--iters K[,K...]] [--warmup N] [--dtype float32|float64|"
          "int32|int64] [--verify] [--touch]\n");
}

int main(int argc, char** argv) {
  int ops[16], nops = 0, verify = 0, touch = 0, i;
  long long bytes[MAX_LIST], iters[MAX_LIST];
  int nbytes = 0, niters = 0;
  long long warmup_flag = -1;
  DType dt = {MPI_FLOAT, 4, "float32"};
  const char* op_text = "all_reduce,broadcast,all_gather,reduce_scatter,barrier";
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  nbytes = bench_parse_list("4,4K,256K,4M", bytes, MAX_LIST);
  niters = bench_parse_list("100", iters, MAX_LIST);
  for (i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--verify") == 0) {
      verify = 1;
      continue;
    }
    if (strcmp(a, "--touch") == 0) {
      touch = 1;
      continue;
    }
    if (v == NULL) {
      usage();
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    ++i;
    if (strcmp(a, "--op") == 0)
      op_text = v;
    else if (strcmp(a, "--bytes") == 0)
      nbytes = bench_parse_list(v, bytes, MAX_LIST);
    else if (strcmp(a, "--iters") == 0)
      niters = bench_parse_list(v, iters, MAX_LIST);
    else if (strcmp(a, "--warmup") == 0)
      warmup_flag = atoll(v);
    else if (strcmp(a, "--dtype") == 0) {
      if (strcmp(v, "float32") == 0)
        dt = (DType){MPI_FLOAT, 4, "float32"};
      else if (strcmp(v, "float64") == 0)
        dt = (DType){MPI_DOUBLE, 8, "float64"};
      else if (strcmp(v, "int32") == 0)
        dt = (DType){MPI_INT32_T, 4, "int32"};
      else if (strcmp(v, "int64") == 0)
        dt = (DType){MPI_INT64_T, 8, "int64"};
      else {
        usage();
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
    } else {
      usage();
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (nbytes <= 0 || niters <= 0 || (niters != 1 && niters != nbytes)) {
    usage();
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  {
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", op_text);
    for (char* tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ",")) {
      int k, found = -1;
      for (k = 0; k < 5; ++k)
        if (strcmp(tok, kOpNames[k]) == 0) found = k;
      if (found < 0 || nops >= 16) {
        usage();
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      ops[nops++] = found;
    }
  }
  int exit_code = 0;
  for (int oi = 0; oi < nops; ++oi) {
    int op = ops[oi];
    int sizes = op == BARRIER ? 1 : nbytes;
    for (int si = 0; si < sizes; ++si) {
      long long it = niters == 1 ? iters[0] : iters[si];
      if (op == BARRIER) {
        int k;
        for (k = 0; k < niters; ++k)
          if (iters[k] > it) it = iters[k];
      }
      long long warmup = warmup_flag >= 0 ? warmup_flag : (it / 10 > 2 ? it / 10 : 2);
      Case c;
      if (!case_init(&c, op, bytes[si], &dt, n, rank)) {
        fprintf(stderr, "rank %d: cannot allocate %lld bytes\n", rank, bytes[si]);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      long long wrong = 0;
      if (verify) {
        case_fill(&c);
        case_run(&c);
        wrong += case_check(&c);
      }
      case_fill(&c);
      for (long long k = 0; k < warmup; ++k) case_run(&c);
      double* times = malloc(sizeof(double) * it);
      struct rusage ru0, ru1;
      getrusage(RUSAGE_SELF, &ru0);
      for (long long k = 0; k < it; ++k) {
        if (touch) case_touch(&c);
        double t0 = bench_now_us();
        case_run(&c);
        times[k] = bench_now_us() - t0;
      }
      getrusage(RUSAGE_SELF, &ru1);
      MPI_Allreduce(MPI_IN_PLACE, times, (int)it, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      long long csw[2] = {ru1.ru_nvcsw - ru0.ru_nvcsw, ru1.ru_nivcsw - ru0.ru_nivcsw};
      MPI_Allreduce(MPI_IN_PLACE, csw, 2, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      if (verify) {
        case_fill(&c);
        case_run(&c);
        wrong += case_check(&c);
        MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (wrong > 0) exit_code = 1;
      }
      if (rank == 0) {
        double mean = 0;
        for (long long k = 0; k < it; ++k) mean += times[k];
        mean /= it;
        qsort(times, it, sizeof(double), bench_cmp_double);
        double p50 = percentile(times, it, 0.5), p99 = percentile(times, it, 0.99);
        char alg[64] = "null", bus[64] = "null";
        if (op != BARRIER && p50 > 0) {
          double algbw = c.total_bytes / (p50 * 1e-6) / 1e9;
          snprintf(alg, sizeof(alg), "%.6g", algbw);
          snprintf(bus, sizeof(bus), "%.6g", algbw * bus_factor(op, n));
        }
        printf(
            "{\"system\":\"mpi\",\"op\":\"%s\",\"bytes\":%zu,\"world\":%d,\"dtype\":\"%s\","
            "\"iters\":%lld,\"warmup\":%lld,\"p50_us\":%.6g,\"p99_us\":%.6g,\"min_us\":%.6g,"
            "\"mean_us\":%.6g,\"algbw_gbps\":%s,\"busbw_gbps\":%s,\"verified\":%s,"
            "\"vol_csw_per_iter\":%.4g,\"invol_csw_per_iter\":%.4g}\n",
            kOpNames[op], c.total_bytes, n, dt.name, it, warmup, p50, p99, times[0], mean, alg, bus,
            verify ? (wrong == 0 ? "true" : "false") : "null", (double)csw[0] / it,
            (double)csw[1] / it);
        fflush(stdout);
      }
      free(times);
      case_free(&c);
    }
  }
  MPI_Finalize();
  return exit_code;
}
