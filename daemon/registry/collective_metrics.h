// CollectiveMetrics: musterd's per-op collective counters for /metrics,
// derived from the flight recorder of the groups' segments (the ranks
// report nothing extra; recording stays the only cost on their path).
//
// A sweep reads every member ring of every segment it is given from the
// first record it has not accounted for yet (a cursor per ring) and counts
// each record once, when it has finished (completed or failed): the call,
// its input bytes (count x dtype size) and its duration (started, or
// submitted, to completed) for completed ones, its failure cause for
// failed ones. Records still running hold the cursor back; finished ones
// after them are counted and remembered until the cursor passes them, so
// nothing is counted twice. A ring wraps after `--trace-records` calls: if
// it wrapped past a ring's cursor between two sweeps, the records it lost
// are unknown (their op too) and counted in `missed` only. musterd sweeps
// every 100 ms and on each scrape, so a rank may issue up to
// trace_records / 0.1 s (20,480 per second by default) on one group
// without losing any to the metrics. A segment that is no longer offered
// (its group was destroyed, re-formed or removed) is swept a last time and
// then forgotten.
//
// Labels are bounded: op (TraceOpName: 20 values), backend (shm, gloo,
// nccl, third_party: the group's backend config for the record's device,
// any name muster does not define counts as third_party), cause (timeout,
// aborted, mismatch, peer_gone, invalid_argument, other).
//
// Thread-safe (one mutex; sweeps run on any thread, never under the
// registry's lock).
#ifndef MUSTER_DAEMON_REGISTRY_COLLECTIVE_METRICS_H_
#define MUSTER_DAEMON_REGISTRY_COLLECTIVE_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "backends/shm/segment.h"
#include "daemon/metrics/metrics_text.h"

namespace muster {

// The backend a record of `device` (0 cpu, 1 cuda) ran on under group
// backend config `config` ("gloo", "cpu:gloo,cuda:nccl", ...), as a bounded
// label value.
std::string CollectiveBackendLabel(const std::string& config, int device);
// The failure cause label of an absl::StatusCode.
const char* CollectiveFailureCause(int code);

class CollectiveMetrics {
 public:
  // A segment to sweep: `key` names it for as long as it lives (its shm
  // name); `backend` is its group's backend config.
  struct Source {
    std::string key;
    std::shared_ptr<GroupSegment> segment;
    std::string backend;
  };
  // Counts what the rings of `sources` recorded since the last sweep; the
  // segments of earlier sweeps not in `sources` are swept once more and
  // dropped.
  void Sweep(const std::vector<Source>& sources);

  using OpBackend = std::pair<std::string, std::string>;
  struct Snapshot {
    std::map<OpBackend, uint64_t> calls;               // finished calls (completed or failed)
    std::map<OpBackend, uint64_t> bytes;               // input bytes of the completed ones
    std::map<OpBackend, Histogram::Snapshot> seconds;  // durations of the completed ones
    std::map<std::tuple<std::string, std::string, std::string>, uint64_t> failures;  // + cause
    std::map<std::string, uint64_t> missed;  // backend -> records lost to a wrapped ring
  };
  Snapshot snapshot();

 private:
  struct Ring {
    uint64_t cursor = 1;          // every id below it is accounted for
    std::set<uint64_t> finished;  // ids >= cursor already counted
  };
  struct Tracked {
    std::shared_ptr<GroupSegment> segment;
    std::string backend;
    std::vector<Ring> rings;
  };
  void SweepOne(Tracked& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::map<std::string, Tracked> tracked_ ABSL_GUARDED_BY(mu_);
  std::map<OpBackend, uint64_t> calls_ ABSL_GUARDED_BY(mu_);
  std::map<OpBackend, uint64_t> bytes_ ABSL_GUARDED_BY(mu_);
  std::map<OpBackend, std::unique_ptr<Histogram>> seconds_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t> failures_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> missed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muster

#endif  // MUSTER_DAEMON_REGISTRY_COLLECTIVE_METRICS_H_
