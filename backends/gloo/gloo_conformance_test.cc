// The communicator conformance suite over GlooCommunicator: every rank (a
// thread) connects a full mesh on loopback, rendezvousing through one
// in-process HashStore per group. A member's death is its process going
// away: its connections close when the suite destroys its communicator.
#include "backends/communicator_conformance.h"
#include "backends/gloo/gloo_communicator.h"
#include "muster/hash_store.h"

namespace muster {
namespace {

class GlooTransport : public ConformanceTransport {
 public:
  Traits traits() const override {
    // Gloo names no missing rank, cannot wake this rank's own wait and
    // learns of a death only as a closed connection.
    Traits t;
    // (A member that sees a closed connection closes its own mesh, so a
    // death reaches members whose ring neighbours are alive.)
    return t;
  }
  absl::Status NewGroup(int world, int variant) override {
    world_ = world;
    store_ = std::make_shared<HashStore>();
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Connect(int rank) override {
    auto comm = GlooCommunicator::Connect(store_, rank, world_, "127.0.0.1", absl::Seconds(30));
    if (!comm.ok()) return comm.status();
    return std::unique_ptr<Communicator>(std::move(*comm));
  }
  void MemberDied(int rank, const std::string& reason) override {}

 private:
  int world_ = 0;
  std::shared_ptr<HashStore> store_;
};

}  // namespace

std::unique_ptr<ConformanceTransport> MakeConformanceTransport() {
  return std::make_unique<GlooTransport>();
}

}  // namespace muster
