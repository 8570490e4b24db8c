// Backend: one communication library serving one process group on one kind
// of device ("cpu" or "cuda"). Backends are created by name through the
// BackendRegistry, so a third party can add one without touching muster.
// Collective operations are added to this interface by the collectives
// work; today a backend knows its identity and the group it serves.
//
// Implementations document their own thread-safety; the registry is
// thread-safe.
#ifndef MUSTER_BACKENDS_BACKEND_H_
#define MUSTER_BACKENDS_BACKEND_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace muster {

// What a backend is created for.
struct BackendOptions {
  std::string group_name;
  int group_rank = 0;
  int group_size = 1;
  std::string device;  // "cpu" or "cuda"
  absl::Duration timeout = absl::Minutes(30);
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const std::string& name() const = 0;
  virtual const BackendOptions& options() const = 0;
  int rank() const { return options().group_rank; }
  int size() const { return options().group_size; }
};

using BackendFactory =
    std::function<absl::StatusOr<std::unique_ptr<Backend>>(const BackendOptions& options)>;

// A parsed backend configuration: which backend serves each device.
// "gloo" -> {cpu: gloo}; "nccl" -> {cuda: nccl};
// "cpu:gloo,cuda:nccl" -> both. Ordered by device name.
using BackendConfig = std::map<std::string, std::string>;

// "cpu:gloo,cuda:nccl" (canonical order) for a parsed config.
std::string FormatBackendConfig(const BackendConfig& config);

// The registry of backends by name. The built-in "gloo" (cpu), "nccl"
// (cuda) and "shm" (cpu) are registered from the start.
class BackendRegistry {
 public:
  static BackendRegistry& Global();

  // Registers `name` for `devices`. AlreadyExists if taken; InvalidArgument
  // for an empty or malformed name or an unknown device.
  absl::Status Register(const std::string& name, BackendFactory factory,
                        const std::vector<std::string>& devices);
  bool Has(const std::string& name) const;
  // Devices `name` was registered for (empty if unknown).
  std::vector<std::string> Devices(const std::string& name) const;

  // Parses and validates a config string against the registered backends.
  absl::StatusOr<BackendConfig> Parse(absl::string_view config) const;
  // Syntax only: device names and backend-name characters, not whether the
  // names are registered (the daemon cannot know a rank's own backends).
  static absl::StatusOr<BackendConfig> ParseSyntax(absl::string_view config);
  // Creates the backend registered as `name`.
  absl::StatusOr<std::unique_ptr<Backend>> Create(const std::string& name,
                                                  const BackendOptions& options) const;

 private:
  BackendRegistry();
  struct Entry {
    BackendFactory factory;
    std::vector<std::string> devices;
  };
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

// c10d's register_backend: adds a backend to the global registry.
inline absl::Status RegisterBackend(const std::string& name, BackendFactory factory,
                                    const std::vector<std::string>& devices) {
  return BackendRegistry::Global().Register(name, std::move(factory), devices);
}

}  // namespace muster

#endif  // MUSTER_BACKENDS_BACKEND_H_
