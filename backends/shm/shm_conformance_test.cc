// The communicator conformance suite over ShmCommunicator: the ranks are
// threads mapping one GroupSegment with a 4 KiB slot (large buffers take
// many rounds); a member's death is musterd aborting the segment.
#include <unistd.h>

#include <atomic>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "backends/communicator_conformance.h"
#include "backends/shm/collectives.h"
#include "backends/shm/segment.h"

namespace muster {
namespace {

class ShmTransport : public ConformanceTransport {
 public:
  ~ShmTransport() override { Drop(); }
  Traits traits() const override {
    Traits t;
    t.timeout_names_ranks = true;
    t.abort_wakes_own_wait = true;
    t.death_names_reason = true;
    // (A late arrival fails since the segment decides each round once.)
    return t;
  }
  absl::Status NewGroup(int world, int variant) override {
    Drop();
    static std::atomic<int> n{0};
    name_ = absl::StrCat("/muster-conformance.", ::getpid(), ".", n++);
    auto segment = GroupSegment::Create(name_, world, 4096);
    if (!segment.ok()) return segment.status();
    owner_ = std::move(*segment);
    global_.resize(world);
    std::iota(global_.begin(), global_.end(), 100);
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Connect(int rank) override {
    // Each rank maps the segment itself, as rank processes do.
    auto segment = GroupSegment::Open(name_, static_cast<int>(global_.size()));
    if (!segment.ok()) return segment.status();
    return std::unique_ptr<Communicator>(new Member(std::move(*segment), rank, global_));
  }
  void MemberDied(int rank, const std::string& reason) override { owner_->Abort(reason); }

 private:
  // A ShmCommunicator owning its mapping of the segment (a base, so the
  // mapping outlives the communicator).
  struct Mapping {
    std::unique_ptr<GroupSegment> segment;
  };
  struct Member : Mapping, ShmCommunicator {
    Member(std::unique_ptr<GroupSegment> s, int rank, std::vector<int> global)
        : Mapping{std::move(s)}, ShmCommunicator(segment.get(), rank, "g", std::move(global)) {}
  };
  void Drop() {
    if (owner_ != nullptr) GroupSegment::Unlink(name_);
    owner_.reset();
  }
  std::string name_;
  std::unique_ptr<GroupSegment> owner_;
  std::vector<int> global_;
};

}  // namespace

std::unique_ptr<ConformanceTransport> MakeConformanceTransport() {
  return std::make_unique<ShmTransport>();
}

}  // namespace muster
