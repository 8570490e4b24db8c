#include "daemon/registry/worker_pool.h"

#include <algorithm>

namespace muster {

WorkerPool::WorkerPool(int max_threads, int reserved_for_short, absl::Duration idle_exit)
    : max_threads_(std::max(2, max_threads)),
      max_blocking_(std::max(1, max_threads_ - std::max(1, reserved_for_short))),
      idle_exit_(idle_exit) {}

WorkerPool::~WorkerPool() {
  Drain();
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void WorkerPool::JoinEnded() {
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (std::find(ended_.begin(), ended_.end(), it->get_id()) != ended_.end()) {
      it->join();  // it has left Work(), or is about to
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
  ended_.clear();
}

void WorkerPool::Run(Kind kind, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  JoinEnded();
  (kind == Kind::kShort ? short_ : blocking_).push_back(std::move(task));
  // A new thread unless an idle one can take it.
  int startable = static_cast<int>(short_.size()) +
                  std::min<int>(static_cast<int>(blocking_.size()),
                                std::max(0, max_blocking_ - running_blocking_));
  if (startable > idle_ && static_cast<int>(threads_.size()) < max_threads_) {
    ++idle_;  // counted as idle until it takes a task
    threads_.emplace_back([this] { Work(); });
  }
}

bool WorkerPool::Take(std::function<void()>* task, Kind* kind) {
  if (!short_.empty()) {
    *task = std::move(short_.front());
    short_.pop_front();
    *kind = Kind::kShort;
    return true;
  }
  if (!blocking_.empty() && running_blocking_ < max_blocking_) {
    *task = std::move(blocking_.front());
    blocking_.pop_front();
    *kind = Kind::kBlocking;
    ++running_blocking_;
    return true;
  }
  return false;
}

void WorkerPool::Work() {
  absl::MutexLock lock(&mu_);
  while (true) {
    std::function<void()> task;
    Kind kind;
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !short_.empty() ||
             (!blocking_.empty() && running_blocking_ < max_blocking_);
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), idle_exit_)) {
      --idle_;  // idle for long: this thread ends (joined by the next Run)
      ended_.push_back(std::this_thread::get_id());
      return;
    }
    if (!Take(&task, &kind)) {
      if (stopping_) return;
      continue;
    }
    --idle_;
    ++running_;
    mu_.Unlock();
    task();
    task = nullptr;  // destroy captures outside the lock
    mu_.Lock();
    --running_;
    if (kind == Kind::kBlocking) --running_blocking_;
    ++idle_;
  }
}

void WorkerPool::Drain() {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return running_ == 0 && short_.empty() && blocking_.empty();
  };
  mu_.Await(absl::Condition(&done));
}

int WorkerPool::threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size() - ended_.size());
}

int WorkerPool::pending() const {
  absl::MutexLock lock(&mu_);
  return running_ + static_cast<int>(short_.size() + blocking_.size());
}

}  // namespace muster
