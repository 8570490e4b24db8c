// musterd's GPU collectives: the Gpu gRPC service, and the glue between the
// registry and the NCCL engine (the engine's GpuGroupDirectory, and the
// registry's observer that tells the engine about formed, broken and
// destroyed groups and departed ranks).
//
// Thread-safe. Create after the registry, destroy before it: the
// destructor detaches from the registry and stops the engine.
#ifndef MUSTER_DAEMON_GPU_GPU_SERVICE_H_
#define MUSTER_DAEMON_GPU_GPU_SERVICE_H_

#include <memory>
#include <string>

#include "backends/nccl/gpu_runtime.h"
#include "daemon/access/access_policy.h"
#include "daemon/gpu/nccl_engine.h"
#include "daemon/registry/registry.h"
#include "proto/gpu.grpc.pb.h"

namespace muster {

class GpuService final : public v1::Gpu::CallbackService,
                         public GpuGroupDirectory,
                         public RegistryObserver {
 public:
  // `runtime`: see LoadGpuRuntime (null: GPUs unavailable). `store_token`:
  // the token for the jobs' stores (the unique-id exchange).
  // `access` (outlives the service; nullptr: anyone) admits callers: a rank
  // may only drive its own job's communicators.
  GpuService(Registry* registry, const AccessPolicy* access, std::string store_token,
             std::unique_ptr<GpuRuntime> runtime = nullptr);
  ~GpuService() override;
  // Detaches from the registry and stops the engine (queued requests fail
  // with ABORTED). Idempotent; the service still answers RPCs afterwards.
  void Shutdown();

  // v1::Gpu
  grpc::ServerUnaryReactor* Collective(grpc::CallbackServerContext* context,
                                       const v1::GpuCollectiveRequest* request,
                                       v1::GpuCollectiveResponse* response) override;
  grpc::ServerUnaryReactor* CollectiveStatus(grpc::CallbackServerContext* context,
                                             const v1::CollectiveStatusRequest* request,
                                             v1::CollectiveStatusResponse* response) override;
  grpc::ServerUnaryReactor* ListCommunicators(grpc::CallbackServerContext* context,
                                              const v1::ListCommunicatorsRequest* request,
                                              v1::ListCommunicatorsResponse* response) override;

  // Every communicator of every job (for /metrics).
  v1::ListCommunicatorsResponse AllCommunicators() { return engine_->List(""); }

  // GpuGroupDirectory
  absl::StatusOr<GpuGroupView> Lookup(const std::string& job_id, const std::string& group,
                                      int global_rank) override;
  std::string BrokenReason(const std::string& job_id, const std::string& group) override;
  void BreakGroup(const std::string& job_id, const std::string& group,
                  const std::string& reason) override;
  absl::StatusOr<std::shared_ptr<Store>> JobStore(const std::string& job_id) override;

  // RegistryObserver
  void GroupFormed(const v1::GroupInfo& group, const std::vector<int>& local_ranks) override;
  void GroupBroken(const std::string& job_id, const std::string& group,
                   const std::string& reason) override;
  void GroupDestroyed(const std::string& job_id, const std::string& group,
                      int global_rank) override;
  void RankGone(const std::string& job_id, int global_rank) override;

 private:
  // The caller of `context`, if it may act on `job_id` (empty: any job).
  absl::StatusOr<Caller> Admit(grpc::CallbackServerContext* context,
                               const google::protobuf::Message& request, const std::string& job_id);

  Registry* const registry_;
  const AccessPolicy* const access_;
  const std::string store_token_;
  std::unique_ptr<GpuRuntime> runtime_;
  std::unique_ptr<NcclEngine> engine_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_GPU_GPU_SERVICE_H_
