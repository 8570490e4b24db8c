#include "daemon/store/store_service.h"

#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace muster {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

grpc::Status Unavailable() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "musterd's store is shutting down");
}

absl::Duration TimeoutOf(const v1::Timeout& t) {
  return t.millis() > 0 ? absl::Milliseconds(t.millis()) : absl::Seconds(300);
}

}  // namespace

grpc::ServerUnaryReactor* StoreService::Remote(grpc::CallbackServerContext* context,
                                               std::function<grpc::Status(BlockingStore&)> fn) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status s = Gate(context); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  // Thread: one store call that may block on the network (etcd), so no
  // gRPC thread waits for it.
  std::thread([reactor, store = remote_, fn = std::move(fn)] {
    reactor->Finish(fn(*store));
  }).detach();
  return reactor;
}

grpc::Status StoreService::Gate(grpc::CallbackServerContext* context) const {
  if (access_ == nullptr) return grpc::Status::OK;
  absl::StatusOr<Caller> caller = access_->Admit(*context, nullptr);
  if (!caller.ok()) return ToGrpc(caller.status());
  if (!caller->privileged) {
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat("the store holds every job's keys: over musterd's socket it "
                     "is open to root, musterd's user and the operator group, not "
                     "to ",
                     caller->description, " (ranks use the TCP store with the job's token)"));
  }
  return grpc::Status::OK;
}

grpc::Status StoreService::CheckSizes(grpc::CallbackServerContext* context,
                                      const std::vector<const std::string*>& keys,
                                      const std::vector<const std::string*>& values) const {
  if (grpc::Status s = Gate(context); !s.ok()) return s;
  if (keys.size() > limits_.max_keys_per_request) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat(keys.size(), " keys exceed --store-max-keys-per-request=",
                                     limits_.max_keys_per_request));
  }
  for (const std::string* k : keys) {
    if (k->size() > limits_.max_key_bytes) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("key of ", k->size(),
                       " bytes exceeds --store-max-key-bytes=", limits_.max_key_bytes));
    }
  }
  for (const std::string* v : values) {
    if (v->size() > limits_.max_value_bytes) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("value of ", v->size(),
                       " bytes exceeds --store-max-value-bytes=", limits_.max_value_bytes));
    }
  }
  return grpc::Status::OK;
}

StoreService::Depends StoreService::Wrote() {
  return [](StoreServer::Loop&) { return true; };
}

StoreService::Depends StoreService::ReadKeys(std::vector<std::string> keys) {
  return [keys = std::move(keys)](StoreServer::Loop& loop) { return loop.ReadsUnlogged(keys); };
}

StoreService::Depends StoreService::ReadAll() {
  return [](StoreServer::Loop& loop) { return loop.HasUnlogged(); };
}

namespace {

// Finishes `reactor` with `status` after this iteration's flush, or with
// the flush's error if it failed and the result `depends` on it.
void FinishAfterFlush(StoreServer::Loop& loop, grpc::ServerUnaryReactor* reactor,
                      grpc::Status status, bool depends) {
  StoreServer::Loop* l = &loop;
  loop.AfterFlush([reactor, status, l, depends] {
    absl::Status flushed = l->flush_status();
    reactor->Finish(flushed.ok() || !depends ? status : ToGrpc(flushed));
  });
}

}  // namespace

grpc::ServerUnaryReactor* StoreService::Run(grpc::CallbackServerContext* context, Depends depends,
                                            Task task) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status s = Gate(context); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  bool posted = server_->Post(
      [reactor, depends = std::move(depends), task = std::move(task)](StoreServer::Loop& loop) {
        if (loop.stopping()) {
          reactor->Finish(Unavailable());
          return;
        }
        grpc::Status status = task(loop);
        FinishAfterFlush(loop, reactor, status, depends(loop));
      });
  if (!posted) reactor->Finish(Unavailable());
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::RunWhenPresent(grpc::CallbackServerContext* context,
                                                       std::vector<std::string> keys,
                                                       const v1::Timeout& timeout, Task on_ready) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status s = Gate(context); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  absl::Duration wait_for = TimeoutOf(timeout);
  // Shared by the task and its ready callback (no second copy of a long
  // list).
  auto shared_keys = std::make_shared<const std::vector<std::string>>(std::move(keys));
  auto task = [reactor, shared_keys, wait_for,
               on_ready = std::move(on_ready)](StoreServer::Loop& loop) {
    StoreServer::Loop* l = &loop;
    WhenPresent(
        loop, *shared_keys, wait_for,
        [l, reactor, on_ready, shared_keys] {
          grpc::Status status = on_ready(*l);
          // Released (or found present) by a write still unlogged: it stands
          // only if that write does.
          FinishAfterFlush(*l, reactor, status, l->ReadsUnlogged(*shared_keys));
        },
        [reactor](absl::Status expired) { reactor->Finish(ToGrpc(expired)); });
  };
  if (!server_->Post(std::move(task))) reactor->Finish(Unavailable());
  return reactor;
}

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* context,
                                            const v1::SetRequest* request,
                                            v1::SetResponse* response) {
  if (grpc::Status s = CheckSizes(context, {&request->key()}, {&request->value()}); !s.ok()) {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(s);
    return reactor;
  }
  if (remote_ != nullptr) {
    return Remote(context, [request, response](BlockingStore& st) {
      return ToGrpc(st.Set(request->key(), request->value()));
    });
  }
  return Run(context, Wrote(), [request](StoreServer::Loop& loop) {
    if (grpc::Status s = ToGrpc(loop.writable()); !s.ok()) return s;
    return ToGrpc(loop.kv().Set(request->key(), request->value()));
  });
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* context,
                                            const v1::GetRequest* request,
                                            v1::GetResponse* response) {
  if (remote_ != nullptr) {
    return Remote(context, [request, response](BlockingStore& st) {
      auto v = st.Get(request->key(), TimeoutOf(request->timeout()));
      if (!v.ok()) return ToGrpc(v.status());
      response->set_value(*v);
      return grpc::Status::OK;
    });
  }
  return RunWhenPresent(context, {request->key()}, request->timeout(),
                        [request, response](StoreServer::Loop& loop) {
                          const std::string* value = loop.kv().Find(request->key());
                          if (value == nullptr) return ToGrpc(NoValue(request->key()));
                          response->set_value(*value);
                          return grpc::Status::OK;
                        });
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* context,
                                            const v1::AddRequest* request,
                                            v1::AddResponse* response) {
  if (remote_ != nullptr) {
    return Remote(context, [request, response](BlockingStore& st) {
      auto v = st.Add(request->key(), request->delta());
      if (!v.ok()) return ToGrpc(v.status());
      response->set_value(*v);
      return grpc::Status::OK;
    });
  }
  return Run(context, Wrote(), [request, response](StoreServer::Loop& loop) {
    if (grpc::Status s = ToGrpc(loop.writable()); !s.ok()) return s;
    auto v = loop.kv().Add(request->key(), request->delta());
    if (!v.ok()) return ToGrpc(v.status());
    response->set_value(*v);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* StoreService::CompareSet(grpc::CallbackServerContext* context,
                                                   const v1::CompareSetRequest* request,
                                                   v1::CompareSetResponse* response) {
  if (remote_ != nullptr) {
    return Remote(context, [request, response](BlockingStore& st) {
      auto v = st.CompareSet(request->key(), request->expected(), request->desired());
      if (!v.ok()) return ToGrpc(v.status());
      response->set_value(*v);
      return grpc::Status::OK;
    });
  }
  return Run(context, Wrote(), [request, response](StoreServer::Loop& loop) {
    if (grpc::Status s = ToGrpc(loop.writable()); !s.ok()) return s;
    auto v = loop.kv().CompareSet(request->key(), request->expected(), request->desired());
    if (!v.ok()) return ToGrpc(v.status());
    response->set_value(*v);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* StoreService::Wait(grpc::CallbackServerContext* context,
                                             const v1::WaitRequest* request,
                                             v1::WaitResponse* response) {
  if (remote_ != nullptr) {
    return Remote(context, [request, response](BlockingStore& st) {
      std::vector<std::string> keys(request->keys().begin(), request->keys().end());
      return ToGrpc(st.Wait(keys, TimeoutOf(request->timeout())));
    });
  }
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  return RunWhenPresent(context, std::move(keys), request->timeout(),
                        [](StoreServer::Loop&) { return grpc::Status::OK; });
}

grpc::ServerUnaryReactor* StoreService::Check(grpc::CallbackServerContext* context,
                                              const v1::CheckRequest* request,
                                              v1::CheckResponse* response) {
  if (remote_ != nullptr) {
    return Remote(context, [request, response](BlockingStore& st) {
      std::vector<std::string> keys(request->keys().begin(), request->keys().end());
      auto v = st.Check(keys);
      if (!v.ok()) return ToGrpc(v.status());
      response->set_all_present(*v);
      return grpc::Status::OK;
    });
  }
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  return Run(context, ReadKeys(keys), [keys, response](StoreServer::Loop& loop) {
    response->set_all_present(loop.kv().Check(keys));
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* StoreService::DeleteKey(grpc::CallbackServerContext* context,
                                                  const v1::DeleteKeyRequest* request,
                                                  v1::DeleteKeyResponse* response) {
  if (remote_ != nullptr) {
    return Remote(context, [request, response](BlockingStore& st) {
      auto v = st.DeleteKey(request->key());
      if (!v.ok()) return ToGrpc(v.status());
      response->set_deleted(*v);
      return grpc::Status::OK;
    });
  }
  return Run(context, Wrote(), [request, response](StoreServer::Loop& loop) {
    if (grpc::Status s = ToGrpc(loop.writable()); !s.ok()) return s;
    response->set_deleted(loop.kv().Delete(request->key()));
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* StoreService::NumKeys(grpc::CallbackServerContext* context,
                                                const v1::NumKeysRequest* request,
                                                v1::NumKeysResponse* response) {
  if (remote_ != nullptr) {
    return Remote(context, [request, response](BlockingStore& st) {
      auto v = st.NumKeys();
      if (!v.ok()) return ToGrpc(v.status());
      response->set_num_keys(*v);
      return grpc::Status::OK;
    });
  }
  return Run(context, ReadAll(), [response](StoreServer::Loop& loop) {
    response->set_num_keys(loop.kv().NumKeys());
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* StoreService::Append(grpc::CallbackServerContext* context,
                                               const v1::AppendRequest* request,
                                               v1::AppendResponse* response) {
  if (grpc::Status s = CheckSizes(context, {&request->key()}, {&request->value()}); !s.ok()) {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(s);
    return reactor;
  }
  if (remote_ != nullptr) {
    return Remote(context, [request, response](BlockingStore& st) {
      return ToGrpc(st.Append(request->key(), request->value()));
    });
  }
  return Run(context, Wrote(), [request](StoreServer::Loop& loop) {
    if (grpc::Status s = ToGrpc(loop.writable()); !s.ok()) return s;
    return ToGrpc(loop.kv().Append(request->key(), request->value()));
  });
}

grpc::ServerUnaryReactor* StoreService::MultiGet(grpc::CallbackServerContext* context,
                                                 const v1::MultiGetRequest* request,
                                                 v1::MultiGetResponse* response) {
  if (remote_ != nullptr) {
    return Remote(context, [request, response](BlockingStore& st) {
      std::vector<std::string> keys(request->keys().begin(), request->keys().end());
      auto v = st.MultiGet(keys, TimeoutOf(request->timeout()));
      if (!v.ok()) return ToGrpc(v.status());
      for (const std::string& value : *v) response->add_values(value);
      return grpc::Status::OK;
    });
  }
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  return RunWhenPresent(context, keys, request->timeout(),
                        [keys, response](StoreServer::Loop& loop) {
                          for (const std::string& k : keys) {
                            const std::string* value = loop.kv().Find(k);
                            if (value == nullptr) {
                              response->clear_values();
                              return ToGrpc(NoValue(k));
                            }
                            response->add_values(*value);
                          }
                          return grpc::Status::OK;
                        });
}

grpc::ServerUnaryReactor* StoreService::MultiSet(grpc::CallbackServerContext* context,
                                                 const v1::MultiSetRequest* request,
                                                 v1::MultiSetResponse* response) {
  std::vector<const std::string*> keys, values;
  for (const auto& e : request->entries()) {
    keys.push_back(&e.key());
    values.push_back(&e.value());
  }
  if (grpc::Status s = CheckSizes(context, keys, values); !s.ok()) {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(s);
    return reactor;
  }
  if (remote_ != nullptr) {
    return Remote(context, [request, response](BlockingStore& st) {
      std::vector<std::string> keys, values;
      for (const auto& e : request->entries()) {
        keys.push_back(e.key());
        values.push_back(e.value());
      }
      return ToGrpc(st.MultiSet(keys, values));
    });
  }
  return Run(context, Wrote(), [request](StoreServer::Loop& loop) {
    std::vector<std::string> keys, values;
    for (const auto& e : request->entries()) {
      keys.push_back(e.key());
      values.push_back(e.value());
    }
    if (grpc::Status s = ToGrpc(loop.writable()); !s.ok()) return s;
    return ToGrpc(loop.kv().MultiSet(keys, values));
  });
}

grpc::ServerUnaryReactor* StoreService::ListKeys(grpc::CallbackServerContext* context,
                                                 const v1::ListKeysRequest* request,
                                                 v1::ListKeysResponse* response) {
  if (remote_ != nullptr) {
    return Remote(context, [request, response](BlockingStore& st) {
      auto v = st.ListKeys();
      if (!v.ok()) return ToGrpc(v.status());
      for (const std::string& k : *v) {
        if (absl::StartsWith(k, request->prefix())) response->add_keys(k);
      }
      return grpc::Status::OK;
    });
  }
  return Run(context, ReadAll(), [request, response](StoreServer::Loop& loop) {
    for (const std::string& k : loop.kv().ListKeys(request->prefix())) response->add_keys(k);
    return grpc::Status::OK;
  });
}

}  // namespace muster
