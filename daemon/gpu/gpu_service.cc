#include "daemon/gpu/gpu_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/gpu/gpu_runtime_loader.h"
#include "daemon/registry/job_coordinator.h"
#include "daemon/registry/services.h"
#include "muster/tcp_store.h"

namespace muster {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace

GpuService::GpuService(Registry* registry, const AccessPolicy* access, std::string store_token,
                       std::unique_ptr<GpuRuntime> runtime)
    : registry_(registry),
      access_(access),
      store_token_(std::move(store_token)),
      runtime_(std::move(runtime)) {
  if (runtime_ == nullptr) runtime_ = UnavailableGpuRuntime("no GPU runtime");
  engine_ = std::make_unique<NcclEngine>(runtime_.get(), this);
  registry_->SetObserver(this);
}

GpuService::~GpuService() { Shutdown(); }

void GpuService::Shutdown() {
  registry_->SetObserver(nullptr);
  engine_->Shutdown();
}

absl::StatusOr<Caller> GpuService::Admit(grpc::CallbackServerContext* context,
                                         const google::protobuf::Message& request,
                                         const std::string& job_id) {
  absl::StatusOr<Caller> caller = AdmitCaller(access_, *context, &request);
  if (!caller.ok() || job_id.empty()) return caller;
  if (absl::Status s = registry_->CheckAccess(job_id, *caller); !s.ok()) return s;
  return caller;
}

grpc::ServerUnaryReactor* GpuService::Collective(grpc::CallbackServerContext* context,
                                                 const v1::GpuCollectiveRequest* request,
                                                 v1::GpuCollectiveResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auto caller = Admit(context, *request, request->caller().job_id()); !caller.ok()) {
    reactor->Finish(ToGrpc(caller.status()));
    return reactor;
  }
  engine_->Collective(
      *request, [this, reactor, request, response](absl::StatusOr<uint64_t> launched) {
        if (launched.ok()) {
          response->set_launched(*launched);
          response->set_channel(engine_->ChannelName(request->caller().job_id(), request->group(),
                                                     request->caller().global_rank()));
        }
        reactor->Finish(ToGrpc(launched.status()));
      });
  return reactor;
}

grpc::ServerUnaryReactor* GpuService::CollectiveStatus(grpc::CallbackServerContext* context,
                                                       const v1::CollectiveStatusRequest* request,
                                                       v1::CollectiveStatusResponse* response) {
  if (auto caller = Admit(context, *request, request->caller().job_id()); !caller.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpc(caller.status()));
    return reactor;
  }
  bool finished = false;
  absl::Status s =
      engine_->CollectiveStatus(request->caller().job_id(), request->group(),
                                request->caller().global_rank(), request->sequence(), &finished);
  response->set_finished(finished);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(s));
  return reactor;
}

grpc::ServerUnaryReactor* GpuService::ListCommunicators(grpc::CallbackServerContext* context,
                                                        const v1::ListCommunicatorsRequest* request,
                                                        v1::ListCommunicatorsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Caller> caller = Admit(context, *request, "");
  if (!caller.ok()) {
    reactor->Finish(ToGrpc(caller.status()));
    return reactor;
  }
  *response = engine_->List(request->job_id());
  if (!caller->privileged) {
    // Only the caller's own jobs.
    auto* all = response->mutable_communicators();
    all->erase(std::remove_if(all->begin(), all->end(),
                              [&](const v1::GpuCommunicatorInfo& c) {
                                return !registry_->CheckAccess(c.job_id(), *caller).ok();
                              }),
               all->end());
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

absl::StatusOr<GpuGroupView> GpuService::Lookup(const std::string& job_id, const std::string& group,
                                                int global_rank) {
  if (!registry_->IsLiveLocalRank(job_id, global_rank)) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", global_rank, " of job '", job_id,
                                                      "' is not a live rank of this musterd"));
  }
  absl::StatusOr<v1::GroupInfo> info = registry_->GetGroup(job_id, group, Caller::InProcess());
  if (!info.ok()) return info.status();
  if (info->state() == v1::GROUP_STATE_BROKEN) {
    return absl::AbortedError(info->broken_reason());
  }
  if (info->state() != v1::GROUP_STATE_READY) {
    return absl::FailedPreconditionError(absl::StrCat("group '", group, "' is not ready (",
                                                      v1::GroupState_Name(info->state()), ")"));
  }
  GpuGroupView view;
  view.generation = info->generation();
  view.job_epoch = info->epoch();
  view.timeout = absl::Milliseconds(info->timeout_millis());
  if (view.timeout <= absl::ZeroDuration()) view.timeout = absl::Minutes(30);
  view.backend = info->backend();
  view.local_synchronization = info->local_synchronization();
  if (absl::StatusOr<int64_t> owner = registry_->JobOwner(job_id); owner.ok()) {
    view.owner_uid = *owner;
  }
  bool member = false;
  for (const auto& m : info->members()) {
    view.ranks.push_back(m.global_rank());
    member = member || m.global_rank() == global_rank;
    // Members registered here: the engine compares their collectives
    // before launching them.
    if (registry_->IsLiveLocalRank(job_id, m.global_rank())) {
      view.local_ranks.push_back(m.global_rank());
    }
  }
  std::sort(view.local_ranks.begin(), view.local_ranks.end());
  if (!member) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", global_rank, " is not a member of group '", group, "'"));
  }
  return view;
}

std::string GpuService::BrokenReason(const std::string& job_id, const std::string& group) {
  absl::StatusOr<v1::GroupInfo> info = registry_->GetGroup(job_id, group, Caller::InProcess());
  if (!info.ok()) return std::string(info.status().message());
  if (info->state() == v1::GROUP_STATE_BROKEN || info->state() == v1::GROUP_STATE_DESTROYED) {
    return info->broken_reason().empty() ? "the group was destroyed" : info->broken_reason();
  }
  return "";
}

void GpuService::BreakGroup(const std::string& job_id, const std::string& group,
                            const std::string& reason) {
  (void)registry_->AbortGroup(job_id, group, reason, Caller::InProcess());
}

absl::StatusOr<std::shared_ptr<Store>> GpuService::JobStore(const std::string& job_id) {
  absl::StatusOr<std::string> master = registry_->JobMaster(job_id);
  if (!master.ok()) return master.status();
  TcpStoreOptions options;
  if (absl::Status s = SplitHostPort(*master, &options.host, &options.port); !s.ok()) return s;
  options.token = store_token_;
  options.connect_timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Connect(options);
  if (!store.ok()) return store.status();
  return std::shared_ptr<Store>(std::move(*store));
}

void GpuService::GroupFormed(const v1::GroupInfo& group, const std::vector<int>& local_ranks) {
  std::vector<int> members;
  for (const auto& m : group.members()) members.push_back(m.global_rank());
  engine_->GroupFormed(group.job_id(), group.name(), members, group.local_synchronization(),
                       group.backend(), local_ranks);
}

void GpuService::GroupBroken(const std::string& job_id, const std::string& group,
                             const std::string& reason) {
  engine_->GroupBroken(job_id, group, reason);
}

void GpuService::GroupDestroyed(const std::string& job_id, const std::string& group,
                                int global_rank) {
  engine_->GroupDestroyed(job_id, group, global_rank);
}

void GpuService::RankGone(const std::string& job_id, int global_rank) {
  engine_->RankGone(job_id, global_rank);
}

}  // namespace muster
