// A strict reader of the Prometheus text exposition format (0.0.4), for
// tests: what a scrape must satisfy before Prometheus would take it (as
// `promtool check metrics` does, minus its style hints) -- valid metric and
// label names, escapes, each sample after its family's # TYPE, a family's
// samples together, counters named *_total and never negative, histogram
// buckets with `le`, cumulative, ending at +Inf equal to _count. Returns the
// samples by "name{label="value",...}" (labels as written).
//
// Thread-compatible.
#ifndef MUSTER_DAEMON_METRICS_PROMETHEUS_PARSER_H_
#define MUSTER_DAEMON_METRICS_PROMETHEUS_PARSER_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace muster {

struct ParsedMetrics {
  std::map<std::string, std::string> types;  // family -> counter, gauge, histogram, ...
  std::map<std::string, double> samples;     // "name{labels}" -> value
  double Value(const std::string& sample) const {
    auto it = samples.find(sample);
    return it == samples.end() ? -1 : it->second;
  }
};

// InvalidArgument naming the line and what is wrong with it.
absl::StatusOr<ParsedMetrics> ParsePrometheusText(const std::string& text);

}  // namespace muster

#endif  // MUSTER_DAEMON_METRICS_PROMETHEUS_PARSER_H_
