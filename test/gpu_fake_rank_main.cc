// muster-fakegpu-rank: a rank process that runs collectives on "CUDA"
// tensors through musterd-fakegpu, with ShmCudaDriver standing in for the
// CUDA driver. Test-only; see gpu_fake_test.cc.
//
// Usage: muster-fakegpu-rank STEP[,STEP...]   (environment as for any rank)
// Prints "STEP <name> OK" or "STEP <name> FAILED: <why>" per step and exits
// 1 if any failed. Steps:
//   allreduce   float32 SUM of (rank+1) over 1000 elements, then Synchronize
//   bcast       int64 broadcast from group rank 1 (world >= 2)
//   allgather   all_gather_into_tensor and all_gather into a list
//   reducescatter  reduce_scatter_tensor, MAX
//   alltoall    all_to_all_single with uneven splits
//   gather      gather to group rank 0; scatter from the last rank
//   p2p         a ring with batch_isend_irecv
//   subgroup    NewGroup({0, last}) with a CUDA backend; all_reduce on it
//   comms       print the daemon's communicators ("COMM job=.. group=.. ...")
//   mixed       CPU and CUDA tensors in one call: INVALID_ARGUMENT
//   cpuonly     a CUDA tensor on a "cpu:gloo" group: INVALID_ARGUMENT
//   free        free a buffer, allocate another, all_reduce again
//   crash       exit at once without leaving the job (a dead rank)
//   afterdeath  all_reduce until it fails; OK if ABORTED naming rank 1
//   pause       sleep 2 s (while a test reads the daemon's view)
//   latency     2000 one-float all_reduces; prints "LATENCY p50_us=.. p90_us=.."
//   desync      the last rank broadcasts while the others all_reduce: every
//               rank FAILED_PRECONDITION naming both; then an all_reduce works
//   late        NewGroup "short" (all ranks, 1 s timeout); the last rank
//               all_reduces after 2.5 s: the others DEADLINE_EXCEEDED, it
//               ABORTED, both naming the last rank
//               (what the daemon path adds: the fake runtime does no work)
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cuda_driver.h"
#include "muster/world.h"
#include "proto/gpu.grpc.pb.h"
#include "test/shm_cuda_driver.h"

namespace muster {
namespace {

testing::ShmCudaDriver driver;

template <typename T>
T* Device(size_t n) {
  absl::StatusOr<void*> p = driver.Allocate(std::max<size_t>(n, 1) * sizeof(T));
  if (!p.ok()) {
    std::fprintf(stderr, "allocation failed: %s\n", std::string(p.status().message()).c_str());
    std::exit(2);
  }
  return static_cast<T*>(*p);
}

Tensor Cuda(void* data, size_t count, DType dtype) {
  Tensor t;
  t.data = data;
  t.count = count;
  t.dtype = dtype;
  t.device = Device::kCuda;
  return t;
}

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

absl::Status Run(World& world, const std::string& step) {
  ProcessGroup& g = world.world_group();
  const int r = g.rank(), n = g.size();
  if (step == "allreduce") {
    float* x = Device<float>(1000);
    for (int i = 0; i < 1000; ++i) x[i] = static_cast<float>(r + 1) * i;
    auto w = g.AllReduce(Cuda(x, 1000, DType::kFloat32));
    if (absl::Status s = w->Synchronize(absl::Seconds(30)); !s.ok()) return s;
    const float factor = n * (n + 1) / 2.0f;
    for (int i = 0; i < 1000; ++i) {
      if (x[i] != factor * i) return absl::InternalError(absl::StrCat("x[", i, "]=", x[i]));
    }
    return absl::OkStatus();
  }
  if (step == "bcast") {
    int64_t* x = Device<int64_t>(7);
    for (int i = 0; i < 7; ++i) x[i] = r == 1 ? 100 + i : -1;
    if (absl::Status s = g.Broadcast(Cuda(x, 7, DType::kInt64), 1)->Wait(); !s.ok()) return s;
    for (int i = 0; i < 7; ++i) {
      if (x[i] != 100 + i) return absl::InternalError(absl::StrCat("x[", i, "]=", x[i]));
    }
    return absl::OkStatus();
  }
  if (step == "allgather") {
    int32_t* in = Device<int32_t>(3);
    int32_t* out = Device<int32_t>(3 * n);
    for (int i = 0; i < 3; ++i) in[i] = 10 * r + i;
    if (absl::Status s =
            g.AllGatherIntoTensor(Cuda(out, 3 * n, DType::kInt32), Cuda(in, 3, DType::kInt32))
                ->Wait();
        !s.ok()) {
      return s;
    }
    std::vector<Tensor> list;
    std::vector<int32_t*> parts;
    for (int i = 0; i < n; ++i) {
      parts.push_back(Device<int32_t>(3));
      list.push_back(Cuda(parts.back(), 3, DType::kInt32));
    }
    if (absl::Status s = g.AllGather(list, Cuda(in, 3, DType::kInt32))->Wait(); !s.ok()) return s;
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < 3; ++i) {
        if (out[3 * j + i] != 10 * j + i || parts[j][i] != 10 * j + i) {
          return absl::InternalError(absl::StrCat("block ", j, " element ", i, " wrong"));
        }
      }
    }
    return absl::OkStatus();
  }
  if (step == "reducescatter") {
    double* in = Device<double>(2 * n);
    double* out = Device<double>(2);
    for (int i = 0; i < 2 * n; ++i) in[i] = (i + r) % 5;
    if (absl::Status s = g.ReduceScatterTensor(Cuda(out, 2, DType::kFloat64),
                                               Cuda(in, 2 * n, DType::kFloat64), ReduceOp::kMax)
                             ->Wait();
        !s.ok()) {
      return s;
    }
    for (int i = 0; i < 2; ++i) {
      double expected = 0;
      for (int q = 0; q < n; ++q) expected = std::max<double>(expected, (2 * r + i + q) % 5);
      if (out[i] != expected) return absl::InternalError(absl::StrCat("out[", i, "]=", out[i]));
    }
    return absl::OkStatus();
  }
  if (step == "alltoall") {
    // Rank r sends (p+1) elements to rank p, valued 100*r + p.
    std::vector<size_t> send(n), recv(n);
    size_t send_total = 0, recv_total = 0;
    for (int p = 0; p < n; ++p) {
      send[p] = p + 1;
      recv[p] = r + 1;
      send_total += send[p];
      recv_total += recv[p];
    }
    int32_t* in = Device<int32_t>(send_total);
    int32_t* out = Device<int32_t>(recv_total);
    size_t k = 0;
    for (int p = 0; p < n; ++p) {
      for (size_t j = 0; j < send[p]; ++j) in[k++] = 100 * r + p;
    }
    if (absl::Status s = g.AllToAllSingle(Cuda(out, recv_total, DType::kInt32),
                                          Cuda(in, send_total, DType::kInt32), recv, send)
                             ->Wait();
        !s.ok()) {
      return s;
    }
    k = 0;
    for (int p = 0; p < n; ++p) {
      for (size_t j = 0; j < recv[p]; ++j) {
        if (out[k++] != 100 * p + r) return absl::InternalError(absl::StrCat("from ", p));
      }
    }
    return absl::OkStatus();
  }
  if (step == "gather") {
    int16_t* in = Device<int16_t>(2);
    in[0] = static_cast<int16_t>(r);
    in[1] = static_cast<int16_t>(-r);
    std::vector<Tensor> outs;
    std::vector<int16_t*> parts;
    for (int i = 0; i < n; ++i) {
      parts.push_back(Device<int16_t>(2));
      outs.push_back(Cuda(parts.back(), 2, DType::kFloat16));
    }
    if (absl::Status s = g.Gather(outs, Cuda(in, 2, DType::kFloat16), 0)->Wait(); !s.ok()) {
      return s;
    }
    if (r == 0) {
      for (int i = 0; i < n; ++i) {
        if (parts[i][0] != i || parts[i][1] != -i) return absl::InternalError("gather block");
      }
    }
    int16_t* out = Device<int16_t>(2);
    std::vector<Tensor> ins;
    for (int i = 0; i < n; ++i) {
      int16_t* part = Device<int16_t>(2);
      part[0] = static_cast<int16_t>(50 + i);
      part[1] = 7;
      ins.push_back(Cuda(part, 2, DType::kFloat16));
    }
    if (absl::Status s = g.Scatter(Cuda(out, 2, DType::kFloat16), ins, n - 1)->Wait(); !s.ok()) {
      return s;
    }
    return Expect(out[0] == 50 + r && out[1] == 7, "scatter block");
  }
  if (step == "p2p") {
    float* send = Device<float>(64);
    float* recv = Device<float>(64);
    for (int i = 0; i < 64; ++i) send[i] = static_cast<float>(r * 1000 + i);
    std::vector<ProcessGroup::P2PRequest> batch(2);
    batch[0].send = true;
    batch[0].tensor = Cuda(send, 64, DType::kFloat32);
    batch[0].peer = (r + 1) % n;
    batch[1].send = false;
    batch[1].tensor = Cuda(recv, 64, DType::kFloat32);
    batch[1].peer = (r + n - 1) % n;
    for (auto& w : g.BatchISendIRecv(batch)) {
      if (absl::Status s = w->Wait(); !s.ok()) return s;
    }
    const int from = (r + n - 1) % n;
    for (int i = 0; i < 64; ++i) {
      if (recv[i] != from * 1000 + i) return absl::InternalError(absl::StrCat("recv[", i, "]"));
    }
    return absl::OkStatus();
  }
  if (step == "subgroup") {
    GroupOptions options;
    options.backend = "cpu:gloo,cuda:nccl";
    options.name = "pair";
    auto pair = world.NewGroup({0, n - 1}, options);
    if (!pair.ok()) return pair.status();
    if (!(*pair)->is_member()) return absl::OkStatus();
    float* x = Device<float>(5);
    for (int i = 0; i < 5; ++i) x[i] = static_cast<float>(r == 0 ? i : 10 - i);
    if (absl::Status s = (*pair)->AllReduce(Cuda(x, 5, DType::kFloat32), ReduceOp::kMax)->Wait();
        !s.ok()) {
      return s;
    }
    for (int i = 0; i < 5; ++i) {
      float expected = n == 1 ? static_cast<float>(i) : std::max<float>(i, 10 - i);
      if (x[i] != expected) return absl::InternalError(absl::StrCat("x[", i, "]=", x[i]));
    }
    return absl::OkStatus();
  }
  if (step == "comms") {
    auto channel = grpc::CreateChannel(absl::StrCat("unix:", std::getenv("MUSTER_SOCKET")),
                                       grpc::InsecureChannelCredentials());
    auto stub = v1::Gpu::NewStub(channel);
    grpc::ClientContext context;
    v1::ListCommunicatorsRequest request;
    v1::ListCommunicatorsResponse response;
    grpc::Status s = stub->ListCommunicators(&context, request, &response);
    if (!s.ok()) return absl::UnavailableError(s.error_message());
    for (const auto& c : response.communicators()) {
      std::printf("COMM job=%s group=%s rank=%d origin=%s state=%s launched=%llu channel=%llu\n",
                  c.job_id().c_str(), c.group().c_str(), c.global_rank(), c.origin().c_str(),
                  c.state().c_str(), static_cast<unsigned long long>(c.launched()),
                  static_cast<unsigned long long>(c.channel_requests()));
    }
    return absl::OkStatus();
  }
  if (step == "mixed") {
    float* d = Device<float>(4);
    std::vector<float> host(4 * n);
    absl::Status s = g.AllGatherIntoTensor(Tensor{host.data(), host.size(), DType::kFloat32},
                                           Cuda(d, 4, DType::kFloat32))
                         ->Wait();
    return Expect(
        absl::IsInvalidArgument(s) && s.message().find("mixes CPU and CUDA") != std::string::npos,
        absl::StrCat("expected INVALID_ARGUMENT, got ", s.ToString()));
  }
  if (step == "cpuonly") {
    GroupOptions options;
    options.backend = "cpu:gloo";
    auto cpu = world.NewGroup(g.ranks(), options);
    if (!cpu.ok()) return cpu.status();
    float* d = Device<float>(4);
    absl::Status s = (*cpu)->AllReduce(Cuda(d, 4, DType::kFloat32))->Wait();
    return Expect(absl::IsInvalidArgument(s),
                  absl::StrCat("expected INVALID_ARGUMENT, got ", s.ToString()));
  }
  if (step == "free") {
    for (int round = 0; round < 3; ++round) {
      float* x = Device<float>(256);
      for (int i = 0; i < 256; ++i) x[i] = 1.0f;
      if (absl::Status s = g.AllReduce(Cuda(x, 256, DType::kFloat32))->Wait(); !s.ok()) return s;
      for (int i = 0; i < 256; ++i) {
        if (x[i] != static_cast<float>(n)) return absl::InternalError("free: wrong sum");
      }
      driver.Free(x);
    }
    return absl::OkStatus();
  }
  if (step == "latency") {
    float* x = Device<float>(1);
    std::vector<double> us;
    for (int i = 0; i < 2200; ++i) {
      absl::Time start = absl::Now();
      if (absl::Status s = g.AllReduce(Cuda(x, 1, DType::kFloat32))->Wait(); !s.ok()) return s;
      if (i >= 200) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    }
    std::sort(us.begin(), us.end());
    std::printf("LATENCY p50_us=%.1f p90_us=%.1f\n", us[us.size() / 2], us[us.size() * 9 / 10]);
    return absl::OkStatus();
  }
  if (step == "pause") {
    absl::SleepFor(absl::Seconds(2));
    return absl::OkStatus();
  }
  if (step == "crash") {
    std::fflush(stdout);
    ::_exit(9);
  }
  if (step == "desync") {
    float* x = Device<float>(8);
    absl::Status s = r == n - 1 ? g.Broadcast(Cuda(x, 8, DType::kFloat32), 0)->Wait()
                                : g.AllReduce(Cuda(x, 8, DType::kFloat32))->Wait();
    if (!absl::IsFailedPrecondition(s) || s.message().find("all_reduce #") == std::string::npos ||
        s.message().find("broadcast #") == std::string::npos) {
      return absl::InternalError(
          absl::StrCat("expected FAILED_PRECONDITION naming both calls, got ", s.ToString()));
    }
    std::printf("desync: %s\n", s.ToString().c_str());
    return g.AllReduce(Cuda(x, 8, DType::kFloat32))->Synchronize(absl::Seconds(30));
  }
  if (step == "late") {
    GroupOptions options;
    options.name = "short";
    options.timeout = absl::Seconds(1);
    std::vector<int> all(n);
    std::iota(all.begin(), all.end(), 0);
    auto group = world.NewGroup(all, options);
    if (!group.ok()) return group.status();
    float* x = Device<float>(4);
    if (r == n - 1) absl::SleepFor(absl::Milliseconds(2500));
    absl::Status s = (*group)->AllReduce(Cuda(x, 4, DType::kFloat32))->Wait();
    std::printf("late: %s\n", s.ToString().c_str());
    const bool named =
        s.message().find(absl::StrCat("waiting for ranks ", n - 1)) != std::string::npos;
    return Expect((r == n - 1 ? absl::IsAborted(s) : absl::IsDeadlineExceeded(s)) && named,
                  absl::StrCat("expected ", r == n - 1 ? "ABORTED" : "DEADLINE_EXCEEDED",
                               " naming rank ", n - 1, ", got ", s.ToString()));
  }
  if (step == "afterdeath") {
    float* x = Device<float>(4);
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      absl::Status s = g.AllReduce(Cuda(x, 4, DType::kFloat32))->Wait();
      if (!s.ok()) {
        std::printf("afterdeath: %s\n", s.ToString().c_str());
        return Expect(absl::IsAborted(s) && s.message().find("rank 1") != std::string::npos,
                      absl::StrCat("expected ABORTED naming rank 1, got ", s.ToString()));
      }
    }
    return absl::DeadlineExceededError("collectives kept succeeding after rank 1 died");
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown step ", step));
}

}  // namespace
}  // namespace muster

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: muster-fakegpu-rank STEP[,STEP...]\n");
    return 2;
  }
  muster::SetCudaDriverForTesting(&muster::driver);
  muster::InitOptions options;
  options.backend = "cpu:gloo,cuda:nccl";
  options.timeout = absl::Seconds(30);
  auto world = muster::World::Init(options);
  if (!world.ok()) {
    std::printf("STEP init FAILED: %s\n", world.status().ToString().c_str());
    return 1;
  }
  int failed = 0;
  for (const std::string& step : std::vector<std::string>(absl::StrSplit(argv[1], ','))) {
    absl::Status s = muster::Run(**world, step);
    if (s.ok()) {
      std::printf("STEP %s OK\n", step.c_str());
    } else {
      std::printf("STEP %s FAILED: %s\n", step.c_str(), s.ToString().c_str());
      ++failed;
    }
    std::fflush(stdout);
  }
  return failed == 0 ? 0 : 1;
}
