// StoreMetrics: what musterd's store counts for /metrics -- requests from
// its TCP clients (torch's and muster's native protocol) by operation, and
// the time each took on the loop thread, from its parsed request to its
// reply queued (a parked wait's waiting is not in it; gRPC store calls,
// musterd's own, are not counted).
//
// Thread-safe: the loop thread records, a scrape reads (atomics).
#ifndef MUSTER_DAEMON_STORE_STORE_METRICS_H_
#define MUSTER_DAEMON_STORE_STORE_METRICS_H_

#include <string>

#include "absl/strings/ascii.h"
#include "common/store_wire.h"
#include "daemon/metrics/metrics_text.h"

namespace muster {

struct StoreMetrics {
  static constexpr int kOps = static_cast<int>(wire::Op::kGetWaitFor) + 1;
  Counter requests[kOps];
  Histogram request_seconds{Histogram::LatencyBounds()};

  void Record(wire::Op op, double seconds) {
    int i = static_cast<int>(op);
    if (i >= 0 && i < kOps) requests[i].Add();
    request_seconds.Observe(seconds);
  }
  // The label of operation `i`: "set", "compare_set", ...
  static std::string OpLabel(int i) {
    return absl::AsciiStrToLower(wire::OpName(static_cast<wire::Op>(i)));
  }
};

}  // namespace muster

#endif  // MUSTER_DAEMON_STORE_STORE_METRICS_H_
