#include "daemon/store/local_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace muster {
namespace {

using Loop = StoreServer::Loop;

absl::Status Stopped() { return absl::UnavailableError("musterd's store is shutting down"); }

// A result the loop fills in and the calling thread waits for.
template <typename T>
struct Pending {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<T> result ABSL_GUARDED_BY(mu) = absl::UnknownError("unset");

  void Finish(absl::StatusOr<T> r) {
    absl::MutexLock lock(&mu);
    if (done) return;
    result = std::move(r);
    done = true;
  }
  absl::StatusOr<T> Await() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&done));
    return std::move(result);
  }
};

// Finishes `pending` with `result` once this iteration's log flush is done
// (a failed flush rolled the writes back: the call fails with it).
template <typename T>
void FinishAfterFlush(Loop& loop, std::shared_ptr<Pending<T>> pending, absl::StatusOr<T> result) {
  Loop* l = &loop;
  loop.AfterFlush([l, pending, result = std::move(result)]() mutable {
    absl::Status flushed = l->flush_status();
    pending->Finish(flushed.ok() ? std::move(result) : absl::StatusOr<T>(flushed));
  });
}

// Runs `op` on the loop (writes only while the log is writable) and waits.
template <typename T>
absl::StatusOr<T> Run(StoreServer* server, bool write, std::function<absl::StatusOr<T>(Loop&)> op) {
  auto pending = std::make_shared<Pending<T>>();
  bool posted = server->Post([pending, write, op = std::move(op)](Loop& loop) {
    if (loop.stopping()) {
      pending->Finish(Stopped());
      return;
    }
    if (write) {
      if (absl::Status s = loop.writable(); !s.ok()) {
        pending->Finish(s);
        return;
      }
    }
    FinishAfterFlush(loop, pending, op(loop));
  });
  if (!posted) return Stopped();
  return pending->Await();
}

// Waits on the loop until every key exists (then runs `op`), `timeout`
// (DEADLINE_EXCEEDED naming the missing keys) or shutdown.
template <typename T>
absl::StatusOr<T> RunWhenPresent(StoreServer* server, std::vector<std::string> keys,
                                 absl::Duration timeout,
                                 std::function<absl::StatusOr<T>(Loop&)> op) {
  auto pending = std::make_shared<Pending<T>>();
  bool posted = server->Post([pending, keys = std::move(keys), timeout,
                              op = std::move(op)](Loop& loop) mutable {
    if (loop.stopping()) {
      pending->Finish(Stopped());
      return;
    }
    Loop* l = &loop;
    WhenPresent(
        loop, std::move(keys), timeout, [l, pending, op] { FinishAfterFlush(*l, pending, op(*l)); },
        [pending](absl::Status expired) { pending->Finish(std::move(expired)); });
  });
  if (!posted) return Stopped();
  return pending->Await();
}

struct Empty {};

// The value of `key` once WhenPresent saw every key: a key present only as a
// queue (QUEUE_PUSH), or one of several deleted while the others were
// awaited, has none.
absl::StatusOr<std::string> ValueOf(Loop& loop, const std::string& key) {
  const std::string* value = loop.kv().Find(key);
  if (value == nullptr) return NoValue(key);
  return *value;
}

absl::Status StatusOf(const absl::StatusOr<Empty>& r) { return r.status(); }

absl::StatusOr<Empty> EmptyOr(const absl::Status& s) {
  if (!s.ok()) return s;
  return Empty{};
}

}  // namespace

absl::Status LocalStore::Set(absl::string_view key, absl::string_view value) {
  std::string k(key), v(value);
  return StatusOf(Run<Empty>(server_, /*write=*/true,
                             [k, v](Loop& loop) { return EmptyOr(loop.kv().Set(k, v)); }));
}

absl::StatusOr<std::string> LocalStore::Get(absl::string_view key, absl::Duration timeout) {
  std::string k(key);
  return RunWhenPresent<std::string>(server_, {k}, timeout,
                                     [k](Loop& loop) { return ValueOf(loop, k); });
}

absl::StatusOr<int64_t> LocalStore::Add(absl::string_view key, int64_t delta) {
  std::string k(key);
  return Run<int64_t>(server_, /*write=*/true,
                      [k, delta](Loop& loop) { return loop.kv().Add(k, delta); });
}

absl::StatusOr<std::string> LocalStore::CompareSet(absl::string_view key,
                                                   absl::string_view expected,
                                                   absl::string_view desired) {
  std::string k(key), e(expected), d(desired);
  return Run<std::string>(server_, /*write=*/true,
                          [k, e, d](Loop& loop) { return loop.kv().CompareSet(k, e, d); });
}

absl::Status LocalStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  return StatusOf(RunWhenPresent<Empty>(server_, keys, timeout,
                                        [](Loop&) { return absl::StatusOr<Empty>(Empty{}); }));
}

absl::StatusOr<bool> LocalStore::Check(const std::vector<std::string>& keys) {
  return Run<bool>(server_, /*write=*/false,
                   [keys](Loop& loop) { return absl::StatusOr<bool>(loop.kv().Check(keys)); });
}

absl::StatusOr<bool> LocalStore::DeleteKey(absl::string_view key) {
  std::string k(key);
  return Run<bool>(server_, /*write=*/true,
                   [k](Loop& loop) { return absl::StatusOr<bool>(loop.kv().Delete(k)); });
}

absl::StatusOr<int64_t> LocalStore::NumKeys() {
  return Run<int64_t>(server_, /*write=*/false,
                      [](Loop& loop) { return absl::StatusOr<int64_t>(loop.kv().NumKeys()); });
}

absl::Status LocalStore::Append(absl::string_view key, absl::string_view value) {
  std::string k(key), v(value);
  return StatusOf(Run<Empty>(server_, /*write=*/true,
                             [k, v](Loop& loop) { return EmptyOr(loop.kv().Append(k, v)); }));
}

absl::StatusOr<std::vector<std::string>> LocalStore::MultiGet(const std::vector<std::string>& keys,
                                                              absl::Duration timeout) {
  return RunWhenPresent<std::vector<std::string>>(server_, keys, timeout, [keys](Loop& loop) {
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (const std::string& k : keys) {
      absl::StatusOr<std::string> value = ValueOf(loop, k);
      if (!value.ok()) return absl::StatusOr<std::vector<std::string>>(value.status());
      values.push_back(*std::move(value));
    }
    return absl::StatusOr<std::vector<std::string>>(std::move(values));
  });
}

absl::Status LocalStore::MultiSet(const std::vector<std::string>& keys,
                                  const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("multi_set of ", keys.size(), " keys with ", values.size(), " values"));
  }
  return StatusOf(Run<Empty>(server_, /*write=*/true, [keys, values](Loop& loop) {
    return EmptyOr(loop.kv().MultiSet(keys, values));
  }));
}

absl::StatusOr<std::vector<std::string>> LocalStore::ListKeys() {
  return Run<std::vector<std::string>>(server_, /*write=*/false, [](Loop& loop) {
    return absl::StatusOr<std::vector<std::string>>(loop.kv().ListKeys());
  });
}

LocalStore::Cancel LocalStore::Watch(StoreServer* server, std::vector<std::string> keys,
                                     std::function<void(absl::Status)> ready) {
  // Shared by the loop and the canceller. `mu` orders `ready` with Cancel:
  // once `cancelled` is set under it, `ready` never starts.
  struct State {
    absl::Mutex mu;
    bool cancelled ABSL_GUARDED_BY(mu) = false;
    bool fired ABSL_GUARDED_BY(mu) = false;
    std::function<void(absl::Status)> ready;
    // Loop thread only.
    KvStore::WaitId wait = 0;
    StoreServer::TimerId timer = 0;
  };
  auto state = std::make_shared<State>();
  state->ready = std::move(ready);
  auto fire = [state](absl::Status status) {
    absl::MutexLock lock(&state->mu);
    if (state->cancelled || state->fired) return;
    state->fired = true;
    state->ready(std::move(status));
  };
  bool posted = server->Post([state, fire, keys = std::move(keys)](Loop& loop) {
    if (loop.stopping()) {
      fire(Stopped());
      return;
    }
    {
      absl::MutexLock lock(&state->mu);
      if (state->cancelled) return;
    }
    Loop* l = &loop;
    state->wait = loop.kv().Wait(keys, [state, fire, l] {
      state->wait = 0;
      if (state->timer != 0) l->CancelTimer(state->timer);
      state->timer = 0;
      fire(absl::OkStatus());
    });
    if (state->wait == 0) {
      fire(absl::OkStatus());
      return;
    }
    // Timers fire early at shutdown: the watcher learns the store is gone.
    state->timer = loop.AddTimer(absl::Now() + absl::Hours(24 * 365), [state, fire, l] {
      state->timer = 0;
      if (state->wait != 0) l->kv().CancelWait(state->wait);
      state->wait = 0;
      fire(Stopped());
    });
  });
  if (!posted) {
    fire(Stopped());
    return [] {};
  }
  return [state, server] {
    {
      absl::MutexLock lock(&state->mu);
      if (state->cancelled) return;
      state->cancelled = true;
    }
    server->Post([state](Loop& loop) {
      if (state->wait != 0) loop.kv().CancelWait(state->wait);
      if (state->timer != 0) loop.CancelTimer(state->timer);
      state->wait = 0;
      state->timer = 0;
    });
  };
}

}  // namespace muster
