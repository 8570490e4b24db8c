// The C API (muster/muster.h) over the C++ SDK: handles, error codes and
// the thread-local last error. Nothing here adds behaviour of its own; it
// translates types and keeps what a C caller cannot own (byte-blob results,
// callbacks) alive until the work completed.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/paths.h"
#include "common/version.h"
#include "muster/muster.h"
#include "muster/prefix_store.h"
#include "muster/tcp_store.h"
#include "muster/world.h"
#include "proto/admin.grpc.pb.h"

struct muster_world {
  std::atomic<int> refs{1};
  std::unique_ptr<muster::World> world;
  std::string job_id;
};

struct muster_group {
  std::atomic<int> refs{1};
  muster_world* world = nullptr;  // one reference, dropped after `group`
  std::shared_ptr<muster::ProcessGroup> group;
  std::string name, tag, backend;
  std::atomic<bool> destroyed{false};  // muster_group_destroy succeeded
};

namespace {

// What a C caller cannot keep alive itself: byte-blob inputs and results.
// Attached to the SDK's Work (Work::Retain), so a handle released before
// completion frees nothing the collective still writes.
struct WorkState {
  std::string input;
  std::vector<std::string> blobs;  // written by the collective, read after it
};

}  // namespace

struct muster_work {
  std::atomic<int> refs{1};
  // One reference: the group (its executor, its queue) lives as long as any
  // work of it, so dropping a group's handle never cancels queued work.
  muster_group* group = nullptr;
  std::shared_ptr<muster::Work> work;
  std::shared_ptr<WorkState> state;  // null unless a byte-blob collective
  std::atomic<bool> has_callback{false};
};

struct muster_store {
  std::shared_ptr<muster::Store> store;
};

namespace {

constexpr int kOk = 0;  // MUSTER_OK as an int (lambdas deduce one return type)
using muster::DType;
using muster::ReduceOp;
using muster::Tensor;

thread_local std::string last_error;

int Fail(absl::StatusCode code, absl::string_view message) {
  last_error = std::string(message);
  return static_cast<int>(code);
}

int FromStatus(const absl::Status& status) {
  if (status.ok()) return kOk;
  return Fail(status.code(), status.message());
}

int InvalidArgument(absl::string_view message) {
  return Fail(absl::StatusCode::kInvalidArgument, message);
}

// Reference counting of handles (they all have `std::atomic<int> refs`).
template <typename Handle>
Handle* AddRef(Handle* h) {
  if (h != nullptr) h->refs.fetch_add(1, std::memory_order_relaxed);
  return h;
}

// Drops a reference; true if it was the last (the caller frees the handle).
template <typename Handle>
bool DropRef(Handle* h) {
  return h != nullptr && h->refs.fetch_sub(1, std::memory_order_acq_rel) == 1;
}

// Runs `body`, turning an escaping C++ exception (allocation failure) into
// INTERNAL: nothing may unwind through a C caller.
template <typename Body>
int Guarded(Body body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(absl::StatusCode::kResourceExhausted, "out of memory");
  } catch (const std::exception& e) {
    return Fail(absl::StatusCode::kInternal, absl::StrCat("muster: unexpected error: ", e.what()));
  } catch (...) {
    return Fail(absl::StatusCode::kInternal, "muster: unexpected error");
  }
}

// Seconds as a duration: negative is infinite, zero is `zero_means`.
absl::Duration Seconds(double s, absl::Duration zero_means) {
  if (s < 0) return absl::InfiniteDuration();
  if (s == 0) return zero_means;
  return absl::Seconds(s);
}

int ToTensor(const muster_tensor* in, Tensor* out) {
  if (in == nullptr) return InvalidArgument("tensor is null");
  if (in->dtype < 0 || in->dtype >= muster::kNumDTypes) {
    return InvalidArgument(absl::StrCat("unknown dtype ", in->dtype));
  }
  if (in->device != MUSTER_DEVICE_CPU && in->device != MUSTER_DEVICE_CUDA) {
    return InvalidArgument(absl::StrCat("unknown device ", in->device));
  }
  if (in->data == nullptr && in->count > 0) {
    return InvalidArgument("tensor data is null but its count is not 0");
  }
  out->data = in->data;
  out->count = in->count;
  out->dtype = static_cast<DType>(in->dtype);
  out->device = static_cast<muster::Device>(in->device);
  out->stream = in->stream;
  return kOk;
}

int ToTensors(const muster_tensor* in, size_t n, std::vector<Tensor>* out) {
  if (in == nullptr && n > 0) return InvalidArgument("tensor list is null");
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (int c = ToTensor(&in[i], &(*out)[i]); c != kOk) {
      return Fail(static_cast<absl::StatusCode>(c), absl::StrCat("tensor ", i, ": ", last_error));
    }
  }
  return kOk;
}

int ToOp(int op, ReduceOp* out) {
  if (op < 0 || op >= muster::kNumReduceOps) {
    return InvalidArgument(absl::StrCat("unknown reduce op ", op));
  }
  *out = static_cast<ReduceOp>(op);
  return kOk;
}

int CheckGroup(const muster_group* group, muster_work** work) {
  if (work == nullptr) return InvalidArgument("work out-pointer is null");
  *work = nullptr;
  if (group == nullptr) return InvalidArgument("group is null");
  if (group->destroyed.load(std::memory_order_relaxed)) {
    return Fail(absl::StatusCode::kFailedPrecondition,
                absl::StrCat("group '", group->name, "' was destroyed"));
  }
  return kOk;
}

// Wraps an SDK work. No completion callback is registered unless the caller
// asks for one (muster_work_on_complete): a registered callback makes the
// group's executor run the collective at once, while a caller that waits
// runs it on its own thread, with no hand-off.
muster_work* Wrap(muster_group* group, std::shared_ptr<muster::Work> work,
                  std::shared_ptr<WorkState> state = nullptr) {
  auto* w = new muster_work;
  w->group = muster_group_retain(group);
  if (state != nullptr) work->Retain(state);
  w->work = std::move(work);
  w->state = std::move(state);
  return w;
}

int Deliver(muster_group* group, std::shared_ptr<muster::Work> work, muster_work** out) {
  *out = Wrap(group, std::move(work));
  return kOk;
}

}  // namespace

extern "C" {

int muster_api_version(void) { return MUSTER_C_API_VERSION; }
const char* muster_version(void) { return muster::kVersion; }
const char* muster_last_error(void) { return last_error.c_str(); }

const char* muster_code_name(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code < 0 || code >= static_cast<int>(sizeof(kNames) / sizeof(kNames[0]))) return "UNKNOWN";
  return kNames[code];
}

size_t muster_dtype_size(int dtype) {
  if (dtype < 0 || dtype >= muster::kNumDTypes) return 0;
  return muster::DTypeSize(static_cast<DType>(dtype));
}

int muster_daemon_store_port(const char* socket, int32_t* port) {
  if (port == nullptr) return InvalidArgument("port out-pointer is null");
  return Guarded([&] {
    std::string path = socket != nullptr && socket[0] != '\0' ? socket : "";
    if (path.empty()) {
      const char* env = std::getenv("MUSTER_SOCKET");
      path = env != nullptr && env[0] != '\0' ? env : muster::ClientSocketPath();
    }
    if (absl::Status s = muster::CheckDefaultSocketOwner(path); !s.ok()) return FromStatus(s);
    auto channel =
        grpc::CreateChannel(absl::StrCat("unix:", path), grpc::InsecureChannelCredentials());
    auto stub = muster::v1::Admin::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    muster::v1::StatusRequest req;
    muster::v1::StatusResponse resp;
    grpc::Status s = stub->Status(&context, req, &resp);
    if (!s.ok()) {
      return Fail(absl::StatusCode::kUnavailable,
                  absl::StrCat("cannot reach musterd at unix socket ", path, ": ",
                               s.error_message(), " (is it running? MUSTER_SOCKET?)"));
    }
    if (resp.store_port() <= 0) {
      return Fail(absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("the musterd at ", path, " runs no store (--store=false)"));
    }
    *port = resp.store_port();
    return kOk;
  });
}

// ---- joining a job ----

void muster_init_options_default(muster_init_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->rank = -1;
  o->world_size = -1;
  o->local_rank = -1;
  o->local_world_size = -1;
  o->generation = -1;
}

int muster_world_init(const muster_init_options* o, muster_world** world) {
  if (world == nullptr) return InvalidArgument("world out-pointer is null");
  *world = nullptr;
  if (o != nullptr && o->struct_size != sizeof(muster_init_options)) {
    return InvalidArgument(absl::StrCat("muster_init_options.struct_size is ", o->struct_size,
                                        ", expected ", sizeof(muster_init_options),
                                        " (call muster_init_options_default first)"));
  }
  return Guarded([&] {
    muster::InitOptions options;
    if (o != nullptr) {
      auto str = [](const char* s) { return s == nullptr ? std::string() : std::string(s); };
      options.job_id = str(o->job_id);
      options.rank = o->rank;
      options.world_size = o->world_size;
      options.local_rank = o->local_rank;
      options.local_world_size = o->local_world_size;
      options.master_addr = str(o->master_addr);
      options.master_port = o->master_port;
      options.socket = str(o->socket);
      options.generation = o->generation;
      if (o->backend != nullptr && o->backend[0] != '\0') options.backend = o->backend;
      if (o->timeout_s < 0) {
        options.timeout = absl::InfiniteDuration();
      } else if (o->timeout_s > 0) {
        options.timeout = absl::Seconds(o->timeout_s);
      }
      options.store_token = str(o->store_token);
      if (o->world_group_name != nullptr && o->world_group_name[0] != '\0') {
        options.world_group_name = o->world_group_name;
      }
    }
    auto w = muster::World::Init(std::move(options));
    if (!w.ok()) return FromStatus(w.status());
    auto* handle = new muster_world;
    handle->world = std::move(*w);
    handle->job_id = handle->world->job_id();
    *world = handle;
    return kOk;
  });
}

muster_world* muster_world_retain(muster_world* world) { return AddRef(world); }

void muster_world_release(muster_world* world) {
  if (DropRef(world)) delete world;
}

int muster_world_rank(const muster_world* w) { return w == nullptr ? -1 : w->world->rank(); }
int muster_world_size(const muster_world* w) { return w == nullptr ? -1 : w->world->world_size(); }
int muster_world_local_rank(const muster_world* w) {
  return w == nullptr ? -1 : w->world->local_rank();
}
int muster_world_local_size(const muster_world* w) {
  return w == nullptr ? -1 : w->world->local_world_size();
}
int64_t muster_world_generation(const muster_world* w) {
  return w == nullptr ? -1 : w->world->generation();
}
const char* muster_world_job_id(const muster_world* w) {
  return w == nullptr ? "" : w->job_id.c_str();
}
int64_t muster_world_epoch(const muster_world* w) { return w == nullptr ? -1 : w->world->epoch(); }
int muster_world_pending_joins(muster_world* w, int32_t* waiting) {
  if (w == nullptr || waiting == nullptr) return InvalidArgument("world or waiting is null");
  return Guarded([&] {
    absl::StatusOr<int> n = w->world->PendingJoins();
    if (n.ok()) *waiting = *n;
    return FromStatus(n.status());
  });
}
int muster_world_reconfigure(muster_world* w, double timeout_s, int allow_shrink, int64_t* epoch) {
  if (w == nullptr) return InvalidArgument("world is null");
  return Guarded([&] {
    muster::World::ReconfigureOptions o;
    o.timeout = Seconds(timeout_s, absl::ZeroDuration());
    o.allow_shrink = allow_shrink != 0;
    absl::StatusOr<int64_t> e = w->world->Reconfigure(o);
    if (e.ok() && epoch != nullptr) *epoch = *e;
    return FromStatus(e.status());
  });
}

namespace {
muster_group* WrapGroup(muster_world* world, std::shared_ptr<muster::ProcessGroup> group) {
  auto* g = new muster_group;
  g->world = muster_world_retain(world);
  g->name = group->name();
  g->tag = group->tag();
  g->backend = group->backend();
  g->group = std::move(group);
  return g;
}
}  // namespace

muster_group* muster_world_group(muster_world* world) {
  if (world == nullptr) return nullptr;
  // The world owns its world group; the handle's world reference keeps it.
  std::shared_ptr<muster::ProcessGroup> group(&world->world->world_group(),
                                              [](muster::ProcessGroup*) {});
  return WrapGroup(world, std::move(group));
}

size_t muster_world_failures(const muster_world* world, char* buf, size_t cap) {
  if (world == nullptr) return 0;
  std::string text;
  for (const std::string& f : world->world->failures()) absl::StrAppend(&text, f, "\n");
  if (buf != nullptr && cap > 0) {
    size_t n = std::min(cap - 1, text.size());
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return text.size();
}

// ---- groups ----

void muster_group_options_default(muster_group_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof(*o));
  o->struct_size = sizeof(*o);
}

int muster_group_create(muster_world* world, const int32_t* ranks, size_t nranks,
                        const muster_group_options* o, muster_group** group) {
  if (world == nullptr) return InvalidArgument("world is null");
  if (group == nullptr) return InvalidArgument("group out-pointer is null");
  *group = nullptr;
  if (ranks == nullptr && nranks > 0) return InvalidArgument("ranks is null");
  if (o != nullptr && o->struct_size != sizeof(muster_group_options)) {
    return InvalidArgument(absl::StrCat("muster_group_options.struct_size is ", o->struct_size,
                                        ", expected ", sizeof(muster_group_options),
                                        " (call muster_group_options_default first)"));
  }
  return Guarded([&] {
    muster::GroupOptions options;
    if (o != nullptr) {
      if (o->name != nullptr) options.name = o->name;
      if (o->tag != nullptr) options.tag = o->tag;
      if (o->backend != nullptr) options.backend = o->backend;
      if (o->timeout_s < 0) {
        options.timeout = absl::InfiniteDuration();
      } else if (o->timeout_s > 0) {
        options.timeout = absl::Seconds(o->timeout_s);
      }
      options.local_synchronization = o->local_synchronization != 0;
    }
    auto g = world->world->NewGroup(std::vector<int>(ranks, ranks + nranks), options);
    if (!g.ok()) return FromStatus(g.status());
    *group = WrapGroup(world, std::move(*g));
    return kOk;
  });
}

muster_group* muster_group_retain(muster_group* group) { return AddRef(group); }

void muster_group_release(muster_group* group) {
  if (!DropRef(group)) return;
  muster_world* world = group->world;
  group->group.reset();  // before the world it points into
  delete group;
  muster_world_release(world);
}

int muster_group_destroy(muster_group* group) {
  if (group == nullptr) return InvalidArgument("group is null");
  if (group->group.get() == &group->world->world->world_group()) {
    return Fail(absl::StatusCode::kFailedPrecondition,
                "the world group is destroyed with its world (muster_world_release)");
  }
  return Guarded([&] {
    int code = FromStatus(group->world->world->DestroyProcessGroup(*group->group));
    if (code == kOk) group->destroyed.store(true);
    return code;
  });
}

int muster_group_rank(const muster_group* g) { return g == nullptr ? -1 : g->group->rank(); }
int muster_group_size(const muster_group* g) { return g == nullptr ? -1 : g->group->size(); }

size_t muster_group_ranks(const muster_group* g, int32_t* ranks, size_t cap) {
  if (g == nullptr) return 0;
  const std::vector<int>& all = g->group->ranks();
  for (size_t i = 0; i < all.size() && i < cap && ranks != nullptr; ++i) ranks[i] = all[i];
  return all.size();
}

int muster_group_global_rank(const muster_group* g, int group_rank, int32_t* global_rank) {
  if (g == nullptr || global_rank == nullptr) return InvalidArgument("null argument");
  auto r = g->group->GlobalRank(group_rank);
  if (!r.ok()) return FromStatus(r.status());
  *global_rank = *r;
  return kOk;
}

int muster_group_group_rank(const muster_group* g, int global_rank, int32_t* group_rank) {
  if (g == nullptr || group_rank == nullptr) return InvalidArgument("null argument");
  auto r = g->group->GroupRank(global_rank);
  if (!r.ok()) return FromStatus(r.status());
  *group_rank = *r;
  return kOk;
}

const char* muster_group_name(const muster_group* g) { return g == nullptr ? "" : g->name.c_str(); }
const char* muster_group_tag(const muster_group* g) { return g == nullptr ? "" : g->tag.c_str(); }
const char* muster_group_backend(const muster_group* g) {
  return g == nullptr ? "" : g->backend.c_str();
}

muster_world* muster_group_world(muster_group* g) {
  return g == nullptr ? nullptr : muster_world_retain(g->world);
}

int muster_group_barrier(muster_group* g, double timeout_s) {
  if (g == nullptr) return InvalidArgument("group is null");
  return Guarded(
      [&] { return FromStatus(g->group->Barrier(Seconds(timeout_s, absl::ZeroDuration()))); });
}

int muster_group_monitored_barrier(muster_group* g, double timeout_s) {
  if (g == nullptr) return InvalidArgument("group is null");
  return Guarded([&] {
    return FromStatus(g->group->MonitoredBarrier(Seconds(timeout_s, absl::Minutes(30))));
  });
}

// ---- collectives ----

int muster_all_reduce(muster_group* g, const muster_tensor* tensor, int op, double premul_scale,
                      muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    Tensor t;
    ReduceOp r;
    if (int c = ToTensor(tensor, &t); c != kOk) return c;
    if (int c = ToOp(op, &r); c != kOk) return c;
    return Deliver(g, g->group->AllReduce(t, r, premul_scale), work);
  });
}

int muster_all_reduce_coalesced(muster_group* g, const muster_tensor* tensors, size_t n, int op,
                                muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    std::vector<Tensor> ts;
    ReduceOp r;
    if (int c = ToTensors(tensors, n, &ts); c != kOk) return c;
    if (int c = ToOp(op, &r); c != kOk) return c;
    return Deliver(g, g->group->AllReduceCoalesced(std::move(ts), r), work);
  });
}

int muster_broadcast(muster_group* g, const muster_tensor* tensor, int root, muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    Tensor t;
    if (int c = ToTensor(tensor, &t); c != kOk) return c;
    return Deliver(g, g->group->Broadcast(t, root), work);
  });
}

int muster_reduce(muster_group* g, const muster_tensor* tensor, int root, int op,
                  muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    Tensor t;
    ReduceOp r;
    if (int c = ToTensor(tensor, &t); c != kOk) return c;
    if (int c = ToOp(op, &r); c != kOk) return c;
    return Deliver(g, g->group->Reduce(t, root, r), work);
  });
}

int muster_all_gather(muster_group* g, const muster_tensor* outputs, size_t n,
                      const muster_tensor* input, muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    std::vector<Tensor> outs;
    Tensor in;
    if (int c = ToTensors(outputs, n, &outs); c != kOk) return c;
    if (int c = ToTensor(input, &in); c != kOk) return c;
    return Deliver(g, g->group->AllGather(std::move(outs), in), work);
  });
}

int muster_all_gather_into_tensor(muster_group* g, const muster_tensor* output,
                                  const muster_tensor* input, muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    Tensor out, in;
    if (int c = ToTensor(output, &out); c != kOk) return c;
    if (int c = ToTensor(input, &in); c != kOk) return c;
    return Deliver(g, g->group->AllGatherIntoTensor(out, in), work);
  });
}

int muster_all_gather_coalesced(muster_group* g, const muster_tensor* outputs,
                                const muster_tensor* inputs, size_t n, muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    std::vector<Tensor> ins, outs;
    if (int c = ToTensors(inputs, n, &ins); c != kOk) return c;
    size_t size = static_cast<size_t>(g->group->size());
    if (int c = ToTensors(outputs, n * size, &outs); c != kOk) return c;
    std::vector<std::vector<Tensor>> lists(n);
    for (size_t i = 0; i < n; ++i) {
      lists[i].assign(outs.begin() + i * size, outs.begin() + (i + 1) * size);
    }
    return Deliver(g, g->group->AllGatherCoalesced(std::move(lists), std::move(ins)), work);
  });
}

int muster_gather(muster_group* g, const muster_tensor* outputs, size_t n,
                  const muster_tensor* input, int root, muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    std::vector<Tensor> outs;
    Tensor in;
    if (int c = ToTensors(outputs, n, &outs); c != kOk) return c;
    if (int c = ToTensor(input, &in); c != kOk) return c;
    return Deliver(g, g->group->Gather(std::move(outs), in, root), work);
  });
}

int muster_scatter(muster_group* g, const muster_tensor* output, const muster_tensor* inputs,
                   size_t n, int root, muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    std::vector<Tensor> ins;
    Tensor out;
    if (int c = ToTensor(output, &out); c != kOk) return c;
    if (int c = ToTensors(inputs, n, &ins); c != kOk) return c;
    return Deliver(g, g->group->Scatter(out, std::move(ins), root), work);
  });
}

int muster_reduce_scatter(muster_group* g, const muster_tensor* output, const muster_tensor* inputs,
                          size_t n, int op, muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    std::vector<Tensor> ins;
    Tensor out;
    ReduceOp r;
    if (int c = ToTensor(output, &out); c != kOk) return c;
    if (int c = ToTensors(inputs, n, &ins); c != kOk) return c;
    if (int c = ToOp(op, &r); c != kOk) return c;
    return Deliver(g, g->group->ReduceScatter(out, std::move(ins), r), work);
  });
}

int muster_reduce_scatter_tensor(muster_group* g, const muster_tensor* output,
                                 const muster_tensor* input, int op, muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    Tensor out, in;
    ReduceOp r;
    if (int c = ToTensor(output, &out); c != kOk) return c;
    if (int c = ToTensor(input, &in); c != kOk) return c;
    if (int c = ToOp(op, &r); c != kOk) return c;
    return Deliver(g, g->group->ReduceScatterTensor(out, in, r), work);
  });
}

int muster_all_to_all(muster_group* g, const muster_tensor* outputs, const muster_tensor* inputs,
                      size_t n, muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    std::vector<Tensor> outs, ins;
    if (int c = ToTensors(outputs, n, &outs); c != kOk) return c;
    if (int c = ToTensors(inputs, n, &ins); c != kOk) return c;
    return Deliver(g, g->group->AllToAll(std::move(outs), std::move(ins)), work);
  });
}

int muster_all_to_all_single(muster_group* g, const muster_tensor* output,
                             const muster_tensor* input, const uint64_t* output_splits,
                             const uint64_t* input_splits, size_t n_splits, muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  if (n_splits > 0 && (output_splits == nullptr || input_splits == nullptr)) {
    return InvalidArgument("split sizes are null but n_splits is not 0");
  }
  return Guarded([&] {
    Tensor out, in;
    if (int c = ToTensor(output, &out); c != kOk) return c;
    if (int c = ToTensor(input, &in); c != kOk) return c;
    std::vector<size_t> outs(output_splits, output_splits + n_splits);
    std::vector<size_t> ins(input_splits, input_splits + n_splits);
    return Deliver(g, g->group->AllToAllSingle(out, in, std::move(outs), std::move(ins)), work);
  });
}

int muster_collective_barrier(muster_group* g, muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] { return Deliver(g, g->group->CollectiveBarrier(), work); });
}

int muster_broadcast_bytes(muster_group* g, const void* data, size_t size, int root,
                           muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  if (data == nullptr && size > 0) return InvalidArgument("data is null but size is not 0");
  return Guarded([&] {
    auto state = std::make_shared<WorkState>();
    state->blobs.resize(1);
    if (size > 0) state->blobs[0].assign(static_cast<const char*>(data), size);
    *work = Wrap(g, g->group->BroadcastBytes(&state->blobs[0], root), state);
    return kOk;
  });
}

int muster_all_gather_bytes(muster_group* g, const void* data, size_t size, muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  if (data == nullptr && size > 0) return InvalidArgument("data is null but size is not 0");
  return Guarded([&] {
    auto state = std::make_shared<WorkState>();
    if (size > 0) state->input.assign(static_cast<const char*>(data), size);
    *work = Wrap(g, g->group->AllGatherBytes(state->input, &state->blobs), state);
    return kOk;
  });
}

int muster_gather_bytes(muster_group* g, const void* data, size_t size, int root,
                        muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  if (data == nullptr && size > 0) return InvalidArgument("data is null but size is not 0");
  return Guarded([&] {
    auto state = std::make_shared<WorkState>();
    if (size > 0) state->input.assign(static_cast<const char*>(data), size);
    *work = Wrap(g, g->group->GatherBytes(state->input, &state->blobs, root), state);
    return kOk;
  });
}

int muster_scatter_bytes(muster_group* g, const void* const* blobs, const size_t* sizes, size_t n,
                         int root, muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  if (n > 0 && (blobs == nullptr || sizes == nullptr)) {
    return InvalidArgument("blobs or sizes is null but n is not 0");
  }
  return Guarded([&] {
    std::vector<std::string> in(n);
    for (size_t i = 0; i < n; ++i) {
      if (blobs[i] == nullptr && sizes[i] > 0) {
        return InvalidArgument(absl::StrCat("blob ", i, " is null but its size is not 0"));
      }
      if (sizes[i] > 0) in[i].assign(static_cast<const char*>(blobs[i]), sizes[i]);
    }
    auto state = std::make_shared<WorkState>();
    state->blobs.resize(1);
    *work = Wrap(g, g->group->ScatterBytes(std::move(in), &state->blobs[0], root), state);
    return kOk;
  });
}

int muster_send(muster_group* g, const muster_tensor* tensor, int dst, uint64_t tag,
                muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    Tensor t;
    if (int c = ToTensor(tensor, &t); c != kOk) return c;
    return Deliver(g, g->group->ISend(t, dst, tag), work);
  });
}

int muster_recv(muster_group* g, const muster_tensor* tensor, int src, uint64_t tag,
                muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    Tensor t;
    if (int c = ToTensor(tensor, &t); c != kOk) return c;
    return Deliver(g, g->group->IRecv(t, src, tag), work);
  });
}

int muster_recv_anysource(muster_group* g, const muster_tensor* tensor, uint64_t tag,
                          muster_work** work) {
  if (int c = CheckGroup(g, work); c != kOk) return c;
  return Guarded([&] {
    Tensor t;
    if (int c = ToTensor(tensor, &t); c != kOk) return c;
    return Deliver(g, g->group->IRecvAnySource(t, tag), work);
  });
}

int muster_batch_isend_irecv(muster_group* g, const muster_p2p_op* ops, size_t n,
                             muster_work** works) {
  // `works` has n entries: none to clear (or check) when n is 0.
  if (works == nullptr && n > 0) return InvalidArgument("works is null but n is not 0");
  for (size_t i = 0; i < n; ++i) works[i] = nullptr;
  muster_work* unused = nullptr;
  if (int c = CheckGroup(g, &unused); c != kOk) return c;
  if (ops == nullptr && n > 0) return InvalidArgument("ops is null but n is not 0");
  return Guarded([&] {
    std::vector<muster::ProcessGroup::P2PRequest> requests(n);
    for (size_t i = 0; i < n; ++i) {
      if (int c = ToTensor(&ops[i].tensor, &requests[i].tensor); c != kOk) {
        return Fail(static_cast<absl::StatusCode>(c), absl::StrCat("op ", i, ": ", last_error));
      }
      requests[i].send = ops[i].send != 0;
      requests[i].peer = ops[i].peer;
      requests[i].tag = ops[i].tag;
    }
    std::vector<std::shared_ptr<muster::Work>> all = g->group->BatchISendIRecv(requests);
    for (size_t i = 0; i < n; ++i) works[i] = Wrap(g, all[i]);
    return kOk;
  });
}

// ---- work handles ----

muster_work* muster_work_retain(muster_work* w) { return AddRef(w); }

void muster_work_release(muster_work* w) {
  if (!DropRef(w)) return;
  muster_group* group = w->group;
  delete w;
  muster_group_release(group);
}

int muster_work_wait(muster_work* w, double timeout_s) {
  if (w == nullptr) return InvalidArgument("work is null");
  return Guarded(
      [&] { return FromStatus(w->work->Wait(Seconds(timeout_s, absl::ZeroDuration()))); });
}

int muster_work_is_completed(muster_work* w) {
  return w != nullptr && w->work->IsCompleted() ? 1 : 0;
}

int muster_work_status(muster_work* w) {
  if (w == nullptr) return InvalidArgument("work is null");
  return FromStatus(w->work->status());
}

int muster_work_synchronize(muster_work* w, double timeout_s) {
  if (w == nullptr) return InvalidArgument("work is null");
  return Guarded(
      [&] { return FromStatus(w->work->Synchronize(Seconds(timeout_s, absl::ZeroDuration()))); });
}

uint64_t muster_work_sequence(const muster_work* w) {
  return w == nullptr ? 0 : w->work->sequence();
}

int muster_work_source_rank(const muster_work* w) {
  return w == nullptr ? -1 : w->work->source_rank();
}

int muster_work_on_complete(muster_work* w, muster_work_callback callback, void* arg) {
  if (w == nullptr || callback == nullptr) return InvalidArgument("work or callback is null");
  if (w->has_callback.exchange(true)) {
    return Fail(absl::StatusCode::kFailedPrecondition, "the work already has a callback");
  }
  return Guarded([&] {
    w->work->OnComplete([callback, arg](const absl::Status& status) {
      std::string message(status.message());
      callback(arg, static_cast<int>(status.code()), message.c_str());
    });
    return kOk;
  });
}

size_t muster_work_blob_count(const muster_work* w) {
  if (w == nullptr || w->state == nullptr || !w->work->IsCompleted()) return 0;
  return w->state->blobs.size();
}

int muster_work_blob(const muster_work* w, size_t i, const void** data, size_t* size) {
  if (w == nullptr || data == nullptr || size == nullptr) return InvalidArgument("null argument");
  if (!w->work->IsCompleted()) {
    return Fail(absl::StatusCode::kFailedPrecondition, "the work has not completed yet");
  }
  size_t n = w->state == nullptr ? 0 : w->state->blobs.size();
  if (i >= n) {
    return Fail(absl::StatusCode::kOutOfRange, absl::StrCat("blob ", i, " of ", n));
  }
  *data = w->state->blobs[i].data();
  *size = w->state->blobs[i].size();
  return kOk;
}

// ---- the store ----

int muster_world_store(muster_world* world, muster_store** store) {
  if (world == nullptr || store == nullptr) return InvalidArgument("null argument");
  return Guarded([&] {
    auto s = world->world->store();
    if (!s.ok()) return FromStatus(s.status());
    *store = new muster_store{*s};
    return kOk;
  });
}

int muster_store_connect(const char* host, int port, const char* token, int torch113,
                         double timeout_s, muster_store** store) {
  if (host == nullptr || store == nullptr) return InvalidArgument("null argument");
  if (port <= 0 || port > 65535)
    return InvalidArgument(absl::StrCat("port ", port, " is not 1-65535"));
  return Guarded([&] {
    muster::TcpStoreOptions o;
    o.host = host;
    o.port = port;
    if (token != nullptr) o.token = token;
    o.protocol = torch113 ? muster::TcpStoreOptions::Protocol::kTorch113
                          : muster::TcpStoreOptions::Protocol::kNative;
    o.timeout = Seconds(timeout_s, muster::kDefaultStoreTimeout);
    o.connect_timeout = std::min(o.timeout, absl::Seconds(60));
    auto s = muster::TcpStore::Connect(o);
    if (!s.ok()) return FromStatus(s.status());
    *store = new muster_store{std::shared_ptr<muster::Store>(std::move(*s))};
    (*store)->store->set_timeout(o.timeout);
    return kOk;
  });
}

int muster_store_prefixed(muster_store* store, const char* prefix, muster_store** prefixed) {
  if (store == nullptr || prefix == nullptr || prefixed == nullptr) {
    return InvalidArgument("null argument");
  }
  return Guarded([&] {
    auto p = std::make_shared<muster::PrefixStore>(prefix, store->store);
    p->set_timeout(store->store->timeout());
    *prefixed = new muster_store{std::move(p)};
    return kOk;
  });
}

void muster_store_release(muster_store* store) { delete store; }

void muster_store_set_timeout(muster_store* store, double timeout_s) {
  if (store != nullptr) store->store->set_timeout(Seconds(timeout_s, muster::kDefaultStoreTimeout));
}

namespace {
absl::string_view Bytes(const void* data, size_t size) {
  return data == nullptr ? absl::string_view()
                         : absl::string_view(static_cast<const char*>(data), size);
}

int CopyOut(const std::string& value, void** out, size_t* size) {
  void* p = std::malloc(value.empty() ? 1 : value.size());
  if (p == nullptr) return Fail(absl::StatusCode::kResourceExhausted, "out of memory");
  std::memcpy(p, value.data(), value.size());
  *out = p;
  *size = value.size();
  return kOk;
}

int CheckKeys(const char* const* keys, size_t n, std::vector<std::string>* out) {
  if (keys == nullptr && n > 0) return InvalidArgument("keys is null but n is not 0");
  for (size_t i = 0; i < n; ++i) {
    if (keys[i] == nullptr) return InvalidArgument(absl::StrCat("key ", i, " is null"));
    out->emplace_back(keys[i]);
  }
  return kOk;
}

absl::Duration StoreTimeout(const muster_store* store, double timeout_s) {
  return Seconds(timeout_s, store->store->timeout());
}
}  // namespace

int muster_store_set(muster_store* store, const char* key, const void* value, size_t size) {
  if (store == nullptr || key == nullptr) return InvalidArgument("null argument");
  if (value == nullptr && size > 0) return InvalidArgument("value is null but size is not 0");
  return Guarded([&] { return FromStatus(store->store->Set(key, Bytes(value, size))); });
}

int muster_store_get(muster_store* store, const char* key, double timeout_s, void** value,
                     size_t* size) {
  if (store == nullptr || key == nullptr || value == nullptr || size == nullptr) {
    return InvalidArgument("null argument");
  }
  return Guarded([&] {
    auto v = store->store->Get(key, StoreTimeout(store, timeout_s));
    if (!v.ok()) return FromStatus(v.status());
    return CopyOut(*v, value, size);
  });
}

int muster_store_add(muster_store* store, const char* key, int64_t delta, int64_t* result) {
  if (store == nullptr || key == nullptr || result == nullptr) {
    return InvalidArgument("null argument");
  }
  return Guarded([&] {
    auto v = store->store->Add(key, delta);
    if (!v.ok()) return FromStatus(v.status());
    *result = *v;
    return kOk;
  });
}

int muster_store_compare_set(muster_store* store, const char* key, const void* expected,
                             size_t expected_size, const void* desired, size_t desired_size,
                             void** result, size_t* result_size) {
  if (store == nullptr || key == nullptr || result == nullptr || result_size == nullptr) {
    return InvalidArgument("null argument");
  }
  return Guarded([&] {
    auto v =
        store->store->CompareSet(key, Bytes(expected, expected_size), Bytes(desired, desired_size));
    if (!v.ok()) return FromStatus(v.status());
    return CopyOut(*v, result, result_size);
  });
}

int muster_store_wait(muster_store* store, const char* const* keys, size_t n, double timeout_s) {
  if (store == nullptr) return InvalidArgument("store is null");
  return Guarded([&] {
    std::vector<std::string> k;
    if (int c = CheckKeys(keys, n, &k); c != kOk) return c;
    return FromStatus(store->store->Wait(k, StoreTimeout(store, timeout_s)));
  });
}

int muster_store_check(muster_store* store, const char* const* keys, size_t n, int* exist) {
  if (store == nullptr || exist == nullptr) return InvalidArgument("null argument");
  return Guarded([&] {
    std::vector<std::string> k;
    if (int c = CheckKeys(keys, n, &k); c != kOk) return c;
    auto v = store->store->Check(k);
    if (!v.ok()) return FromStatus(v.status());
    *exist = *v ? 1 : 0;
    return kOk;
  });
}

int muster_store_delete_key(muster_store* store, const char* key, int* existed) {
  if (store == nullptr || key == nullptr) return InvalidArgument("null argument");
  return Guarded([&] {
    auto v = store->store->DeleteKey(key);
    if (!v.ok()) return FromStatus(v.status());
    if (existed != nullptr) *existed = *v ? 1 : 0;
    return kOk;
  });
}

int muster_store_num_keys(muster_store* store, int64_t* n) {
  if (store == nullptr || n == nullptr) return InvalidArgument("null argument");
  return Guarded([&] {
    auto v = store->store->NumKeys();
    if (!v.ok()) return FromStatus(v.status());
    *n = *v;
    return kOk;
  });
}

int muster_store_append(muster_store* store, const char* key, const void* value, size_t size) {
  if (store == nullptr || key == nullptr) return InvalidArgument("null argument");
  if (value == nullptr && size > 0) return InvalidArgument("value is null but size is not 0");
  return Guarded([&] { return FromStatus(store->store->Append(key, Bytes(value, size))); });
}

int muster_store_list_keys(muster_store* store, char** keys, size_t* size, size_t* n) {
  if (store == nullptr || keys == nullptr || size == nullptr || n == nullptr) {
    return InvalidArgument("null argument");
  }
  return Guarded([&] {
    auto v = store->store->ListKeys();
    if (!v.ok()) return FromStatus(v.status());
    std::string all;
    for (const std::string& k : *v) {
      all.append(k);
      all.push_back('\0');
    }
    void* p = nullptr;
    size_t bytes = 0;
    if (int c = CopyOut(all, &p, &bytes); c != kOk) return c;
    *keys = static_cast<char*>(p);
    *size = bytes;
    *n = v->size();
    return kOk;
  });
}

void muster_free(void* p) { std::free(p); }

}  // extern "C"
