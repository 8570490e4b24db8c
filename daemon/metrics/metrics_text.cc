#include "daemon/metrics/metrics_text.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace muster {
namespace {

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(static_cast<uint64_t>(std::llround(std::max(0.0, value) * 1e9)),
                       std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  // The count is the +Inf bucket, so that the two always agree.
  s.count = running;
  s.sum = static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

std::vector<double> Histogram::LatencyBounds() {
  std::vector<double> b;
  for (double v = 10e-6; v < 20; v *= 4) b.push_back(v);  // 10 µs, 40 µs, ... 10.5 s
  return b;
}

void MetricsText::Family(const std::string& name, const std::string& type,
                         const std::string& help) {
  absl::StrAppend(&text_, "# HELP ", name, " ", EscapeHelp(help), "\n# TYPE ", name, " ", type,
                  "\n");
}

void MetricsText::Sample(const std::string& name, const MetricLabels& labels, double value) {
  text_ += name;
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      absl::StrAppend(&text_, i ? "," : "", labels[i].first, "=\"",
                      EscapeLabelValue(labels[i].second), "\"");
    }
    text_ += '}';
  }
  absl::StrAppend(&text_, " ", FormatValue(value), "\n");
}

void MetricsText::HistogramSamples(const std::string& name, const MetricLabels& labels,
                                   const Histogram::Snapshot& h) {
  for (size_t i = 0; i <= h.upper_bounds.size(); ++i) {
    MetricLabels l = labels;
    l.emplace_back("le", i < h.upper_bounds.size() ? FormatValue(h.upper_bounds[i]) : "+Inf");
    Sample(name + "_bucket", l, static_cast<double>(h.cumulative[i]));
  }
  Sample(name + "_sum", labels, h.sum);
  Sample(name + "_count", labels, static_cast<double>(h.count));
}

}  // namespace muster
