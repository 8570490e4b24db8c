// WorkerPool: the registry's threads. A bounded set of threads runs queued
// tasks in submission order; threads start on demand, up to max_threads,
// and end after idle_exit without work (an idle daemon holds none). Tasks that may block for long
// (waits on a job's store) are submitted as kBlocking: at most
// max_threads - reserved_for_short of them run at once, so a short task
// (publishing an arrival some wait needs) always finds a thread.
//
// Thread-safe. Drain() and the destructor wait until every queued task ran;
// tasks must not call them.
#ifndef MUSTER_DAEMON_REGISTRY_WORKER_POOL_H_
#define MUSTER_DAEMON_REGISTRY_WORKER_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace muster {

class WorkerPool {
 public:
  enum class Kind { kShort, kBlocking };

  WorkerPool(int max_threads, int reserved_for_short, absl::Duration idle_exit = absl::Seconds(5));
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Run(Kind kind, std::function<void()> task);
  // Blocks until no task is queued or running.
  void Drain();

  // Threads alive now.
  int threads() const;
  // Tasks queued or running now.
  int pending() const;

 private:
  void Work();
  // With mu_ held: a task this thread may start now, or false.
  bool Take(std::function<void()>* task, Kind* kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Joins threads that ended (their ids are in ended_).
  void JoinEnded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_threads_;
  const int max_blocking_;
  const absl::Duration idle_exit_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> short_ ABSL_GUARDED_BY(mu_);
  std::deque<std::function<void()>> blocking_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int running_blocking_ ABSL_GUARDED_BY(mu_) = 0;
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_DAEMON_REGISTRY_WORKER_POOL_H_
