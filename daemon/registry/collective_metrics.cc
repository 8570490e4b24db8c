#include "daemon/registry/collective_metrics.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "backends/shm/trace.h"
#include "muster/types.h"

namespace muster {
namespace {

// Elements a single record may add to the bytes counter (a 64-bit count
// written by a rank would wrap it).
constexpr uint64_t kMaxCountedElements = uint64_t{1} << 40;

// 1 µs, 4 µs, ... 16 s: shared-memory collectives take microseconds,
// inter-node ones milliseconds, a stuck one its timeout.
std::vector<double> DurationBounds() {
  std::vector<double> b;
  for (double v = 1e-6; v < 20; v *= 4) b.push_back(v);
  return b;
}

bool Finished(TraceState s) { return s == TraceState::kCompleted || s == TraceState::kFailed; }

}  // namespace

std::string CollectiveBackendLabel(const std::string& config, int device) {
  absl::string_view chosen;
  absl::string_view fallback;
  const absl::string_view want = device == 1 ? "cuda" : "cpu";
  for (absl::string_view part : absl::StrSplit(config, ',')) {
    size_t colon = part.find(':');
    if (colon == absl::string_view::npos) {
      fallback = part;  // one backend for every device
      continue;
    }
    if (part.substr(0, colon) == want) chosen = part.substr(colon + 1);
  }
  if (chosen.empty()) chosen = fallback;
  if (chosen == "gloo" || chosen == "shm" || chosen == "nccl") return std::string(chosen);
  return "third_party";
}

const char* CollectiveFailureCause(int code) {
  switch (static_cast<absl::StatusCode>(code)) {
    case absl::StatusCode::kDeadlineExceeded:
      return "timeout";
    case absl::StatusCode::kAborted:  // the group broke: a member died, an abort
      return "aborted";
    case absl::StatusCode::kFailedPrecondition:  // the members' calls differ (desync)
      return "mismatch";
    case absl::StatusCode::kUnavailable:  // a peer or musterd went away
      return "peer_gone";
    case absl::StatusCode::kInvalidArgument:
      return "invalid_argument";
    default:
      return "other";
  }
}

void CollectiveMetrics::Sweep(const std::vector<Source>& sources) {
  absl::MutexLock lock(&mu_);
  std::set<std::string> offered;
  for (const Source& s : sources) {
    if (s.segment == nullptr) continue;
    offered.insert(s.key);
    auto [it, added] = tracked_.try_emplace(s.key);
    if (added) {
      it->second.segment = s.segment;
      it->second.backend = s.backend;
      it->second.rings.resize(static_cast<size_t>(s.segment->nranks()));
    }
    SweepOne(it->second);
  }
  for (auto it = tracked_.begin(); it != tracked_.end();) {
    if (offered.count(it->first) != 0) {
      ++it;
      continue;
    }
    SweepOne(it->second);  // what its members recorded before the group went
    it = tracked_.erase(it);
  }
}

void CollectiveMetrics::SweepOne(Tracked& t) {
  for (size_t i = 0; i < t.rings.size(); ++i) {
    Ring& ring = t.rings[i];
    TraceRange range;
    std::vector<TraceEntry> entries =
        ReadTraceFrom(*t.segment, static_cast<int>(i), ring.cursor, &range);
    if (range.next == 0) continue;
    // Overwritten before this sweep saw them: unknown calls.
    if (ring.cursor < range.oldest) {
      uint64_t lost = range.oldest - ring.cursor;
      for (auto f = ring.finished.begin(); f != ring.finished.end() && *f < range.oldest;) {
        if (lost > 0) --lost;  // counted earlier, not lost
        f = ring.finished.erase(f);
      }
      if (lost > 0) {
        // Saturated: the ring's header is the rank's to write.
        uint64_t& missed = missed_[CollectiveBackendLabel(t.backend, 0)];
        missed += std::min(lost, UINT64_MAX - missed);
      }
      ring.cursor = range.oldest;
    }
    if (ring.cursor > range.next) continue;  // nothing new (or a header moved back)
    bool advancing = true;
    size_t e = 0;
    // cursor..next, both included: at most a ring's worth (cursor >= oldest
    // >= 1), counted so that next = 2^64 - 1 (the rank writes it) cannot
    // wrap the loop.
    const uint64_t first = ring.cursor, ids = range.next - first + 1;
    for (uint64_t k = 0; k < ids; ++k) {
      const uint64_t id = first + k;
      while (e < entries.size() && entries[e].id < id) ++e;
      const TraceEntry* rec = e < entries.size() && entries[e].id == id ? &entries[e] : nullptr;
      if (rec == nullptr || !Finished(rec->state)) {
        advancing = false;  // running (or being written): counted once it has finished
        continue;
      }
      if (ring.finished.count(id) == 0) {
        const std::string backend = CollectiveBackendLabel(t.backend, rec->device);
        const OpBackend key{TraceOpName(rec->op), backend};
        ++calls_[key];
        if (rec->state == TraceState::kCompleted) {
          uint64_t width = rec->dtype < kNumDTypes ? DTypeSize(static_cast<DType>(rec->dtype)) : 0;
          // Saturated: a rank's count must not wrap the node's counter.
          bytes_[key] += std::min<uint64_t>(rec->count, kMaxCountedElements) * width;
          std::unique_ptr<Histogram>& h = seconds_[key];
          if (h == nullptr) h = std::make_unique<Histogram>(DurationBounds());
          int64_t from = rec->started_ns != 0 ? rec->started_ns : rec->submitted_ns;
          h->Observe(static_cast<double>(std::max<int64_t>(0, rec->completed_ns - from)) * 1e-9);
        } else {
          ++failures_[{key.first, backend, CollectiveFailureCause(rec->error)}];
        }
        if (!advancing) ring.finished.insert(id);
      }
      if (advancing && id != UINT64_MAX) {
        ring.finished.erase(id);
        ring.cursor = id + 1;
      } else if (advancing) {
        ring.finished.insert(id);  // the last id there is: the cursor stays
      }
    }
  }
}

CollectiveMetrics::Snapshot CollectiveMetrics::snapshot() {
  absl::MutexLock lock(&mu_);
  Snapshot s;
  s.calls = calls_;
  s.bytes = bytes_;
  for (const auto& [key, h] : seconds_) s.seconds[key] = h->snapshot();
  s.failures = failures_;
  s.missed = missed_;
  return s;
}

}  // namespace muster
