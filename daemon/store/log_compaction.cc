#include "daemon/store/log_compaction.h"

#include <deque>

#include "daemon/store/store_log.h"

namespace muster {

LogCompaction::LogCompaction(const KvStore& store) {
  store.ForEachKey([this](absl::string_view key) { values_.emplace(key); });
  store.ForEachQueueItem(
      [this](absl::string_view key, absl::string_view) { queues_.emplace(key); });
  next_value_ = values_.begin();
  next_queue_ = queues_.begin();
}

void LogCompaction::Record(const Mutation& mutation) {
  const bool queue =
      mutation.type == Mutation::Type::kQueuePush || mutation.type == Mutation::Type::kQueuePop;
  const auto& pending = queue ? queues_ : values_;
  if (pending.contains(mutation.key)) return;  // written whole when its turn comes
  EncodeLogRecord(mutation, &out_);
}

bool LogCompaction::Step(const KvStore& store, size_t bytes) {
  // `bytes` of pending contents, whatever the mutations recorded since the
  // last step added: every step moves on by at least one key.
  const size_t until = out_.size() + bytes;
  while (out_.size() < until && next_value_ != values_.end()) {
    if (const std::string* value = store.Find(*next_value_)) {
      EncodeLogRecord(Mutation{Mutation::Type::kSet, *next_value_, *value}, &out_);
    }
    values_.erase(next_value_++);
  }
  while (out_.size() < until && next_queue_ != queues_.end()) {
    if (const std::deque<std::string>* items = store.QueueItems(*next_queue_)) {
      for (const std::string& item : *items) {
        EncodeLogRecord(Mutation{Mutation::Type::kQueuePush, *next_queue_, item}, &out_);
      }
    }
    queues_.erase(next_queue_++);
  }
  return next_value_ == values_.end() && next_queue_ == queues_.end();
}

}  // namespace muster
