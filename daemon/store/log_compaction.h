// LogCompaction: the records of a compacted store log, built a slice at a
// time between the store's loop iterations, so that a large store does not
// hold the loop (a 256 MiB store held it 1.4 s).
//
// At the start it takes the names of every key with a value and every queue
// (`pending`). Each Step writes the current contents of some pending keys
// (a SET of the value, a QUEUE_PUSH per item) and drops them from pending.
// Meanwhile every mutation is passed to Record: one of a pending key is
// skipped (its contents, as they are when its turn comes, are written
// then); any other (a key done, or new since the start) is written as it
// comes. Replaying the records in order therefore gives the store as it is
// when pending is empty and the last mutation was recorded. The caller
// writes `out()` to the new file and drops a compaction whose mutations
// might not all be kept (a failed batch).
//
// Not thread-safe: owned by the store log, on the store server's loop.
#ifndef MUSTER_DAEMON_STORE_LOG_COMPACTION_H_
#define MUSTER_DAEMON_STORE_LOG_COMPACTION_H_

#include <cstddef>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "daemon/store/kv_store.h"

namespace muster {

class LogCompaction {
 public:
  explicit LogCompaction(const KvStore& store);
  LogCompaction(const LogCompaction&) = delete;
  LogCompaction& operator=(const LogCompaction&) = delete;

  // A mutation of the store since the start (see above).
  void Record(const Mutation& mutation);
  // Adds the contents of pending keys to out() until they take at least
  // `bytes` (or none are left); true when none are left.
  bool Step(const KvStore& store, size_t bytes);
  // The records not yet taken by the caller.
  std::string& out() { return out_; }

 private:
  absl::flat_hash_set<std::string> values_;  // pending keys with a value
  absl::flat_hash_set<std::string> queues_;  // pending queues
  // Where Step goes on; erasing other elements keeps them valid, and
  // nothing is inserted after the start.
  absl::flat_hash_set<std::string>::iterator next_value_;
  absl::flat_hash_set<std::string>::iterator next_queue_;
  std::string out_;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_LOG_COMPACTION_H_
