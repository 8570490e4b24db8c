// GroupSegment: the shared-memory segment of one process group on one
// node. musterd creates it when a group whose members are all on this node
// is formed; each member rank maps it and exchanges data through it.
//
// Layout (all offsets fixed at creation):
//   SegmentHeader | RankControl x nranks | slot 0 | slot 1 | ... (slot_bytes each)
//   | mailbox (0→0), (0→1), ... (n-1→n-1)   (point-to-point rings)
//   | trace ring 0 | ... | trace ring n-1       (flight recorder, trace.h)
// Every rank owns its RankControl and its slot: it writes only those, and
// reads everyone's. Progress is published through monotonically increasing
// round counters (release/acquire). The header also carries the abort flag
// and reason, which musterd sets when the group breaks (a member died, the
// operator aborted it) or when it shuts down, and a rank sets when a
// collective times out; the outcome of the last round decided and of the
// last wait for releases decided (so that a collective fails on every
// member or on none); a futex word wakes sleeping waiters.
//
// A GroupSegment object (one process's mapping) also has a process-local
// abort: this process stops waiting on the segment while the segment is
// not aborted for the other members (a rank whose musterd is gone fails its
// own calls; the others learn the same from their own sessions). A rank
// that stops waiting in a round still gives up on it like any other
// (collectives.h), so the round it leaves fails on every member.
//
// Thread-safety: the atomics are the synchronization; see collectives.h
// for the protocol. A GroupSegment object is immutable after Open except
// for its local abort, which any thread may set.
#ifndef MUSTER_BACKENDS_SHM_SEGMENT_H_
#define MUSTER_BACKENDS_SHM_SEGMENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "backends/shm/trace.h"
#include "core/signature.h"

namespace muster {

// What the other members read every round shares one cache line (the
// arrival counter, the signatures with their path bits), and nothing the
// owner writes at other times does: each round moves this line to a reader
// once.
struct alignas(64) RankControl {
  std::atomic<uint64_t> arrived;  // last round whose data is in this rank's slot or lane
  // The last round this rank gave up on (deadline, abort, a failed read;
  // 0: none), or failed before entering it (it gave up waiting for the
  // releases of the round before, or failed reading in it). Written only
  // then, so a round that completes moves nothing but the counters
  // (collectives.h: how a round is decided).
  std::atomic<uint64_t> gave_up;
  // A first round's OpSignature and path (1 = direct) packed in two words
  // (collectives.cc), one pair per round parity: a round k+1 that need not
  // wait for the readers of round k does not overwrite what they compare.
  uint64_t signature[2][2];
  // The smallest rounds' lanes (contributions of at most 8 bytes: a scalar
  // all_reduce), one per parity, on this line: read with `arrived`.
  alignas(8) char word_lane[2][8];
  // Last slot round this rank finished reading (lane rounds do not set it:
  // nobody waits for their readers; the next slot round sets it first, and
  // a waiter counts `arrived` at a later round as a release). On
  // a line of its own: storing it does not take the line above from the
  // peers that spin on `arrived`.
  alignas(64) std::atomic<uint64_t> released;
  // The last round whose releases this rank gave up waiting for (0: none),
  // beside `released`: a waiter that saw every release reads it on the line
  // it just read (collectives.h: how a round is decided).
  std::atomic<uint64_t> gave_up_release;
  // The CPU this rank was on when it last waited longer than a moment (-1:
  // not yet): a waiter does not spin for a rank last seen on its own CPU
  // (read only by a waiter that polled a while).
  alignas(64) std::atomic<int32_t> cpu;
  // Read by musterd (progress, musterctl), not by the other members.
  std::atomic<uint64_t> submitted;  // last collective sequence submitted
  std::atomic<uint64_t> completed;  // last collective sequence completed
  // The last round of the last collective completed (a communicator made
  // later for this rank resumes there: lane rounds do not set `released`).
  std::atomic<uint64_t> last_round;
  std::atomic<int32_t> pid;
  alignas(64) uint64_t meta[64];  // small per-round metadata (e.g. split sizes)
  // The small rounds' buffers, one per round parity (the lanes): a round
  // whose contributions fit writes lane[k % 2] instead of the slot, so it
  // need not wait for every reader of round k-1 (they read the other lane).
  alignas(64) char lane[2][1024];
};
static_assert(offsetof(RankControl, word_lane) + sizeof(RankControl::word_lane) <= 64,
              "the per-round words share one line");

// One single-producer single-consumer byte ring from one rank to another.
// Invariant: read <= written <= read + capacity; bytes [read, written) are
// unread data at positions modulo capacity.
struct alignas(64) MailboxHeader {
  std::atomic<uint64_t> written;
  char pad[56];
  std::atomic<uint64_t> read;
};

struct alignas(64) SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t nranks;
  uint64_t slot_bytes;
  uint64_t slots_offset;
  uint64_t mailbox_bytes;  // ring capacity of each mailbox
  uint64_t mailboxes_offset;
  std::atomic<uint32_t> aborted;  // 0, the AbortKind, or claimed (being recorded)
  // The futex word and its sleepers, on a line of their own (the line above
  // is read on every poll): bumped only when someone sleeps (WakeSleepers),
  // or on every Wake.
  alignas(64) std::atomic<uint32_t> epoch;
  std::atomic<uint32_t> sleepers;  // waiters in futex_wait
  // The outcome of the last round decided: round << 1 | 1 if it failed.
  // A round is decided once, by the first member that saw every member
  // arrive (completed) or gave up on it (failed: timeout, abort), or that
  // failed it from the round before (a failed read, a failed wait for the
  // releases), so no member completes a round another failed (see
  // collectives.h).
  alignas(64) std::atomic<uint64_t> outcome;
  // The same for waits for releases: round << 1 | 1 if a member gave up
  // waiting for the readers of `round` (then round + 1 failed in `outcome`
  // too), << 1 alone if a member that saw every release decided first.
  std::atomic<uint64_t> release_outcome;
  char abort_reason[512];
  uint64_t trace_records;  // records per rank's trace ring (0: none)
  uint64_t trace_offset;   // of trace ring 0
  uint64_t trace_stride;   // bytes per rank's trace ring
  // CPUs the group's local ranks share, as the creating daemon counted
  // them (RegistryOptions::node_cpus; 0: unknown, each rank then counts
  // the machine's).
  uint32_t node_cpus;
};

// Why a segment was aborted: the group broke (collectives fail ABORTED), or
// the daemon that owns the segment is going away (UNAVAILABLE: its ranks
// lose their session too).
enum class AbortKind : uint32_t { kAborted = 1, kUnavailable = 2 };

class GroupSegment {
 public:
  static constexpr uint64_t kMagic = 0x4d55535445525347ull;  // "MUSTERSG"
  static constexpr int kMaxRanks = 256;
  static constexpr uint64_t kMetaWords = 64;
  // Flight-recorder records per rank (musterd --trace-records).
  static constexpr uint64_t kDefaultTraceRecords = 2048;
  static constexpr uint64_t kMaxTraceRecords = 1 << 20;

  // Creates the segment `name` (a POSIX shm name, "/…"; ALREADY_EXISTS if
  // there is one),
  // readable and writable by its owner only: `owner_uid` (the user whose
  // ranks map it) if >= 0, else the calling process's user.
  static absl::StatusOr<std::unique_ptr<GroupSegment>> Create(
      const std::string& name, int nranks, uint64_t slot_bytes, uint64_t mailbox_bytes = 256 << 10,
      int64_t owner_uid = -1, uint64_t trace_records = kDefaultTraceRecords);
  // Maps an existing segment; checks its magic and rank count.
  static absl::StatusOr<std::unique_ptr<GroupSegment>> Open(const std::string& name,
                                                            int expected_nranks);
  // Removes the name (mappings stay valid until unmapped).
  static void Unlink(const std::string& name);
  // Removes segments named "/muster.<pid>.<n>..." whose creating daemon (pid)
  // no longer runs (a musterd killed with SIGKILL cannot clean up). Returns
  // how many were removed.
  static int RemoveStale();
  ~GroupSegment();
  GroupSegment(const GroupSegment&) = delete;
  GroupSegment& operator=(const GroupSegment&) = delete;

  const std::string& name() const { return name_; }
  // The layout (ranks, sizes, offsets) is read from the header once, when
  // mapped (Open checks it against the file's size), and kept here: the
  // header is writable by the group's user, and what it says later moves
  // no pointer of this process.
  int nranks() const { return layout_.nranks; }
  uint64_t slot_bytes() const { return layout_.slot_bytes; }
  // SegmentHeader::node_cpus. The creator sets it before it hands the
  // segment's name to any rank; ranks only read it.
  void set_node_cpus(unsigned cpus) { header_->node_cpus = cpus; }
  unsigned node_cpus() const { return header_->node_cpus; }
  SegmentHeader& header() { return *header_; }
  RankControl& rank(int i) { return controls_[i]; }
  char* slot(int i) { return slots_ + static_cast<uint64_t>(i) * layout_.slot_bytes; }
  // Rank i's lane for rounds of parity `parity` (RankControl::lane).
  char* lane(int i, uint64_t parity) { return controls_[i].lane[parity & 1]; }
  static constexpr size_t kLaneBytes = sizeof(RankControl::lane[0]);
  // Rank i's word lane for rounds of parity `parity` (RankControl::word_lane).
  char* word_lane(int i, uint64_t parity) { return controls_[i].word_lane[parity & 1]; }
  static constexpr size_t kWordLaneBytes = sizeof(RankControl::word_lane[0]);
  // The ring from rank `from` to rank `to`, and its data area.
  MailboxHeader& mailbox(int from, int to);
  char* mailbox_data(int from, int to) {
    return reinterpret_cast<char*>(&mailbox(from, to)) + sizeof(MailboxHeader);
  }
  uint64_t mailbox_bytes() const { return layout_.mailbox_bytes; }
  // Rank i's flight-recorder ring (trace.h): its header, then
  // trace_records() records.
  uint64_t trace_records() const { return layout_.trace_records; }
  TraceRingHeader& trace_ring(int i) {
    return *reinterpret_cast<TraceRingHeader*>(static_cast<char*>(base_) + layout_.trace_offset +
                                               layout_.trace_stride * static_cast<uint64_t>(i));
  }
  TraceRecord* trace_records(int i) {
    return reinterpret_cast<TraceRecord*>(reinterpret_cast<char*>(&trace_ring(i)) +
                                          sizeof(TraceRingHeader));
  }

  // Sets the abort flag (the first aborter's reason and kind win, whole)
  // and wakes every waiter.
  void Abort(const std::string& reason, AbortKind kind = AbortKind::kAborted);
  bool aborted() const { return header_->aborted.load(std::memory_order_acquire) != 0; }
  // The first aborter's reason (waits out an abort being recorded, up to
  // 100 ms, unless !wait). Only when aborted().
  std::string abort_reason(bool wait = true) const;
  // The failure a waiter reports for the shared abort: `context`: reason,
  // ABORTED or UNAVAILABLE by the abort's kind. Only when aborted().
  absl::Status AbortStatus(absl::string_view context) const;

  // Process-local abort: this process's waits on the segment end and fail
  // with `status` (not OK; the first one wins); other members are not
  // told. Wakes this process's sleepers. Thread-safe.
  void AbortLocally(absl::Status status);
  bool locally_aborted() const { return local_abort_.load(std::memory_order_acquire); }
  // The status AbortLocally set (OK before).
  absl::Status local_abort_status() const;
  // Bumps the futex word and wakes sleepers (after publishing progress).
  void Wake();
  // Sleeps until the futex word differs from `seen` or `timeout_us` passed.
  void Sleep(uint32_t seen, int64_t timeout_us);
  // The collectives' pair, for a hot path: WakeSleepers writes nothing
  // shared while nobody sleeps; a waiter that may be woken only by it must
  // sleep with SleepUnless, which counts itself a sleeper before it checks
  // `ready` a last time (so a waker either sees the sleeper, or the sleeper
  // sees the progress). The fence that needs is asymmetric where the kernel
  // has membarrier(2)'s global expedited command: the sleeper (rare: it
  // yielded for a millisecond first) makes every registered process run a
  // barrier, and the waker (every round) needs only a compiler barrier.
  // Otherwise both sides fence. A process that could not register fences
  // itself; should a sleeper's membarrier fail, a wake-up it misses costs
  // at most its sleep's timeout (the collectives sleep <= 1 ms at a time).
  void WakeSleepers();
  // The other side of WakeSleepers' fence: after it, every progress a
  // waker published before its last WakeSleepers is visible to this
  // thread (a sleeper about to sleep; a rank giving up on a round).
  // Returns false if it could fence only this thread (no membarrier here,
  // or the call failed): then a registered waker's last store may still
  // be on its way.
  static bool FenceAllWakers();

  // Whether a page of this mapping past its file's end was replaced by an
  // anonymous one (the group's user truncated the file; only in a process
  // that ran mapping_guard::Install, i.e. musterd).
  bool truncated() const;

  template <typename Ready>
  void SleepUnless(uint32_t seen, int64_t timeout_us, Ready ready) {
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    FenceAllWakers();
    if (!ready()) FutexWait(seen, timeout_us);
    header_->sleepers.fetch_sub(1, std::memory_order_acq_rel);
  }

 private:
  struct Layout {
    int nranks = 0;
    uint64_t slot_bytes = 0;
    uint64_t slots_offset = 0;
    uint64_t mailbox_bytes = 0;
    uint64_t mailboxes_offset = 0;
    uint64_t trace_records = 0;
    uint64_t trace_offset = 0;
    uint64_t trace_stride = 0;
    // What a header says (to be checked), and writing it into a new one.
    static Layout Of(const SegmentHeader& h);
    void WriteTo(SegmentHeader* h) const;
  };
  GroupSegment(std::string name, void* base, size_t bytes, const Layout& layout, int guard);
  // The abort word once an abort being recorded is (its kind; 0 if none).
  uint32_t SettledAbortWord() const;
  void FutexWait(uint32_t seen, int64_t timeout_us);
  std::string name_;
  void* base_;
  size_t bytes_;
  int guard_;  // mapping_guard's handle for this mapping (-1: none)
  SegmentHeader* header_;
  Layout layout_;
  RankControl* controls_;
  char* slots_;
  std::atomic<bool> local_abort_{false};
  // std::mutex, not absl::Mutex: ThreadSanitizer cannot see into Debian's
  // Abseil, and the backends' tests run ranks as threads.
  mutable std::mutex local_mu_;
  absl::Status local_status_;  // guarded by local_mu_
};

}  // namespace muster

#endif  // MUSTER_BACKENDS_SHM_SEGMENT_H_
