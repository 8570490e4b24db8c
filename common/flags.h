// FlagSet: the command-line parser of every muster binary. Flags are spelled
// with dashes (--grpc-port 0, --grpc-port=0); booleans take no value
// (--json) or an explicit --json=false. "--" ends the flags; everything after
// it, and every non-flag word, is positional. --help prints Usage();
// --version prints "<program> <muster version>" (common/version.h), unless the
// program registers a flag of that name itself.
//
// Options for launchers that take torchrun's command line: underscores in a
// flag's name read as dashes (--nproc_per_node), the first positional word
// ends the flags (what follows belongs to the program), one-letter aliases
// (-m), and flags not given read from the environment (PET_NPROC_PER_NODE).
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

  // `-x` means --name (a bool, or a flag whose value follows).
  void AddAlias(char letter, const std::string& name);
  // See the header comment.
  void set_underscores_as_dashes(bool on) { underscores_as_dashes_ = on; }
  void set_stop_at_first_positional(bool on) { stop_at_first_positional_ = on; }
  // Flags not on the command line take $<prefix><NAME> (upper case, dashes
  // as underscores) when set; a bool's value there is an integer (0/1).
  void set_env_prefix(std::string prefix) { env_prefix_ = std::move(prefix); }

  // Whether the last Parse set --name (on the command line or from the
  // environment).
  bool IsSet(const std::string& name) const;
  // Whether the positional words of the last Parse came after "--".
  bool saw_double_dash() const { return saw_double_dash_; }

  // Parses argv[1..]. Returns the positional words, or InvalidArgument naming
  // the bad flag. Sets help_requested() on --help / -h (parsing stops there).
  absl::StatusOr<std::vector<std::string>> Parse(int argc, char** argv);
  absl::StatusOr<std::vector<std::string>> Parse(const std::vector<std::string>& args);
  bool help_requested() const { return help_requested_; }
  // --version was given (and no flag "version" is registered); parsing stops.
  bool version_requested() const { return version_requested_; }

  std::string Usage() const;

  // Convenience for main(): parse, print help or the version (exit 0) or the
  // error (exit 2).
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
  absl::Status Set(const Flag& flag, const std::string& value, const std::string& spelled);
  absl::Status ReadEnvironment();

  std::string program_;
  std::string usage_;
  std::vector<Flag> flags_;
  std::vector<std::pair<char, std::string>> aliases_;
  std::vector<std::string> set_;
  bool help_requested_ = false;
  bool saw_double_dash_ = false;
  bool underscores_as_dashes_ = false;
  bool stop_at_first_positional_ = false;
  std::string env_prefix_;
  bool version_requested_ = false;
};

}  // namespace muster

#endif  // MUSTER_COMMON_FLAGS_H_
