// Backend: one communication library serving one process group on one kind
// of device ("cpu" or "cuda") of this rank. Every group's backends are
// created by name through the BackendRegistry when the group is created —
// muster's own ("gloo": shared memory within a node, Gloo across nodes,
// hierarchical for groups spanning nodes; "shm": node-local only; "nccl":
// CUDA tensors through musterd's communicators) exactly like a third
// party's — and each call of the group dispatches once, to the backend of
// its tensors' device: its Communicator (collectives) or PointToPoint.
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
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "backends/communicator.h"
#include "muster/store.h"

namespace muster {

// What a backend is created for: one group, on one device of this rank.
struct BackendOptions {
  std::string group_name;
  int group_rank = 0;
  int group_size = 1;
  std::vector<int> global_ranks;  // group rank -> global rank
  std::string device;             // "cpu" or "cuda"
  absl::Duration timeout = absl::Minutes(30);
  // A store for this group's rendezvous (c10d's store argument), namespaced
  // to the job attempt, the group and the backend; connects on first use.
  std::function<absl::StatusOr<std::shared_ptr<Store>>()> connect_store;
  // This rank's address toward the job's store (where a TCP transport can
  // listen for its peers).
  std::string local_address;
  // From musterd: the node (daemon) of each member, in group-rank order;
  // this node's shared-memory segment for the group ("" if musterd made
  // none) and the group ranks it holds.
  std::vector<std::string> member_nodes;
  std::string shm_name;
  std::vector<int> shm_group_ranks;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const std::string& name() const = 0;
  virtual const BackendOptions& options() const = 0;
  int rank() const { return options().group_rank; }
  int size() const { return options().group_size; }
  // The group's collectives on this rank; null if the backend has none
  // (they fail UNIMPLEMENTED naming it).
  virtual Communicator* communicator() { return nullptr; }
  // Its sends and receives; null if it has none.
  virtual PointToPoint* point_to_point() { return nullptr; }
  // Any thread: whatever waits in the backend stops and fails with
  // `reason`, as does everything later (this rank lost what the group
  // needs, e.g. its musterd).
  virtual void Abort(const absl::Status& reason) {}
};

using BackendFactory =
    std::function<absl::StatusOr<std::unique_ptr<Backend>>(const BackendOptions& options)>;

// A parsed backend configuration: which backend serves each device.
// "gloo" -> {cpu: gloo}; "nccl" -> {cuda: nccl};
// "cpu:gloo,cuda:nccl" -> both. Ordered by device name.
using BackendConfig = std::map<std::string, std::string>;

// "cpu:gloo,cuda:nccl" (canonical order) for a parsed config.
std::string FormatBackendConfig(const BackendConfig& config);

// The registry of backends by name. The SDK registers the built-in "gloo"
// and "shm" (cpu) and "nccl" (cuda) before its first group
// (RegisterBuiltinBackends in backends/builtin and the SDK's GPU path).
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

// The names of muster's own backends ("gloo", "shm", "nccl"), which the SDK
// registers itself (possibly after a third party's registrations).
bool IsBuiltinBackendName(const std::string& name);

// c10d's register_backend: adds a third party's backend to the global
// registry. AlreadyExists for a built-in name, as for any taken one.
inline absl::Status RegisterBackend(const std::string& name, BackendFactory factory,
                                    const std::vector<std::string>& devices) {
  if (IsBuiltinBackendName(name)) {
    return absl::AlreadyExistsError(
        absl::StrCat("backend '", name, "' is one of muster's built-in backends"));
  }
  return BackendRegistry::Global().Register(name, std::move(factory), devices);
}

}  // namespace muster

#endif  // MUSTER_BACKENDS_BACKEND_H_
