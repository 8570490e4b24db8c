#include "daemon/store/etcd/etcd_liveness.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "daemon/store/etcd/etcd_channel.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace muster {

namespace pb = etcdserverpb;

namespace {

std::string Hex(int64_t id) { return absl::StrCat(absl::Hex(static_cast<uint64_t>(id))); }

}  // namespace

// The endpoints' channels and stubs, which one is in use, and the auth
// token. Thread-safe.
class EtcdLiveness::Channels {
 public:
  using Endpoint = EtcdEndpoint;

  explicit Channels(EtcdStoreOptions options) : opt_(std::move(options)) {}

  absl::Status Connect() {
    ASSIGN_OR_RETURN(endpoints_, OpenEtcdEndpoints(opt_));
    return absl::OkStatus();
  }

  const EtcdStoreOptions& opt() const { return opt_; }

  Endpoint& Current(size_t* index) {
    *index = current_.load() % endpoints_.size();
    return *endpoints_[*index];
  }
  // Moves on from endpoint `index` (unless another thread already did).
  void Next(size_t index) { current_.compare_exchange_strong(index, index + 1); }

  // Adds the auth token to `ctx` (authenticating first when needed).
  absl::Status Authorize(Endpoint& ep, grpc::ClientContext& ctx, absl::Time deadline) {
    return token_.AddTo(ep, ctx, deadline, opt_);
  }
  void DropToken() { token_.Drop(); }

  // Runs `fn` on one endpoint after another until it succeeds, fails with
  // a code other than UNAVAILABLE/DEADLINE_EXCEEDED/UNKNOWN, or `deadline`.
  absl::Status Call(absl::string_view what, absl::Time deadline,
                    const std::function<grpc::Status(Endpoint&, grpc::ClientContext&)>& fn) {
    std::string last;
    size_t tried = 0;
    for (;;) {
      size_t index;
      Endpoint& ep = Current(&index);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + opt_.attempt_timeout)));
      absl::Status auth = Authorize(ep, ctx, deadline);
      if (auth.ok()) {
        grpc::Status s = fn(ep, ctx);
        if (s.ok()) return absl::OkStatus();
        last = absl::StrCat("etcd at ", ep.name, ": ", s.error_message(), " (gRPC code ",
                            static_cast<int>(s.error_code()), ")");
        if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
            absl::StrContains(s.error_message(), "invalid auth token")) {
          DropToken();
        } else if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
                   s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
                   s.error_code() != grpc::StatusCode::UNKNOWN) {
          return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                              absl::StrCat("etcd ", what, ": ", last));
        }
      } else {
        last = std::string(auth.message());
      }
      Next(index);
      if (++tried % endpoints_.size() == 0) {
        absl::SleepFor(std::min(absl::Milliseconds(100), deadline - absl::Now()));
      }
      if (absl::Now() >= deadline) {
        return absl::UnavailableError(absl::StrCat("etcd ", what, " failed: ", last));
      }
    }
  }

 private:
  const EtcdStoreOptions opt_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::atomic<size_t> current_{0};
  EtcdToken token_;
};

absl::StatusOr<std::unique_ptr<EtcdLiveness>> EtcdLiveness::Start(const EtcdStoreOptions& options,
                                                                  absl::Duration ttl) {
  auto channels = std::make_shared<Channels>(options);
  RETURN_IF_ERROR(channels->Connect());
  ttl = std::max(absl::Seconds(1),
                 absl::Seconds(absl::ToInt64Seconds(ttl + absl::Milliseconds(500))));
  std::unique_ptr<EtcdLiveness> l(new EtcdLiveness(options, ttl, std::move(channels)));
  EtcdLiveness* self = l.get();
  l->keeper_ = std::thread([self] { self->Keep(); });
  return l;
}

EtcdLiveness::EtcdLiveness(const EtcdStoreOptions& options, absl::Duration ttl,
                           std::shared_ptr<Channels> channels)
    : options_(options), ttl_(ttl), channels_(std::move(channels)) {}

EtcdLiveness::~EtcdLiveness() { Stop(); }

void EtcdLiveness::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (keeper_.joinable()) keeper_.join();
}

int64_t EtcdLiveness::lease_id() const {
  absl::MutexLock lock(&mu_);
  return lease_;
}

int64_t EtcdLiveness::leases_granted() const {
  absl::MutexLock lock(&mu_);
  return granted_;
}

void EtcdLiveness::PauseKeepAliveForTesting(bool paused) {
  absl::MutexLock lock(&mu_);
  paused_ = paused;
}

absl::Status EtcdLiveness::Put(const std::string& key, const std::string& value, int64_t lease) {
  pb::PutRequest req;
  req.set_key(options_.prefix + key);
  req.set_value(value);
  req.set_lease(lease);
  pb::PutResponse resp;
  return channels_->Call("put", absl::Now() + absl::Seconds(5),
                         [&](Channels::Endpoint& ep, grpc::ClientContext& ctx) {
                           return ep.kv->Put(&ctx, req, &resp);
                         });
}

absl::Status EtcdLiveness::Hold(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&keys_mu_);
  {
    absl::MutexLock state(&mu_);
    if (stopping_) return absl::UnavailableError("musterd's etcd lease keeper is stopping");
  }
  held_[key] = value;
  int64_t lease = lease_id();
  if (lease == 0) {
    return absl::UnavailableError(absl::StrCat("no etcd lease yet (etcd not reachable?): '", key,
                                               "' is put once one is granted"));
  }
  absl::Status s = Put(key, value, lease);
  if (!s.ok()) {
    return Annotate(s, absl::StrCat("putting '", key, "' with etcd lease ", Hex(lease),
                                    " (put again with the next lease)"));
  }
  return s;
}

absl::Status EtcdLiveness::Release(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&keys_mu_);
  held_.erase(key);
  return Put(key, value, 0);
}

absl::StatusOr<int64_t> EtcdLiveness::Grant() {
  pb::LeaseGrantRequest req;
  req.set_ttl(absl::ToInt64Seconds(ttl_));
  pb::LeaseGrantResponse resp;
  RETURN_IF_ERROR(channels_->Call("lease grant", absl::Now() + options_.attempt_timeout,
                                  [&](Channels::Endpoint& ep, grpc::ClientContext& ctx) {
                                    resp.Clear();
                                    return ep.lease->LeaseGrant(&ctx, req, &resp);
                                  }));
  if (!resp.error().empty() || resp.id() == 0) {
    return absl::UnavailableError(absl::StrCat("etcd lease grant: ", resp.error()));
  }
  return resp.id();
}

absl::StatusOr<int64_t> EtcdLiveness::KeepAliveOnce(int64_t lease) {
  size_t index;
  Channels::Endpoint& ep = channels_->Current(&index);
  grpc::ClientContext ctx;
  absl::Time deadline =
      absl::Now() + std::min(options_.attempt_timeout, std::max(ttl_ / 3, absl::Milliseconds(500)));
  ctx.set_deadline(absl::ToChronoTime(deadline));
  if (absl::Status auth = channels_->Authorize(ep, ctx, deadline); !auth.ok()) {
    channels_->Next(index);
    return auth;
  }
  auto stream = ep.lease->LeaseKeepAlive(&ctx);
  pb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  pb::LeaseKeepAliveResponse resp;
  bool answered = stream->Write(req) && stream->Read(&resp);
  ctx.TryCancel();
  grpc::Status finished = stream->Finish();
  if (answered) return resp.ttl();
  if (finished.error_code() == grpc::StatusCode::UNAUTHENTICATED) channels_->DropToken();
  channels_->Next(index);
  return absl::UnavailableError(absl::StrCat("etcd at ", ep.name, ": ", finished.error_message(),
                                             " (gRPC code ",
                                             static_cast<int>(finished.error_code()), ")"));
}

void EtcdLiveness::Keep() {
  absl::Time renewed = absl::Now();  // the last time etcd confirmed the lease
  int failures = 0;
  for (;;) {
    int64_t lease;
    {
      absl::MutexLock lock(&mu_);
      auto running = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !paused_; };
      mu_.Await(absl::Condition(&running));
      if (stopping_) return;
      lease = lease_;
    }
    absl::Duration pause = ttl_ / 3;
    if (lease == 0) {
      absl::StatusOr<int64_t> id = Grant();
      if (!id.ok()) {
        if (failures++ % 10 == 0) {
          MLOG(WARNING) << "cannot get an etcd lease (this node's ranks are not yet visible as "
                           "alive to other nodes): "
                        << id.status().message();
        }
        pause = absl::Milliseconds(500);
      } else {
        int64_t n;
        {
          absl::MutexLock lock(&mu_);
          lease_ = *id;
          n = ++granted_;
        }
        failures = 0;
        renewed = absl::Now();
        absl::MutexLock keys(&keys_mu_);
        MLOG(INFO) << "etcd lease " << Hex(*id) << " granted (TTL " << absl::FormatDuration(ttl_)
                   << ")"
                   << (n > 1 ? absl::StrCat("; the previous one was lost, putting ", held_.size(),
                                            " liveness key(s) again")
                             : "");
        for (const auto& [key, value] : held_) {
          if (absl::Status s = Put(key, value, *id); !s.ok()) {
            MLOG(WARNING) << "cannot put liveness key '" << key << "' with etcd lease " << Hex(*id)
                          << ": " << s.message();
          }
        }
      }
    } else {
      absl::StatusOr<int64_t> granted = KeepAliveOnce(lease);
      if (!granted.ok()) {
        // Logged at the first failure and every 5th after it (retried every
        // 200 ms).
        if (failures++ % 5 == 0) {
          MLOG(WARNING) << "etcd lease " << Hex(lease) << " keep-alive failed (" << failures
                        << " in a row, last renewed " << absl::FormatDuration(absl::Now() - renewed)
                        << " ago, TTL " << absl::FormatDuration(ttl_)
                        << "): " << granted.status().message();
        }
        pause = absl::Milliseconds(200);
      } else if (*granted <= 0) {
        MLOG(WARNING) << "etcd lease " << Hex(lease) << " expired (last renewed "
                      << absl::FormatDuration(absl::Now() - renewed) << " ago, TTL "
                      << absl::FormatDuration(ttl_)
                      << "): other nodes see this node's ranks as lost; granting a new lease";
        absl::MutexLock lock(&mu_);
        lease_ = 0;
        continue;
      } else {
        if (failures > 0) {
          MLOG(INFO) << "etcd lease " << Hex(lease) << " renewed again after " << failures
                     << " failed keep-alive(s)";
        }
        failures = 0;
        renewed = absl::Now();
      }
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), pause);
    if (stopping_) return;
  }
}

EtcdLiveness::Cancel EtcdLiveness::WatchLost(const std::string& prefix,
                                             std::function<void(const std::vector<Lost>&)> lost) {
  struct State {
    absl::Mutex mu;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
    grpc::ClientContext* ctx ABSL_GUARDED_BY(mu) = nullptr;
    std::thread thread;
  };
  auto state = std::make_shared<State>();
  std::shared_ptr<Channels> channels = channels_;
  const std::string etcd_prefix = options_.prefix;
  // Thread: one watch stream at a time over `prefix`, resumed after breaks.
  state->thread = std::thread([state, channels, etcd_prefix, prefix, lost = std::move(lost)] {
    int64_t next = 0;  // the first revision not yet seen (0: from now)
    for (;;) {
      size_t index;
      Channels::Endpoint& ep = channels->Current(&index);
      grpc::ClientContext ctx;
      ctx.AddMetadata("hasleader", "true");  // a member without a leader ends the stream
      std::string why;
      if (absl::Status auth = channels->Authorize(ep, ctx, absl::Now() + absl::Seconds(5));
          !auth.ok()) {
        why = std::string(auth.message());
      } else {
        {
          absl::MutexLock lock(&state->mu);
          if (state->cancelled) return;
          state->ctx = &ctx;
        }
        auto stream = ep.watch->Watch(&ctx);
        pb::WatchRequest req;
        pb::WatchCreateRequest* create = req.mutable_create_request();
        create->set_key(etcd_prefix + prefix);
        create->set_range_end(EtcdPrefixEnd(etcd_prefix + prefix));
        create->set_prev_kv(true);
        create->add_filters(pb::WatchCreateRequest::NOPUT);
        create->set_start_revision(next);
        // Progress notifications (every 10 min) move `next` past revisions
        // without deletions, so a resumed watch does not replay long history.
        create->set_progress_notify(true);
        pb::WatchResponse resp;
        if (stream->Write(req)) {
          while (stream->Read(&resp)) {
            if (resp.created() && next == 0) next = resp.header().revision() + 1;
            if (resp.compact_revision() != 0) {
              MLOG(WARNING) << "watch of lost liveness keys under '" << prefix
                            << "': revisions up to " << resp.compact_revision()
                            << " were compacted; losses from " << next << " on may be missed";
              next = resp.compact_revision();
              break;
            }
            if (resp.canceled()) break;
            if (!resp.created() && resp.events_size() == 0) {  // a progress notification
              next = std::max(next, resp.header().revision() + 1);
              continue;
            }
            std::vector<Lost> batch;
            for (const auto& ev : resp.events()) {
              int64_t revision = ev.kv().mod_revision();
              if (!batch.empty() && batch.back().revision != revision) {
                lost(batch);
                batch.clear();
              }
              next = std::max(next, revision + 1);
              if (ev.type() != mvccpb::Event::DELETE || ev.prev_kv().lease() == 0) continue;
              batch.push_back(Lost{ev.kv().key().substr(etcd_prefix.size()), ev.prev_kv().value(),
                                   revision, ev.prev_kv().lease()});
            }
            if (!batch.empty()) lost(batch);
          }
        }
        {
          absl::MutexLock lock(&state->mu);
          state->ctx = nullptr;
        }
        ctx.TryCancel();
        grpc::Status finished = stream->Finish();
        why = absl::StrCat("etcd at ", ep.name, ": ", finished.error_message());
      }
      absl::MutexLock lock(&state->mu);
      if (state->cancelled) return;
      MLOG(WARNING) << "watch of lost liveness keys under '" << prefix << "' ended (" << why
                    << "); resuming from revision " << next;
      channels->Next(index);
      state->mu.AwaitWithTimeout(absl::Condition(&state->cancelled), absl::Milliseconds(200));
      if (state->cancelled) return;
    }
  });
  return [state] {
    {
      absl::MutexLock lock(&state->mu);
      state->cancelled = true;
      if (state->ctx != nullptr) state->ctx->TryCancel();
    }
    if (state->thread.joinable()) state->thread.join();
  };
}

}  // namespace muster
