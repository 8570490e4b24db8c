// GpuChannel: the fast path between one rank and its NCCL communicator in
// musterd, so that a GPU collective costs no gRPC call. A small POSIX
// shared-memory segment (/muster.<daemon pid>.gpu.<n>, removed with the
// daemon's other segments if it dies) holds one request and one reply:
//
//   rank:   write the serialized GpuCollectiveRequest, publish submit = n,
//           wake the daemon if it sleeps; spin briefly, then futex-wait,
//           until complete == n; read the status.
//   daemon: the communicator's worker polls submit (spinning a short while
//           after each request, then sleeping on the futex), runs the
//           request like a gRPC one, writes the status, publishes
//           complete = n and wakes the rank.
//
// The first collective of a communicator goes through gRPC (it creates the
// communicator); its reply names the channel. A closed channel (the
// communicator failed or is gone) makes the rank fall back to gRPC, which
// reports why. Requests from a channel are bound to its (job, group, rank):
// a rank cannot speak for another.
//
// Thread-safety: one caller at a time per side (the rank's GpuPath holds
// its lock; the daemon side is the communicator's worker). Close/Wake may
// come from any thread.
#ifndef MUSTER_COMMON_GPU_CHANNEL_H_
#define MUSTER_COMMON_GPU_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muster {

class GpuChannel {
 public:
  // Largest serialized request a channel carries (bigger ones use gRPC).
  static constexpr size_t kMaxRequestBytes = 60 * 1024;

  // Daemon side: creates a fresh segment.
  // `owner_uid` >= 0: the user whose rank opens it (the file is given to it,
  // mode 0600); else musterd's user.
  static absl::StatusOr<std::unique_ptr<GpuChannel>> Create(const std::string& name,
                                                            int64_t owner_uid = -1);
  // Rank side.
  static absl::StatusOr<std::unique_ptr<GpuChannel>> Open(const std::string& name);
  ~GpuChannel();  // unmaps; the creator also unlinks
  GpuChannel(const GpuChannel&) = delete;
  GpuChannel& operator=(const GpuChannel&) = delete;

  const std::string& name() const { return name_; }

  // Rank side: one request, blocking until the daemon answers, `deadline`
  // passes (DeadlineExceeded) or the channel closes (Unavailable: fall
  // back to gRPC). Returns the daemon's status and `launched`.
  absl::StatusOr<uint64_t> Call(const std::string& request, absl::Time deadline);

  // Daemon side: the next request if one was submitted (spinning up to
  // `spin` first), else false.
  bool Poll(std::string* request, absl::Duration spin);
  // The doorbell: read it before looking for work (requests, tasks), then
  // WaitForRequest(that value) sleeps only if nothing rang since.
  uint32_t doorbell() const;
  // Sleeps until a request arrives, Wake(), or `timeout`.
  void WaitForRequest(uint32_t doorbell_seen, absl::Duration timeout);
  // Answers the request last returned by Poll.
  void Complete(const absl::Status& status, uint64_t launched);
  // Wakes WaitForRequest (e.g. other work for the worker).
  void Wake();
  // Refuses later calls; a caller waiting on a reply gets Unavailable.
  void Close();
  bool closed() const;

 private:
  struct Layout;
  GpuChannel(std::string name, Layout* layout, bool owner, int guard);
  std::string name_;
  Layout* layout_;
  bool owner_;
  int guard_;            // mapping_guard's handle: in musterd, a truncated file reads zeros
  uint32_t served_ = 0;  // daemon side: last request taken
};

}  // namespace muster

#endif  // MUSTER_COMMON_GPU_CHANNEL_H_
