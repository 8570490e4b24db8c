#include "daemon/metrics/prometheus_parser.h"

#include <cctype>
#include <cstdlib>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace muster {
namespace {

bool ValidName(const std::string& s, bool colon_ok) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool ok = std::isalpha(static_cast<unsigned char>(c)) || c == '_' || (colon_ok && c == ':') ||
              (i > 0 && std::isdigit(static_cast<unsigned char>(c)));
    if (!ok) return false;
  }
  return true;
}

bool ParseValue(const std::string& s, double* v) {
  if (s == "+Inf") return *v = HUGE_VAL, true;
  if (s == "-Inf") return *v = -HUGE_VAL, true;
  if (s == "NaN") return *v = NAN, true;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

struct Family {
  std::string type;
  bool done = false;  // another family's samples came after this one's
  // Histograms: per label set (without le), the buckets seen.
  std::map<std::string, std::vector<std::pair<double, double>>> buckets;
  std::map<std::string, double> counts;
};

}  // namespace

absl::StatusOr<ParsedMetrics> ParsePrometheusText(const std::string& text) {
  ParsedMetrics out;
  std::map<std::string, Family> families;
  std::string current;
  int number = 0;
  if (!text.empty() && text.back() != '\n') {
    return absl::InvalidArgumentError("the text does not end with a newline");
  }
  for (absl::string_view view : absl::StrSplit(text, '\n')) {
    ++number;
    std::string line(view);
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("line ", number, " '", line, "': ", why));
    };
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 3));
      if (f.size() >= 3 && (f[1] == "HELP" || f[1] == "TYPE")) {
        if (!ValidName(f[2], true)) return bad("bad metric name");
        if (f[1] == "TYPE") {
          if (f.size() != 4) return bad("TYPE without a type");
          static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary",
                                                       "untyped"};
          if (!kTypes.count(f[3])) return bad("unknown type");
          Family& fam = families[f[2]];
          if (!fam.type.empty()) return bad("a second TYPE for the family");
          fam.type = f[3];
          out.types[f[2]] = f[3];
          if (f[3] == "counter" && !absl::EndsWith(f[2], "_total")) {
            return bad("a counter's name must end in _total");
          }
        }
        if (!current.empty() && current != f[2]) families[current].done = true;
        current = f[2];
      }
      continue;
    }
    // name{labels} value [timestamp]
    size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos) return bad("no value");
    std::string name = line.substr(0, name_end);
    if (!ValidName(name, true)) return bad("bad metric name");
    size_t pos = name_end;
    std::vector<std::pair<std::string, std::string>> labels;
    if (line[pos] == '{') {
      ++pos;
      while (pos < line.size() && line[pos] != '}') {
        size_t eq = line.find('=', pos);
        if (eq == std::string::npos) return bad("a label without '='");
        std::string label = line.substr(pos, eq - pos);
        if (!ValidName(label, false)) return bad(absl::StrCat("bad label name '", label, "'"));
        if (eq + 1 >= line.size() || line[eq + 1] != '"') return bad("label value not quoted");
        std::string value;
        size_t i = eq + 2;
        for (; i < line.size() && line[i] != '"'; ++i) {
          if (line[i] == '\\') {
            if (++i >= line.size()) return bad("a dangling escape");
            char e = line[i];
            if (e == 'n') {
              value += '\n';
            } else if (e == '\\' || e == '"') {
              value += e;
            } else {
              return bad("a bad escape");
            }
          } else {
            value += line[i];
          }
        }
        if (i >= line.size()) return bad("unterminated label value");
        labels.emplace_back(label, value);
        pos = i + 1;
        if (pos < line.size() && line[pos] == ',') ++pos;
      }
      if (pos >= line.size()) return bad("unterminated labels");
      ++pos;  // '}'
    }
    if (pos >= line.size() || line[pos] != ' ') return bad("no value");
    std::vector<std::string> rest = absl::StrSplit(line.substr(pos + 1), ' ');
    if (rest.empty() || rest.size() > 2) return bad("expected a value and maybe a timestamp");
    double value;
    if (!ParseValue(rest[0], &value)) return bad("bad value");
    // Which family: the name itself, or a histogram's _bucket/_sum/_count.
    std::string family = name, part;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (absl::EndsWith(name, suffix)) {
        std::string base = name.substr(0, name.size() - std::string(suffix).size());
        if (families.count(base) && families[base].type == "histogram") {
          family = base;
          part = suffix;
        }
      }
    }
    auto fam = families.find(family);
    if (fam == families.end() || fam->second.type.empty()) {
      return bad("a sample before its family's # TYPE");
    }
    if (fam->second.done || family != current) return bad("the family's samples are not together");
    if (fam->second.type == "counter" && value < 0) return bad("a negative counter");
    std::string key = name;
    std::string labels_without_le;
    double le = 0;
    bool has_le = false;
    if (!labels.empty()) {
      key += '{';
      for (size_t i = 0; i < labels.size(); ++i) {
        absl::StrAppend(&key, i ? "," : "", labels[i].first, "=\"", labels[i].second, "\"");
        if (labels[i].first == "le") {
          has_le = ParseValue(labels[i].second, &le);
          if (!has_le) return bad("a bad le");
        } else {
          absl::StrAppend(&labels_without_le, labels[i].first, "=", labels[i].second, ",");
        }
      }
      key += '}';
    }
    if (out.samples.count(key)) return bad("a duplicate sample");
    out.samples[key] = value;
    if (part == "_bucket") {
      if (!has_le) return bad("a bucket without le");
      auto& b = fam->second.buckets[labels_without_le];
      if (!b.empty() && (le <= b.back().first || value < b.back().second)) {
        return bad("buckets not in increasing le with cumulative counts");
      }
      b.emplace_back(le, value);
    } else if (part == "_count") {
      fam->second.counts[labels_without_le] = value;
    } else if (fam->second.type == "histogram" && part.empty()) {
      return bad("a histogram sample without _bucket, _sum or _count");
    }
  }
  for (const auto& [name, fam] : families) {
    for (const auto& [labels, buckets] : fam.buckets) {
      if (buckets.empty() || buckets.back().first != HUGE_VAL) {
        return absl::InvalidArgumentError(absl::StrCat(name, "{", labels, "}: no +Inf bucket"));
      }
      auto count = fam.counts.find(labels);
      if (count == fam.counts.end() || count->second != buckets.back().second) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, "{", labels, "}: _count differs from the +Inf bucket"));
      }
    }
  }
  return out;
}

}  // namespace muster
