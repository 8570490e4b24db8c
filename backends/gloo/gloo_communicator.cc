#include "backends/gloo/gloo_communicator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "backends/shm/collectives.h"
#include "common/status_macros.h"
#include "gloo/allgather.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/gather.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/scatter.h"
#include "gloo/transport/tcp/device.h"

namespace muster {
namespace {

// Gloo's store interface over a muster::Store.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit StoreAdapter(std::shared_ptr<muster::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = store_->Set(key, absl::string_view(data.data(), data.size()));
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  }
  std::vector<char> get(const std::string& key) override {
    auto v = store_->Get(key);
    if (!v.ok()) throw std::runtime_error(std::string(v.status().message()));
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    absl::Status s = store_->Wait(keys, absl::FromChrono(timeout));
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  }

 private:
  std::shared_ptr<muster::Store> store_;
};

std::chrono::milliseconds Left(absl::Time deadline) {
  absl::Duration d = deadline - absl::Now();
  if (d < absl::Milliseconds(1)) d = absl::Milliseconds(1);
  if (d > absl::Hours(24)) d = absl::Hours(24);
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

absl::Status GlooError(const std::exception& e, const char* what) {
  std::string message = absl::StrCat(what, " over gloo: ", e.what());
  if (message.find("imed out") != std::string::npos) {
    return absl::DeadlineExceededError(message);
  }
  return absl::AbortedError(message);
}

// Calls f<T>() with the C++ type Gloo should see for `dtype` (16-bit floats
// as uint16_t, bool as uint8_t, complex as its real parts).
template <typename F>
void WithType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      f(uint16_t{});
      break;
    case DType::kFloat32:
    case DType::kComplex64:
      f(float{});
      break;
    case DType::kFloat64:
    case DType::kComplex128:
      f(double{});
      break;
    case DType::kInt8:
      f(int8_t{});
      break;
    case DType::kUInt8:
    case DType::kBool:
      f(uint8_t{});
      break;
    case DType::kInt32:
      f(int32_t{});
      break;
    case DType::kInt64:
      f(int64_t{});
      break;
  }
}

// Elements as Gloo counts them (complex: two reals each).
size_t GlooCount(DType dtype, size_t count) {
  return dtype == DType::kComplex64 || dtype == DType::kComplex128 ? count * 2 : count;
}
DType GlooDType(DType dtype) {
  if (dtype == DType::kComplex64) return DType::kFloat32;
  if (dtype == DType::kComplex128) return DType::kFloat64;
  return dtype;
}

}  // namespace

absl::StatusOr<std::string> LocalAddressToward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result) != 0 ||
      result == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve ", host));
  }
  int fd = ::socket(result->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  absl::Status status;
  std::string address;
  if (fd < 0 || ::connect(fd, result->ai_addr, result->ai_addrlen) != 0) {
    status = ErrnoToStatus(errno, absl::StrCat("no route to ", host));
  } else {
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
    char buf[INET6_ADDRSTRLEN] = {};
    if (local.ss_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in&>(local).sin_addr, buf, sizeof(buf));
    } else {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6&>(local).sin6_addr, buf, sizeof(buf));
    }
    address = buf;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(result);
  if (!status.ok()) return status;
  return address;
}

// See the header: a dead peer must fail a collective, not kill the process.
static void IgnoreSigpipeUnlessHandled() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      ::sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    std::shared_ptr<Store> store, int rank, int size, const std::string& address,
    absl::Duration timeout, bool check_signatures) {
  IgnoreSigpipeUnlessHandled();
  std::unique_ptr<GlooCommunicator> comm(new GlooCommunicator(rank, size));
  comm->check_signatures_ = check_signatures;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = address;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
    StoreAdapter adapter(std::move(store));
    context->connectFullMesh(adapter, device);
    comm->context_ = std::move(context);
  } catch (const std::exception& e) {
    return GlooError(e, "connecting the group");
  }
  return comm;
}

GlooCommunicator::~GlooCommunicator() = default;

absl::Status GlooCommunicator::CheckSignature(uint32_t kind, DType dtype, uint64_t count, int root,
                                              ReduceOp op, absl::Time deadline) {
  if (!check_signatures_) return absl::OkStatus();
  OpSignature mine =
      MakeSignature(++sequence_, static_cast<CollectiveKind>(kind), dtype, count, root, op);
  std::vector<OpSignature> all(size_);
  try {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(reinterpret_cast<uint8_t*>(&mine), sizeof(mine));
    opts.setOutput(reinterpret_cast<uint8_t*>(all.data()), sizeof(mine) * size_);
    opts.setTag(NextTag());
    opts.setTimeout(Left(deadline));
    gloo::allgather(opts);
  } catch (const std::exception& e) {
    return FromGloo(e, "exchanging collective signatures");
  }
  for (int j = 0; j < size_; ++j) {
    if (!SameSignature(all[j], mine)) {
      return absl::FailedPreconditionError(SignatureMismatch(rank_, mine, j, all[j]));
    }
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::CheckRoot(int root) const {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("root ", root, " is outside the group of size ", size_));
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::RawBarrier(absl::Time deadline) {
  try {
    gloo::BarrierOptions opts(context_);
    opts.setTag(NextTag());
    opts.setTimeout(Left(deadline));
    gloo::barrier(opts);
  } catch (const std::exception& e) {
    return FromGloo(e, "barrier");
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Barrier(absl::Time deadline) {
  InFlight in_flight(this);
  RETURN_IF_ERROR(in_flight.refused());
  RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kBarrier), DType::kUInt8, 0,
                                 -1, ReduceOp::kSum, deadline));
  return RawBarrier(deadline);
}

absl::Status GlooCommunicator::RawAllReduce(void* data, size_t count, DType dtype, ReduceOp op,
                                            double scale, absl::Time deadline) {
  if (absl::Status s = CheckReduce(dtype, op); !s.ok()) return s;
  if (count == 0) return RawBarrier(deadline);
  DType gdtype = GlooDType(dtype);
  size_t gcount = GlooCount(dtype, count);
  if (op == ReduceOp::kPremulSum) ReduceInit(data, data, gcount, gdtype, op, scale);
  ReduceOp combine = op == ReduceOp::kAvg || op == ReduceOp::kPremulSum ? ReduceOp::kSum : op;
  try {
    gloo::AllreduceOptions opts(context_);
    WithType(gdtype, [&](auto t) {
      using T = decltype(t);
      opts.setOutput(static_cast<T*>(data), gcount);
    });
    opts.setReduceFunction([gdtype, combine](void* c, const void* a, const void* b, size_t n) {
      if (c != a) std::memmove(c, a, n * DTypeSize(gdtype));
      ReduceInto(c, b, n, gdtype, combine, 1.0);
    });
    opts.setTag(NextTag());
    opts.setTimeout(Left(deadline));
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    return FromGloo(e, "all_reduce");
  }
  if (op == ReduceOp::kAvg) ReduceFinish(data, gcount, gdtype, op, size_);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllReduce(void* data, size_t count, DType dtype, ReduceOp op,
                                         double scale, absl::Time deadline) {
  InFlight in_flight(this);
  RETURN_IF_ERROR(in_flight.refused());
  if (absl::Status s = CheckReduce(dtype, op); !s.ok()) return s;
  RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kAllReduce), dtype, count,
                                 -1, op, deadline));
  return RawAllReduce(data, count, dtype, op, scale, deadline);
}

absl::Status GlooCommunicator::Broadcast(void* data, size_t count, DType dtype, int root,
                                         absl::Time deadline) {
  InFlight in_flight(this);
  RETURN_IF_ERROR(in_flight.refused());
  RETURN_IF_ERROR(CheckRoot(root));
  RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kBroadcast), dtype, count,
                                 root, ReduceOp::kSum, deadline));
  if (count == 0) return RawBarrier(deadline);
  try {
    gloo::BroadcastOptions opts(context_);
    WithType(GlooDType(dtype), [&](auto t) {
      using T = decltype(t);
      opts.setOutput(static_cast<T*>(data), GlooCount(dtype, count));
    });
    opts.setRoot(root);
    opts.setTag(NextTag());
    opts.setTimeout(Left(deadline));
    gloo::broadcast(opts);
  } catch (const std::exception& e) {
    return FromGloo(e, "broadcast");
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Reduce(void* data, size_t count, DType dtype, ReduceOp op,
                                      double scale, int root, absl::Time deadline) {
  InFlight in_flight(this);
  RETURN_IF_ERROR(in_flight.refused());
  RETURN_IF_ERROR(CheckRoot(root));
  std::string copy(static_cast<char*>(data), count * DTypeSize(dtype));
  RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kReduce), dtype, count, root,
                                 op, deadline));
  RETURN_IF_ERROR(RawAllReduce(copy.data(), count, dtype, op, scale, deadline));
  if (rank_ == root) std::memcpy(data, copy.data(), copy.size());
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllGather(const void* in, void* out, size_t count, DType dtype,
                                         absl::Time deadline) {
  InFlight in_flight(this);
  RETURN_IF_ERROR(in_flight.refused());
  RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kAllGather), dtype, count,
                                 -1, ReduceOp::kSum, deadline));
  if (count == 0) return RawBarrier(deadline);
  try {
    gloo::AllgatherOptions opts(context_);
    WithType(GlooDType(dtype), [&](auto t) {
      using T = decltype(t);
      size_t n = GlooCount(dtype, count);
      opts.setInput(const_cast<T*>(static_cast<const T*>(in)), n);
      opts.setOutput(static_cast<T*>(out), n * size_);
    });
    opts.setTag(NextTag());
    opts.setTimeout(Left(deadline));
    gloo::allgather(opts);
  } catch (const std::exception& e) {
    return FromGloo(e, "all_gather");
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Gather(const void* in, void* out, size_t count, DType dtype,
                                      int root, absl::Time deadline) {
  InFlight in_flight(this);
  RETURN_IF_ERROR(in_flight.refused());
  RETURN_IF_ERROR(CheckRoot(root));
  RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kGather), dtype, count, root,
                                 ReduceOp::kSum, deadline));
  if (count == 0) return RawBarrier(deadline);
  try {
    gloo::GatherOptions opts(context_);
    WithType(GlooDType(dtype), [&](auto t) {
      using T = decltype(t);
      size_t n = GlooCount(dtype, count);
      opts.setInput(const_cast<T*>(static_cast<const T*>(in)), n);
      if (rank_ == root) opts.setOutput(static_cast<T*>(out), n * size_);
    });
    opts.setRoot(root);
    opts.setTag(NextTag());
    opts.setTimeout(Left(deadline));
    gloo::gather(opts);
  } catch (const std::exception& e) {
    return FromGloo(e, "gather");
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::Scatter(const void* in, void* out, size_t count, DType dtype,
                                       int root, absl::Time deadline) {
  InFlight in_flight(this);
  RETURN_IF_ERROR(in_flight.refused());
  RETURN_IF_ERROR(CheckRoot(root));
  RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kScatter), dtype, count,
                                 root, ReduceOp::kSum, deadline));
  if (count == 0) return RawBarrier(deadline);
  try {
    gloo::ScatterOptions opts(context_);
    WithType(GlooDType(dtype), [&](auto t) {
      using T = decltype(t);
      size_t n = GlooCount(dtype, count);
      if (rank_ == root) {
        std::vector<T*> inputs;
        for (int i = 0; i < size_; ++i) {
          inputs.push_back(const_cast<T*>(static_cast<const T*>(in)) + i * n);
        }
        opts.setInputs(inputs, n);
      }
      opts.setOutput(static_cast<T*>(out), n);
    });
    opts.setRoot(root);
    opts.setTag(NextTag());
    opts.setTimeout(Left(deadline));
    gloo::scatter(opts);
  } catch (const std::exception& e) {
    return FromGloo(e, "scatter");
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::ReduceScatter(const void* in, void* out, size_t count, DType dtype,
                                             ReduceOp op, double scale, absl::Time deadline) {
  InFlight in_flight(this);
  RETURN_IF_ERROR(in_flight.refused());
  // All-reduce everything, keep our block: simple, and correct for every op.
  size_t es = DTypeSize(dtype);
  std::string all(static_cast<const char*>(in), count * es * size_);
  RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kReduceScatter), dtype,
                                 count, -1, op, deadline));
  RETURN_IF_ERROR(RawAllReduce(all.data(), count * size_, dtype, op, scale, deadline));
  std::memcpy(out, all.data() + rank_ * count * es, count * es);
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllToAll(const void* in, const std::vector<size_t>& send_counts,
                                        void* out, const std::vector<size_t>& recv_counts,
                                        DType dtype, absl::Time deadline) {
  InFlight in_flight(this);
  RETURN_IF_ERROR(in_flight.refused());
  if (send_counts.size() != static_cast<size_t>(size_) ||
      recv_counts.size() != static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("all_to_all needs ", size_, " send and receive counts (one per rank)"));
  }
  RETURN_IF_ERROR(CheckSignature(static_cast<uint32_t>(CollectiveKind::kAllToAll), dtype, size_, -1,
                                 ReduceOp::kSum, deadline));
  // Every rank's counts (also without the signature exchange: the
  // hierarchical communicator's all_to_all runs here), so that splits that
  // do not match fail on every rank instead of in Gloo, which aborts the
  // process on a message longer than its receive.
  std::vector<uint64_t> mine(2 * size_);
  for (int j = 0; j < size_; ++j) {
    mine[j] = send_counts[j];
    mine[size_ + j] = recv_counts[j];
  }
  std::vector<uint64_t> all(2 * size_ * size_);  // rank i: sends then expects, per rank
  try {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(mine.data(), mine.size());
    opts.setOutput(all.data(), all.size());
    opts.setTag(NextTag());
    opts.setTimeout(Left(deadline));
    gloo::allgather(opts);
  } catch (const std::exception& e) {
    return FromGloo(e, "exchanging all_to_all counts");
  }
  for (int j = 0; j < size_; ++j) {
    for (int i = 0; i < size_; ++i) {
      uint64_t sends = all[2 * size_ * i + j];            // rank i sends to rank j
      uint64_t expects = all[2 * size_ * j + size_ + i];  // rank j expects from rank i
      if (sends != expects) {
        return absl::InvalidArgumentError(absl::StrCat("all_to_all: group rank ", i, " sends ",
                                                       sends, " elements to group rank ", j,
                                                       ", which expects ", expects));
      }
    }
  }
  try {
    gloo::AlltoallvOptions opts(context_);
    WithType(GlooDType(dtype), [&](auto t) {
      using T = decltype(t);
      std::vector<int64_t> send, recv;
      for (size_t c : send_counts) send.push_back(static_cast<int64_t>(GlooCount(dtype, c)));
      for (size_t c : recv_counts) recv.push_back(static_cast<int64_t>(GlooCount(dtype, c)));
      opts.setInput(const_cast<T*>(static_cast<const T*>(in)), send);
      opts.setOutput(static_cast<T*>(out), recv);
    });
    opts.setTag(NextTag());
    opts.setTimeout(Left(deadline));
    gloo::alltoallv(opts);
  } catch (const std::exception& e) {
    return FromGloo(e, "all_to_all");
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllGatherV(const void* in, void* out,
                                          const std::vector<size_t>& bytes, absl::Time deadline) {
  InFlight in_flight(this);
  RETURN_IF_ERROR(in_flight.refused());
  if (bytes.size() != static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError("all_gatherv: one byte count per rank");
  }
  size_t total = 0;
  for (size_t b : bytes) total += b;
  if (total == 0) return RawBarrier(deadline);
  try {
    gloo::AllgathervOptions opts(context_);
    opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes[rank_]);
    opts.setOutput(static_cast<uint8_t*>(out), bytes);
    opts.setTag(NextTag());
    opts.setTimeout(Left(deadline));
    gloo::allgatherv(opts);
  } catch (const std::exception& e) {
    return FromGloo(e, "all_gatherv");
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::FromGloo(const std::exception& e, const char* what) {
  if (aborted_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(abort_mu_);
    return abort_reason_;
  }
  absl::Status failed = GlooError(e, what);
  Abort(failed);
  return failed;
}

GlooCommunicator::InFlight::InFlight(GlooCommunicator* comm) : comm_(comm) {
  std::lock_guard<std::mutex> lock(comm_->abort_mu_);
  if (comm_->aborted_.load(std::memory_order_relaxed)) {
    refused_ = comm_->abort_reason_;
  } else {
    ++comm_->in_flight_;
  }
}

GlooCommunicator::InFlight::~InFlight() {
  if (!refused_.ok()) return;
  bool close;
  {
    std::lock_guard<std::mutex> lock(comm_->abort_mu_);
    close = --comm_->in_flight_ == 0 && comm_->aborted_.load(std::memory_order_relaxed);
  }
  if (close) comm_->Close();  // Abort came while this collective ran
}

void GlooCommunicator::Abort(const absl::Status& reason) {
  bool idle;
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    abort_reason_ = reason;
    aborted_.store(true, std::memory_order_release);
    idle = in_flight_ == 0;
  }
  if (idle) Close();
}

void GlooCommunicator::Close() {
  try {
    if (context_ != nullptr) context_->closeConnections();
  } catch (const std::exception& e) {
    // Closing is best effort: the peers' connections end when we exit anyway.
  }
}

}  // namespace muster
