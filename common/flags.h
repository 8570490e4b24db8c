// FlagSet: the command-line parser of every muster binary. Flags are spelled
// with dashes (--grpc-port 0, --grpc-port=0); booleans take no value
// (--json) or an explicit --json=false. "--" ends the flags; everything after
// it, and every non-flag word, is positional. --help prints Usage().
//
// Not thread-safe; use from main() only.
#ifndef MUSTER_COMMON_FLAGS_H_
#define MUSTER_COMMON_FLAGS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muster {

class FlagSet {
 public:
  // `usage` is printed above the flag list by --help.
  FlagSet(std::string program, std::string usage);

  // Each registers --name with the current value of *target as its default.
  void AddString(const std::string& name, std::string* target, const std::string& help);
  void AddInt(const std::string& name, int64_t* target, const std::string& help);
  void AddDouble(const std::string& name, double* target, const std::string& help);
  void AddBool(const std::string& name, bool* target, const std::string& help);

  // Parses argv[1..]. Returns the positional words, or InvalidArgument naming
  // the bad flag. Sets help_requested() on --help / -h (parsing stops there).
  absl::StatusOr<std::vector<std::string>> Parse(int argc, char** argv);
  absl::StatusOr<std::vector<std::string>> Parse(const std::vector<std::string>& args);
  bool help_requested() const { return help_requested_; }

  std::string Usage() const;

  // Convenience for main(): parse, print help (exit 0) or the error (exit 2).
  std::vector<std::string> ParseOrExit(int argc, char** argv);

 private:
  struct Flag {
    std::string name;
    std::string help;
    std::string default_text;
    bool is_bool = false;
    std::function<bool(absl::string_view)> set;  // false: value not accepted
  };
  const Flag* Find(absl::string_view name) const;

  std::string program_;
  std::string usage_;
  std::vector<Flag> flags_;
  bool help_requested_ = false;
};

}  // namespace muster

#endif  // MUSTER_COMMON_FLAGS_H_
