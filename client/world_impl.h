// The implementation behind the public World handle of muster/world.h, and
// the rank's session with its musterd that the World and its groups share.
// Internal to the SDK.
//
// WorldSession is the Attach stream: a reader thread (owned by the session,
// started by Open, joined by Close) collects failure events and notices the
// stream's end; the rank's unary calls to the daemon go through Call, which
// fails at once after that end and is cancelled by it. The daemon is gone
// when the stream ends without this rank having left (musterd was killed,
// crashed or shut down): status() turns UNAVAILABLE naming its pid and
// socket, for good (a restarted musterd is a new daemon: the rank never
// reattaches), and `on_gone` runs once on the reader thread.
//
// World::Impl owns the session (shared with the groups, which may outlive
// the World; its destructor closes it), the world group, the job's store
// and the list of groups to break when the daemon goes.
//
// Thread-safety: both classes are thread-safe.
#ifndef MUSTER_CLIENT_WORLD_IMPL_H_
#define MUSTER_CLIENT_WORLD_IMPL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "muster/store.h"
#include "muster/world.h"
#include "proto/groups.grpc.pb.h"
#include "proto/session.grpc.pb.h"

namespace muster {

class WorldSession {
 public:
  using GoneCallback = std::function<void(const absl::Status&)>;

  ~WorldSession() { Close(); }

  absl::Status Open(const InitOptions& o, GoneCallback on_gone);

  // Leaves the job (an orderly end of the stream) and joins the reader.
  void Close();

  // OK while the session lives; UNAVAILABLE naming the daemon once it is gone.
  absl::Status status() const;

  // The error `s` as the caller should see it. Once the daemon is gone,
  // every failure is that (UNAVAILABLE naming it; `what` says which call).
  // UNAVAILABLE or CANCELLED while the session still looks alive is how a
  // daemon going away shows first (a shutting-down musterd aborts its
  // segments as UNAVAILABLE; a dead one breaks the connection under a
  // call): wait up to a second for the stream's end to say so.
  absl::Status Explain(absl::Status s, absl::string_view what = "") const;

  // Runs one unary RPC to the daemon (`rpc` gets its context, deadline
  // set): refused once the daemon is gone, cancelled if it goes meanwhile,
  // errors translated (and explained) with `what` as context.
  absl::Status Call(const std::string& what, absl::Duration timeout,
                    const std::function<grpc::Status(grpc::ClientContext*)>& rpc);

  std::vector<std::string> failures() const;

  v1::Groups::Stub* groups() { return groups_stub_.get(); }
  // Registered.rejoin_epoch: non-zero when this rank took over from a
  // process that is gone (it joins that epoch before forming groups).
  int64_t rejoin_epoch() const { return rejoin_epoch_; }
  bool rejoin_grows() const { return rejoin_grows_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }

 private:
  // Registration failed: the stream's status says why.
  absl::Status Finish(const char* what);
  // Open's registration: the Register message out, the daemon's answer in.
  absl::Status Register(const InitOptions& o, v1::SessionServerMessage* reply);

  bool reader_started() const { return !daemon_.empty(); }

  // Keeps a failure event (rank_failed, job_aborted) for failures().
  void RecordEvent(const v1::SessionServerMessage& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The reader thread: failure events until the stream ends; then, unless
  // this rank is leaving, the daemon is gone.
  void ReadEvents();

  GoneCallback on_gone_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Session::Stub> session_stub_;
  std::unique_ptr<v1::Groups::Stub> groups_stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionClientMessage, v1::SessionServerMessage>>
      stream_;
  std::string session_id_;
  int64_t rejoin_epoch_ = 0;
  bool rejoin_grows_ = false;
  std::string daemon_;  // "musterd (pid P, unix:SOCKET)", set before the reader starts
  std::thread reader_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool leaving_ ABSL_GUARDED_BY(mu_) = false;   // Close() began: the end is no failure
  bool ended_ ABSL_GUARDED_BY(mu_) = false;     // the reader saw the stream end
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // stream_->Finish() was called
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> gone_fast_{false};  // gone_, for the collectives' fast path
  absl::Status gone_status_ ABSL_GUARDED_BY(mu_);
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> failures_ ABSL_GUARDED_BY(mu_);
};

class World::Impl {
 public:
  // `options`: complete (InitOptionsFromEnv ran).
  explicit Impl(InitOptions options);
  // Closes the session (leaves the job).
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // Opens the session and forms the world group.
  absl::Status Start();

  const InitOptions& options() const { return options_; }
  ProcessGroup& world_group() { return *world_group_; }

  // World's public methods (see muster/world.h).
  absl::StatusOr<std::shared_ptr<ProcessGroup>> NewGroup(std::vector<int> ranks,
                                                         GroupOptions options);
  absl::StatusOr<
      std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>>
  NewSubgroups(int group_size, GroupOptions options);
  absl::StatusOr<
      std::pair<std::shared_ptr<ProcessGroup>, std::vector<std::shared_ptr<ProcessGroup>>>>
  NewSubgroupsByEnumeration(const std::vector<std::vector<int>>& rank_lists, GroupOptions options);
  absl::Status DestroyProcessGroup(ProcessGroup& group);
  int64_t epoch() const;
  // This epoch's rank and world size (the registration's until a shrink),
  // and the registration ranks of the members in dense-rank order.
  int rank() const;
  int world_size() const;
  std::vector<int> members() const;
  absl::StatusOr<int64_t> Reconfigure(absl::Duration timeout, bool allow_shrink);
  absl::StatusOr<int> PendingJoins();
  absl::StatusOr<std::shared_ptr<Store>> store();
  std::vector<std::string> failures() const;
  absl::Status session_status() const;

 private:
  // The session's reader thread: the daemon is gone; breaks every group.
  void OnDaemonGone(const absl::Status& gone);
  // Forms a group through musterd and keeps it for Reconfigure and
  // OnDaemonGone.
  // `ranks`: this epoch's; `world`: the world group (it spans every member
  // after a reconfiguration).
  absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateGroup(const std::vector<int>& ranks,
                                                            const GroupOptions& options,
                                                            const std::string& name,
                                                            bool world = false);
  // Forms a group of the given registration ranks through musterd (in this
  // rank's epoch).
  absl::StatusOr<std::shared_ptr<ProcessGroup>> FormGroup(const std::vector<int>& slots,
                                                          const GroupOptions& options,
                                                          const std::string& name);
  // Joins job epoch `epoch` through musterd; its members become this
  // World's.
  // `start_min_size` > 0: an elastic start (see InitOptions.min_world_size).
  absl::Status JoinEpoch(int64_t epoch, absl::Duration timeout, bool allow_shrink = false,
                         int start_min_size = 0);
  std::string NextGroupName();

  const InitOptions options_;
  // Shared with the groups (they may outlive the World); the destructor
  // closes it.
  std::shared_ptr<WorldSession> session_;
  std::shared_ptr<ProcessGroup> world_group_;
  mutable absl::Mutex mu_;
  int64_t group_counter_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<Store> store_ ABSL_GUARDED_BY(mu_);
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Registration ranks of this epoch's members, in dense-rank order.
  std::vector<int> members_ ABSL_GUARDED_BY(mu_);
  // Every group this World created (the world group first), in creation
  // order, with what formed it: for OnDaemonGone and Reconfigure. Expired
  // and destroyed ones are dropped as new ones come.
  struct HeldGroup {
    std::weak_ptr<ProcessGroup> group;
    std::vector<int> slots;  // registration ranks of its members
    GroupOptions options;
    std::string name;
    bool world = false;
    bool destroyed = false;
  };
  absl::Mutex groups_mu_;
  std::vector<HeldGroup> groups_ ABSL_GUARDED_BY(groups_mu_);
};

}  // namespace muster

#endif  // MUSTER_CLIENT_WORLD_IMPL_H_
