/* One rank of the C API test (c_api_test.sh runs two under muster-run).
 * Plain C11 over libmuster.so: it proves muster.h is a C header and that
 * the library does what it says. Every check prints what it expected and
 * what it got; the rank prints "RANK r OK" and exits 0 only if all passed.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "muster/muster.h"

static int failures = 0;
static int my_rank = -1;

#define CHECK(cond, ...)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "rank %d: FAIL %s:%d: %s: ", my_rank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                     \
      fprintf(stderr, "\n");                                                            \
      ++failures;                                                                       \
    }                                                                                   \
  } while (0)

/* Calls that must succeed: on failure print the code and message, stop. */
#define MUST(call)                                                                               \
  do {                                                                                           \
    int code_ = (call);                                                                          \
    if (code_ != MUSTER_OK) {                                                                    \
      fprintf(stderr, "rank %d: FAIL %s:%d: %s -> %s: %s\n", my_rank, __FILE__, __LINE__, #call, \
              muster_code_name(code_), muster_last_error());                                     \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

static muster_tensor cpu_tensor(void* data, uint64_t count, int dtype) {
  muster_tensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.count = count;
  t.dtype = dtype;
  t.device = MUSTER_DEVICE_CPU;
  return t;
}

/* Waits for a work, releases it, returns its code. */
static int finish(muster_work* work) {
  int code = muster_work_wait(work, 60.0);
  muster_work_release(work);
  return code;
}

/* Written by whichever thread completes the work. */
struct callback_record {
  atomic_int calls;
  atomic_int code;
};

static void on_complete(void* arg, int code, const char* message) {
  struct callback_record* r = (struct callback_record*)arg;
  (void)message;
  atomic_store(&r->code, code);
  atomic_fetch_add(&r->calls, 1);
}

int main(void) {
  CHECK(muster_api_version() == MUSTER_C_API_VERSION, "library API %d, header %d",
        muster_api_version(), MUSTER_C_API_VERSION);
  CHECK(strlen(muster_version()) > 0, "empty version");
  CHECK(strcmp(muster_code_name(MUSTER_DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED") == 0, "%s",
        muster_code_name(MUSTER_DEADLINE_EXCEEDED));
  CHECK(muster_dtype_size(MUSTER_BFLOAT16) == 2, "%zu", muster_dtype_size(MUSTER_BFLOAT16));

  /* Options with a wrong struct_size are refused, not misread. */
  muster_init_options bad;
  memset(&bad, 0, sizeof(bad));
  muster_world* world = NULL;
  int code = muster_world_init(&bad, &world);
  CHECK(code == MUSTER_INVALID_ARGUMENT && world == NULL, "code %d", code);
  CHECK(strstr(muster_last_error(), "struct_size") != NULL, "%s", muster_last_error());

  muster_init_options options;
  muster_init_options_default(&options);
  options.world_group_name = "c-world";
  MUST(muster_world_init(&options, &world));
  my_rank = muster_world_rank(world);
  int size = muster_world_size(world);
  CHECK(size == 2, "world size %d", size);
  int peer = 1 - my_rank;

  muster_group* wg = muster_world_group(world);
  CHECK(strcmp(muster_group_name(wg), "c-world") == 0, "world group '%s'", muster_group_name(wg));
  CHECK(muster_group_rank(wg) == my_rank, "group rank %d", muster_group_rank(wg));

  /* all_reduce, with a completion callback. */
  float x[3] = {1.0f + my_rank, 2.0f, -3.0f * my_rank};
  muster_tensor tx = cpu_tensor(x, 3, MUSTER_FLOAT32);
  muster_work* work = NULL;
  MUST(muster_all_reduce(wg, &tx, MUSTER_SUM, 1.0, &work));
  struct callback_record record;
  atomic_init(&record.calls, 0);
  atomic_init(&record.code, -1);
  MUST(muster_work_on_complete(work, on_complete, &record));
  MUST(muster_work_wait(work, 60.0));
  /* The callback runs on the completing thread, maybe just after wait. */
  for (int i = 0; i < 5000 && atomic_load(&record.calls) == 0; ++i) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  CHECK(muster_work_is_completed(work) == 1, "not completed after wait");
  CHECK(muster_work_sequence(work) >= 1, "sequence %llu",
        (unsigned long long)muster_work_sequence(work));
  CHECK(atomic_load(&record.calls) == 1 && atomic_load(&record.code) == MUSTER_OK,
        "callback calls %d code %d", atomic_load(&record.calls), atomic_load(&record.code));
  code = muster_work_on_complete(work, on_complete, &record);
  CHECK(code == MUSTER_FAILED_PRECONDITION, "a second callback gave %d", code);
  muster_work_release(work);
  CHECK(x[0] == 3.0f && x[1] == 4.0f && x[2] == -3.0f, "all_reduce got %g %g %g", x[0], x[1], x[2]);

  /* MAX on int64, broadcast of int32. */
  int64_t m = 10 * (my_rank + 1);
  muster_tensor tm = cpu_tensor(&m, 1, MUSTER_INT64);
  MUST(muster_all_reduce(wg, &tm, MUSTER_MAX, 1.0, &work));
  MUST(finish(work));
  CHECK(m == 20, "max %lld", (long long)m);
  int32_t b[2] = {my_rank == 1 ? 7 : 0, my_rank == 1 ? 8 : 0};
  muster_tensor tb = cpu_tensor(b, 2, MUSTER_INT32);
  MUST(muster_broadcast(wg, &tb, 1, &work));
  MUST(finish(work));
  CHECK(b[0] == 7 && b[1] == 8, "broadcast %d %d", b[0], b[1]);

  /* all_gather_into_tensor and reduce_scatter_tensor. */
  double in[2] = {my_rank * 10.0, my_rank * 10.0 + 1};
  double gathered[4] = {0};
  muster_tensor tin = cpu_tensor(in, 2, MUSTER_FLOAT64);
  muster_tensor tg = cpu_tensor(gathered, 4, MUSTER_FLOAT64);
  MUST(muster_all_gather_into_tensor(wg, &tg, &tin, &work));
  MUST(finish(work));
  CHECK(gathered[0] == 0 && gathered[1] == 1 && gathered[2] == 10 && gathered[3] == 11,
        "all_gather %g %g %g %g", gathered[0], gathered[1], gathered[2], gathered[3]);
  double block[2] = {0};
  muster_tensor tblock = cpu_tensor(block, 2, MUSTER_FLOAT64);
  MUST(muster_reduce_scatter_tensor(wg, &tblock, &tg, MUSTER_SUM, &work));
  MUST(finish(work));
  CHECK(block[0] == 2 * gathered[2 * my_rank] && block[1] == 2 * gathered[2 * my_rank + 1],
        "reduce_scatter %g %g", block[0], block[1]);

  /* all_to_all_single with uneven splits: rank r sends r+1 elements to
   * each peer j... here rank 0 sends 1 to 0 and 2 to 1; rank 1 sends 3 to 0
   * and 1 to 1. */
  int32_t send[4], recv[4] = {-1, -1, -1, -1};
  uint64_t in_splits[2], out_splits[2];
  if (my_rank == 0) {
    in_splits[0] = 1, in_splits[1] = 2, out_splits[0] = 1, out_splits[1] = 3;
  } else {
    in_splits[0] = 3, in_splits[1] = 1, out_splits[0] = 2, out_splits[1] = 1;
  }
  uint64_t in_total = in_splits[0] + in_splits[1], out_total = out_splits[0] + out_splits[1];
  for (uint64_t i = 0; i < in_total; ++i) send[i] = 100 * my_rank + (int32_t)i;
  muster_tensor ts = cpu_tensor(send, in_total, MUSTER_INT32);
  muster_tensor tr = cpu_tensor(recv, out_total, MUSTER_INT32);
  MUST(muster_all_to_all_single(wg, &tr, &ts, out_splits, in_splits, 2, &work));
  MUST(finish(work));
  if (my_rank == 0) {
    CHECK(recv[0] == 0 && recv[1] == 100 && recv[2] == 101 && recv[3] == 102,
          "all_to_all_single %d %d %d %d", recv[0], recv[1], recv[2], recv[3]);
  } else {
    CHECK(recv[0] == 1 && recv[1] == 2 && recv[2] == 103, "all_to_all_single %d %d %d", recv[0],
          recv[1], recv[2]);
  }

  /* Splits that do not add up: a failed work naming the problem, and the
   * group still works afterwards. */
  uint64_t wrong[2] = {5, 5};
  MUST(muster_all_to_all_single(wg, &tr, &ts, wrong, wrong, 2, &work));
  code = finish(work);
  CHECK(code == MUSTER_INVALID_ARGUMENT, "bad splits gave %s: %s", muster_code_name(code),
        muster_last_error());

  /* Splits whose sum wraps past 2^64 back to the right total: refused, not
   * taken for ~2^64 elements to copy. */
  uint64_t wraps[2] = {UINT64_MAX, in_total + 1};
  MUST(muster_all_to_all_single(wg, &tr, &ts, out_splits, wraps, 2, &work));
  code = finish(work);
  CHECK(code == MUSTER_INVALID_ARGUMENT, "wrapping splits gave %s: %s", muster_code_name(code),
        muster_last_error());

  /* A count whose bytes would wrap. */
  muster_tensor huge = cpu_tensor(x, (uint64_t)1 << 62, MUSTER_FLOAT32);
  MUST(muster_all_reduce(wg, &huge, MUSTER_SUM, 1.0, &work));
  code = finish(work);
  CHECK(code == MUSTER_INVALID_ARGUMENT && strstr(muster_last_error(), "more than memory") != NULL,
        "2^62 float32 gave %s: %s", muster_code_name(code), muster_last_error());

  /* An empty batch of point-to-point operations, with no array for its
   * (zero) works: nothing to do, nothing written. */
  CHECK(muster_batch_isend_irecv(wg, NULL, 0, NULL) == MUSTER_OK, "empty batch: %s",
        muster_last_error());

  /* A bitwise op on floats is refused. */
  MUST(muster_all_reduce(wg, &tx, MUSTER_BAND, 1.0, &work));
  code = finish(work);
  CHECK(code == MUSTER_INVALID_ARGUMENT, "BAND on float32 gave %s", muster_code_name(code));
  CHECK(strlen(muster_last_error()) > 0, "no message");

  /* Arguments the C layer cannot read: an error and no work. */
  muster_tensor junk = cpu_tensor(x, 3, 99);
  work = NULL;
  code = muster_all_reduce(wg, &junk, MUSTER_SUM, 1.0, &work);
  CHECK(code == MUSTER_INVALID_ARGUMENT && work == NULL, "unknown dtype gave %d", code);
  CHECK(strstr(muster_last_error(), "dtype") != NULL, "%s", muster_last_error());
  code = muster_all_reduce(NULL, &tx, MUSTER_SUM, 1.0, &work);
  CHECK(code == MUSTER_INVALID_ARGUMENT, "null group gave %d", code);

  /* Still usable after the failures. */
  int32_t one = 1;
  muster_tensor tone = cpu_tensor(&one, 1, MUSTER_INT32);
  MUST(muster_all_reduce(wg, &tone, MUSTER_SUM, 1.0, &work));
  MUST(finish(work));
  CHECK(one == 2, "sum after failures %d", one);

  /* Byte blobs of different sizes. */
  char blob[32];
  int n = snprintf(blob, sizeof(blob), "rank-%d%s", my_rank, my_rank ? "-longer" : "");
  MUST(muster_all_gather_bytes(wg, blob, (size_t)n, &work));
  MUST(muster_work_wait(work, 60.0));
  CHECK(muster_work_blob_count(work) == 2, "blobs %zu", muster_work_blob_count(work));
  const void* data = NULL;
  size_t data_size = 0;
  MUST(muster_work_blob(work, 1, &data, &data_size));
  CHECK(data_size == strlen("rank-1-longer") && memcmp(data, "rank-1-longer", data_size) == 0,
        "blob 1 has %zu bytes", data_size);
  code = muster_work_blob(work, 2, &data, &data_size);
  CHECK(code == MUSTER_OUT_OF_RANGE, "blob 2 gave %d", code);
  muster_work_release(work);

  /* Point to point. */
  int64_t msg = my_rank == 0 ? 4242 : 0;
  muster_tensor tmsg = cpu_tensor(&msg, 1, MUSTER_INT64);
  if (my_rank == 0) {
    MUST(muster_send(wg, &tmsg, peer, 5, &work));
  } else {
    MUST(muster_recv(wg, &tmsg, peer, 5, &work));
  }
  MUST(finish(work));
  CHECK(msg == 4242, "recv %lld", (long long)msg);

  /* A named subgroup, created by every rank. */
  int32_t ranks[2] = {1, 0};
  muster_group_options gopts;
  muster_group_options_default(&gopts);
  gopts.name = "c-reversed";
  muster_group* sub = NULL;
  MUST(muster_group_create(world, ranks, 2, &gopts, &sub));
  CHECK(muster_group_rank(sub) == 1 - my_rank, "subgroup rank %d", muster_group_rank(sub));
  int32_t global = -1;
  MUST(muster_group_global_rank(sub, 0, &global));
  CHECK(global == 1, "group rank 0 is global %d", global);
  code = muster_group_global_rank(sub, 5, &global);
  CHECK(code != MUSTER_OK, "group rank 5 accepted");
  int32_t got[4] = {0};
  CHECK(muster_group_ranks(sub, got, 4) == 2 && got[0] == 1 && got[1] == 0, "ranks %d %d", got[0],
        got[1]);
  float y = 1.5f;
  muster_tensor ty = cpu_tensor(&y, 1, MUSTER_FLOAT32);
  MUST(muster_reduce(sub, &ty, 0, MUSTER_SUM, &work));
  MUST(finish(work));
  if (my_rank == 1) CHECK(y == 3.0f, "reduce at root %g", y);
  MUST(muster_group_barrier(sub, 30.0));
  MUST(muster_group_destroy(sub));
  work = (muster_work*)&record; /* must be reset to NULL */
  code = muster_all_reduce(sub, &ty, MUSTER_SUM, 1.0, &work);
  CHECK(code == MUSTER_FAILED_PRECONDITION && work == NULL, "collective on a destroyed group: %d",
        code);
  CHECK(strstr(muster_last_error(), "destroyed") != NULL, "%s", muster_last_error());
  muster_group_release(sub);

  /* A work keeps its group: releasing the group's handle right after
   * issuing a collective does not cancel it. */
  gopts.name = "c-dropped";
  muster_group* dropped = NULL;
  MUST(muster_group_create(world, ranks, 2, &gopts, &dropped));
  int64_t d = my_rank + 1;
  muster_tensor td = cpu_tensor(&d, 1, MUSTER_INT64);
  MUST(muster_all_reduce(dropped, &td, MUSTER_SUM, 1.0, &work));
  muster_group_release(dropped);
  MUST(finish(work));
  CHECK(d == 3, "all_reduce after releasing the group handle: %lld", (long long)d);
  code = muster_group_destroy(wg);
  CHECK(code == MUSTER_FAILED_PRECONDITION, "destroying the world group gave %d", code);

  /* The job's store. */
  muster_store* store = NULL;
  MUST(muster_world_store(world, &store));
  char key[32];
  snprintf(key, sizeof(key), "c-key-%d", my_rank);
  MUST(muster_store_set(store, key, "v", 1));
  int64_t counter = 0;
  MUST(muster_store_add(store, "c-counter", 5, &counter));
  CHECK(counter == 5 || counter == 10, "counter %lld", (long long)counter);
  snprintf(key, sizeof(key), "c-key-%d", peer);
  void* value = NULL;
  size_t value_size = 0;
  MUST(muster_store_get(store, key, 30.0, &value, &value_size));
  CHECK(value_size == 1 && ((char*)value)[0] == 'v', "get %zu bytes", value_size);
  muster_free(value);
  code = muster_store_get(store, "never-set", 0.2, &value, &value_size);
  CHECK(code == MUSTER_DEADLINE_EXCEEDED, "missing key gave %s", muster_code_name(code));
  const char* keys[2] = {"c-key-0", "c-key-1"};
  MUST(muster_store_wait(store, keys, 2, 30.0));
  int exist = 0;
  MUST(muster_store_check(store, keys, 2, &exist));
  CHECK(exist == 1, "check %d", exist);
  void* cas = NULL;
  size_t cas_size = 0;
  snprintf(key, sizeof(key), "c-cas-%d", my_rank);
  MUST(muster_store_compare_set(store, key, "", 0, "first", 5, &cas, &cas_size));
  CHECK(cas_size == 5 && memcmp(cas, "first", 5) == 0, "compare_set %zu", cas_size);
  muster_free(cas);
  MUST(muster_group_barrier(wg, 30.0));
  char* listed = NULL;
  size_t listed_size = 0, nkeys = 0;
  MUST(muster_store_list_keys(store, &listed, &listed_size, &nkeys));
  int saw_counter = 0;
  for (size_t off = 0; off < listed_size; off += strlen(listed + off) + 1) {
    if (strcmp(listed + off, "c-counter") == 0) saw_counter = 1;
  }
  CHECK(saw_counter && nkeys >= 5, "list_keys: %zu keys, counter %d", nkeys, saw_counter);
  muster_free(listed);
  MUST(muster_group_barrier(wg, 30.0)); /* both listed before a key goes */
  int existed = 0;
  MUST(muster_store_delete_key(store, "c-cas-0", &existed));
  MUST(muster_group_barrier(wg, 30.0));
  if (my_rank == 0) {
    int exist_now = 1;
    const char* gone[1] = {"c-cas-0"};
    MUST(muster_store_check(store, gone, 1, &exist_now));
    CHECK(exist_now == 0, "c-cas-0 still exists after delete_key");
  }
  muster_store_release(store);

  muster_group_release(wg);
  muster_world_release(world);
  if (failures > 0) {
    fprintf(stderr, "rank %d: %d check(s) failed\n", my_rank, failures);
    return 1;
  }
  printf("RANK %d OK\n", my_rank);
  return 0;
}
