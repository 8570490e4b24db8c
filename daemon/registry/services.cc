#include "daemon/registry/services.h"

#include <unistd.h>

#include <deque>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace muster {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// What a group call that failed while the daemon shuts down reports:
// UNAVAILABLE (the rank's musterd is going away), whatever stopped it.
absl::Status WhileStopping(Registry* registry, absl::Status s) {
  if (s.ok() || s.code() == absl::StatusCode::kUnavailable || !registry->stopping()) return s;
  return absl::UnavailableError(s.message());
}

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(s));
  return reactor;
}

// Admits the call or finishes it with the refusal: `caller` is set on success.
#define ADMIT_OR_FINISH(caller, context, request)                              \
  absl::StatusOr<Caller> caller = AdmitCaller(access_, *(context), (request)); \
  if (!caller.ok()) return Finish((context), caller.status())

// One rank's session stream. The first client message must be `register`;
// the registry pushes events through SessionSink::Push; the end of the
// stream (the rank exited, or its connection broke) tells the registry.
class SessionReactor final
    : public grpc::ServerBidiReactor<v1::SessionClientMessage, v1::SessionServerMessage>,
      public SessionSink {
 public:
  // A session of `caller`, or one that ends at once with `caller`'s error.
  SessionReactor(Registry* registry, absl::StatusOr<Caller> caller)
      : registry_(registry), caller_(std::move(caller)) {
    if (!caller_.ok()) {
      FinishWith(ToGrpc(caller_.status()));
    } else if (caller_->via == Caller::Via::kTcp) {
      FinishWith(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                              "ranks register over musterd's unix socket, not over TCP"));
    } else {
      StartRead(&in_);
    }
  }

  // `registered` is always the stream's first message: events the registry
  // pushes while the registration is in flight (a failure another daemon
  // reported a moment ago) wait behind it.
  void Push(const v1::SessionServerMessage& message) override {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!registered_sent_ && !message.has_registered()) {
      held_.push_back(message);
      return;
    }
    out_.push_back(message);
    if (message.has_registered()) {
      registered_sent_ = true;
      for (auto& event : held_) out_.push_back(std::move(event));
      held_.clear();
    }
    if (!writing_) {
      writing_ = true;
      StartWrite(&out_.front());
    }
  }

  void End(const std::string& reason) override {
    FinishWith(grpc::Status(grpc::StatusCode::UNAVAILABLE, reason));
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      EndSession();
      return;
    }
    if (in_.has_register_()) {
      bool first;
      {
        absl::MutexLock lock(&mu_);
        first = !registering_;
        registering_ = true;
      }
      if (!first) {
        FinishWith(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                "a session registers exactly once"));
        return;
      }
      if (absl::Status bad = CheckFieldLimits(in_.register_(), FieldLimits()); !bad.ok()) {
        MLOG(WARNING) << "refused a registration from " << caller_->description << ": "
                      << bad.message();
        FinishWith(ToGrpc(bad));
        return;
      }
      {
        absl::MutexLock lock(&mu_);
        register_in_flight_ = true;
      }
      registry_->Register(in_.register_(), *caller_, this,
                          [this](absl::StatusOr<v1::Registered> r) { OnRegistered(std::move(r)); });
      return;
    }
    if (in_.has_leave()) {
      std::string id;
      {
        absl::MutexLock lock(&mu_);
        id = session_id_;
        left_ = true;
      }
      registry_->Leave(id);
      StartRead(&in_);
      return;
    }
    FinishWith(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "the first session message must be `register`"));
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (!out_.empty()) out_.pop_front();
    if (!ok) {
      out_.clear();
      writing_ = false;
      return;
    }
    if (!out_.empty() && !finished_) {
      StartWrite(&out_.front());
    } else {
      writing_ = false;
      if (finish_pending_) {
        finished_ = true;
        Finish(finish_status_);
      }
    }
  }

  void OnCancel() override { EndSession(); }

  void OnDone() override {
    EndSession();
    bool last;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      last = !register_in_flight_;
    }
    if (last) delete this;
  }

 private:
  // The registry's answer to `register`. The stream may have ended
  // meanwhile; the reactor stays alive until this ran (see OnDone).
  void OnRegistered(absl::StatusOr<v1::Registered> r) {
    bool ended;
    {
      absl::MutexLock lock(&mu_);
      ended = ended_;
      if (r.ok()) session_id_ = r->session_id();
    }
    if (ended) {
      if (r.ok()) registry_->Disconnected(r->session_id(), this);
    } else if (!r.ok()) {
      FinishWith(ToGrpc(r.status()));
    } else {
      v1::SessionServerMessage reply;
      *reply.mutable_registered() = *r;
      reply.mutable_registered()->set_daemon_pid(::getpid());
      Push(reply);
      absl::MutexLock lock(&mu_);
      if (!finished_ && !finish_pending_) StartRead(&in_);
    }
    bool last;
    {
      absl::MutexLock lock(&mu_);
      register_in_flight_ = false;
      last = done_;
    }
    if (last) delete this;
  }

  // The rank is gone (or the stream broke): tell the registry once.
  void EndSession() {
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      if (ended_) return;
      ended_ = true;
      id = session_id_;
    }
    if (!id.empty()) registry_->Disconnected(id, this);
    FinishWith(grpc::Status::OK);
  }

  void FinishWith(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (finished_ || finish_pending_) return;
    if (writing_) {
      finish_pending_ = true;
      finish_status_ = status;
      return;
    }
    finished_ = true;
    Finish(status);
  }

  Registry* registry_;
  const absl::StatusOr<Caller> caller_;
  v1::SessionClientMessage in_;
  absl::Mutex mu_;
  std::deque<v1::SessionServerMessage> out_ ABSL_GUARDED_BY(mu_);
  bool registered_sent_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<v1::SessionServerMessage> held_ ABSL_GUARDED_BY(mu_);  // until then
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_pending_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  bool registering_ ABSL_GUARDED_BY(mu_) = false;
  bool left_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool register_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::string session_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<Caller> AdmitCaller(const AccessPolicy* access,
                                   const grpc::CallbackServerContext& context,
                                   const google::protobuf::Message* request) {
  if (access == nullptr) {
    if (request != nullptr) RETURN_IF_ERROR(CheckFieldLimits(*request, FieldLimits()));
    return Caller::InProcess();
  }
  return access->Admit(context, request);
}

grpc::ServerBidiReactor<v1::SessionClientMessage, v1::SessionServerMessage>* SessionService::Attach(
    grpc::CallbackServerContext* context) {
  return new SessionReactor(registry_, AdmitCaller(access_, *context, nullptr));
}

grpc::ServerUnaryReactor* SessionService::ListRanks(grpc::CallbackServerContext* context,
                                                    const v1::ListRanksRequest* request,
                                                    v1::ListRanksResponse* response) {
  ADMIT_OR_FINISH(caller, context, request);
  for (auto& r : registry_->ListRanks(request->job_id(), *caller)) {
    *response->add_ranks() = std::move(r);
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* SessionService::ListJobs(grpc::CallbackServerContext* context,
                                                   const v1::ListJobsRequest* request,
                                                   v1::ListJobsResponse* response) {
  ADMIT_OR_FINISH(caller, context, request);
  for (auto& j : registry_->ListJobs(*caller)) *response->add_jobs() = std::move(j);
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* SessionService::AbortJob(grpc::CallbackServerContext* context,
                                                   const v1::AbortJobRequest* request,
                                                   v1::AbortJobResponse*) {
  ADMIT_OR_FINISH(caller, context, request);
  return Finish(context, registry_->AbortJob(request->job_id(), request->reason(), *caller));
}

grpc::ServerUnaryReactor* GroupsService::CreateGroup(grpc::CallbackServerContext* context,
                                                     const v1::CreateGroupRequest* request,
                                                     v1::CreateGroupResponse* response) {
  ADMIT_OR_FINISH(caller, context, request);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  registry_->CreateGroup(*request, *caller,
                         [this, reactor, response](absl::StatusOr<v1::GroupInfo> r) {
                           if (r.ok()) *response->mutable_group() = std::move(*r);
                           reactor->Finish(ToGrpc(WhileStopping(registry_, r.status())));
                         });
  return reactor;
}

grpc::ServerUnaryReactor* GroupsService::DestroyGroup(grpc::CallbackServerContext* context,
                                                      const v1::DestroyGroupRequest* request,
                                                      v1::DestroyGroupResponse*) {
  ADMIT_OR_FINISH(caller, context, request);
  return Finish(context, registry_->DestroyGroup(*request, *caller));
}

grpc::ServerUnaryReactor* GroupsService::ListGroups(grpc::CallbackServerContext* context,
                                                    const v1::ListGroupsRequest* request,
                                                    v1::ListGroupsResponse* response) {
  ADMIT_OR_FINISH(caller, context, request);
  for (auto& g : registry_->ListGroups(request->job_id(), *caller)) {
    *response->add_groups() = std::move(g);
  }
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* GroupsService::GetGroup(grpc::CallbackServerContext* context,
                                                  const v1::GetGroupRequest* request,
                                                  v1::GetGroupResponse* response) {
  ADMIT_OR_FINISH(caller, context, request);
  auto g = registry_->GetGroup(request->job_id(), request->name(), *caller);
  if (g.ok()) *response->mutable_group() = std::move(*g);
  return Finish(context, g.status());
}

grpc::ServerUnaryReactor* GroupsService::AbortGroup(grpc::CallbackServerContext* context,
                                                    const v1::AbortGroupRequest* request,
                                                    v1::AbortGroupResponse*) {
  ADMIT_OR_FINISH(caller, context, request);
  return Finish(context, registry_->AbortGroup(request->job_id(), request->name(),
                                               request->reason(), *caller));
}

grpc::ServerUnaryReactor* GroupsService::Trace(grpc::CallbackServerContext* context,
                                               const v1::TraceRequest* request,
                                               v1::TraceResponse* response) {
  ADMIT_OR_FINISH(caller, context, request);
  if (request->gather()) {
    // Peer daemons are asked on a worker; the reactor finishes from there.
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    registry_->TraceGathered(*request, *caller,
                             [reactor, response](absl::StatusOr<v1::TraceResponse> trace) {
                               if (trace.ok()) *response = std::move(*trace);
                               reactor->Finish(ToGrpc(trace.status()));
                             });
    return reactor;
  }
  // Reads shared memory only (a few hundred kilobytes per rank at most):
  // short enough for the reactor thread.
  auto trace = registry_->Trace(*request, *caller);
  if (trace.ok()) *response = std::move(*trace);
  return Finish(context, trace.status());
}

grpc::ServerUnaryReactor* GroupsService::Barrier(grpc::CallbackServerContext* context,
                                                 const v1::BarrierRequest* request,
                                                 v1::BarrierResponse*) {
  ADMIT_OR_FINISH(caller, context, request);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  registry_->Barrier(*request, *caller, [this, reactor](absl::Status s) {
    reactor->Finish(ToGrpc(WhileStopping(registry_, std::move(s))));
  });
  return reactor;
}

grpc::ServerUnaryReactor* GroupsService::Reconfigure(grpc::CallbackServerContext* context,
                                                     const v1::ReconfigureRequest* request,
                                                     v1::ReconfigureResponse* response) {
  ADMIT_OR_FINISH(caller, context, request);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  registry_->Reconfigure(*request, *caller,
                         [this, reactor, response](absl::StatusOr<v1::ReconfigureResponse> r) {
                           if (r.ok()) *response = std::move(*r);
                           reactor->Finish(ToGrpc(WhileStopping(registry_, r.status())));
                         });
  return reactor;
}

grpc::ServerUnaryReactor* GroupsService::PendingJoins(grpc::CallbackServerContext* context,
                                                      const v1::PendingJoinsRequest* request,
                                                      v1::PendingJoinsResponse* response) {
  ADMIT_OR_FINISH(caller, context, request);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  registry_->PendingJoins(*request, *caller,
                          [this, reactor, response](absl::StatusOr<v1::PendingJoinsResponse> r) {
                            if (r.ok()) *response = std::move(*r);
                            reactor->Finish(ToGrpc(WhileStopping(registry_, r.status())));
                          });
  return reactor;
}

}  // namespace muster
