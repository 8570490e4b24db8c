// The torch.distributed backend "muster" (see muster_backend.h).
#include "muster_backend.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

namespace muster_torch {
namespace {

// ---- errors ---------------------------------------------------------------

// The exception torch expects from a failed collective: DistBackendError
// (torch.distributed.DistBackendError, a RuntimeError) on 2.x, c10::Error
// (RuntimeError) on 1.13. No C++ backtrace: muster's message says it all.
#if TORCH_VERSION_MAJOR >= 2
using CollectiveError = c10::DistBackendError;
CollectiveError MakeError(const std::string& message) { return CollectiveError(message); }
#else
using CollectiveError = c10::Error;
CollectiveError MakeError(const std::string& message) { return CollectiveError(message, ""); }
#endif

// "DEADLINE_EXCEEDED: <message>".
std::string Describe(int code, const std::string& message) {
  return c10::str(muster_code_name(code), ": ", message);
}

// Throws the current muster error of this thread for a call that failed.
[[noreturn]] void ThrowLast(const std::string& what, int code) {
  throw MakeError(c10::str("muster: ", what, " failed: ", Describe(code, muster_last_error())));
}

// ---- tensors --------------------------------------------------------------

template <typename Label>
int ToMusterDType(at::ScalarType type, const Label& what) {
  switch (type) {
    case at::kHalf:
      return MUSTER_FLOAT16;
    case at::kBFloat16:
      return MUSTER_BFLOAT16;
    case at::kFloat:
      return MUSTER_FLOAT32;
    case at::kDouble:
      return MUSTER_FLOAT64;
    case at::kChar:
      return MUSTER_INT8;
    case at::kByte:
      return MUSTER_UINT8;
    case at::kInt:
      return MUSTER_INT32;
    case at::kLong:
      return MUSTER_INT64;
    case at::kBool:
      return MUSTER_BOOL;
    case at::kComplexFloat:
      return MUSTER_COMPLEX64;
    case at::kComplexDouble:
      return MUSTER_COMPLEX128;
    default:
      TORCH_CHECK(false, "muster ", what, ": unsupported dtype ", c10::toString(type),
                  " (muster takes float16, bfloat16, float32, float64, int8, uint8, int32, "
                  "int64, bool, complex64, complex128)");
  }
  return -1;  // not reached
}

// The muster descriptions of one call's tensors, and what the Work must keep
// alive. All tensors of a call must be on one device. One per call; not
// thread-safe.
class TensorSet {
 public:
  explicit TensorSet(OpLabel what) : what_(std::move(what)) {}

  // A tensor the call only reads: a non-contiguous one is copied.
  muster_tensor Input(const at::Tensor& t) {
    Check(t);
    at::Tensor c = t.is_contiguous() ? t : t.contiguous();
    // Lazy conjugate / negative views: the memory holds the unresolved data.
    if (c.is_conj()) c = c.resolve_conj();
    if (c.is_neg()) c = c.resolve_neg();
    keep_.push_back(c);
    return Describe(c);
  }

  // A tensor the call writes (or reads and writes): must be contiguous.
  muster_tensor Output(const at::Tensor& t) {
    Check(t);
    TORCH_CHECK(!t.is_conj() && !t.is_neg(), "muster ", what_,
                ": output tensors must not be lazy conjugate/negative views (call "
                "resolve_conj()/resolve_neg() first)");
    TORCH_CHECK(t.is_contiguous(), "muster ", what_,
                ": output tensors must be contiguous (got sizes ", t.sizes(), ", strides ",
                t.strides(), "); pass t.contiguous() and copy back");
    keep_.push_back(t);
    return Describe(t);
  }

  std::vector<at::Tensor> TakeKeep() { return std::move(keep_); }
  const std::optional<c10::Stream>& stream() const { return stream_; }

 private:
  void Check(const at::Tensor& t) {
    TORCH_CHECK(t.defined(), "muster ", what_, ": undefined tensor");
    TORCH_CHECK(t.layout() == at::kStrided, "muster ", what_, ": only dense tensors (got ",
                t.layout(), ")");
    ToMusterDType(t.scalar_type(), what_);
    if (device_.has_value()) {
      TORCH_CHECK(t.device() == *device_, "muster ", what_,
                  ": all tensors must be on one device (got ", *device_, " and ", t.device(), ")");
    } else {
      device_ = t.device();
    }
  }

  muster_tensor Describe(const at::Tensor& t) {
    muster_tensor d{};
    d.data = t.numel() == 0 ? nullptr : t.data_ptr();
    d.count = static_cast<uint64_t>(t.numel());
    d.dtype = ToMusterDType(t.scalar_type(), what_);
    if (t.is_cuda()) {
#if TORCH_VERSION_MAJOR >= 2
      if (!stream_.has_value()) {
        stream_ = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device());
      }
      d.device = MUSTER_DEVICE_CUDA;
      d.stream = stream_->native_handle();
#else
      TORCH_CHECK(false, "muster ", what_, ": CUDA tensors need torch 2.x (this is torch ",
                  TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ")");
#endif
    } else {
      TORCH_CHECK(t.is_cpu(), "muster ", what_, ": tensors must be on cpu or cuda (got ",
                  t.device(), ")");
      d.device = MUSTER_DEVICE_CPU;
      d.stream = nullptr;
    }
    return d;
  }

  const OpLabel what_;
  std::optional<c10::Device> device_;
  std::optional<c10::Stream> stream_;
  std::vector<at::Tensor> keep_;
};

// A torch ReduceOp as muster's op and PREMUL_SUM scale.
struct Reduction {
  int op = MUSTER_SUM;
  double scale = 1.0;
};

Reduction ToMusterOp(const c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return {MUSTER_SUM};
    case c10d::ReduceOp::AVG:
      return {MUSTER_AVG};
    case c10d::ReduceOp::PRODUCT:
      return {MUSTER_PRODUCT};
    case c10d::ReduceOp::MIN:
      return {MUSTER_MIN};
    case c10d::ReduceOp::MAX:
      return {MUSTER_MAX};
    case c10d::ReduceOp::BAND:
      return {MUSTER_BAND};
    case c10d::ReduceOp::BOR:
      return {MUSTER_BOR};
    case c10d::ReduceOp::BXOR:
      return {MUSTER_BXOR};
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(s != nullptr, "muster ", what, ": PREMUL_SUM without its factor");
#if TORCH_VERSION_MAJOR >= 2
      if (s->tensor_factor.defined()) {
        TORCH_CHECK(s->tensor_factor.numel() == 1, "muster ", what,
                    ": PREMUL_SUM needs a 1-element factor tensor");
        return {MUSTER_PREMUL_SUM, s->tensor_factor.item<double>()};
      }
#else
      if (!s->tensor_factors.empty()) {
        TORCH_CHECK(s->tensor_factors[0].numel() == 1, "muster ", what,
                    ": PREMUL_SUM needs a 1-element factor tensor");
        return {MUSTER_PREMUL_SUM, s->tensor_factors[0].item<double>()};
      }
#endif
      return {MUSTER_PREMUL_SUM, s->double_factor};
    }
    default:
      TORCH_CHECK(false, "muster ", what, ": unsupported reduce op ", static_cast<int>(op.op_));
  }
  return {};  // not reached
}

// For calls without a scale in muster's API (reduce, reduce_scatter,
// allreduce_coalesced): PREMUL_SUM is SUM over inputs multiplied first.
void CheckPremulDType(const at::Tensor& t, const char* what) {
  TORCH_CHECK(at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()), "muster ",
              what, ": reduce op PREMUL_SUM does not support dtype ",
              c10::toString(t.scalar_type()));
}

// PREMUL_SUM where the caller's own tensors are the buffers (allreduce_coalesced,
// reduce at the root): they are multiplied in place, then `launch(started)`
// runs, setting `started` once muster took the collective. If it throws
// before that, they get back the values they held, from a copy taken first
// (one extra copy per such call; only PREMUL_SUM pays it).
template <typename LaunchFn>
auto ScaleInPlaceThenLaunch(std::vector<at::Tensor>& tensors, double scale, LaunchFn launch)
    -> decltype(launch(std::declval<bool&>())) {
  std::vector<at::Tensor> before;
  before.reserve(tensors.size());
  for (const auto& t : tensors) before.push_back(t.clone());
  for (auto& t : tensors) t.mul_(scale);
  bool started = false;
  try {
    return launch(started);
  } catch (...) {
    if (!started) {
      for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(before[i]);
    }
    throw;
  }
}

void CheckSingle(const std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(tensors.size() == 1, "muster ", what, ": expects one tensor per call (got ",
              tensors.size(), ")");
}

std::vector<at::Tensor> Flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

// The type of every future's value (made once: creating it costs an
// allocation per collective).
const c10::TypePtr& TensorListType() {
  static const c10::TypePtr type = c10::ListType::create(c10::TensorType::get());
  return type;
}

// ---- completion thread ----------------------------------------------------

// One process-wide thread that runs completion tasks posted by muster's
// completion callbacks. muster calls them on its group executors, which must
// not block on the group; torch future callbacks (DDP hooks, Python code
// taking the GIL) run here instead. Leaked on purpose: it may still run
// while the process exits. Thread-safe.
class CompletionThread {
 public:
  static CompletionThread& Get() {
    static CompletionThread* instance = new CompletionThread();
    return *instance;
  }

  void Post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  CompletionThread() {
    std::thread([this] { Run(); }).detach();
  }

  void Run() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !tasks_.empty(); });
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      try {
        task();
      } catch (const std::exception& e) {
        TORCH_WARN("muster: a completion callback threw: ", e.what());
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
};

// What a MusterWork dropped before completion leaves behind: its handles
// and tensors, released on the completion thread once every handle
// completed (never on a muster executor: releasing a handle may release
// its group).
struct Orphan {
  std::atomic<size_t> pending;
  std::vector<muster_work*> handles;
  std::vector<at::Tensor> outputs, keep_alive;

  static void Done(void* arg, int, const char*) {
    auto* o = static_cast<Orphan*>(arg);
    if (o->pending.fetch_sub(1) != 1) return;
    CompletionThread::Get().Post([o] {
      for (muster_work* h : o->handles) muster_work_release(h);
      delete o;
    });
  }
};

// The argument of one muster_work_on_complete registration.
struct CallbackArg {
  MusterWork* work;  // holds one reference, dropped after the callback ran
  size_t index;
};

// ---- the job ----------------------------------------------------------------

// The process's muster world, shared by all backends: joined by the first
// backend, released when the last one shuts down.
std::mutex world_mu;
muster_world* world = nullptr;  // guarded by world_mu
int live_backends = 0;          // guarded by world_mu

}  // namespace

// ---- MusterWork -------------------------------------------------------------

MusterWork::MusterWork(int rank, c10d::OpType op, OpLabel what, std::vector<muster_work*> handles,
                       std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep_alive,
                       std::optional<c10::Stream> stream)
    : c10d::Work(rank, op),
      what_(std::move(what)),
      handles_(std::move(handles)),
      outputs_(std::move(outputs)),
      keep_alive_(std::move(keep_alive)),
      stream_(stream),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          TensorListType(), stream.has_value() ? std::vector<c10::Device>{stream->device()}
                                               : std::vector<c10::Device>{})),
      done_(handles_.size(), false),
      pending_(handles_.size()) {}

MusterWork::~MusterWork() {
  std::vector<muster_work*> pending;
  for (muster_work* h : handles_) {
    if (!muster_work_is_completed(h)) pending.push_back(h);
  }
  if (pending.empty()) {
    for (muster_work* h : handles_) muster_work_release(h);
    return;
  }
  // Dropped before it completed (async_op=True and the handle discarded):
  // the collective still reads and writes the tensors, so they and the
  // handles live on until it completed.
  auto* orphan = new Orphan{{pending.size()}, handles_, outputs_, keep_alive_};
  for (muster_work* h : pending) {
    if (muster_work_on_complete(h, &Orphan::Done, orphan) != MUSTER_OK) {
      Orphan::Done(orphan, MUSTER_OK, "");  // cannot happen: no callback was set
    }
  }
}

void MusterWork::Start() {
  if (handles_.empty()) Settle();
}

void MusterWork::RegisterCallbacks() {
  for (size_t i = 0; i < handles_.size(); ++i) {
    c10::raw::intrusive_ptr::incref(this);
    auto* arg = new CallbackArg{this, i};
    if (muster_work_on_complete(handles_[i], &MusterWork::OnComplete, arg) != MUSTER_OK) {
      // Cannot happen (one callback per handle); complete through polling.
      delete arg;
      c10::raw::intrusive_ptr::decref(this);
    }
  }
}

void MusterWork::OnComplete(void* arg, int code, const char* message) {
  std::unique_ptr<CallbackArg> a(static_cast<CallbackArg*>(arg));
  // Adopt the reference taken in Start().
  auto work = c10::intrusive_ptr<MusterWork>::reclaim(a->work);
  std::string text = message == nullptr ? "" : message;
  size_t index = a->index;
  CompletionThread::Get().Post(
      [work = std::move(work), index, code, text = std::move(text)]() mutable {
        work->HandleDone(index, code, text);
        work.reset();
      });
}

void MusterWork::HandleDone(size_t index, int code, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (done_[index]) return;
    done_[index] = true;
    --pending_;
    if (code != MUSTER_OK && first_error_code_ == MUSTER_OK) {
      first_error_code_ = code;
      first_error_ = message;
    }
    if (pending_ != 0) return;
  }
  Settle();
}

void MusterWork::Settle() {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (settled_) return;
    settled_ = true;
    if (first_error_code_ != MUSTER_OK) {
      error = std::make_exception_ptr(MakeError(
          c10::str("muster: ", what_, " failed: ", Describe(first_error_code_, first_error_))));
    }
  }
  {
    // The future first (as gloo does): once wait() returns or isCompleted()
    // says so, the future is complete too. A CUDA future records its events
    // on the current stream: make that the collective's stream.
    c10::OptionalStreamGuard guard(stream_.has_value() ? c10::optional<c10::Stream>(*stream_)
                                                       : c10::optional<c10::Stream>());
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    exception_ = error;
  }
  cv_.notify_all();
}

bool MusterWork::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return true;
  }
  for (size_t i = 0; i < handles_.size(); ++i) {
    if (!muster_work_is_completed(handles_[i])) return false;
  }
  // Every handle finished but the callbacks may not have been relayed yet:
  // read the results here (a completed work's wait returns at once).
  for (size_t i = 0; i < handles_.size(); ++i) {
    int code = muster_work_wait(handles_[i], -1);
    HandleDone(i, code, code == MUSTER_OK ? "" : muster_last_error());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool MusterWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr MusterWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

bool MusterWork::wait(std::chrono::milliseconds timeout) {
  // muster_work_wait lets this thread run the collective itself (no hand-off
  // to the group's executor) when it waits without a timeout; with one, the
  // group's executor runs it and the wait gives up at the deadline.
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (size_t i = 0; i < handles_.size(); ++i) {
    double seconds = -1;
    if (timeout != kNoTimeout) {
      seconds = std::max(
          1e-6, std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count());
    }
    int code = muster_work_wait(handles_[i], seconds);
    if (code != MUSTER_OK && muster_work_is_completed(handles_[i])) {
      // It may have completed right after the wait gave up: its own result.
      code = muster_work_status(handles_[i]);
    } else if (code != MUSTER_OK) {
      throw MakeError(c10::str("muster: ", what_, ": ", muster_code_name(MUSTER_DEADLINE_EXCEEDED),
                               ": not completed within the wait timeout of ", timeout.count(),
                               " ms (the collective goes on; wait again or fail)"));
    }
    HandleDone(i, code, code == MUSTER_OK ? "" : muster_last_error());
  }
  // Every handle is done: whoever saw the last one settles the Work (maybe
  // the completion thread, a moment from now).
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return completed_; });
    error = exception_;
  }
  if (error) std::rethrow_exception(error);
  return true;
}

void MusterWork::synchronize() {
  if (!stream_.has_value()) return;  // CPU: wait() already ordered everything
  for (size_t i = 0; i < handles_.size(); ++i) {
    int code = muster_work_synchronize(handles_[i], -1);
    if (code != MUSTER_OK) ThrowLast(c10::str(what_, ": synchronize"), code);
  }
}

std::vector<at::Tensor> MusterWork::result() { return outputs_; }

int MusterWork::sourceRank() const {
  int global = handles_.size() == 1 ? muster_work_source_rank(handles_[0]) : -1;
  for (size_t i = 0; global >= 0 && i < group_ranks_.size(); ++i) {
    if (group_ranks_[i] == global) return static_cast<int>(i);
  }
  TORCH_CHECK(false, "muster ", what_,
              ": sourceRank() is known only once a receive from any source completed");
}

c10::intrusive_ptr<c10::ivalue::Future> MusterWork::getFuture() {
  std::call_once(callbacks_once_, [this] { RegisterCallbacks(); });
  return future_;
}

// ---- CoalescedWork ----------------------------------------------------------

CoalescedWork::CoalescedWork(int rank, std::vector<c10::intrusive_ptr<MusterWork>> works)
#if TORCH_VERSION_MAJOR >= 2
    : c10d::Work(rank, c10d::OpType::COALESCED), works_(std::move(works)) {
#else
    : c10d::Work(rank, c10d::OpType::UNKNOWN), works_(std::move(works)) {
#endif
  std::vector<c10::Device> devices;
  std::vector<at::Tensor> outputs = result();
  for (const auto& w : works_) {
    for (const c10::Device& d : w->getFuture()->devices()) {
      if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
    }
  }
  future_ = c10::make_intrusive<c10::ivalue::Future>(TensorListType(), devices);
  if (works_.empty()) {
    future_->markCompleted(c10::IValue(outputs));
    return;
  }
  // Completes future_ once every child future completed.
  struct State {
    std::mutex mu;
    size_t pending;
    std::exception_ptr error;
  };
  auto state = std::make_shared<State>();
  state->pending = works_.size();
  auto future = future_;
  for (const auto& w : works_) {
    w->getFuture()->addCallback([state, future, outputs](c10::ivalue::Future& f) {
      std::exception_ptr error;
      {
        std::lock_guard<std::mutex> lock(state->mu);
        if (f.hasError() && !state->error) state->error = f.exception_ptr();
        if (--state->pending != 0) return;
        error = state->error;
      }
      if (error) {
        future->setError(error);
      } else {
        future->markCompleted(c10::IValue(outputs));
      }
    });
  }
}

bool CoalescedWork::isCompleted() {
  for (const auto& w : works_) {
    if (!w->isCompleted()) return false;
  }
  return true;
}

bool CoalescedWork::isSuccess() const {
  for (const auto& w : works_) {
    if (!w->isSuccess()) return false;
  }
  return true;
}

std::exception_ptr CoalescedWork::exception() const {
  for (const auto& w : works_) {
    if (auto e = w->exception()) return e;
  }
  return nullptr;
}

bool CoalescedWork::wait(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  std::exception_ptr first;
  for (const auto& w : works_) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (timeout != kNoTimeout && left <= std::chrono::milliseconds(0)) {
      left = std::chrono::milliseconds(1);
    }
    try {
      w->wait(timeout == kNoTimeout ? kNoTimeout : left);
    } catch (...) {
      if (!w->isCompleted()) throw;  // the wait timed out
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  return true;
}

void CoalescedWork::synchronize() {
  for (const auto& w : works_) w->synchronize();
}

std::vector<at::Tensor> CoalescedWork::result() {
  std::vector<at::Tensor> out;
  for (const auto& w : works_) {
    for (const at::Tensor& t : w->result()) out.push_back(t);
  }
  return out;
}

c10::intrusive_ptr<c10::ivalue::Future> CoalescedWork::getFuture() { return future_; }

// ---- MusterBackend ----------------------------------------------------------

MusterBackend::MusterBackend(int rank, int size, muster_group* group,
                             std::vector<int32_t> global_ranks, std::string name, bool is_world,
                             double timeout_s)
    : BackendBase(rank, size),
      global_ranks_(std::move(global_ranks)),
      name_(std::move(name)),
      is_world_(is_world),
      timeout_s_(timeout_s),
      group_(group) {
  init();  // torch's usage logging of the backend
}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10d::Backend::Options> MusterBackend::getBackendOptions() {
  auto timeout = timeout_s_ > 0 ? std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000))
                                : kBackendDefaultTimeout;
  auto options = c10::make_intrusive<Options>("muster", timeout);
  options->group_name = name_;
  options->global_ranks_in_group.assign(global_ranks_.begin(), global_ranks_.end());
  return options;
}
#endif

MusterBackend::~MusterBackend() { Shutdown(); }

c10::intrusive_ptr<MusterBackend> MusterBackend::Create(int group_rank, int group_size,
                                                        const std::string& group_id,
                                                        const std::vector<int64_t>& global_ranks,
                                                        double timeout_s,
                                                        const WorldConfig& config) {
  TORCH_CHECK(muster_api_version() == MUSTER_C_API_VERSION,
              "muster: libmuster.so speaks C API version ", muster_api_version(),
              " but the torch backend was built for version ", MUSTER_C_API_VERSION,
              "; rebuild it (muster.torch.build())");
  std::lock_guard<std::mutex> lock(world_mu);
  const bool is_world = global_ranks.empty();
  if (world == nullptr) {
    muster_init_options o;
    muster_init_options_default(&o);
    auto str = [](const std::string& s) { return s.empty() ? nullptr : s.c_str(); };
    o.job_id = str(config.job_id);
    if (config.rank >= 0) o.rank = config.rank;
    if (config.world_size >= 0) o.world_size = config.world_size;
    o.master_addr = str(config.master_addr);
    if (config.master_port > 0) o.master_port = config.master_port;
    o.socket = str(config.socket);
    o.backend = str(config.backend);
    if (config.timeout_s > 0) o.timeout_s = config.timeout_s;
    o.world_group_name = str(config.world_group_name);
    muster_world* w = nullptr;
    int code = muster_world_init(&o, &w);
    if (code != MUSTER_OK) ThrowLast("joining the job (muster_world_init)", code);
    world = w;
  }
  muster_group* group = nullptr;
  std::vector<int32_t> ranks;
  if (is_world) {
    group = muster_world_group(world);
    TORCH_CHECK(group != nullptr, "muster: the world has no group");
    int n = muster_group_size(group);
    ranks.resize(n);
    muster_group_ranks(group, ranks.data(), ranks.size());
  } else {
    ranks.assign(global_ranks.begin(), global_ranks.end());
    muster_group_options go;
    muster_group_options_default(&go);
    go.name = group_id.c_str();
    go.local_synchronization = 1;
    if (timeout_s > 0) go.timeout_s = timeout_s;
    int code = muster_group_create(world, ranks.data(), ranks.size(), &go, &group);
    if (code != MUSTER_OK) {
      std::string message = muster_last_error();
      if (live_backends == 0) {  // nothing else uses the world we just joined
        muster_world_release(world);
        world = nullptr;
      }
      throw MakeError(
          c10::str("muster: creating group '", group_id, "' failed: ", Describe(code, message)));
    }
  }
  TORCH_CHECK(muster_group_size(group) == group_size && muster_group_rank(group) == group_rank,
              "muster: group '", group_id, "' is rank ", muster_group_rank(group), " of ",
              muster_group_size(group), " in muster but rank ", group_rank, " of ", group_size,
              " in torch");
  ++live_backends;
  return c10::make_intrusive<MusterBackend>(group_rank, group_size, group, std::move(ranks),
                                            group_id, is_world, timeout_s);
}

void MusterBackend::Shutdown() {
  muster_group* g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    g = group_;
    group_ = nullptr;
  }
  if (g == nullptr) return;
  if (!is_world_) (void)muster_group_destroy(g);  // best effort: failures change nothing here
  muster_group_release(g);
  std::lock_guard<std::mutex> lock(world_mu);
  if (--live_backends == 0 && world != nullptr) {
    muster_world_release(world);
    world = nullptr;
  }
}

muster_group* MusterBackend::RetainGroup() {
  std::lock_guard<std::mutex> lock(mu_);
  return group_ == nullptr ? nullptr : muster_group_retain(group_);
}

OpLabel MusterBackend::What(const char* op) const { return OpLabel{op, name_}; }

int MusterBackend::GlobalRank(int group_rank, const char* what) const {
  TORCH_CHECK(group_rank >= 0 && group_rank < static_cast<int>(global_ranks_.size()), "muster ",
              What(what), ": rank ", group_rank, " is outside the group (size ",
              global_ranks_.size(), ")");
  return global_ranks_[group_rank];
}

void MusterBackend::CheckRoot(int64_t root, const char* what) const {
  TORCH_CHECK(root >= 0 && root < getSize(), "muster ", What(what), ": root rank ", root,
              " is outside the group (size ", getSize(), ")");
}

c10::intrusive_ptr<MusterWork> MusterBackend::Launch(c10d::OpType op, const char* what,
                                                     const Call& call,
                                                     std::vector<at::Tensor> outputs,
                                                     std::vector<at::Tensor> keep_alive,
                                                     std::optional<c10::Stream> stream) {
  muster_work* handle = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(group_ != nullptr, "muster ", What(what), ": the group was destroyed");
    ++calls_;
    int code = call(group_, &handle);
    if (code != MUSTER_OK || handle == nullptr) {
      ThrowLast(What(what), code == MUSTER_OK ? MUSTER_INTERNAL : code);
    }
  }
  return Wrap(op, what, {handle}, std::move(outputs), std::move(keep_alive), stream);
}

c10::intrusive_ptr<MusterWork> MusterBackend::Wrap(c10d::OpType op, const char* what,
                                                   std::vector<muster_work*> handles,
                                                   std::vector<at::Tensor> outputs,
                                                   std::vector<at::Tensor> keep_alive,
                                                   std::optional<c10::Stream> stream) {
  auto work = c10::make_intrusive<MusterWork>(getRank(), op, What(what), std::move(handles),
                                              std::move(outputs), std::move(keep_alive), stream);
  work->Start();
  std::lock_guard<std::mutex> lock(mu_);
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

c10::intrusive_ptr<c10d::Work> MusterBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  const char* what = "broadcast";
  CheckSingle(tensors, what);
  CheckRoot(opts.rootRank, what);
  TensorSet ts(What(what));
  muster_tensor t = ts.Output(tensors[0]);
  int root = static_cast<int>(opts.rootRank);
  return Launch(
      c10d::OpType::BROADCAST, what,
      [&](muster_group* g, muster_work** w) { return muster_broadcast(g, &t, root, w); }, tensors,
      ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  const char* what = "allreduce";
  CheckSingle(tensors, what);
  Reduction r = ToMusterOp(opts.reduceOp, what);
  TensorSet ts(What(what));
  muster_tensor t = ts.Output(tensors[0]);
  return Launch(
      c10d::OpType::ALLREDUCE, what,
      [&](muster_group* g, muster_work** w) { return muster_all_reduce(g, &t, r.op, r.scale, w); },
      tensors, ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const char* what = "allreduce_coalesced";
  Reduction r = ToMusterOp(opts.reduceOp, what);
  TensorSet ts(What(what));
  std::vector<muster_tensor> ms;
  for (auto& t : tensors) {
    ms.push_back(ts.Output(t));
    if (r.op == MUSTER_PREMUL_SUM) CheckPremulDType(t, what);
  }
  int op = r.op == MUSTER_PREMUL_SUM ? MUSTER_SUM : r.op;
  auto launch = [&](bool& started) {
    return Launch(
        c10d::OpType::ALLREDUCE_COALESCED, what,
        [&](muster_group* g, muster_work** w) {
          int code = muster_all_reduce_coalesced(g, ms.data(), ms.size(), op, w);
          started = code == MUSTER_OK;
          return code;
        },
        tensors, ts.TakeKeep(), ts.stream());
  };
  if (r.op == MUSTER_PREMUL_SUM) return ScaleInPlaceThenLaunch(tensors, r.scale, launch);
  bool started = false;
  return launch(started);
}

c10::intrusive_ptr<c10d::Work> MusterBackend::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  const char* what = "reduce";
  CheckSingle(tensors, what);
  CheckRoot(opts.rootRank, what);
  Reduction r = ToMusterOp(opts.reduceOp, what);
  TensorSet ts(What(what));
  int root = static_cast<int>(opts.rootRank);
  muster_tensor t;
  bool scale_in_place = false;
  if (r.op == MUSTER_PREMUL_SUM) {
    // SUM of the scaled inputs; only the root's tensor changes (as in NCCL):
    // other ranks send a scaled copy.
    CheckPremulDType(tensors[0], what);
    r.op = MUSTER_SUM;
    if (getRank() == root) {
      t = ts.Output(tensors[0]);
      scale_in_place = true;
    } else {
      t = ts.Output(tensors[0].mul(r.scale));
    }
  } else {
    t = ts.Output(tensors[0]);
  }
  auto launch = [&](bool& started) {
    return Launch(
        c10d::OpType::REDUCE, what,
        [&](muster_group* g, muster_work** w) {
          int code = muster_reduce(g, &t, root, r.op, w);
          started = code == MUSTER_OK;
          return code;
        },
        tensors, ts.TakeKeep(), ts.stream());
  };
  if (scale_in_place) return ScaleInPlaceThenLaunch(tensors, r.scale, launch);
  bool started = false;
  return launch(started);
}

c10::intrusive_ptr<c10d::Work> MusterBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  const char* what = "allgather";
  CheckSingle(inputs, what);
  TORCH_CHECK(outputs.size() == 1, "muster ", What(what), ": expects one output list (got ",
              outputs.size(), ")");
  TORCH_CHECK(static_cast<int>(outputs[0].size()) == getSize(), "muster ", What(what), ": expects ",
              getSize(), " output tensors (the group size), got ", outputs[0].size());
  TensorSet ts(What(what));
  muster_tensor in = ts.Input(inputs[0]);
  std::vector<muster_tensor> outs;
  for (const auto& o : outputs[0]) {
    TORCH_CHECK(o.numel() == inputs[0].numel() && o.scalar_type() == inputs[0].scalar_type(),
                "muster ", What(what), ": every output must have the input's dtype ",
                c10::toString(inputs[0].scalar_type()), " and ", inputs[0].numel(),
                " elements (got ", c10::toString(o.scalar_type()), ", ", o.numel(), ")");
    outs.push_back(ts.Output(o));
  }
  return Launch(
      c10d::OpType::ALLGATHER, what,
      [&](muster_group* g, muster_work** w) {
        return muster_all_gather(g, outs.data(), outs.size(), &in, w);
      },
      outputs[0], ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions&) {
  const char* what = "allgather_into_tensor";
  TORCH_CHECK(
      output.numel() == input.numel() * getSize() && output.scalar_type() == input.scalar_type(),
      "muster ", What(what), ": the output must have the input's dtype and group size (", getSize(),
      ") times its ", input.numel(), " elements (got ", c10::toString(output.scalar_type()), ", ",
      output.numel(), ")");
  TensorSet ts(What(what));
  muster_tensor in = ts.Input(input);
  muster_tensor out = ts.Output(output);
  return Launch(
      c10d::OpType::_ALLGATHER_BASE, what,
      [&](muster_group* g, muster_work** w) {
        return muster_all_gather_into_tensor(g, &out, &in, w);
      },
      {output}, ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  const char* what = "allgather_coalesced";
  const int size = getSize();
  TORCH_CHECK(static_cast<int>(output_lists.size()) == size, "muster ", What(what),
              ": expects one output list per rank (", size, "), got ", output_lists.size());
  TensorSet ts(What(what));
  std::vector<muster_tensor> ins;
  for (const auto& t : inputs) ins.push_back(ts.Input(t));
  // muster: outputs[i * size + j] receives rank j's inputs[i];
  // torch: output_lists[j][i].
  std::vector<muster_tensor> outs(inputs.size() * size);
  for (int j = 0; j < size; ++j) {
    TORCH_CHECK(output_lists[j].size() == inputs.size(), "muster ", What(what), ": output list ", j,
                " has ", output_lists[j].size(), " tensors, expected ", inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor& o = output_lists[j][i];
      TORCH_CHECK(o.numel() == inputs[i].numel() && o.scalar_type() == inputs[i].scalar_type(),
                  "muster ", What(what), ": output [", j, "][", i, "] must match input ", i,
                  " in dtype and size");
      outs[i * size + j] = ts.Output(o);
    }
  }
  return Launch(
      c10d::OpType::ALLGATHER_COALESCED, what,
      [&](muster_group* g, muster_work** w) {
        return muster_all_gather_coalesced(g, outs.data(), ins.data(), ins.size(), w);
      },
      Flatten(output_lists), ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::GatherOptions& opts) {
  const char* what = "gather";
  CheckSingle(inputs, what);
  CheckRoot(opts.rootRank, what);
  const bool is_root = opts.rootRank == getRank();
  TensorSet ts(What(what));
  muster_tensor in = ts.Input(inputs[0]);
  std::vector<muster_tensor> outs;
  std::vector<at::Tensor> out_tensors;
  if (is_root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(), "muster ",
                What(what), ": the root expects one list of ", getSize(), " output tensors");
    for (const auto& o : outputs[0]) {
      TORCH_CHECK(o.numel() == inputs[0].numel() && o.scalar_type() == inputs[0].scalar_type(),
                  "muster ", What(what),
                  ": every output must match the input in dtype and "
                  "size");
      outs.push_back(ts.Output(o));
    }
    out_tensors = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "muster ",
                What(what), ": only the root passes output tensors");
  }
  int root = static_cast<int>(opts.rootRank);
  return Launch(
      c10d::OpType::GATHER, what,
      [&](muster_group* g, muster_work** w) {
        return muster_gather(g, outs.data(), outs.size(), &in, root, w);
      },
      out_tensors, ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::scatter(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      const c10d::ScatterOptions& opts) {
  const char* what = "scatter";
  CheckSingle(outputs, what);
  CheckRoot(opts.rootRank, what);
  const bool is_root = opts.rootRank == getRank();
  TensorSet ts(What(what));
  muster_tensor out = ts.Output(outputs[0]);
  std::vector<muster_tensor> ins;
  if (is_root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(), "muster ",
                What(what), ": the root expects one list of ", getSize(), " input tensors");
    for (const auto& t : inputs[0]) {
      TORCH_CHECK(t.numel() == outputs[0].numel() && t.scalar_type() == outputs[0].scalar_type(),
                  "muster ", What(what),
                  ": every input must match the output in dtype and "
                  "size");
      ins.push_back(ts.Input(t));
    }
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), "muster ", What(what),
                ": only the root passes input tensors");
  }
  int root = static_cast<int>(opts.rootRank);
  return Launch(
      c10d::OpType::SCATTER, what,
      [&](muster_group* g, muster_work** w) {
        return muster_scatter(g, &out, ins.data(), ins.size(), root, w);
      },
      outputs, ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* what = "reduce_scatter";
  CheckSingle(outputs, what);
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(), "muster ",
              What(what), ": expects one list of ", getSize(), " input tensors");
  Reduction r = ToMusterOp(opts.reduceOp, what);
  TensorSet ts(What(what));
  muster_tensor out = ts.Output(outputs[0]);
  std::vector<muster_tensor> ins;
  for (const auto& t : inputs[0]) {
    TORCH_CHECK(t.numel() == outputs[0].numel() && t.scalar_type() == outputs[0].scalar_type(),
                "muster ", What(what), ": every input must match the output in dtype and size");
    if (r.op == MUSTER_PREMUL_SUM) {
      CheckPremulDType(t, what);
      ins.push_back(ts.Input(t.mul(r.scale)));
    } else {
      ins.push_back(ts.Input(t));
    }
  }
  int op = r.op == MUSTER_PREMUL_SUM ? MUSTER_SUM : r.op;
  return Launch(
      c10d::OpType::REDUCE_SCATTER, what,
      [&](muster_group* g, muster_work** w) {
        return muster_reduce_scatter(g, &out, ins.data(), ins.size(), op, w);
      },
      outputs, ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const char* what = "reduce_scatter_tensor";
  TORCH_CHECK(
      input.numel() == output.numel() * getSize() && output.scalar_type() == input.scalar_type(),
      "muster ", What(what), ": the input must have the output's dtype and group size (", getSize(),
      ") times its ", output.numel(), " elements (got ", c10::toString(input.scalar_type()), ", ",
      input.numel(), ")");
  Reduction r = ToMusterOp(opts.reduceOp, what);
  TensorSet ts(What(what));
  muster_tensor out = ts.Output(output);
  muster_tensor in;
  if (r.op == MUSTER_PREMUL_SUM) {
    CheckPremulDType(input, what);
    in = ts.Input(input.mul(r.scale));
  } else {
    in = ts.Input(input);
  }
  int op = r.op == MUSTER_PREMUL_SUM ? MUSTER_SUM : r.op;
  return Launch(
      c10d::OpType::_REDUCE_SCATTER_BASE, what,
      [&](muster_group* g, muster_work** w) {
        return muster_reduce_scatter_tensor(g, &out, &in, op, w);
      },
      {output}, ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                            std::vector<int64_t>& output_splits,
                                                            std::vector<int64_t>& input_splits,
                                                            const c10d::AllToAllOptions&) {
  const char* what = "alltoall_base";
  const int size = getSize();
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "muster ", What(what),
              ": input and output dtypes differ (", c10::toString(input.scalar_type()), " vs ",
              c10::toString(output.scalar_type()), ")");
  // torch's splits count rows (dimension 0); muster's count elements.
  auto to_elements = [&](const at::Tensor& t, const std::vector<int64_t>& splits,
                         const char* which) {
    std::vector<uint64_t> out;
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    int64_t row = rows == 0 ? 0 : t.numel() / rows;
    if (splits.empty()) {
      TORCH_CHECK(rows % size == 0, "muster ", What(what), ": the ", which, " tensor's dim 0 (",
                  rows, ") does not divide equally across the group size ", size);
      out.assign(size, static_cast<uint64_t>(rows / size * row));
      return out;
    }
    TORCH_CHECK(static_cast<int>(splits.size()) == size, "muster ", What(what), ": ", which,
                " split sizes has ", splits.size(), " entries, expected the group size ", size);
    int64_t sum = 0;
    for (int64_t s : splits) {
      TORCH_CHECK(s >= 0, "muster ", What(what), ": negative ", which, " split size ", s);
      // No sum past dim 0 (it could wrap and come back equal to it).
      TORCH_CHECK(s <= rows - sum, "muster ", What(what), ": ", which,
                  " split sizes add up to more than the ", which, " tensor's dim 0 (", rows, ")");
      sum += s;
      out.push_back(static_cast<uint64_t>(s * row));
    }
    TORCH_CHECK(sum == rows, "muster ", What(what), ": ", which, " split sizes add up to ", sum,
                " but the ", which, " tensor's dim 0 is ", rows);
    return out;
  };
  std::vector<uint64_t> out_el = to_elements(output, output_splits, "output");
  std::vector<uint64_t> in_el = to_elements(input, input_splits, "input");
  TensorSet ts(What(what));
  muster_tensor in = ts.Input(input);
  muster_tensor out = ts.Output(output);
  return Launch(
      c10d::OpType::ALLTOALL_BASE, what,
      [&](muster_group* g, muster_work** w) {
        return muster_all_to_all_single(g, &out, &in, out_el.data(), in_el.data(), size, w);
      },
      {output}, ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllToAllOptions&) {
  const char* what = "alltoall";
  const int size = getSize();
  TORCH_CHECK(static_cast<int>(outputs.size()) == size && static_cast<int>(inputs.size()) == size,
              "muster ", What(what), ": expects ", size, " input and output tensors (got ",
              inputs.size(), " and ", outputs.size(), ")");
  TensorSet ts(What(what));
  std::vector<muster_tensor> ins, outs;
  for (int i = 0; i < size; ++i) {
    TORCH_CHECK(inputs[i].scalar_type() == outputs[i].scalar_type(), "muster ", What(what),
                ": input and output dtypes differ");
    ins.push_back(ts.Input(inputs[i]));
    outs.push_back(ts.Output(outputs[i]));
  }
  return Launch(
      c10d::OpType::ALLTOALL, what,
      [&](muster_group* g, muster_work** w) {
        return muster_all_to_all(g, outs.data(), ins.data(), size, w);
      },
      outputs, ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::send(std::vector<at::Tensor>& tensors, int dst_rank,
                                                   int tag) {
  const char* what = "send";
  CheckSingle(tensors, what);
  int dst = GlobalRank(dst_rank, what);
  TensorSet ts(What(what));
  muster_tensor t = ts.Input(tensors[0]);
  return Launch(
      c10d::OpType::SEND, what,
      [&](muster_group* g, muster_work** w) {
        return muster_send(g, &t, dst, static_cast<uint64_t>(tag), w);
      },
      tensors, ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::recv(std::vector<at::Tensor>& tensors, int src_rank,
                                                   int tag) {
  const char* what = "recv";
  CheckSingle(tensors, what);
  int src = GlobalRank(src_rank, what);
  TensorSet ts(What(what));
  muster_tensor t = ts.Output(tensors[0]);
  return Launch(
      c10d::OpType::RECV, what,
      [&](muster_group* g, muster_work** w) {
        return muster_recv(g, &t, src, static_cast<uint64_t>(tag), w);
      },
      tensors, ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                            int tag) {
  const char* what = "recv";
  CheckSingle(tensors, what);
  TensorSet ts(What(what));
  muster_tensor t = ts.Output(tensors[0]);
  auto work = Launch(
      c10d::OpType::RECVANYSOURCE, what,
      [&](muster_group* g, muster_work** w) {
        return muster_recv_anysource(g, &t, static_cast<uint64_t>(tag), w);
      },
      tensors, ts.TakeKeep(), ts.stream());
  work->SetGroupRanks(global_ranks_);
  return work;
}

c10::intrusive_ptr<c10d::Work> MusterBackend::barrier(const c10d::BarrierOptions&) {
  const char* what = "barrier";
  return Launch(
      c10d::OpType::BARRIER, what,
      [&](muster_group* g, muster_work** w) { return muster_collective_barrier(g, w); }, {}, {},
      std::nullopt);
}

void MusterBackend::MonitoredBarrier(double timeout_s) {
  // Our own reference: a concurrent shutdown must not free the group while
  // the barrier blocks.
  muster_group* g = RetainGroup();
  TORCH_CHECK(g != nullptr, "muster ", What("monitored_barrier"), ": the group was destroyed");
  // Unset: the group's timeout (as gloo's monitored_barrier uses).
  if (timeout_s <= 0) timeout_s = timeout_s_;
  int code = muster_group_monitored_barrier(g, timeout_s);
  muster_group_release(g);
  if (code != MUSTER_OK) ThrowLast(What("monitored_barrier"), code);
}

void MusterBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool) {
  double timeout_s =
      opts.timeout == c10d::kUnsetTimeout ? 0 : std::chrono::duration<double>(opts.timeout).count();
  MonitoredBarrier(timeout_s);
}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10d::Work> MusterBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  const char* what = "allgather_into_tensor_coalesced";
  const int size = getSize();
  TORCH_CHECK(outputs.size() == inputs.size(), "muster ", What(what), ": ", inputs.size(),
              " inputs but ", outputs.size(), " outputs");
  TensorSet ts(What(what));
  std::vector<muster_tensor> ins;
  std::vector<muster_tensor> outs(inputs.size() * size);
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * size &&
                    outputs[i].scalar_type() == inputs[i].scalar_type(),
                "muster ", What(what), ": output ", i, " must have input ", i,
                "'s dtype and group size (", size, ") times its ", inputs[i].numel(), " elements");
    ins.push_back(ts.Input(inputs[i]));
    // Output i is rank 0's chunk, then rank 1's, ...: one muster output each.
    muster_tensor whole = ts.Output(outputs[i]);
    size_t chunk_bytes = inputs[i].numel() * outputs[i].element_size();
    for (int j = 0; j < size; ++j) {
      muster_tensor part = whole;
      part.count = inputs[i].numel();
      part.data =
          whole.data == nullptr ? nullptr : static_cast<char*>(whole.data) + j * chunk_bytes;
      outs[i * size + j] = part;
    }
  }
  return Launch(
      c10d::OpType::COALESCED, what,
      [&](muster_group* g, muster_work** w) {
        return muster_all_gather_coalesced(g, outs.data(), ins.data(), ins.size(), w);
      },
      outputs, ts.TakeKeep(), ts.stream());
}

c10::intrusive_ptr<c10d::Work> MusterBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* what = "reduce_scatter_tensor_coalesced";
  TORCH_CHECK(outputs.size() == inputs.size(), "muster ", What(what), ": ", inputs.size(),
              " inputs but ", outputs.size(), " outputs");
  // muster has no coalesced reduce_scatter: one call per pair, one Work.
  std::vector<c10::intrusive_ptr<MusterWork>> works;
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto w = _reduce_scatter_base(outputs[i], inputs[i], opts);
    works.push_back(c10::static_intrusive_pointer_cast<MusterWork>(w));
  }
  return c10::make_intrusive<CoalescedWork>(getRank(), std::move(works));
}
#endif

// Coalescing: collectives issued between start and end run as they come
// (muster keeps their order); the Work of endCoalescing completes when all of
// them did.
void MusterBackend::startCoalescing() {
  std::lock_guard<std::mutex> lock(mu_);
  if (coalescing_) {
    // A coalescing block that raised never reached endCoalescing (torch's
    // manager has no finally): start afresh rather than refuse forever.
    TORCH_WARN("muster ", What("startCoalescing"),
               ": the previous coalescing block never ended; its works are dropped from it");
  }
  coalescing_ = true;
  coalesced_.clear();
}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10d::Work> MusterBackend::endCoalescing() {
  std::vector<c10::intrusive_ptr<MusterWork>> works;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(coalescing_, "muster ", What("endCoalescing"), ": not coalescing");
    coalescing_ = false;
    works.swap(coalesced_);
  }
  return c10::make_intrusive<CoalescedWork>(getRank(), std::move(works));
}
#else
void MusterBackend::endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>&) {
  // The calls already returned their own Works to the caller.
  std::lock_guard<std::mutex> lock(mu_);
  coalescing_ = false;
  coalesced_.clear();
}
#endif

}  // namespace muster_torch

// ---- the Python module ------------------------------------------------------

namespace {

namespace py = pybind11;

muster_torch::WorldConfig ToWorldConfig(const py::dict& d) {
  muster_torch::WorldConfig c;
  auto get_str = [&](const char* k, std::string* out) {
    if (d.contains(k) && !d[k].is_none()) *out = py::str(d[k]);
  };
  auto get_int = [&](const char* k, int* out) {
    if (d.contains(k) && !d[k].is_none()) *out = d[k].cast<int>();
  };
  get_str("job_id", &c.job_id);
  get_int("rank", &c.rank);
  get_int("world_size", &c.world_size);
  get_str("master_addr", &c.master_addr);
  get_int("master_port", &c.master_port);
  get_str("socket", &c.socket);
  get_str("backend", &c.backend);
  get_str("world_group_name", &c.world_group_name);
  if (d.contains("timeout_s") && !d["timeout_s"].is_none()) {
    c.timeout_s = d["timeout_s"].cast<double>();
  }
  return c;
}

// Runs `f`, turning c10::Error into RuntimeError with its message only.
template <typename F>
auto Translate(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw std::runtime_error(e.what_without_backtrace());
  }
}

muster_torch::MusterBackend* AsMuster(muster_torch::BackendBase* backend) {
  auto* b = dynamic_cast<muster_torch::MusterBackend*>(backend);
  if (b == nullptr) {
    throw py::type_error(c10::str("not a muster backend (backend '",
                                  backend == nullptr ? "none" : backend->getBackendName(), "')"));
  }
  return b;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::module_::import("torch.distributed");
  m.doc() = "The torch.distributed backend \"muster\" (use the muster.torch package).";
  m.attr("C_API_VERSION") = MUSTER_C_API_VERSION;
  m.def("library_api_version", [] { return muster_api_version(); });
  m.def("library_version", [] { return std::string(muster_version()); });
  m.def(
      "world_joined",
      [] {
        std::lock_guard<std::mutex> lock(muster_torch::world_mu);
        return muster_torch::world != nullptr;
      },
      "Whether this process already joined muster's job.");
  m.def(
      "epoch",
      [] {
        std::lock_guard<std::mutex> lock(muster_torch::world_mu);
        return muster_torch::world == nullptr ? int64_t{-1}
                                              : muster_world_epoch(muster_torch::world);
      },
      "The job epoch this process is in (-1 before it joined the job).");
  m.def(
      "reconfigure",
      [](double timeout_s) {
        muster_world* w;
        {
          std::lock_guard<std::mutex> lock(muster_torch::world_mu);
          w = muster_torch::world == nullptr ? nullptr : muster_world_retain(muster_torch::world);
        }
        TORCH_CHECK(w != nullptr, "muster: reconfigure(): no process group uses muster yet");
        int64_t epoch = 0;
        int code;
        {
          py::gil_scoped_release release;
          // torch's groups have a fixed size: every rank comes back.
          code = muster_world_reconfigure(w, timeout_s, /*allow_shrink=*/0, &epoch);
        }
        std::string message = code == MUSTER_OK ? "" : muster_last_error();
        muster_world_release(w);
        if (code != MUSTER_OK) {
          throw muster_torch::MakeError(
              c10::str("muster: reconfigure failed: ", muster_torch::Describe(code, message)));
        }
        return epoch;
      },
      py::arg("timeout_s"));
  m.def(
      "create_backend",
      [](int group_rank, int group_size, const std::string& group_id,
         const std::vector<int64_t>& global_ranks, double timeout_s, const py::dict& world) {
        muster_torch::WorldConfig config = ToWorldConfig(world);
        py::gil_scoped_release release;
        return Translate([&] {
          return c10::intrusive_ptr<muster_torch::BackendBase>(muster_torch::MusterBackend::Create(
              group_rank, group_size, group_id, global_ranks, timeout_s, config));
        });
      },
      py::arg("group_rank"), py::arg("group_size"), py::arg("group_id"), py::arg("global_ranks"),
      py::arg("timeout_s"), py::arg("world"),
      "Creates the muster backend of one torch group (joins the job first if needed).");
  m.def(
      "group_handle",
      [](muster_torch::BackendBase* backend) {
        muster_group* g = AsMuster(backend)->RetainGroup();
        if (g == nullptr) throw std::runtime_error("muster: the group was destroyed");
        return reinterpret_cast<uintptr_t>(g);
      },
      py::arg("backend"),
      "A new reference to the muster_group* of a muster backend, as an int (the caller "
      "releases it).");
  m.def(
      "group_name", [](muster_torch::BackendBase* backend) { return AsMuster(backend)->name(); },
      py::arg("backend"));
  m.def(
      "monitored_barrier",
      [](muster_torch::BackendBase* backend, double timeout_s) {
        muster_torch::MusterBackend* b = AsMuster(backend);
        py::gil_scoped_release release;
        Translate([&] {
          b->MonitoredBarrier(timeout_s);
          return 0;
        });
      },
      py::arg("backend"), py::arg("timeout_s"),
      "c10d's monitored_barrier; raises naming the ranks that did not arrive.");
  m.def(
      "shutdown",
      [](muster_torch::BackendBase* backend) {
        muster_torch::MusterBackend* b = AsMuster(backend);
        py::gil_scoped_release release;
        b->Shutdown();
      },
      py::arg("backend"), "Destroys the backend's muster group now.");
  m.def(
      "daemon_store_port",
      [](const std::string& socket) {
        int32_t port = 0;
        int code;
        {
          py::gil_scoped_release release;
          code = muster_daemon_store_port(socket.empty() ? nullptr : socket.c_str(), &port);
        }
        if (code != MUSTER_OK) {
          throw std::runtime_error(c10::str("muster: asking musterd for its store port failed: ",
                                            muster_code_name(code), ": ", muster_last_error()));
        }
        return port;
      },
      py::arg("socket") = "",
      "The store port of the musterd at `socket` (empty: $MUSTER_SOCKET or the default).");
}
