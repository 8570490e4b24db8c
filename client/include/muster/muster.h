/* muster's C API: the stable seam between muster and other languages.
 *
 * libmuster.so exports these functions and nothing else (a version script
 * keeps muster's C++ internal). It links gRPC, protobuf, Abseil and Gloo as
 * shared libraries: load it with RTLD_LOCAL before anything that depends on
 * it (the Python package does), so that they bind among its own
 * dependencies and never to other copies in the process (libtorch has its
 * own Gloo and protobuf). The Python package and the torch.distributed
 * backend "muster" reach muster only through this API.
 *
 * Conventions:
 *  - Handles are opaque and reference counted: each *_create / *_init /
 *    *_retain gives one reference, each *_release drops one. A group handle
 *    keeps its world alive; a work handle keeps its group alive (releasing
 *    a group's handle never cancels its queued work) but not the buffers:
 *    they must stay valid until the work completed.
 *  - Functions that can fail return a muster_code (0 = MUSTER_OK). The
 *    codes are absl/gRPC's canonical codes. On failure the calling
 *    thread's muster_last_error() holds the message (valid until this
 *    thread's next muster_* call). No function throws or aborts on bad
 *    input; a null handle is MUSTER_INVALID_ARGUMENT.
 *  - Timeouts are seconds as double; a negative timeout is infinite, zero
 *    means "the default" where a default exists (documented per call).
 *  - Collectives return a work handle at once (also when they fail: the
 *    failure is the work's status) unless the arguments could not even be
 *    read (null pointers; unknown dtype, device or reduce op) or the group
 *    was destroyed, which returns an error and *work = NULL.
 *
 * Thread-safety: every function may be called from any thread, except
 * that no other thread may use the world or its groups while
 * muster_world_reconfigure runs (it replaces the groups' insides). Collectives
 * of one group must be called in the same order on every member (c10d).
 */
#ifndef MUSTER_CLIENT_INCLUDE_MUSTER_MUSTER_H_
#define MUSTER_CLIENT_INCLUDE_MUSTER_MUSTER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a struct or function changes incompatibly. */
#define MUSTER_C_API_VERSION 1

typedef enum muster_code {
  MUSTER_OK = 0,
  MUSTER_CANCELLED = 1,
  MUSTER_UNKNOWN = 2,
  MUSTER_INVALID_ARGUMENT = 3,
  MUSTER_DEADLINE_EXCEEDED = 4,
  MUSTER_NOT_FOUND = 5,
  MUSTER_ALREADY_EXISTS = 6,
  MUSTER_PERMISSION_DENIED = 7,
  MUSTER_RESOURCE_EXHAUSTED = 8,
  MUSTER_FAILED_PRECONDITION = 9,
  MUSTER_ABORTED = 10,
  MUSTER_OUT_OF_RANGE = 11,
  MUSTER_UNIMPLEMENTED = 12,
  MUSTER_INTERNAL = 13,
  MUSTER_UNAVAILABLE = 14,
  MUSTER_DATA_LOSS = 15,
  MUSTER_UNAUTHENTICATED = 16
} muster_code;

typedef enum muster_dtype {
  MUSTER_FLOAT16 = 0,
  MUSTER_BFLOAT16 = 1,
  MUSTER_FLOAT32 = 2,
  MUSTER_FLOAT64 = 3,
  MUSTER_INT8 = 4,
  MUSTER_UINT8 = 5,
  MUSTER_INT32 = 6,
  MUSTER_INT64 = 7,
  MUSTER_BOOL = 8,
  MUSTER_COMPLEX64 = 9,
  MUSTER_COMPLEX128 = 10
} muster_dtype;

typedef enum muster_reduce_op {
  MUSTER_SUM = 0,
  MUSTER_AVG = 1,
  MUSTER_PRODUCT = 2,
  MUSTER_MIN = 3,
  MUSTER_MAX = 4,
  MUSTER_BAND = 5,
  MUSTER_BOR = 6,
  MUSTER_BXOR = 7,
  MUSTER_PREMUL_SUM = 8
} muster_reduce_op;

typedef enum muster_device { MUSTER_DEVICE_CPU = 0, MUSTER_DEVICE_CUDA = 1 } muster_device;

/* A buffer: `count` elements of `dtype` at `data` (not owned). CUDA
 * buffers are ordered on `stream` (a cudaStream_t; null: the legacy
 * default stream) like a kernel launched there. */
typedef struct muster_tensor {
  void* data;
  uint64_t count;
  int32_t dtype;  /* muster_dtype */
  int32_t device; /* muster_device */
  void* stream;
} muster_tensor;

typedef struct muster_world muster_world;
typedef struct muster_group muster_group;
typedef struct muster_work muster_work;
typedef struct muster_store muster_store;

/* ---- library ---- */

/* MUSTER_C_API_VERSION of the library (compare with the header's). */
int muster_api_version(void);
/* muster's version string, e.g. "0.1.0". */
const char* muster_version(void);
/* The message of this thread's last failed call ("" if none). */
const char* muster_last_error(void);
/* The code's name, e.g. "DEADLINE_EXCEEDED". */
const char* muster_code_name(int code);
/* Bytes per element of a dtype; 0 for an unknown one. */
size_t muster_dtype_size(int dtype);
/* The store port of the musterd serving the unix socket `socket` (null:
 * $MUSTER_SOCKET, else musterd's default socket); for jobs not launched by
 * muster-run (e.g. torchrun on one node) whose store is that musterd's. */
int muster_daemon_store_port(const char* socket, int32_t* port);

/* ---- joining a job ---- */

/* Every field left at its muster_init_options_default() value is read from
 * the environment the way c10d's env:// does (RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, MUSTER_SOCKET,
 * MUSTER_JOB_ID, MUSTER_GENERATION / TORCHELASTIC_RESTART_COUNT,
 * MUSTER_STORE_TOKEN). Strings are copied; null means unset. */
typedef struct muster_init_options {
  uint32_t struct_size; /* sizeof(muster_init_options), set by _default */
  const char* job_id;
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;
  int32_t local_world_size;
  const char* master_addr; /* the job store: a musterd's store */
  int32_t master_port;
  const char* socket; /* the node's musterd */
  int64_t generation;
  const char* backend; /* the world group's backend config; default "gloo" */
  double timeout_s;    /* default timeout of every group; 0: 30 minutes */
  const char* store_token;
  const char* world_group_name; /* default "world" */
} muster_init_options;

void muster_init_options_default(muster_init_options* options);
/* Joins the job: registers with the node's musterd and forms the world
 * group. `options` may be null (everything from the environment). */
int muster_world_init(const muster_init_options* options, muster_world** world);
muster_world* muster_world_retain(muster_world* world);
/* Drops a reference; the last one (groups hold one each) leaves the job. */
void muster_world_release(muster_world* world);
int muster_world_rank(const muster_world* world);
int muster_world_size(const muster_world* world);
int muster_world_local_rank(const muster_world* world);
int muster_world_local_size(const muster_world* world);
int64_t muster_world_generation(const muster_world* world);
const char* muster_world_job_id(const muster_world* world);
/* The job epoch this rank is in (0 at start; see muster_world_reconfigure). */
int64_t muster_world_epoch(const muster_world* world);
/* Elastic jobs (World::Reconfigure): after a member died, the survivors call
   it, and so does muster_world_init in the process that replaces it; every
   world rank joins the job's next epoch and every group this rank holds is
   formed again under it (handles stay valid). timeout_s 0: the world's
   timeout; negative: none. allow_shrink: form the epoch with the ranks alive
   (and new ones that joined) instead of every rank; muster_world_rank and
   muster_world_size change then. *epoch (may be NULL) receives the new
   epoch. No other thread may use this world or its groups meanwhile. */
int muster_world_reconfigure(muster_world* world, double timeout_s, int allow_shrink,
                             int64_t* epoch);
/* How many processes wait to join the job's next epoch (*waiting). */
int muster_world_pending_joins(muster_world* world, int32_t* waiting);
/* A new reference to the world group. */
muster_group* muster_world_group(muster_world* world);
/* Copies the failures of other ranks this rank was told about, one message
 * per line, into buf (NUL-terminated, truncated to cap). Returns the
 * length of the whole text. */
size_t muster_world_failures(const muster_world* world, char* buf, size_t cap);

/* ---- groups ---- */

typedef struct muster_group_options {
  uint32_t struct_size; /* sizeof(muster_group_options), set by _default */
  const char* name;     /* null: "group_<n>" */
  const char* tag;
  const char* backend; /* null: the world's */
  double timeout_s;    /* 0: the world's */
  /* c10d's use_local_synchronization: only members call and rendezvous;
   * otherwise every world rank calls (non-members get a handle whose
   * muster_group_rank is -1). */
  int32_t local_synchronization;
} muster_group_options;

void muster_group_options_default(muster_group_options* options);
/* c10d's new_group(ranks): `ranks` are global ranks, in group-rank order.
 * `options` may be null. */
int muster_group_create(muster_world* world, const int32_t* ranks, size_t nranks,
                        const muster_group_options* options, muster_group** group);
muster_group* muster_group_retain(muster_group* group);
void muster_group_release(muster_group* group);
/* Destroys the group in musterd (c10d's destroy_process_group(group));
 * the handle stays valid (release it) but later collectives on it fail
 * with FAILED_PRECONDITION; work already issued completes. */
int muster_group_destroy(muster_group* group);
int muster_group_rank(const muster_group* group); /* -1: not a member */
int muster_group_size(const muster_group* group);
/* Copies up to `cap` global ranks; returns the group's size. */
size_t muster_group_ranks(const muster_group* group, int32_t* ranks, size_t cap);
int muster_group_global_rank(const muster_group* group, int group_rank, int32_t* global_rank);
int muster_group_group_rank(const muster_group* group, int global_rank, int32_t* group_rank);
const char* muster_group_name(const muster_group* group);
const char* muster_group_tag(const muster_group* group);
/* Canonical backend config, e.g. "cpu:gloo,cuda:nccl". */
const char* muster_group_backend(const muster_group* group);
/* The world this group belongs to (a new reference). */
muster_world* muster_group_world(muster_group* group);
/* Blocks until every member called it; timeout 0: the group's. Goes
 * through musterd (works even when the group's communicator broke). */
int muster_group_barrier(muster_group* group, double timeout_s);
/* c10d's monitored_barrier: DEADLINE_EXCEEDED naming the members that did
 * not arrive within `timeout_s`. */
int muster_group_monitored_barrier(muster_group* group, double timeout_s);

/* ---- collectives (c10d semantics, asynchronous) ---- */

int muster_all_reduce(muster_group* group, const muster_tensor* tensor, int op, double premul_scale,
                      muster_work** work);
int muster_all_reduce_coalesced(muster_group* group, const muster_tensor* tensors, size_t n, int op,
                                muster_work** work);
int muster_broadcast(muster_group* group, const muster_tensor* tensor, int root,
                     muster_work** work);
int muster_reduce(muster_group* group, const muster_tensor* tensor, int root, int op,
                  muster_work** work);
/* outputs[i] receives group rank i's input; n must be the group size. */
int muster_all_gather(muster_group* group, const muster_tensor* outputs, size_t n,
                      const muster_tensor* input, muster_work** work);
/* output holds size * input->count elements; input is apart from output or
 * is this rank's part of it (in place): any other overlap is
 * MUSTER_INVALID_ARGUMENT. */
int muster_all_gather_into_tensor(muster_group* group, const muster_tensor* output,
                                  const muster_tensor* input, muster_work** work);
/* outputs[i * size + j] receives group rank j's inputs[i] (n inputs). */
int muster_all_gather_coalesced(muster_group* group, const muster_tensor* outputs,
                                const muster_tensor* inputs, size_t n, muster_work** work);
/* outputs (n = size) matter at the root only; elsewhere n may be 0. */
int muster_gather(muster_group* group, const muster_tensor* outputs, size_t n,
                  const muster_tensor* input, int root, muster_work** work);
/* inputs (n = size) matter at the root only; elsewhere n may be 0. */
int muster_scatter(muster_group* group, const muster_tensor* output, const muster_tensor* inputs,
                   size_t n, int root, muster_work** work);
/* inputs[i] (n = size) is reduced into group rank i's output. */
int muster_reduce_scatter(muster_group* group, const muster_tensor* output,
                          const muster_tensor* inputs, size_t n, int op, muster_work** work);
/* input holds size * output->count elements. */
int muster_reduce_scatter_tensor(muster_group* group, const muster_tensor* output,
                                 const muster_tensor* input, int op, muster_work** work);
/* outputs[i] receives group rank i's inputs[this rank]; n = size. */
int muster_all_to_all(muster_group* group, const muster_tensor* outputs,
                      const muster_tensor* inputs, size_t n, muster_work** work);
/* Split sizes in elements (n_splits = size each, or 0 for equal splits). */
int muster_all_to_all_single(muster_group* group, const muster_tensor* output,
                             const muster_tensor* input, const uint64_t* output_splits,
                             const uint64_t* input_splits, size_t n_splits, muster_work** work);
/* A barrier run by the ranks themselves (no daemon round trip). */
int muster_collective_barrier(muster_group* group, muster_work** work);

/* Byte blobs ("object" collectives); results are read from the work once
 * it completed, with muster_work_blob. */
int muster_broadcast_bytes(muster_group* group, const void* data, size_t size, int root,
                           muster_work** work);
int muster_all_gather_bytes(muster_group* group, const void* data, size_t size, muster_work** work);
int muster_gather_bytes(muster_group* group, const void* data, size_t size, int root,
                        muster_work** work);
/* The root passes n = size blobs; other ranks pass n = 0. */
int muster_scatter_bytes(muster_group* group, const void* const* blobs, const size_t* sizes,
                         size_t n, int root, muster_work** work);

/* Point to point; peers are global ranks (c10d). */
int muster_send(muster_group* group, const muster_tensor* tensor, int dst, uint64_t tag,
                muster_work** work);
int muster_recv(muster_group* group, const muster_tensor* tensor, int src, uint64_t tag,
                muster_work** work);
/* c10d's recv(src=None): the first message with `tag` from any member;
 * muster_work_source_rank names the sender once the work completed.
 * Messages match by (peer, tag): different tags in any order, one tag in
 * the order sent. */
int muster_recv_anysource(muster_group* group, const muster_tensor* tensor, uint64_t tag,
                          muster_work** work);
typedef struct muster_p2p_op {
  int32_t send; /* 1: send, 0: receive */
  int32_t peer; /* global rank */
  uint64_t tag;
  muster_tensor tensor;
} muster_p2p_op;
/* c10d's batch_isend_irecv: `works` receives n handles. */
int muster_batch_isend_irecv(muster_group* group, const muster_p2p_op* ops, size_t n,
                             muster_work** works);

/* ---- work handles ---- */

muster_work* muster_work_retain(muster_work* work);
void muster_work_release(muster_work* work);
/* Blocks until the work completed or `timeout_s` passed
 * (DEADLINE_EXCEEDED; the collective itself goes on); returns its status. */
int muster_work_wait(muster_work* work, double timeout_s);
/* 1 if completed, else 0. Non-blocking. */
int muster_work_is_completed(muster_work* work);
/* Its status once completed (FAILED_PRECONDITION before). */
int muster_work_status(muster_work* work);
/* CUDA work: also blocks the CPU until the GPU finished it. */
int muster_work_synchronize(muster_work* work, double timeout_s);
/* Its sequence number in its group (from 1; 0 if it never started). */
uint64_t muster_work_sequence(const muster_work* work);
/* A completed receive: the sender's global rank; -1 otherwise. */
int muster_work_source_rank(const muster_work* work);
/* Calls `callback(arg, code, message)` once the work completed: at once
 * on this thread if it already has, else on the thread that completes it
 * (a group's executor or a waiter; possibly just after another thread's
 * muster_work_wait returned). A work with a callback is run by its group's
 * executor at once, so use callbacks only when nobody waits (futures).
 * The callback must not block on another collective of the same group,
 * nor release the last reference to the work's group (directly, or by
 * releasing the work when that holds the last one): hand such releases to
 * another thread. Returns MUSTER_OK, or FAILED_PRECONDITION if the work
 * already has a callback. */
typedef void (*muster_work_callback)(void* arg, int code, const char* message);
int muster_work_on_complete(muster_work* work, muster_work_callback callback, void* arg);
/* Byte-blob results, once completed: the number of blobs and blob i. */
size_t muster_work_blob_count(const muster_work* work);
int muster_work_blob(const muster_work* work, size_t i, const void** data, size_t* size);

/* ---- the job's store ---- */

/* The store of the group's job (namespaced to the job attempt). */
int muster_world_store(muster_world* world, muster_store** store);
/* A TCP store client of its own: a musterd's store (native protocol, with
 * `token` if it needs one) or, with torch113 = 1, any PyTorch TCPStore. */
int muster_store_connect(const char* host, int port, const char* token, int torch113,
                         double timeout_s, muster_store** store);
/* Keys of `store` under "<prefix>/" (c10d's PrefixStore); a new handle. */
int muster_store_prefixed(muster_store* store, const char* prefix, muster_store** prefixed);
void muster_store_release(muster_store* store);
/* The default timeout of blocking calls (0 in the calls below means it). */
void muster_store_set_timeout(muster_store* store, double timeout_s);

int muster_store_set(muster_store* store, const char* key, const void* value, size_t size);
/* Blocks until the key exists. *value is malloc'ed: free it with
 * muster_free. */
int muster_store_get(muster_store* store, const char* key, double timeout_s, void** value,
                     size_t* size);
int muster_store_add(muster_store* store, const char* key, int64_t delta, int64_t* result);
/* c10d's compare_set; *result (malloc'ed) is the value stored afterwards. */
int muster_store_compare_set(muster_store* store, const char* key, const void* expected,
                             size_t expected_size, const void* desired, size_t desired_size,
                             void** result, size_t* result_size);
int muster_store_wait(muster_store* store, const char* const* keys, size_t n, double timeout_s);
/* *exist = 1 if every key exists now. */
int muster_store_check(muster_store* store, const char* const* keys, size_t n, int* exist);
/* *existed = 1 if the key existed. */
int muster_store_delete_key(muster_store* store, const char* key, int* existed);
int muster_store_num_keys(muster_store* store, int64_t* n);
int muster_store_append(muster_store* store, const char* key, const void* value, size_t size);
/* Every key, sorted, as one malloc'ed block of NUL-terminated strings
 * (*size bytes in all, *n keys). */
int muster_store_list_keys(muster_store* store, char** keys, size_t* size, size_t* n);

/* Frees what muster_store_get / compare_set / list_keys returned. */
void muster_free(void* p);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MUSTER_CLIENT_INCLUDE_MUSTER_MUSTER_H_ */
