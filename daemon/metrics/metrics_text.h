// Metrics in the Prometheus text exposition format (version 0.0.4): the
// small pieces musterd's /metrics is built from.
//
// MetricsText writes one scrape: families (# HELP, # TYPE) and their samples,
// escaping label values and help text as the format requires; names must be
// valid Prometheus names (checked in debug builds, the callers use
// literals). Histogram keeps cumulative bucket counts, a sum and a count
// with atomics, so event paths can observe without a lock.
//
// Thread-safety: MetricsText is single-threaded (one per scrape); Histogram
// and Counter are thread-safe.
#ifndef MUSTER_DAEMON_METRICS_METRICS_TEXT_H_
#define MUSTER_DAEMON_METRICS_METRICS_TEXT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace muster {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// A monotonic counter.
class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A histogram of durations (seconds) or sizes, with fixed upper bounds.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value);
  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;
  // Exponential bounds for latencies: 10 µs ... ~10 s.
  static std::vector<double> LatencyBounds();

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1, not cumulative
  std::atomic<uint64_t> sum_nanos_{0};                // sum * 1e9, rounded
  std::atomic<uint64_t> count_{0};
};

class MetricsText {
 public:
  // Starts a family; `type` is "counter", "gauge" or "histogram".
  void Family(const std::string& name, const std::string& type, const std::string& help);
  // One sample of the current family (`suffix` e.g. "_total" or "").
  void Sample(const std::string& name, const MetricLabels& labels, double value);
  void Sample(const std::string& name, double value) { Sample(name, {}, value); }
  // A histogram's _bucket, _sum and _count samples.
  void HistogramSamples(const std::string& name, const MetricLabels& labels,
                        const Histogram::Snapshot& h);
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// A label value or help text escaped for the format.
std::string EscapeLabelValue(const std::string& value);

}  // namespace muster

#endif  // MUSTER_DAEMON_METRICS_METRICS_TEXT_H_
