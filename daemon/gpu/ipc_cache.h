// IpcCache: CUDA IPC handles a rank sent to musterd, opened once and kept
// open per owner (one rank of one job) until the rank says it freed the
// allocation or the rank is gone. Opening is expensive (tens of µs and a
// mapping per call), so every collective on the same allocation reuses it.
//
// The CUDA calls are behind IpcOpener so the bookkeeping is testable
// without a GPU: the engine plugs in cudaIpcOpenMemHandle /
// cudaIpcOpenEventHandle.
//
// Thread-safe. Close() of the opener is called without the lock held.
#ifndef MUSTER_DAEMON_GPU_IPC_CACHE_H_
#define MUSTER_DAEMON_GPU_IPC_CACHE_H_

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace muster {

// What an opened handle maps to: a pointer, and for memory the bytes of the
// allocation behind it (checked on every use, looked up once).
struct IpcResource {
  void* ptr = nullptr;
  size_t bytes = 0;
};

class IpcOpener {
 public:
  virtual ~IpcOpener() = default;
  // Opens `handle` (its raw bytes).
  virtual absl::StatusOr<IpcResource> Open(const std::string& handle) = 0;
  virtual void Close(void* opened) = 0;
};

class IpcCache {
 public:
  // `kind` names the resource in errors ("memory", "event"); `handle_bytes`
  // is the exact size of a handle (64 for CUDA IPC handles).
  IpcCache(IpcOpener* opener, std::string kind, size_t handle_bytes);
  ~IpcCache();  // closes everything still open
  IpcCache(const IpcCache&) = delete;
  IpcCache& operator=(const IpcCache&) = delete;

  // The opened resource for `handle` of `owner`, opening it on first use.
  // InvalidArgument for a handle of the wrong size or one that fails to
  // open (the opener's message is kept).
  absl::StatusOr<IpcResource> Get(const std::string& owner, const std::string& handle);
  // Closes one handle of `owner` (no-op if not open). Returns whether it was.
  bool Release(const std::string& owner, const std::string& handle);
  // Closes every handle of `owner`. Returns how many.
  int ReleaseOwner(const std::string& owner);

  int open_count(const std::string& owner) const;
  int total_open() const;
  // Opens performed so far (cache misses), for tests and musterctl.
  uint64_t opens() const;

 private:
  IpcOpener* const opener_;
  const std::string kind_;
  const size_t handle_bytes_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, IpcResource> open_;
  uint64_t opens_ = 0;
};

}  // namespace muster

#endif  // MUSTER_DAEMON_GPU_IPC_CACHE_H_
