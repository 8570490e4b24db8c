#include "backends/backend.h"

#include <algorithm>
#include <cctype>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace muster {
namespace {

const std::vector<std::string>& KnownDevices() {
  static const auto* devices = new std::vector<std::string>{"cpu", "cuda"};
  return *devices;
}

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

}  // namespace

bool IsBuiltinBackendName(const std::string& name) {
  return name == "gloo" || name == "shm" || name == "nccl";
}

std::string FormatBackendConfig(const BackendConfig& config) {
  std::vector<std::string> parts;
  for (const auto& [device, backend] : config) {
    parts.push_back(device.empty() ? backend : absl::StrCat(device, ":", backend));
  }
  return absl::StrJoin(parts, ",");
}

BackendRegistry& BackendRegistry::Global() {
  static BackendRegistry* registry = new BackendRegistry();
  return *registry;
}

BackendRegistry::BackendRegistry() = default;

absl::Status BackendRegistry::Register(const std::string& name, BackendFactory factory,
                                       const std::vector<std::string>& devices) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("backend name '", name, "' must be 1-64 letters, digits, '_' or '-'"));
  }
  if (devices.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("backend '", name, "' needs at least one device"));
  }
  for (const std::string& d : devices) {
    if (std::find(KnownDevices().begin(), KnownDevices().end(), d) == KnownDevices().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("backend '", name, "': unknown device '", d, "' (known: cpu, cuda)"));
    }
  }
  if (!factory) return absl::InvalidArgumentError(absl::StrCat("backend '", name, "': no factory"));
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.count(name) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("backend '", name, "' is already registered"));
  }
  entries_[name] = Entry{std::move(factory), devices};
  return absl::OkStatus();
}

bool BackendRegistry::Has(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.count(name) != 0;
}

std::vector<std::string> BackendRegistry::Devices(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  return it == entries_.end() ? std::vector<std::string>{} : it->second.devices;
}

absl::StatusOr<BackendConfig> BackendRegistry::Parse(absl::string_view text) const {
  std::string config = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (config.empty()) return absl::InvalidArgumentError("empty backend config");
  BackendConfig result;
  std::lock_guard<std::mutex> lock(mu_);
  auto known = [&](const std::string& name) -> absl::Status {
    if (entries_.count(name) != 0) return absl::OkStatus();
    std::vector<std::string> names;
    for (const auto& [n, e] : entries_) names.push_back(n);
    return absl::InvalidArgumentError(absl::StrCat("unknown backend '", name, "' in '", text,
                                                   "' (registered: ", absl::StrJoin(names, ", "),
                                                   ")"));
  };
  if (config.find(':') == std::string::npos) {
    // A bare name serves every device it was registered for.
    if (absl::Status s = known(config); !s.ok()) return s;
    for (const std::string& d : entries_.at(config).devices) result[d] = config;
    return result;
  }
  for (absl::string_view part : absl::StrSplit(config, ',')) {
    std::vector<std::string> kv = absl::StrSplit(part, ':');
    for (std::string& field : kv) field = std::string(absl::StripAsciiWhitespace(field));
    if (kv.size() != 2 || kv[0].empty() || kv[1].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed backend config '", text,
                       "': expected DEVICE:BACKEND[,DEVICE:BACKEND], got '", part, "'"));
    }
    const std::string& device = kv[0];
    const std::string& name = kv[1];
    if (std::find(KnownDevices().begin(), KnownDevices().end(), device) == KnownDevices().end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown device '", device, "' in backend config '", text, "' (known: cpu, cuda)"));
    }
    if (absl::Status s = known(name); !s.ok()) return s;
    const auto& devices = entries_.at(name).devices;
    if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("backend '", name, "' does not support device '", device, "'"));
    }
    if (!result.emplace(device, name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("device '", device, "' appears twice in backend config '", text, "'"));
    }
  }
  return result;
}

absl::StatusOr<BackendConfig> BackendRegistry::ParseSyntax(absl::string_view text) {
  std::string config = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (config.empty()) return absl::InvalidArgumentError("empty backend config");
  BackendConfig result;
  if (config.find(':') == std::string::npos) {
    if (!ValidName(config)) {
      return absl::InvalidArgumentError(absl::StrCat("malformed backend name '", text, "'"));
    }
    result[""] = config;  // devices unknown here: whatever the name serves
    return result;
  }
  for (absl::string_view part : absl::StrSplit(config, ',')) {
    std::vector<std::string> kv = absl::StrSplit(part, ':');
    for (std::string& field : kv) field = std::string(absl::StripAsciiWhitespace(field));
    if (kv.size() != 2 || !ValidName(kv[1]) ||
        std::find(KnownDevices().begin(), KnownDevices().end(), kv[0]) == KnownDevices().end() ||
        !result.emplace(kv[0], kv[1]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed backend config '", text,
                       "': expected DEVICE:BACKEND[,DEVICE:BACKEND] with "
                       "devices cpu and cuda, each at most once"));
    }
  }
  return result;
}

absl::StatusOr<std::unique_ptr<Backend>> BackendRegistry::Create(
    const std::string& name, const BackendOptions& options) const {
  BackendFactory factory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(name);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat("no backend named '", name, "'"));
    }
    factory = it->second.factory;
  }
  return factory(options);
}

}  // namespace muster
