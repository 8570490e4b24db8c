// The conformance suite every Communicator runs (like the Store suite in
// client/store_conformance_test.cc): each collective x dtype x reduce op
// (valid ones checked bit for bit against one reference built from
// backends/shm/reduce.h's kernels, invalid ones INVALID_ARGUMENT) at world
// sizes 1-4, then the failure cases: bad arguments, desync
// (FAILED_PRECONDITION, the group stays usable), a member that never joins
// (DEADLINE_EXCEEDED), Abort from another thread, a member that dies.
//
// The suite's test cases live in communicator_conformance.cc; a transport's
// cc_test links them (alwayslink) with one file that defines
// MakeConformanceTransport(). Ranks are threads of the test process.
#ifndef MUSTER_BACKENDS_COMMUNICATOR_CONFORMANCE_H_
#define MUSTER_BACKENDS_COMMUNICATOR_CONFORMANCE_H_

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/communicator.h"

namespace muster {

// One transport under test: makes groups of communicators. Members of a
// group have global ranks 100, 101, ... (group rank + 100), as messages
// that name ranks show them.
class ConformanceTransport {
 public:
  // What the transport can say or do; the suite checks it where it can.
  struct Traits {
    // DEADLINE_EXCEEDED names the global ranks that did not arrive.
    bool timeout_names_ranks = false;
    // Abort ends this rank's wait at once (else the wait ends at its
    // deadline, failing with the abort's reason).
    bool abort_wakes_own_wait = false;
    // After MemberDied, the survivors' error carries the reason given.
    bool death_names_reason = false;
    // Which reduce op applies to which dtype: backends/shm/reduce.h's
    // rule (c10d's), or a transport's narrower one (NCCL: no bitwise
    // ops). Pairs it rejects must be INVALID_ARGUMENT.
    std::function<absl::Status(DType, ReduceOp)> check_reduce;
    // Suite cases (their ids in communicator_conformance.cc, e.g.
    // "MemberDeath") this transport fails today because of a known bug:
    // they run in a "[!mayfail]" twin instead. Each entry says which bug.
    std::vector<std::string> known_bugs;
    bool KnownBug(const std::string& id) const {
      return std::find(known_bugs.begin(), known_bugs.end(), id) != known_bugs.end();
    }
  };

  virtual ~ConformanceTransport() = default;
  virtual Traits traits() const = 0;
  // Layouts of one world size to test (e.g. ways to split ranks across
  // nodes); NewGroup's `variant` is in [0, variants(world)).
  virtual int variants(int world) const { return 1; }
  virtual std::string VariantName(int world, int variant) const { return ""; }
  // Starts a new group of `world` members (the previous one is gone).
  virtual absl::Status NewGroup(int world, int variant) = 0;
  // Member `rank` of the current group. Called once per rank, every rank
  // on its own thread, concurrently.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Connect(int rank) = 0;
  // Does what the transport's daemons do when member `rank` of the current
  // group dies (`reason` names it); the suite then destroys its
  // communicator, as the process's exit would.
  virtual void MemberDied(int rank, const std::string& reason) = 0;
};

// Defined once per test binary: the transport that binary tests.
std::unique_ptr<ConformanceTransport> MakeConformanceTransport();

}  // namespace muster

#endif  // MUSTER_BACKENDS_COMMUNICATOR_CONFORMANCE_H_
