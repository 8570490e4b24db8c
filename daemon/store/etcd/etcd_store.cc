#include "daemon/store/etcd/etcd_store.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <array>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "common/store_wire.h"
#include "daemon/store/etcd/etcd_channel.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace muster {

namespace pb = etcdserverpb;

namespace {

using Endpoint = EtcdEndpoint;

// One key's value as read: nullopt when missing.
struct Read {
  std::optional<std::string> value;
  int64_t mod_revision = 0;
};

Read FromRange(const pb::RangeResponse& r) {
  Read out;
  if (r.kvs_size() > 0) {
    out.value = r.kvs(0).value();
    out.mod_revision = r.kvs(0).mod_revision();
  }
  return out;
}

// Whether a request surely never reached etcd's state machine (so even a
// write may be sent again): the connection could not be made, or etcd
// refused it before proposing it.
bool NotApplied(const grpc::Status& s) {
  const std::string& m = s.error_message();
  for (const char* sign :
       {"failed to connect", "Connection refused", "connections to all", "etcdserver: no leader",
        "etcdserver: too many requests", "etcdserver: not capable"}) {
    if (absl::StrContains(m, sign)) return true;
  }
  return false;
}

// Whether to try the next endpoint. Reads and blind writes (Put, Delete,
// MultiSet) may be repeated; a read-modify-write Txn that may have been
// applied must not be (a retry after its lost reply would apply it twice).
bool Retriable(const grpc::Status& s, bool idempotent) {
  if (!idempotent) {
    return (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
            s.error_code() == grpc::StatusCode::UNKNOWN) &&
           NotApplied(s);
  }
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:  // etcd's "leader changed", "request timed out"
      return true;
    default:
      return false;
  }
}

absl::StatusCode Translate(grpc::StatusCode c) { return static_cast<absl::StatusCode>(c); }

// What a failed connection says about TLS to etcd (empty: not TLS's fault),
// in musterd's flags: a handshake refused for the CA, or a server that
// closes the connection of a client without a certificate (etcd's
// --client-cert-auth, TLS 1.3: after the handshake, "Endpoint read failed").
std::string TlsProblem(const grpc::Status& s, absl::string_view endpoint, bool have_cert) {
  const std::string& m = s.error_message();
  if (absl::StrContains(m, "certificate verify failed")) {
    return "etcd's server certificate is not trusted: --etcd-ca must name the CA that signed "
           "it";
  }
  if (absl::StrContains(m, "Ssl handshake failed") || absl::StrContains(m, "SSL_ERROR")) {
    return "the TLS handshake with etcd failed: check --etcd-ca, --etcd-cert and --etcd-key";
  }
  if (absl::StartsWith(endpoint, "https://") && !have_cert &&
      absl::StrContains(m, "failed to connect") &&
      (absl::StrContains(m, "Endpoint read failed") || absl::StrContains(m, "Socket closed") ||
       absl::StrContains(m, "Connection reset"))) {
    return "etcd closed the TLS connection, as etcd --client-cert-auth does to a client "
           "without a certificate: give --etcd-cert and --etcd-key";
  }
  return "";
}

}  // namespace

class EtcdStore::Impl {
 public:
  explicit Impl(EtcdStoreOptions options) : opt_(std::move(options)) {}

  absl::Status Connect() {
    ASSIGN_OR_RETURN(endpoints_, OpenEtcdEndpoints(opt_));
    return absl::OkStatus();
  }

  const EtcdStoreOptions& opt() const { return opt_; }
  std::string Key(absl::string_view k) const { return absl::StrCat(opt_.prefix, k); }

  // Runs `fn(endpoint, context)` until it succeeds, moving to the next
  // endpoint on a retriable failure, until `deadline`.
  absl::Status Call(absl::string_view what, absl::Time deadline, bool idempotent,
                    const std::function<grpc::Status(Endpoint&, grpc::ClientContext&)>& fn) {
    std::string last;
    size_t tried = 0;
    bool reauthenticated = false;
    // Consecutive failures that TLS explains: twice round every endpoint is
    // a configuration error, not an outage, and fails the call at once.
    size_t tls_failures = 0;
    for (;;) {
      if (stopping_.load()) return absl::UnavailableError("musterd's store is shutting down");
      size_t index = current_.load() % endpoints_.size();
      Endpoint& ep = *endpoints_[index];
      grpc::ClientContext ctx;
      absl::Time now = absl::Now();
      // A write that is not retried gets the call's whole time: cutting its
      // attempt short would only make its outcome unknown.
      ctx.set_deadline(absl::ToChronoTime(
          idempotent ? std::min(deadline, now + opt_.attempt_timeout) : deadline));
      if (absl::Status auth = AddToken(ep, ctx, deadline); !auth.ok()) {
        last = std::string(auth.message());
        if (auth.code() != absl::StatusCode::kUnavailable) return auth;
      } else {
        grpc::Status s = fn(ep, ctx);
        if (s.ok()) return absl::OkStatus();
        last = absl::StrCat("etcd at ", ep.name, ": ", s.error_message(), " (gRPC code ",
                            static_cast<int>(s.error_code()), ")");
        if ((s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
             absl::StrContains(s.error_message(), "invalid auth token")) &&
            !opt_.user.empty() && !reauthenticated) {
          reauthenticated = true;
          DropToken();
          continue;
        }
        if (std::string tls = TlsProblem(s, ep.name, !opt_.cert_pem.empty()); tls.empty()) {
          tls_failures = 0;
        } else if (++tls_failures >= 2 * endpoints_.size()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "etcd ", what, ": TLS to etcd failed at every endpoint: ", tls, " (", last, ")"));
        }
        if (!Retriable(s, idempotent)) {
          if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
              s.error_code() == grpc::StatusCode::UNKNOWN ||
              s.error_code() == grpc::StatusCode::UNAVAILABLE) {
            return absl::UnavailableError(absl::StrCat(
                "etcd ", what, " may or may not have been applied (not retried): ", last));
          }
          return absl::Status(Translate(s.error_code()), absl::StrCat("etcd ", what, ": ", last));
        }
      }
      // Next endpoint; after a full round, back off briefly.
      current_.compare_exchange_strong(index, index + 1);
      if (++tried % endpoints_.size() == 0) {
        absl::SleepFor(std::min(absl::Milliseconds(100), deadline - absl::Now()));
      }
      if (absl::Now() >= deadline) {
        return absl::UnavailableError(absl::StrCat("etcd ", what, " failed: ", last));
      }
    }
  }

  // A Txn with no compares whose success ops are Ranges of `keys`.
  using ReadResult = absl::StatusOr<std::pair<std::vector<Read>, int64_t>>;

  // Reads of the same keys coalesced: a caller joins a batch that has not
  // started yet (so its result is at least as new as the call). One caller
  // runs a batch at a time, its own among them, under its own deadline;
  // then the first caller queued meanwhile runs the next one, so that no
  // caller's reply waits on others' batches.
  // `since`: the caller may also join a batch already sent, if it was sent
  // at or after `since` (a read that begins after the caller's request
  // arrived still answers that request linearizably).
  ReadResult ReadKeys(const std::vector<std::string>& keys, absl::Time deadline, bool count_only,
                      absl::Time since = absl::InfiniteFuture()) {
    auto self = std::make_shared<PendingRead>();
    std::pair<std::vector<std::string>, bool> id(keys, count_only);
    read_mu_.Lock();
    ReadQueue& q = reads_[id];
    if (q.running && q.joinable && q.sent_at >= since) {
      q.sent.push_back(self);
    } else {
      q.queued.push_back(self);
    }
    if (q.running) {
      read_mu_.Unlock();  // as in Add: a notification per waiter, no re-lock
      self->notified.WaitForNotification();
      if (!self->runs_next) return self->result;
      read_mu_.Lock();
    }
    reads_[id].running = true;
    reads_[id].sent.swap(reads_[id].queued);
    reads_[id].sent_at = absl::Now();
    reads_[id].joinable = true;
    read_mu_.Unlock();
    ReadResult r = ReadKeysOnce(keys, deadline, count_only);
    read_mu_.Lock();
    std::vector<std::shared_ptr<PendingRead>> batch;
    batch.swap(reads_[id].sent);
    // No caller may join this batch once its results go out unlocked.
    reads_[id].joinable = false;
    read_mu_.Unlock();
    for (const auto& p : batch) {
      p->result = r;
      if (p != self) p->notified.Notify();
    }
    read_mu_.Lock();
    ReadQueue& after = reads_[id];
    if (after.queued.empty()) {
      reads_.erase(id);
    } else {
      after.queued.front()->runs_next = true;
      after.queued.front()->notified.Notify();
    }
    read_mu_.Unlock();
    return self->result;
  }

  // Waits for the same keys share one watch: a caller joins the wait in
  // flight; when it ends without the keys (its owner's deadline or cancel),
  // the others that still have time start another.
  // `queues`: a queued item of a key's name counts as present (WAIT and
  // CHECK as PyTorch sees them); such waits share flights among themselves.
  absl::Status WaitFor(const std::vector<std::string>& keys, absl::Time deadline,
                       absl::Duration timeout, WaitCancel* cancel, bool queues = false) {
    auto once = [&] {
      return queues ? WaitPresent(keys, deadline, timeout, cancel, true, true)
                    : WaitForOnce(keys, deadline, timeout, cancel);
    };
    auto& flights = queues ? queued_flights_ : flights_;
    for (;;) {
      std::shared_ptr<Flight> flight;
      bool owner = false;
      {
        absl::MutexLock lock(&flight_mu_);
        std::shared_ptr<Flight>& slot = flights[keys];
        if (slot == nullptr) {
          slot = std::make_shared<Flight>();
          owner = true;
        }
        flight = slot;
      }
      if (owner) {
        absl::Status s = once();
        std::vector<std::shared_ptr<Wake>> waiters;
        {
          absl::MutexLock lock(&flight_mu_);
          flight->status = s;
          flight->done = true;
          waiters.swap(flight->waiters);
          flights.erase(keys);
        }
        for (const auto& w : waiters) w->Set();
        return s;
      }
      // Each waiter sleeps on its own Wake (set by the owner when the flight
      // ends, or by this caller's cancel): hundreds of waiters on one
      // Mutex condition would be re-evaluated on every unlock and handed the
      // lock one after another when the key appears.
      auto wake = std::make_shared<Wake>();
      // A waiter that stops waiting before its flight ends leaves it.
      auto leave = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(flight_mu_) {
        auto& w = flight->waiters;
        w.erase(std::remove(w.begin(), w.end(), wake), w.end());
      };
      bool joined = false;
      {
        absl::MutexLock lock(&flight_mu_);
        joined = !flight->done;
        if (joined) flight->waiters.push_back(wake);
      }
      if (joined) {
        if (cancel != nullptr && !cancel->SetOnCancel([wake] { wake->Set(); })) {
          absl::MutexLock lock(&flight_mu_);
          leave();
          return absl::CancelledError("wait cancelled");
        }
        wake->WaitUntil(deadline);  // the flight's end, this caller's cancel or deadline
        if (cancel != nullptr) cancel->ClearOnCancel();
      }
      absl::MutexLock lock(&flight_mu_);
      if (!flight->done) leave();
      if (flight->done && flight->status.ok()) return absl::OkStatus();
      if (cancel != nullptr && cancel->cancelled()) return absl::CancelledError("wait cancelled");
      if (!flight->done) {  // this caller's deadline
        flight_mu_.Unlock();
        absl::Status s = once();  // reads once, then times out
        flight_mu_.Lock();
        return s;
      }
      if (!absl::IsDeadlineExceeded(flight->status) && !absl::IsCancelled(flight->status)) {
        return flight->status;
      }
      // The owner gave up (its deadline or cancel): wait in a new flight.
    }
  }

  ReadResult ReadKeysOnce(const std::vector<std::string>& keys, absl::Time deadline,
                          bool count_only) {
    std::vector<Read> reads;
    int64_t revision = 0;
    for (size_t begin = 0; begin < keys.size() || (begin == 0 && keys.empty()); begin += 128) {
      pb::TxnRequest req;
      size_t end = std::min(keys.size(), begin + 128);
      for (size_t i = begin; i < end; ++i) {
        pb::RangeRequest* r = req.add_success()->mutable_request_range();
        r->set_key(Key(keys[i]));
        if (count_only) r->set_count_only(true);
        // Later chunks read the first chunk's revision: one snapshot.
        if (revision != 0) r->set_revision(revision);
      }
      pb::TxnResponse resp;
      RETURN_IF_ERROR(Call("read", deadline, true, [&](Endpoint& ep, grpc::ClientContext& ctx) {
        resp.Clear();
        return ep.kv->Txn(&ctx, req, &resp);
      }));
      if (revision == 0) revision = resp.header().revision();
      for (const pb::ResponseOp& op : resp.responses()) {
        Read r = FromRange(op.response_range());
        if (count_only && op.response_range().count() > 0) r.value = std::string();
        reads.push_back(std::move(r));
      }
      if (keys.empty()) break;
    }
    return std::make_pair(std::move(reads), revision);
  }

  // Read-modify-write of `keys`: `update` gets the current values and says
  // what to store (nullopt: leave the key); retried on conflicts.
  using Update = std::function<absl::StatusOr<std::vector<std::optional<std::string>>>(
      const std::vector<Read>&)>;
  // `known`: the keys' values as this process last wrote them (skips the
  // first read; a stale guess only fails the compare). `written`: the
  // values as stored by the successful Txn.
  absl::Status Modify(absl::string_view what, const std::vector<std::string>& keys,
                      absl::Time deadline, const Update& update,
                      const std::vector<Read>* known = nullptr,
                      std::vector<Read>* written = nullptr) {
    std::vector<Read> current;
    if (known != nullptr) {
      current = *known;
    } else {
      ASSIGN_OR_RETURN(auto read, ReadKeys(keys, deadline, false));
      current = std::move(read.first);
    }
    for (;;) {
      ASSIGN_OR_RETURN(std::vector<std::optional<std::string>> next, update(current));
      pb::TxnRequest req;
      bool writes = false;
      for (size_t i = 0; i < keys.size(); ++i) {
        pb::Compare* c = req.add_compare();
        c->set_key(Key(keys[i]));
        c->set_result(pb::Compare::EQUAL);
        if (current[i].value.has_value()) {
          c->set_target(pb::Compare::MOD);
          c->set_mod_revision(current[i].mod_revision);
        } else {
          c->set_target(pb::Compare::VERSION);
          c->set_version(0);
        }
        if (next[i].has_value()) {
          writes = true;
          pb::PutRequest* put = req.add_success()->mutable_request_put();
          put->set_key(Key(keys[i]));
          put->set_value(*next[i]);
        }
        req.add_failure()->mutable_request_range()->set_key(Key(keys[i]));
      }
      if (!writes) return absl::OkStatus();
      pb::TxnResponse resp;
      RETURN_IF_ERROR(Call(what, deadline, false, [&](Endpoint& ep, grpc::ClientContext& ctx) {
        resp.Clear();
        return ep.kv->Txn(&ctx, req, &resp);
      }));
      if (resp.succeeded()) {
        if (written != nullptr) {
          written->assign(keys.size(), Read{});
          for (size_t i = 0; i < keys.size(); ++i) {
            (*written)[i].value = next[i].has_value() ? next[i] : current[i].value;
            // A put in a Txn gets the Txn's revision.
            (*written)[i].mod_revision =
                next[i].has_value() ? resp.header().revision() : current[i].mod_revision;
          }
        }
        return absl::OkStatus();
      }
      for (size_t i = 0; i < keys.size(); ++i) {
        current[i] = FromRange(resp.responses(static_cast<int>(i)).response_range());
      }
      if (absl::Now() >= deadline) {
        return absl::UnavailableError(
            absl::StrCat("etcd ", what, ": still conflicting with other writers at the deadline"));
      }
    }
  }

  // Blocks until every key exists (or deadline / cancel).
  absl::Status WaitForOnce(const std::vector<std::string>& keys, absl::Time deadline,
                           absl::Duration timeout, WaitCancel* cancel) {
    for (;;) {
      if (cancel != nullptr && cancel->cancelled()) return absl::CancelledError("wait cancelled");
      if (stopping_.load()) return absl::UnavailableError("musterd's store is shutting down");
      std::set<std::string> missing;
      int64_t revision = 0;
      // The check itself gets a second even when the wait's time is up, so
      // an expired wait still reports DeadlineExceeded with its missing keys.
      absl::Time read_deadline = std::max(deadline, absl::Now() + absl::Seconds(1));
      if (keys.size() <= 128) {
        ASSIGN_OR_RETURN(auto read, ReadKeys(keys, read_deadline, true));
        for (size_t i = 0; i < keys.size(); ++i) {
          if (!read.first[i].value.has_value()) missing.insert(Key(keys[i]));
        }
        revision = read.second;
      } else {
        ASSIGN_OR_RETURN(auto present, ListPrefix(read_deadline, &revision));
        std::set<std::string> have(present.begin(), present.end());
        for (const std::string& k : keys) {
          if (!have.count(k)) missing.insert(Key(k));
        }
      }
      if (missing.empty()) return absl::OkStatus();
      if (absl::Now() >= deadline) return TimedOut(missing, timeout);
      absl::Status watched = WatchUntilPresent(&missing, revision, deadline, cancel);
      if (watched.ok() || missing.empty()) return absl::OkStatus();
      if (absl::IsCancelled(watched)) return watched;
      if (absl::Now() >= deadline) return TimedOut(missing, timeout);
      // The stream broke or was compacted: read again and re-watch.
      absl::SleepFor(std::min(absl::Milliseconds(50), deadline - absl::Now()));
    }
  }

  absl::Status TimedOut(const std::set<std::string>& missing, absl::Duration timeout) {
    std::vector<std::string> named;
    for (const std::string& k : missing) {
      if (named.size() >= wire::kMaxNamedMissingKeys) break;
      named.push_back(k.substr(opt_.prefix.size()));
    }
    return absl::DeadlineExceededError(absl::StrCat("store wait timed out after ",
                                                    absl::FormatDuration(timeout), "; ",
                                                    wire::MissingKeysText(named, missing.size())));
  }

  // One watch stream from `revision` + 1 over the missing keys (one watcher
  // per key for a few, the whole prefix for many). OK once none is missing.
  // `map_keys` / `queues`: what makes a key present (its value, a queued
  // item of that name); `missing` holds map keys (Key(k)) either way.
  absl::Status WatchUntilPresent(std::set<std::string>* missing, int64_t revision,
                                 absl::Time deadline, WaitCancel* cancel, bool map_keys = true,
                                 bool queues = false) {
    size_t index = current_.load() % endpoints_.size();
    Endpoint& ep = *endpoints_[index];
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    // A member that loses its leader cancels the watch instead of going quiet.
    ctx.AddMetadata("hasleader", "true");
    RETURN_IF_ERROR(AddToken(ep, ctx, deadline));
    if (cancel != nullptr && !cancel->SetOnCancel([&ctx] { ctx.TryCancel(); })) {
      return absl::CancelledError("wait cancelled");
    }
    auto clear_cancel = [cancel] {
      if (cancel != nullptr) cancel->ClearOnCancel();
    };
    {
      absl::MutexLock lock(&watches_mu_);
      if (stopping_.load()) {
        clear_cancel();
        return absl::UnavailableError("musterd's store is shutting down");
      }
      watches_.insert(&ctx);
    }
    auto unregister = [this, &ctx] {
      absl::MutexLock lock(&watches_mu_);
      watches_.erase(&ctx);
    };
    auto stream = ep.watch->Watch(&ctx);
    bool whole_prefix = missing->size() > 8;
    // (key, range_end): range_end empty for one key.
    std::vector<std::pair<std::string, std::string>> ranges;
    if (!queues) {
      if (whole_prefix) {
        ranges.emplace_back(opt_.prefix, EtcdPrefixEnd(opt_.prefix));
      } else {
        for (const std::string& k : *missing) ranges.emplace_back(k, "");
      }
    } else {
      ranges = QueueWatchRanges(*missing, whole_prefix, map_keys);
    }
    bool wrote = true;
    for (const auto& [k, end] : ranges) {
      pb::WatchRequest req;
      pb::WatchCreateRequest* create = req.mutable_create_request();
      create->set_key(k);
      if (!end.empty()) create->set_range_end(end);
      // No start revision: a watcher that starts in the past is "unsynced"
      // in etcd and gets its events from a loop that runs every 100 ms
      // (half a barrier's time went there); from now it is synced and gets
      // each event as it commits. What committed between the read at
      // `revision` and the watch's start is read again below.
      create->add_filters(pb::WatchCreateRequest::NODELETE);
      if (!stream->Write(req)) {
        wrote = false;
        break;
      }
    }
    bool broken = !wrote;
    pb::WatchResponse resp;
    size_t created = 0;
    int64_t watch_revision = 0;  // the latest "created" header: watched after it
    absl::Status recheck;
    while (!broken && !missing->empty() && stream->Read(&resp)) {
      if (resp.canceled() || resp.compact_revision() != 0) {
        broken = true;  // compacted or the member lost its leader
        break;
      }
      for (const auto& ev : resp.events()) {
        if (ev.type() != mvccpb::Event::PUT) continue;
        missing->erase(queues ? MapKeyOfEvent(ev.kv().key()) : ev.kv().key());
      }
      if (resp.created()) {
        ++created;
        watch_revision = std::max(watch_revision, resp.header().revision());
      }
      if (created == ranges.size() && watch_revision > revision && !missing->empty()) {
        // Writes after the read and up to the watch's start: read again
        // (once), every later write arrives as an event.
        revision = watch_revision;
        std::vector<std::string> keys;
        for (const std::string& k : *missing) keys.push_back(k.substr(opt_.prefix.size()));
        std::set<std::string> still;
        int64_t read_revision = 0;
        recheck = ReadPresence(keys, deadline, map_keys, queues, &still, &read_revision);
        if (!recheck.ok()) {
          broken = true;
          break;
        }
        std::set<std::string> kept;
        for (const std::string& k : *missing) {
          if (still.count(k)) kept.insert(k);
        }
        missing->swap(kept);
      }
    }
    bool done = missing->empty();
    ctx.TryCancel();
    stream->WritesDone();
    grpc::Status finished = stream->Finish();
    clear_cancel();
    unregister();
    if (done) return absl::OkStatus();
    if (cancel != nullptr && cancel->cancelled()) return absl::CancelledError("wait cancelled");
    if (finished.error_code() == grpc::StatusCode::UNAVAILABLE || broken) {
      current_.compare_exchange_strong(index, index + 1);
    }
    return absl::UnavailableError(
        absl::StrCat("etcd watch at ", ep.name, " ended: ", finished.error_message()));
  }

  // Every store key (prefix stripped), sorted; *revision: the read's.
  absl::StatusOr<std::vector<std::string>> ListPrefix(absl::Time deadline, int64_t* revision) {
    pb::RangeRequest req;
    req.set_key(opt_.prefix);
    req.set_range_end(EtcdPrefixEnd(opt_.prefix));
    req.set_keys_only(true);
    pb::RangeResponse resp;
    RETURN_IF_ERROR(Call("list", deadline, true, [&](Endpoint& ep, grpc::ClientContext& ctx) {
      resp.Clear();
      return ep.kv->Range(&ctx, req, &resp);
    }));
    if (revision != nullptr) *revision = resp.header().revision();
    std::vector<std::string> keys;
    keys.reserve(resp.kvs_size());
    for (const auto& kv : resp.kvs()) keys.push_back(kv.key().substr(opt_.prefix.size()));
    return keys;
  }

  // Adds of one key coalesced: one caller runs one read-modify-write for
  // the sum of every delta queued (its own among them), under its own
  // deadline, and hands each its result; then the first caller queued
  // meanwhile runs the next round, so that no caller's reply waits on
  // others' rounds.
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta, absl::Time deadline) {
    auto self = std::make_shared<PendingAdd>();
    self->delta = delta;
    std::string k(key);
    add_mu_.Lock();
    AddQueue& q = adds_[k];
    q.queued.push_back(self);
    if (q.running) {
      // Each waiter sleeps on its own notification (with hundreds of them a
      // shared Mutex::Await would have every unlock re-evaluate them all)
      // and reads its result without the lock: the notification orders it,
      // and hundreds of woken waiters re-taking add_mu_ would form a convoy
      // that delays the replies and the next round.
      add_mu_.Unlock();
      self->notified.WaitForNotification();
      if (!self->runs_next) return self->result;
      add_mu_.Lock();
    } else {
      q.running = true;
      // The first round guesses "missing" (a barrier's fresh counter)
      // instead of reading first: a wrong guess costs nothing, the failed
      // Txn reads the value back.
      q.last = std::vector<Read>(1);
    }
    {
      std::vector<std::shared_ptr<PendingAdd>> batch;
      batch.swap(adds_[k].queued);
      std::optional<std::vector<Read>> last;
      last.swap(adds_[k].last);  // leaves none: a failed round guesses nothing
      add_mu_.Unlock();
      uint64_t sum = 0;
      for (const auto& p : batch) sum += static_cast<uint64_t>(p->delta);
      int64_t after = 0;
      std::vector<Read> written;
      absl::Status s = Modify(
          "add", {k}, deadline,
          [&](const std::vector<Read>& cur)
              -> absl::StatusOr<std::vector<std::optional<std::string>>> {
            int64_t value = 0;
            if (cur[0].value.has_value()) {
              std::optional<int64_t> parsed = wire::ParseCounter(*cur[0].value);
              if (!parsed.has_value()) {
                return absl::FailedPreconditionError(absl::StrCat(
                    "ADD on key '", wire::PrintableKey(k), "' whose value is not a number (",
                    cur[0].value->size(), " bytes)"));
              }
              value = *parsed;
            }
            after = static_cast<int64_t>(static_cast<uint64_t>(value) + sum);
            return std::vector<std::optional<std::string>>{absl::StrCat(after)};
          },
          last.has_value() ? &*last : nullptr, &written);
      batches_.fetch_add(1);
      uint64_t running = static_cast<uint64_t>(after) - sum;
      // Results handed out without the lock.
      for (const auto& p : batch) {
        if (s.ok()) {
          running += static_cast<uint64_t>(p->delta);
          p->result = static_cast<int64_t>(running);
        } else {
          p->result = s;
        }
        if (p != self) p->notified.Notify();
      }
      add_mu_.Lock();
      AddQueue& next = adds_[k];
      if (next.queued.empty()) {
        adds_.erase(k);
      } else {
        if (s.ok()) next.last = std::move(written);
        next.queued.front()->runs_next = true;
        next.queued.front()->notified.Notify();
      }
    }
    add_mu_.Unlock();
    return self->result;
  }

  uint64_t add_batches() const { return batches_.load(); }

  // ---- Queues (EtcdStore::QueuePush and friends; see the header) ----

  // The root of every queue's items: the prefix with its last byte replaced
  // by "\0queues" and that byte, so it sorts just before the store's key
  // range and no store key (nor a prefix given on a command line) can
  // reach it.
  absl::StatusOr<std::string> QueueRoot() const {
    if (opt_.prefix.empty() || opt_.prefix.back() == '\0') {
      return absl::FailedPreconditionError(
          "etcd store: queues need a key prefix (--etcd-prefix) not ending in a NUL byte");
    }
    std::string root = opt_.prefix.substr(0, opt_.prefix.size() - 1);
    root.append(std::string("\0queues", 7));
    root.push_back(opt_.prefix.back());
    return root;
  }
  // The prefix of queue `key`'s items: the key's length first, so no queue's
  // prefix is a prefix of another's.
  absl::StatusOr<std::string> QueuePrefix(absl::string_view key) const {
    ASSIGN_OR_RETURN(std::string root, QueueRoot());
    return absl::StrCat(root, key.size(), ":", key, "/");
  }
  // An event's etcd key as the map key (Key(k)) it makes present: a queue
  // item counts for its queue's name.
  std::string MapKeyOfEvent(const std::string& etcd_key) const {
    absl::StatusOr<std::string> root = QueueRoot();
    if (!root.ok() || !absl::StartsWith(etcd_key, *root)) return etcd_key;
    absl::string_view rest = absl::string_view(etcd_key).substr(root->size());
    size_t colon = rest.find(':');
    uint64_t len = 0;
    if (colon == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, colon), &len) ||
        rest.size() < colon + 1 + len) {
      return etcd_key;
    }
    return Key(rest.substr(colon + 1, len));
  }
  // Watch ranges for `missing` (map keys) when queued items count.
  std::vector<std::pair<std::string, std::string>> QueueWatchRanges(
      const std::set<std::string>& missing, bool whole_prefix, bool map_keys) const {
    std::vector<std::pair<std::string, std::string>> ranges;
    std::string root = QueueRoot().value_or("");
    if (whole_prefix) {
      if (map_keys) ranges.emplace_back(opt_.prefix, EtcdPrefixEnd(opt_.prefix));
      ranges.emplace_back(root, EtcdPrefixEnd(root));
      return ranges;
    }
    for (const std::string& k : missing) {
      if (map_keys) ranges.emplace_back(k, "");
      std::string qp = absl::StrCat(root, k.size() - opt_.prefix.size(), ":",
                                    absl::string_view(k).substr(opt_.prefix.size()), "/");
      ranges.emplace_back(qp, EtcdPrefixEnd(qp));
    }
    return ranges;
  }

  // Which of `keys` are missing (as map keys, Key(k)) at one revision:
  // a key is present if `map_keys` and it has a value, or if `queues` and
  // its queue has an item. Txns of at most 128 ranges, later ones at the
  // first one's revision.
  absl::Status ReadPresence(const std::vector<std::string>& keys, absl::Time deadline,
                            bool map_keys, bool queues, std::set<std::string>* missing,
                            int64_t* revision) {
    const size_t per_key = (map_keys ? 1 : 0) + (queues ? 1 : 0);
    const size_t chunk = 128 / per_key;
    *revision = 0;
    for (size_t begin = 0; begin < keys.size(); begin += chunk) {
      size_t end = std::min(keys.size(), begin + chunk);
      pb::TxnRequest req;
      for (size_t i = begin; i < end; ++i) {
        if (map_keys) {
          pb::RangeRequest* r = req.add_success()->mutable_request_range();
          r->set_key(Key(keys[i]));
          r->set_count_only(true);
          if (*revision != 0) r->set_revision(*revision);
        }
        if (queues) {
          ASSIGN_OR_RETURN(std::string qp, QueuePrefix(keys[i]));
          pb::RangeRequest* r = req.add_success()->mutable_request_range();
          r->set_key(qp);
          r->set_range_end(EtcdPrefixEnd(qp));
          r->set_count_only(true);
          if (*revision != 0) r->set_revision(*revision);
        }
      }
      pb::TxnResponse resp;
      RETURN_IF_ERROR(Call("read", deadline, true, [&](Endpoint& ep, grpc::ClientContext& ctx) {
        resp.Clear();
        return ep.kv->Txn(&ctx, req, &resp);
      }));
      if (*revision == 0) *revision = resp.header().revision();
      for (size_t i = begin; i < end; ++i) {
        bool present = false;
        for (size_t j = 0; j < per_key; ++j) {
          present =
              present ||
              resp.responses(static_cast<int>((i - begin) * per_key + j)).response_range().count() >
                  0;
        }
        if (!present) missing->insert(Key(keys[i]));
      }
    }
    return absl::OkStatus();
  }

  // Blocks until every key is present in ReadPresence's sense (or
  // deadline / cancel): a read, then a watch from the revision after it.
  absl::Status WaitPresent(const std::vector<std::string>& keys, absl::Time deadline,
                           absl::Duration timeout, WaitCancel* cancel, bool map_keys, bool queues) {
    for (;;) {
      if (cancel != nullptr && cancel->cancelled()) return absl::CancelledError("wait cancelled");
      if (stopping_.load()) return absl::UnavailableError("musterd's store is shutting down");
      std::set<std::string> missing;
      int64_t revision = 0;
      RETURN_IF_ERROR(ReadPresence(keys, std::max(deadline, absl::Now() + absl::Seconds(1)),
                                   map_keys, queues, &missing, &revision));
      if (missing.empty()) return absl::OkStatus();
      if (absl::Now() >= deadline) return TimedOut(missing, timeout);
      absl::Status watched =
          WatchUntilPresent(&missing, revision, deadline, cancel, map_keys, queues);
      if (watched.ok() || missing.empty()) return absl::OkStatus();
      if (absl::IsCancelled(watched)) return watched;
      if (absl::Now() >= deadline) return TimedOut(missing, timeout);
      absl::SleepFor(std::min(absl::Milliseconds(50), deadline - absl::Now()));
    }
  }

  absl::Status QueuePush(absl::string_view key, absl::string_view value, absl::Time deadline) {
    ASSIGN_OR_RETURN(std::string qp, QueuePrefix(key));
    pb::PutRequest req;
    // Unique across musterds (a random id per EtcdStore) and pushes; the
    // order is the create revision's, not the name's.
    req.set_key(absl::StrCat(qp, absl::Hex(store_id_, absl::kZeroPad16), "-",
                             absl::Hex(pushes_.fetch_add(1), absl::kZeroPad16)));
    req.set_value(std::string(value));
    pb::PutResponse resp;
    // Not repeated after a lost reply: the first Put may have been applied
    // and its item popped since, so a second would queue the value twice.
    return Call("queue_push", deadline, false, [&](Endpoint& ep, grpc::ClientContext& ctx) {
      resp.Clear();
      return ep.kv->Put(&ctx, req, &resp);
    });
  }

  // One non-blocking pop: the queue's length before it (0: empty). This
  // node's pops of one queue take turns (a stripe lock), so they do not
  // race each other for the oldest item; only other musterds' pops
  // conflict.
  absl::StatusOr<int64_t> QueuePopOnce(absl::string_view key, std::string* value,
                                       absl::Time deadline) {
    ASSIGN_OR_RETURN(std::string qp, QueuePrefix(key));
    absl::Mutex& turn = pop_turns_[std::hash<std::string>{}(qp) % pop_turns_.size()];
    if (!turn.LockWhenWithDeadline(absl::Condition::kTrue, deadline)) {
      turn.Unlock();
      return absl::UnavailableError(
          absl::StrCat("etcd queue_pop: this musterd's earlier pops of queue '",
                       wire::PrintableKey(key), "' still ran at the deadline"));
    }
    auto unlock = [&turn](void*) { turn.Unlock(); };
    std::unique_ptr<void, decltype(unlock)> unlocker(&turn, unlock);
    pb::RangeRequest oldest;
    oldest.set_key(qp);
    oldest.set_range_end(EtcdPrefixEnd(qp));
    oldest.set_sort_target(pb::RangeRequest::CREATE);
    oldest.set_sort_order(pb::RangeRequest::ASCEND);
    oldest.set_limit(1);
    pb::RangeResponse head;
    RETURN_IF_ERROR(
        Call("queue_pop (read)", deadline, true, [&](Endpoint& ep, grpc::ClientContext& ctx) {
          head.Clear();
          return ep.kv->Range(&ctx, oldest, &head);
        }));
    for (;;) {
      if (head.kvs_size() == 0) return 0;
      const std::string item = head.kvs(0).key();
      pb::TxnRequest txn;
      pb::Compare* c = txn.add_compare();
      c->set_key(item);
      c->set_target(pb::Compare::MOD);
      c->set_result(pb::Compare::EQUAL);
      c->set_mod_revision(head.kvs(0).mod_revision());
      pb::RangeRequest* count = txn.add_success()->mutable_request_range();
      count->set_key(qp);
      count->set_range_end(EtcdPrefixEnd(qp));
      count->set_count_only(true);
      txn.add_success()->mutable_request_delete_range()->set_key(item);
      *txn.add_failure()->mutable_request_range() = oldest;
      pb::TxnResponse resp;
      RETURN_IF_ERROR(
          Call("queue_pop", deadline, false, [&](Endpoint& ep, grpc::ClientContext& ctx) {
            resp.Clear();
            return ep.kv->Txn(&ctx, txn, &resp);
          }));
      if (resp.succeeded()) {
        *value = head.kvs(0).value();
        return resp.responses(0).response_range().count();
      }
      // Another popper took it: the failed Txn read the new oldest item.
      pop_conflicts_.fetch_add(1);
      head = resp.responses(0).response_range();
      if (absl::Now() >= deadline) {
        return absl::UnavailableError(
            "etcd queue_pop: still conflicting with other poppers at the deadline");
      }
    }
  }

  absl::StatusOr<int64_t> QueuePop(absl::string_view key, std::string* value,
                                   absl::Duration timeout, WaitCancel* cancel,
                                   absl::Duration call_timeout) {
    absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      // Each pop gets the store's call timeout, not the (maybe year-long)
      // wait's: only the wait in between is what the caller may cancel.
      ASSIGN_OR_RETURN(int64_t before, QueuePopOnce(key, value, absl::Now() + call_timeout));
      if (before > 0 || timeout <= absl::ZeroDuration()) return before;
      absl::Status w = WaitPresent({std::string(key)}, deadline, timeout, cancel,
                                   /*map_keys=*/false, /*queues=*/true);
      if (absl::IsDeadlineExceeded(w)) {
        return absl::DeadlineExceededError(absl::StrCat("queue_pop timed out after ",
                                                        absl::FormatDuration(timeout), ": queue '",
                                                        wire::PrintableKey(key), "' stayed empty"));
      }
      RETURN_IF_ERROR(w);
    }
  }

  absl::StatusOr<int64_t> QueueLen(absl::string_view key, absl::Time deadline) {
    ASSIGN_OR_RETURN(std::string qp, QueuePrefix(key));
    pb::RangeRequest req;
    req.set_key(qp);
    req.set_range_end(EtcdPrefixEnd(qp));
    req.set_count_only(true);
    pb::RangeResponse resp;
    RETURN_IF_ERROR(Call("queue_len", deadline, true, [&](Endpoint& ep, grpc::ClientContext& ctx) {
      resp.Clear();
      return ep.kv->Range(&ctx, req, &resp);
    }));
    return resp.count();
  }

  uint64_t pop_conflicts() const { return pop_conflicts_.load(); }

  // Ends every watch now and makes calls stop retrying.
  void Shutdown() {
    stopping_.store(true);
    absl::MutexLock lock(&watches_mu_);
    for (grpc::ClientContext* ctx : watches_) ctx->TryCancel();
  }

 private:
  absl::Status AddToken(Endpoint& ep, grpc::ClientContext& ctx, absl::Time deadline) {
    return token_.AddTo(ep, ctx, deadline, opt_);
  }
  void DropToken() { token_.Drop(); }

  struct PendingRead {
    absl::Notification notified;
    ReadResult result;
    bool runs_next = false;  // notified to run the next batch (its own in it)
  };
  struct ReadQueue {
    bool running = false;
    std::vector<std::shared_ptr<PendingRead>> queued;
    // The batch in flight, and when it was sent.
    std::vector<std::shared_ptr<PendingRead>> sent;
    absl::Time sent_at;
    bool joinable = false;  // `sent` takes late joiners (until its results go out)
  };
  // A flag one thread sleeps on and others set (idempotent).
  struct Wake {
    absl::Mutex mu;
    bool set ABSL_GUARDED_BY(mu) = false;
    void Set() {
      absl::MutexLock lock(&mu);
      set = true;
    }
    // False at the deadline.
    bool WaitUntil(absl::Time deadline) {
      absl::MutexLock lock(&mu);
      return mu.AwaitWithDeadline(absl::Condition(&set), deadline);
    }
  };
  struct Flight {
    bool done = false;  // guarded by flight_mu_, like the rest
    absl::Status status;
    std::vector<std::shared_ptr<Wake>> waiters;  // woken when done
  };

  struct PendingAdd {
    int64_t delta = 0;
    absl::Notification notified;
    absl::StatusOr<int64_t> result;
    bool runs_next = false;  // notified to run the next round (its own add in it)
  };
  struct AddQueue {
    bool running = false;
    std::vector<std::shared_ptr<PendingAdd>> queued;
    // What the last round wrote: the next round's guess of the value.
    std::optional<std::vector<Read>> last;
  };

  EtcdStoreOptions opt_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::atomic<size_t> current_{0};
  std::atomic<bool> stopping_{false};
  absl::Mutex watches_mu_;
  std::set<grpc::ClientContext*> watches_ ABSL_GUARDED_BY(watches_mu_);
  EtcdToken token_;
  absl::Mutex add_mu_;
  std::map<std::string, AddQueue> adds_ ABSL_GUARDED_BY(add_mu_);
  std::atomic<uint64_t> batches_{0};
  // Queue item names: this store's random id and a push counter.
  const uint64_t store_id_ = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  std::atomic<uint64_t> pushes_{0};
  std::atomic<uint64_t> pop_conflicts_{0};
  std::array<absl::Mutex, 16> pop_turns_;
  absl::Mutex read_mu_;
  std::map<std::pair<std::vector<std::string>, bool>, ReadQueue> reads_ ABSL_GUARDED_BY(read_mu_);
  absl::Mutex flight_mu_;
  std::map<std::vector<std::string>, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(flight_mu_);
  std::map<std::vector<std::string>, std::shared_ptr<Flight>> queued_flights_
      ABSL_GUARDED_BY(flight_mu_);
};

absl::StatusOr<std::unique_ptr<EtcdStore>> EtcdStore::Create(EtcdStoreOptions options) {
  auto impl = std::make_unique<Impl>(options);
  RETURN_IF_ERROR(impl->Connect());
  return std::unique_ptr<EtcdStore>(new EtcdStore(std::move(impl), std::move(options)));
}

EtcdStore::EtcdStore(std::unique_ptr<Impl> impl, EtcdStoreOptions options)
    : impl_(std::move(impl)), options_(std::move(options)) {}
EtcdStore::~EtcdStore() = default;

absl::Status EtcdStore::Set(absl::string_view key, absl::string_view value) {
  pb::PutRequest req;
  req.set_key(impl_->Key(key));
  req.set_value(std::string(value));
  pb::PutResponse resp;
  return impl_->Call(
      "put", absl::Now() + timeout(), true,
      [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.kv->Put(&ctx, req, &resp); });
}

absl::StatusOr<std::string> EtcdStore::Get(absl::string_view key, absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::vector<std::string> v, MultiGet({std::string(key)}, timeout));
  return std::move(v[0]);
}

absl::StatusOr<int64_t> EtcdStore::Add(absl::string_view key, int64_t delta) {
  return impl_->Add(key, delta, absl::Now() + timeout());
}

absl::StatusOr<std::string> EtcdStore::CompareSet(absl::string_view key, absl::string_view expected,
                                                  absl::string_view desired) {
  std::string reply;
  RETURN_IF_ERROR(impl_->Modify(
      "compare_set", {std::string(key)}, absl::Now() + timeout(),
      [&](const std::vector<Read>& cur) -> absl::StatusOr<std::vector<std::optional<std::string>>> {
        return std::vector<std::optional<std::string>>{
            wire::CompareSetResult(cur[0].value, expected, desired, &reply)};
      }));
  return reply;
}

absl::Status EtcdStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  return impl_->WaitFor(keys, absl::Now() + timeout, timeout, nullptr);
}

absl::Status EtcdStore::WaitCancellable(const std::vector<std::string>& keys,
                                        absl::Duration timeout, WaitCancel* cancel) {
  return impl_->WaitFor(keys, absl::Now() + timeout, timeout, cancel);
}

absl::StatusOr<bool> EtcdStore::Check(const std::vector<std::string>& keys) {
  ASSIGN_OR_RETURN(std::vector<std::string> missing, Missing(keys));
  return missing.empty();
}

absl::StatusOr<std::vector<std::string>> EtcdStore::Missing(const std::vector<std::string>& keys) {
  std::vector<std::string> missing;
  absl::Time deadline = absl::Now() + timeout();
  if (keys.size() > 128) {
    ASSIGN_OR_RETURN(std::vector<std::string> present, impl_->ListPrefix(deadline, nullptr));
    std::set<std::string> have(present.begin(), present.end());
    for (const std::string& k : keys) {
      if (!have.count(k)) missing.push_back(k);
    }
    return missing;
  }
  ASSIGN_OR_RETURN(auto read, impl_->ReadKeys(keys, deadline, true));
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!read.first[i].value.has_value()) missing.push_back(keys[i]);
  }
  return missing;
}

absl::StatusOr<bool> EtcdStore::DeleteKey(absl::string_view key) {
  pb::DeleteRangeRequest req;
  req.set_key(impl_->Key(key));
  pb::DeleteRangeResponse resp;
  RETURN_IF_ERROR(impl_->Call("delete", absl::Now() + timeout(), true,
                              [&](Endpoint& ep, grpc::ClientContext& ctx) {
                                resp.Clear();
                                return ep.kv->DeleteRange(&ctx, req, &resp);
                              }));
  return resp.deleted() > 0;
}

absl::StatusOr<int64_t> EtcdStore::NumKeys() {
  pb::RangeRequest req;
  req.set_key(options_.prefix);
  req.set_range_end(EtcdPrefixEnd(options_.prefix));
  req.set_count_only(true);
  pb::RangeResponse resp;
  RETURN_IF_ERROR(impl_->Call("count", absl::Now() + timeout(), true,
                              [&](Endpoint& ep, grpc::ClientContext& ctx) {
                                resp.Clear();
                                return ep.kv->Range(&ctx, req, &resp);
                              }));
  return resp.count();
}

absl::Status EtcdStore::Append(absl::string_view key, absl::string_view value) {
  return impl_->Modify(
      "append", {std::string(key)}, absl::Now() + timeout(),
      [&](const std::vector<Read>& cur) -> absl::StatusOr<std::vector<std::optional<std::string>>> {
        return std::vector<std::optional<std::string>>{
            absl::StrCat(cur[0].value.value_or(""), value)};
      });
}

absl::StatusOr<std::vector<std::string>> EtcdStore::MultiGet(const std::vector<std::string>& keys,
                                                             absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    ASSIGN_OR_RETURN(
        auto read,
        impl_->ReadKeys(keys, std::max(deadline, absl::Now() + absl::Seconds(1)), false));
    std::vector<std::string> values;
    bool all = true;
    for (Read& r : read.first) {
      if (!r.value.has_value()) {
        all = false;
        break;
      }
      values.push_back(std::move(*r.value));
    }
    if (all) return values;
    RETURN_IF_ERROR(impl_->WaitFor(keys, deadline, timeout, nullptr));
  }
}

absl::Status EtcdStore::MultiSet(const std::vector<std::string>& keys,
                                 const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    return absl::InvalidArgumentError("MultiSet: keys and values differ in number");
  }
  absl::Time deadline = absl::Now() + timeout();
  for (size_t begin = 0; begin < keys.size(); begin += 128) {
    pb::TxnRequest req;
    for (size_t i = begin; i < std::min(keys.size(), begin + 128); ++i) {
      pb::PutRequest* put = req.add_success()->mutable_request_put();
      put->set_key(impl_->Key(keys[i]));
      put->set_value(values[i]);
    }
    pb::TxnResponse resp;
    RETURN_IF_ERROR(impl_->Call(
        "multi_set", deadline, true,
        [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.kv->Txn(&ctx, req, &resp); }));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> EtcdStore::ListKeys() {
  return impl_->ListPrefix(absl::Now() + timeout(), nullptr);
}

uint64_t EtcdStore::add_rounds() const { return impl_->add_batches(); }

absl::Status EtcdStore::QueuePush(absl::string_view key, absl::string_view value) {
  return impl_->QueuePush(key, value, absl::Now() + timeout());
}

absl::StatusOr<int64_t> EtcdStore::QueuePop(absl::string_view key, std::string* value,
                                            absl::Duration timeout, WaitCancel* cancel) {
  return impl_->QueuePop(key, value, timeout, cancel, this->timeout());
}

absl::StatusOr<int64_t> EtcdStore::QueueLen(absl::string_view key) {
  return impl_->QueueLen(key, absl::Now() + timeout());
}

absl::Status EtcdStore::WaitCancellableOrQueued(const std::vector<std::string>& keys,
                                                absl::Duration timeout, WaitCancel* cancel) {
  return impl_->WaitFor(keys, absl::Now() + timeout, timeout, cancel, /*queues=*/true);
}

absl::StatusOr<std::vector<std::string>> EtcdStore::MissingOrQueued(
    const std::vector<std::string>& keys) {
  std::set<std::string> missing;
  int64_t revision = 0;
  RETURN_IF_ERROR(impl_->ReadPresence(keys, absl::Now() + timeout(), /*map_keys=*/true,
                                      /*queues=*/true, &missing, &revision));
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    if (missing.count(impl_->Key(k))) out.push_back(k);
  }
  return out;
}

uint64_t EtcdStore::queue_pop_conflicts() const { return impl_->pop_conflicts(); }

absl::StatusOr<std::vector<std::string>> EtcdStore::ValuesSince(
    const std::vector<std::string>& keys, absl::Time since) {
  ASSIGN_OR_RETURN(auto read, impl_->ReadKeys(keys, absl::Now() + timeout(), false, since));
  std::vector<std::string> values;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!read.first[i].value.has_value()) {
      return absl::NotFoundError(
          absl::StrCat("key '", wire::PrintableKey(keys[i]), "' was deleted after its wait"));
    }
    values.push_back(std::move(*read.first[i].value));
  }
  return values;
}

void EtcdStore::Shutdown() { impl_->Shutdown(); }

}  // namespace muster
