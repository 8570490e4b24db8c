#include "common/flags.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/version.h"

namespace muster {

FlagSet::FlagSet(std::string program, std::string usage)
    : program_(std::move(program)), usage_(std::move(usage)) {}

void FlagSet::AddString(const std::string& name, std::string* target, const std::string& help) {
  flags_.push_back(
      {name, help, absl::StrCat("\"", *target, "\""), false, [target](absl::string_view v) {
         *target = std::string(v);
         return true;
       }});
}

void FlagSet::AddInt(const std::string& name, int64_t* target, const std::string& help) {
  flags_.push_back({name, help, absl::StrCat(*target), false,
                    [target](absl::string_view v) { return absl::SimpleAtoi(v, target); }});
}

void FlagSet::AddDouble(const std::string& name, double* target, const std::string& help) {
  flags_.push_back({name, help, absl::StrCat(*target), false,
                    [target](absl::string_view v) { return absl::SimpleAtod(v, target); }});
}

void FlagSet::AddBool(const std::string& name, bool* target, const std::string& help) {
  flags_.push_back({name, help, *target ? "true" : "false", true,
                    [target](absl::string_view v) { return absl::SimpleAtob(v, target); }});
}

void FlagSet::AddAlias(char letter, const std::string& name) { aliases_.push_back({letter, name}); }

const FlagSet::Flag* FlagSet::Find(absl::string_view name) const {
  std::string wanted(name);
  if (underscores_as_dashes_) std::replace(wanted.begin(), wanted.end(), '_', '-');
  for (const Flag& f : flags_) {
    if (f.name == wanted) return &f;
  }
  return nullptr;
}

bool FlagSet::IsSet(const std::string& name) const {
  return std::find(set_.begin(), set_.end(), name) != set_.end();
}

absl::Status FlagSet::Set(const Flag& flag, const std::string& value, const std::string& spelled) {
  if (!flag.set(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag ", spelled, ": cannot parse '", value, "'"));
  }
  if (!IsSet(flag.name)) set_.push_back(flag.name);
  return absl::OkStatus();
}

absl::Status FlagSet::ReadEnvironment() {
  if (env_prefix_.empty()) return absl::OkStatus();
  for (const Flag& f : flags_) {
    if (IsSet(f.name)) continue;
    std::string var = env_prefix_ + f.name;
    for (char& c : var) c = c == '-' ? '_' : static_cast<char>(std::toupper(c));
    const char* value = std::getenv(var.c_str());
    if (value == nullptr) continue;
    std::string v = value;
    if (f.is_bool) {
      int64_t n;
      if (!absl::SimpleAtoi(v, &n)) {
        return absl::InvalidArgumentError(
            absl::StrCat("$", var, ": cannot parse '", v, "' (want 0 or 1)"));
      }
      v = n != 0 ? "true" : "false";
    }
    RETURN_IF_ERROR(Set(f, v, "$" + var));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  return Parse(args);
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  set_.clear();
  saw_double_dash_ = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "--") {
      saw_double_dash_ = positional.empty();
      positional.insert(positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return positional;
    }
    if (arg == "--version" && Find("version") == nullptr) {
      version_requested_ = true;
      return positional;
    }
    if (arg.size() == 2 && arg[0] == '-' && arg[1] != '-') {
      for (const auto& [letter, name] : aliases_) {
        if (letter == arg[1]) arg = "--" + name;
      }
      if (arg.size() == 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown flag ", arg, " (see ", program_, " --help)"));
      }
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      if (stop_at_first_positional_) {
        positional.insert(positional.end(), args.begin() + i, args.end());
        break;
      }
      positional.push_back(arg);
      continue;
    }
    std::string body = arg.substr(2);
    std::string name = body;
    std::string value;
    bool has_value = false;
    size_t eq = body.find('=');
    if (eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    const Flag* flag = Find(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (see ", program_, " --help)"));
    }
    if (!has_value) {
      if (flag->is_bool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
    }
    RETURN_IF_ERROR(Set(*flag, value, "--" + name));
  }
  RETURN_IF_ERROR(ReadEnvironment());
  return positional;
}

std::string FlagSet::Usage() const {
  std::string out = usage_;
  if (!out.empty() && out.back() != '\n') out += '\n';
  out += "\nFlags:\n";
  for (const Flag& f : flags_) {
    std::string alias;
    for (const auto& [letter, name] : aliases_) {
      if (name == f.name) alias = absl::StrCat("-", std::string(1, letter), ", ");
    }
    absl::StrAppend(&out, "  ", alias, "--", f.name, f.is_bool ? "" : " VALUE", "\n");
    for (absl::string_view line : absl::StrSplit(f.help, '\n')) {
      absl::StrAppend(&out, "      ", line, "\n");
    }
    absl::StrAppend(&out, "      (default: ", f.default_text, ")\n");
  }
  absl::StrAppend(&out, "  --help\n      Print this help and exit.\n");
  if (Find("version") == nullptr) {
    absl::StrAppend(&out, "  --version\n      Print the version and exit.\n");
  }
  return out;
}

std::vector<std::string> FlagSet::ParseOrExit(int argc, char** argv) {
  auto parsed = Parse(argc, argv);
  if (help_requested_) {
    std::fputs(Usage().c_str(), stdout);
    std::exit(0);
  }
  if (version_requested_) {
    std::printf("%s %s\n", program_.c_str(), kVersion);
    std::exit(0);
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s: %s\n", program_.c_str(),
                 std::string(parsed.status().message()).c_str());
    std::exit(2);
  }
  return *std::move(parsed);
}

}  // namespace muster
