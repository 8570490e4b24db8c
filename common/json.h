// Just enough JSON for muster's machine-readable outputs: a streaming writer
// (ready file, `musterctl --json`) and a parser for flat objects whose values
// are strings, numbers, booleans or null (ready files, tests).
//
// Not thread-safe: one writer per thread.
#ifndef MUSTER_COMMON_JSON_H_
#define MUSTER_COMMON_JSON_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster {

// Returns `s` as a quoted JSON string.
std::string JsonQuote(absl::string_view s);

// Builds one JSON document. Commas are inserted automatically; the caller
// keeps the Begin/End calls balanced (a CHECK-style invariant of use).
class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  // Inside an object: the name of the next value.
  JsonWriter& Key(absl::string_view key);
  JsonWriter& String(absl::string_view value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Double(double value);
  JsonWriter& Bool(bool value);

  const std::string& str() const { return out_; }

 private:
  void BeforeValue();

  std::string out_;
  // One entry per open container: true until its first element is written.
  std::vector<bool> first_;
  bool after_key_ = false;
};

// Parses `{"k": "v", "n": 12, "b": true, "z": null}`. String values are
// unescaped; numbers, booleans and null are returned as their literal text.
// Nested objects or arrays are an InvalidArgument error.
absl::StatusOr<std::map<std::string, std::string>> ParseFlatJsonObject(absl::string_view text);

}  // namespace muster

#endif  // MUSTER_COMMON_JSON_H_
