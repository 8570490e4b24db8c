// ShmCommunicator: one rank's view of a process group whose members share a
// node, executing collectives by itself on the group's shared-memory
// segment (no daemon round trip, no system call on the fast path).
//
// Protocol: a collective is a sequence of rounds, numbered globally per
// group. In round k a rank (1) waits until every rank released round k-1
// (so its slot may be overwritten), (2) writes its contribution into its
// own slot and publishes arrived=k, (3) waits until every rank arrived at
// k, (4) reads what it needs from the slots, (5) publishes released=k.
// A small round (every rank's contribution fits in a lane, 1 KiB, and is
// read within the round: barrier, all_reduce, broadcast, reduce,
// all_gather and gather of small buffers) goes through lane k % 2 (8 bytes
// or less: the word lane on the line of `arrived`, read with it) instead
// and skips steps (1) and (5): a rank in round k saw every rank arrive at
// k-1, so each finished reading round k-2, the last to use that lane (and
// the signature words of that parity); a slot round after lane rounds
// publishes the release of round k-1 before it waits for the others', and
// counts a rank that arrived at k or later as released (it finished k-1:
// a rank in a lane round k, a mismatched call, publishes no release, and
// both then reach the signature check). A
// small round writes the line its peers spin on once (arrived), not twice.
// Waiting spins briefly (not at all for a rank last seen on the waiter's
// CPU: it cannot run while the waiter spins; with more ranks than CPUs it
// looks once between yields: WaitPolicy), then yields the CPU for up to
// 1 ms (others that want it get it; an idle CPU returns at once), then
// sleeps on the segment's futex word; it ends
// early if the segment is aborted (ABORTED with musterd's reason;
// UNAVAILABLE when musterd is shutting down), aborted locally in this
// process (with the local reason: the rank lost its musterd; it gives up
// on the round as below, so peers do not run its work) or the
// deadline passes (DEADLINE_EXCEEDED naming the ranks that did not arrive;
// the segment is then aborted so no rank waits for a collective that can
// never complete). A collective fails on every member or on none. A member
// that gives up on a round (its deadline, an abort, a failed read) first
// publishes so (its gave_up word), fences (against every waker: the ranks
// publish progress with a compiler barrier, GroupSegment::WakeSleepers),
// looks at the others again, and unless they all arrived after all decides
// the round failed in the segment's outcome word (compare-and-swap: the
// first decision stands). A member that saw every arrival then reads the
// gave_up words (lines it just read: no extra cache miss) and only if one is
// set takes the decision, deciding "completed" if nobody did yet; so a round
// that completes writes nothing shared but the counters, and no member
// completes a round another failed (one that gave up unseen must see every
// arrival that was seen). Waits for releases (the readers of a round, and
// a direct collective's end: WaitReaders) are decided the same way in their
// own words (gave_up_release, beside `released`, and the segment's
// release_outcome), so a rank whose deadline passes just as the last peer
// releases either completes with the others or fails with them; a failed
// release wait of round k also fails round k+1 in the outcome word (a rank
// whose calls do not match and goes on to round k+1 fails there). A member
// that failed reading decides round k+1 failed before it releases, and a
// member that saw every release looks at that decision. So a rank whose
// deadline passed may still return OK, late, when a member that saw
// everyone there decided first. A
// member that arrives after the round was failed (a late rank) fails at
// once with ABORTED and the reason of the member that gave up, and once
// the segment is aborted every later collective fails at its start. In the first round of every
// collective each rank also publishes its OpSignature; if they differ, every rank fails the
// collective with FAILED_PRECONDITION naming both ranks and both
// signatures (desync). Reductions combine contributions in rank order on
// every rank, so all ranks get bitwise-identical results.
//
// Large buffers are cut into slot-sized chunks, one round per chunk.
//
// Direct transfers. all_reduce, broadcast, all_gather and reduce_scatter of
// at least DirectOptions' thresholds first exchange where each rank's source
// buffer is (one round, carrying the signature). If every source is a
// shared allocation (SharedAllocation, the SDK's AllocShared), peers map it
// and read it in place ("mapped": all_reduce = each rank reduces its 1/n
// of the buffer reading all peers' buffers and writes it into its own, then
// copies the other ranks' reduced parts from their buffers). Otherwise,
// above the cross-memory-attach threshold, peers read ordinary buffers with
// process_vm_readv (one kernel copy, no staging through the slots: "cma").
// Peers read other ranks' buffers and write their own, with three
// exceptions over CMA that write a peer's buffer with process_vm_writev
// where nobody else touches it: all_reduce (rank r reduces part r of every
// buffer and writes the result into part r of each, block by block while
// it is in cache; nobody but rank r touches part r of any buffer),
// all_gather (rank r copies its input into part r of its output and writes
// each block, in cache, into part r of every peer's output), and a
// relayed broadcast (two ranks, or more ranks than CPUs:
// rank r owns part r of the result; the root writes its part into every
// receiver, a receiver reads its part from the root and writes it into
// every other receiver; nobody but rank r writes part r). A
// rank returns only once every peer finished with its buffer, even when
// the collective failed (AwaitPeerWrites). A rank that cannot map
// or read a peer says so in the next round and every rank falls back to the
// slots, so mixed cases (some buffers shared, some not) stay correct. The
// first round also carries whether a rank takes the direct path, so ranks
// configured with different thresholds fail with FAILED_PRECONDITION
// instead of misreading each other; the other kinds (reduce, gather, ...)
// ignore the thresholds altogether.
//
// Thread-compatible: one thread drives a communicator at a time (the SDK
// runs each group's collectives on one executor thread, in order); Abort is
// thread-safe.
#ifndef MUSTER_BACKENDS_SHM_COLLECTIVES_H_
#define MUSTER_BACKENDS_SHM_COLLECTIVES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "backends/communicator.h"
#include "backends/shm/reduce.h"
#include "backends/shm/segment.h"
#include "backends/shm/shared_memory.h"

namespace muster {

// The buffer sizes [min_bytes, max_bytes] for which a collective takes a path.
struct ByteRange {
  size_t min_bytes = SIZE_MAX;
  size_t max_bytes = SIZE_MAX;
  bool Contains(size_t bytes) const { return bytes >= min_bytes && bytes <= max_bytes; }
};

// The buffer sizes for which each collective with a CMA path takes it.
struct CmaRanges {
  ByteRange all_reduce;
  ByteRange broadcast;
  ByteRange all_gather;
  ByteRange reduce_scatter;
  // The range of `kind` (empty for collectives without a CMA path).
  ByteRange For(CollectiveKind kind) const;
};

// When collectives go direct (see above); the same on every rank.
struct DirectOptions {
  // Shared allocations on every rank: peers read them in place.
  size_t mapped_min_bytes = 64 << 10;
  // Ordinary buffers: peers read (all_reduce and all_gather write) them with
  // process_vm_readv/writev when the collective's buffer is in its range
  // (all_reduce and broadcast: the buffer; all_gather: each rank's input;
  // reduce_scatter: the whole input). Elsewhere, and for the other
  // collectives, the slots. The defaults are where CMA won on the 2-vCPU
  // VM of docs/benchmarks.md ("Cross-memory attach vs the slots";
  // all_reduce: "all_reduce owners write their part"), world 2:
  // all_gather and reduce_scatter at every size from those minimums up (up
  // to 2x), all_reduce from 16 KiB (1.5-2.6x the slots' speed at 16
  // KiB-1 MiB; at 8 KiB even), broadcast from 32 KiB to under 1 MiB (from 1
  // MiB the slots, whose copy in and copy out overlap, were as fast or
  // faster: 1.4x at 64 MiB); all_gather up to 16 MiB per rank: from 32 MiB
  // of output the slots copy out with non-temporal stores, and with parts
  // of 32 MiB they took 0.80x the CMA push's time ("the least an all_gather
  // copies").
  CmaRanges cma{
      {16 << 10, SIZE_MAX}, {32 << 10, (1 << 20) - 1}, {16 << 10, 16 << 20}, {64 << 10, SIZE_MAX}};
  // Broadcast in a group of two ranks with a CPU each, instead of
  // cma.broadcast, relayed (ShmCommunicator's header): the root writes half
  // of the receiver's result while the receiver reads the other half, two
  // CPUs copying instead of one (1.1-3x the earlier paths' speed at 64
  // KiB-64 MiB, world 2; docs/benchmarks.md, "the broadcast root copies
  // too").
  ByteRange cma_broadcast_pair{32 << 10, SIZE_MAX};
  // When the group has more ranks than the node has CPUs (world 4 on 2
  // vCPUs, docs/benchmarks.md "CMA when ranks outnumber CPUs" and
  // "all_reduce owners write their part"): all_reduce from 256 KiB
  // (1.1-1.5x faster at 1-16 MiB; below, within the scheduler's spread),
  // all_gather up to 8 MiB per rank (0.4-0.9x the slots' time; 5 MiB and
  // 8 MiB per rank at world 4: 0.8-0.9x; 16 MiB even, 32 MiB slower;
  // "the relayed broadcast") and reduce_scatter up to 16 MiB of input
  // (0.4-0.9x the slots' time; above, even or slower), broadcast
  // relayed from 256 KiB to under 32 MiB (world 3 and 4: 0.6-0.9x the
  // slots' time; at 64 MiB 1.0-1.5x, their copy in and copy out overlap;
  // "the relayed broadcast"; plain CMA, every receiver reading the root,
  // was 1.1-2x slower than the slots).
  CmaRanges cma_oversubscribed{{256 << 10, SIZE_MAX},
                               {256 << 10, (32 << 20) - 1},
                               {16 << 10, 8 << 20},
                               {64 << 10, 16 << 20}};
  // CMA for every collective above from `min_bytes` up (SIZE_MAX: never),
  // oversubscribed or not.
  void SetCmaMinBytes(size_t min_bytes);
  // The defaults, overridden by MUSTER_SHM_MAPPED_MIN_BYTES and
  // MUSTER_SHM_CMA_MIN_BYTES (ParseByteCount; the latter replaces every
  // CMA range by [count, any]). A value that does not parse is ignored
  // with a warning on stderr naming it.
  static DirectOptions FromEnv();
};

// A byte count as the MUSTER_SHM_*_BYTES variables take it: digits with an
// optional K, M or G (KiB, MiB, GiB), or "off" (SIZE_MAX). Returns whether
// `text` was one.
bool ParseByteCount(const std::string& text, size_t* bytes);

// How a rank waits for its peers (ShmCommunicator::WaitAll): it polls
// `poll_burst` times between looks at the clock, spins for up to
// `spin_us` (the collective's first arrival: the others may be anywhere)
// or `inside_spin_us` (later waits: the late ranks are inside the
// collective) unless a late rank was last seen on its own CPU, then
// yields. Chosen from the group's size and the CPUs the node's ranks share
// (GroupSegment::node_cpus: musterd's count of the ranks' CPUs, which a
// cpuset narrows below the machine's).
struct WaitPolicy {
  int poll_burst = 64;
  int spin_us = 50;
  int inside_spin_us = 5000;
  bool oversubscribed = false;  // more ranks than CPUs
  static WaitPolicy For(int ranks, unsigned cpus);
};

class ShmCommunicator : public Communicator {
 public:
  // `rank` is this process's group rank; `global_ranks[i]` the global rank
  // of group rank i (for messages). `segment` must outlive the object.
  ShmCommunicator(GroupSegment* segment, int rank, std::string group_name,
                  std::vector<int> global_ranks);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // The segment's process-local abort (GroupSegment::AbortLocally): this
  // rank's waits end with `reason` (a wait it leaves gives up on its round,
  // as at a deadline, unless the round completed after all); the segment
  // is not aborted for the other members.
  void Abort(const absl::Status& reason) override { segment_->AbortLocally(reason); }
  // Sequence number of the last collective started (0 before the first).
  uint64_t sequence() const { return sequence_; }
  void set_direct_options(const DirectOptions& options) { direct_ = options; }
  // Replaces WaitPolicy::For(size, the segment's node_cpus, else this
  // machine's CPUs); the same on every rank (oversubscribed changes which
  // path an all_reduce takes and which collectives go CMA:
  // DirectOptions::cma_oversubscribed).
  void set_wait_policy(const WaitPolicy& policy) { wait_ = policy; }
  const WaitPolicy& wait_policy() const { return wait_; }
  // Tests: every round sleeps `delay` after all ranks arrived, before it
  // reads (a rank lagging in the middle of a round).
  void set_read_delay_for_testing(absl::Duration delay) { read_delay_ = delay; }
  // Tests: every write into a peer's buffer (WriteTarget) sleeps `delay`
  // first (a writer descheduled in the middle of its copies).
  void set_write_delay_for_testing(absl::Duration delay) { write_delay_ = delay; }
  const DirectOptions& direct_options() const { return direct_; }
  // Tests: a rank giving up on a wait for releases sleeps `pause` after it
  // looked at the others a last time, before it decides (a rank
  // descheduled there).
  void set_release_give_up_pause_for_testing(absl::Duration pause) {
    release_give_up_pause_ = pause;
  }
  // Tests: this rank's probes of peers' buffers fail (as process_vm_readv
  // does where the kernel forbids it).
  void fail_cma_probe_for_testing() { fail_cma_probe_ = true; }
  // Whether a failed probe made the group stop offering CMA.
  bool cma_refused() const { return cma_refused_; }
  // How the last collective moved its data: "slots", "mapped" or "cma".
  const char* last_path() const { return last_path_; }
  // Tests: the group's rounds this rank has run (synchronizations).
  uint64_t rounds_for_testing() const { return round_; }
  // Tests: bytes this rank wrote into peers' buffers (a broadcast root's
  // share over CMA).
  uint64_t peer_bytes_written_for_testing() const { return peer_bytes_written_; }

  absl::Status Barrier(absl::Time deadline) override;
  // In place: `data` holds the input and receives the result.
  absl::Status AllReduce(void* data, size_t count, DType dtype, ReduceOp op, double scale,
                         absl::Time deadline) override;
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                         absl::Time deadline) override;
  // In place at the root; other ranks' `data` is unchanged.
  absl::Status Reduce(void* data, size_t count, DType dtype, ReduceOp op, double scale, int root,
                      absl::Time deadline) override;
  // `out` holds size()*count elements, rank i's input at offset i*count;
  // `in` as Communicator::AllGather says (peers may read it while this rank
  // writes `out`).
  absl::Status AllGather(const void* in, void* out, size_t count, DType dtype,
                         absl::Time deadline) override;
  // `out` (size()*count elements) is used at the root only.
  absl::Status Gather(const void* in, void* out, size_t count, DType dtype, int root,
                      absl::Time deadline) override;
  // `in` (size()*count elements) is read at the root only.
  absl::Status Scatter(const void* in, void* out, size_t count, DType dtype, int root,
                       absl::Time deadline) override;
  // `in` holds size()*count elements; block i is reduced into rank i's `out`.
  absl::Status ReduceScatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                             double scale, absl::Time deadline) override;
  // Sends send_counts[j] elements (consecutive in `in`) to rank j and
  // receives recv_counts[j] elements from rank j (consecutive in `out`).
  // Every pair must agree, else INVALID_ARGUMENT on every rank.
  absl::Status AllToAll(const void* in, const std::vector<size_t>& send_counts, void* out,
                        const std::vector<size_t>& recv_counts, DType dtype,
                        absl::Time deadline) override;

 private:
  // Starts collective `sig` (assigns its sequence number); returns its
  // first-round flag holder.
  OpSignature Begin(CollectiveKind kind, DType dtype, uint64_t count, int root, ReduceOp op);
  absl::Status Finish(absl::Status status);
  // Which buffer a round's contributions go through: the slots, or (when
  // each rank's fits in GroupSegment::kLaneBytes and the op reads them
  // within the round) the lanes, which need no wait for the previous
  // round's readers; the word lanes (8 bytes) share the arrival's line.
  // kSlotParts: a large broadcast's, reduce's or gather's pieces go
  // through the slots split in equal parts used in turn, so a rank writes
  // piece p+1 while its peers still read piece p (a round waits only for
  // the readers of the round that last used its part: the copies in and
  // out overlap, and each piece is read while it is still in cache).
  enum class Via { kSlots, kLanes, kWordLanes, kSlotParts };
  // Where a kSlotParts round writes: `offset` into each slot, and how many
  // rounds back (`lag`) the part was last read.
  struct SlotPart {
    uint64_t lag = 1;
    size_t offset = 0;
  };
  // One round: write(buffer) fills this rank's buffer, read() reads
  // everyone's through Buffer(j).
  template <typename Write, typename Read>
  absl::Status Round(const OpSignature* signature, absl::Time deadline, Write write, Read read,
                     Via via = Via::kSlots, SlotPart part = {});
  // Rank j's buffer in the round in progress (its slot, slot part or lane).
  char* Buffer(int j) {
    switch (via_) {
      case Via::kWordLanes:
        return segment_->word_lane(j, round_);
      case Via::kLanes:
        return segment_->lane(j, round_);
      case Via::kSlotParts:
        return segment_->slot(j) + part_offset_;
      default:
        return segment_->slot(j);
    }
  }
  // How a collective whose ranks each write `bytes` in all goes through
  // the segment: the lanes (small enough, and not a direct transfer), slot
  // parts (at least two of the smallest, a 64th of a slot: 128 KiB at the
  // default 4 MiB) or whole slots.
  Via ViaFor(size_t bytes) const;
  // The same once the exchange round ran: slot parts or whole slots.
  Via SlotsVia(size_t bytes) const;
  // `via`, with whole slots for slot parts (collectives where every rank
  // writes and reads as much: pieces would overlap nothing).
  static Via WholeSlots(Via via);
  // Elements of `es` bytes per round for `bytes` in all (each rank's): a
  // slot part's worth (an eighth of `bytes`, at least the smallest part, a
  // `divisor`th of a slot, and at most an eighth of a slot) when parted,
  // else a whole slot's.
  size_t ChunkFor(size_t bytes, size_t es, int divisor = 64) const;
  // A `divisor`th of a slot, in whole cache lines.
  size_t SmallestPart(int divisor) const;
  // Runs rounds over [0, count) in pieces of at most `chunk` elements;
  // write(buffer, offset, length) and read(offset, length) handle one piece.
  // `signature` (the first round's) is null when an earlier round of the
  // collective already carried it.
  // `start`: elements already moved (by the exchange round, which used the
  // first part). kSlotParts: `part_bytes` of each slot per round.
  template <typename Write, typename Read>
  absl::Status Chunked(const OpSignature* signature, size_t count, size_t chunk,
                       absl::Time deadline, Write write, Read read, size_t start = 0,
                       Via via = Via::kSlots, size_t part_bytes = 0);

  // kSlotsFirstDone: the slots, and the exchange round already was the
  // slot path's first round (no rank's buffer is read directly). kCmaDone:
  // CMA, and the exchange round already ran the direct work (every rank
  // had reached the peers it reads in an earlier collective).
  enum class Direct { kSlots, kSlotsFirstDone, kMapped, kCma, kCmaDone };
  // Whether the current collective, of `bytes` (as DirectOptions counts
  // them), exchanges its sources first.
  bool GoesDirect(size_t bytes) const;
  // Whether this rank offers CMA for the current collective of `bytes`.
  bool OffersCma(size_t bytes) const;
  // The first round of a direct collective: publishes this rank's source
  // buffer and the buffer peers write into over CMA (`target`: the
  // collective's output; nullptr if nobody writes it), agrees on the path;
  // `root` >= 0: only the root's buffer is read. Maps or probes the peers'
  // sources (reached_ says whether it worked) for the next round. Ranks
  // whose buffer is not read directly also run write_first(slot) (the slot
  // path's first write); if every rank did, the round ends with
  // read_first() and returns kSlotsFirstDone. If every rank offers CMA and
  // CmaVerified, the round ends with direct_work() instead (no probe) and
  // returns kCmaDone.
  template <typename WriteFirst, typename ReadFirst, typename Work>
  absl::StatusOr<Direct> ExchangeSources(const OpSignature& signature, const void* source,
                                         const void* target, size_t bytes, int root,
                                         absl::Time deadline, WriteFirst write_first,
                                         ReadFirst read_first, Work direct_work);
  // Whether this rank's probes reached, in an earlier collective that went
  // CMA on every rank, each peer its CMA work touches (Touches) with `root`
  // (-1: every peer) and `relayed`, and those peers' processes are the same.
  bool CmaVerified(int root, bool relayed) const;
  // A round whose read runs `work` only if every rank reached its peers'
  // sources; sets *fallback (and skips `work`) otherwise.
  template <typename Fn>
  absl::Status DirectRound(absl::Time deadline, bool* fallback, Fn work);
  // Runs a direct collective's work; if it fails, fails the next round on
  // every member and aborts the segment.
  template <typename Fn>
  absl::Status RunDirectWork(Fn work);
  // Whether rank j's direct work in the collective in progress writes into
  // this rank's buffer (CMA all_reduce: every peer its reduced part; CMA
  // all_gather: every peer its input; a relayed broadcast: every peer, if
  // this rank is not the root).
  bool PeerWritesHere(int j) const;
  // A collective that fails after this rank ran its direct work (round
  // work_round_) returns only once every peer that writes into its buffer
  // is past that work (released that round, arrived at or gave up on a
  // later one) or gone, so no write lands after the caller got its buffer
  // back; after kPeerWritesGrace it returns anyway, saying which rank may
  // still write. Returns `status`, with that note if so.
  absl::Status AwaitPeerWrites(absl::Status status);
  // Copies `len` bytes at `offset` of rank j's source to `dst`.
  absl::Status ReadSource(int j, size_t offset, size_t len, char* dst);
  // Copies `len` bytes from `src` to `offset` of rank j's target (the
  // address it published) with process_vm_writev.
  absl::Status WriteTarget(int j, size_t offset, size_t len, const char* src);
  // ReadSource's and WriteTarget's cross-memory copy between `local` and
  // `remote_addr` in rank j's process, to the last byte.
  absl::Status CmaCopy(int j, uint64_t remote_addr, size_t len, char* local, bool write);
  // Two ranks with a CPU each (a broadcast's root copies too).
  bool PairWithCpus() const { return size_ == 2 && !wait_.oversubscribed; }
  // Whether a CMA all_gather whose ranks each own `part_bytes` pushes
  // (AllGather) rather than reads its peers' inputs: always when every rank
  // has a CPU; with more ranks than CPUs, parts up to 1 MiB. The same on
  // every rank (wait_ and the count are).
  bool PushesAllGather(size_t part_bytes) const;
  // Whether a CMA broadcast is relayed (ShmCommunicator's header): two
  // ranks, or more ranks than CPUs; not three or more ranks with a CPU
  // each, where every receiver reads the root's whole buffer.
  bool RelaysBroadcast() const { return size_ == 2 || wait_.oversubscribed; }
  // Whether this rank's direct work touches rank j's buffer: reads it (j is
  // the root, or every rank is a source) or writes it (`relayed`: a
  // relayed CMA broadcast, where every rank writes into the receivers).
  bool Touches(int j, int root, bool relayed) const {
    return j != rank_ && (root < 0 || j == root || relayed);
  }
  // Rank j's source at `offset`: its mapping, or `tmp` filled by CMA.
  absl::StatusOr<const char*> Source(int j, const char* own, size_t offset, size_t len, char* tmp);
  // Waits until every peer finished reading this rank's buffer.
  absl::Status WaitReaders(absl::Time deadline);
  // Decides round `round` in `outcome` (the segment's outcome or
  // release_outcome word): completed, or failed if `failed`, unless it was
  // decided before. Returns whether the round failed.
  bool Decide(std::atomic<uint64_t>& outcome, uint64_t round, bool failed);
  // Whether some member's `gave_up` word (gave_up or gave_up_release) is at
  // `round` or past it (only then does a member that saw every arrival, or
  // every release, look at the decision).
  bool AnyGaveUp(std::atomic<uint64_t> RankControl::*gave_up, uint64_t round) const;
  // Publishes that this rank gives up on `round` in its `gave_up` word, then
  // fences against every waker (GroupSegment::FenceAllWakers: the ranks
  // publish progress with a compiler barrier only).
  void AnnounceGivingUp(std::atomic<uint64_t> RankControl::*gave_up, uint64_t round);
  // Gives up waiting for every rank's `field` >= target (deadline, abort):
  // announces it, then decides it failed unless every rank is there after
  // all. Arrivals at round `round` (= target) are decided in `outcome`;
  // releases of round `target` in `release_outcome`, and a failure there
  // fails round `round` (= target + 1) in `outcome` too. Returns whether the
  // wait failed; then `missing` (if given) holds the global ranks that were
  // not there at its last look.
  bool GiveUp(std::atomic<uint64_t> RankControl::*field, uint64_t target, uint64_t round,
              std::vector<int>* missing = nullptr);
  // Fails round `round` on every member (a read in the round before failed,
  // or a wait for its releases): decides it failed in the outcome word.
  void FailRound(uint64_t round);
  // The status of a round another member failed: the segment's abort, or
  // this process's local abort if that comes first (within a second).
  absl::Status Aborted() const;
  // The collective in progress failed by this process's local abort.
  absl::Status LocalAbortStatus() const;
  // Whether rank j's `field` is at `target` or past it. For releases, a
  // rank that arrived at a later round counts too: it finished every round
  // before that one, and lane rounds publish no release (so a slot round
  // after a lane round, against a lane round on another rank, reaches the
  // signature check rather than waiting out its deadline).
  bool Reached(int j, std::atomic<uint64_t> RankControl::*field, uint64_t target) const;
  // Waits until Reached(j, field, target) for every j.
  absl::Status WaitAll(std::atomic<uint64_t> RankControl::*field, uint64_t target,
                       absl::Time deadline, const char* what);
  absl::Status CheckRoot(int root) const;

  GroupSegment* segment_;
  int rank_;
  int size_;
  std::string group_name_;
  std::vector<int> global_ranks_;
  uint64_t round_ = 0;
  Via via_ = Via::kSlots;                 // of the round in progress
  size_t part_offset_ = 0;                // of a kSlotParts round in progress
  absl::Duration read_delay_;             // set_read_delay_for_testing
  absl::Duration write_delay_;            // set_write_delay_for_testing
  absl::Duration release_give_up_pause_;  // set_release_give_up_pause_for_testing
  uint64_t sequence_ = 0;
  OpSignature current_;
  // How WaitAll waits (first_round_ is the collective's first round).
  WaitPolicy wait_;
  uint64_t first_round_ = 1;
  // Publishes this rank's CPU; true if a rank whose `field` is below
  // `target` was last seen waiting on this same CPU.
  bool SharesCpuWithLate(std::atomic<uint64_t> RankControl::*field, uint64_t target);

  // Direct transfers.
  struct PeerSource {
    int32_t pid = 0;
    uint64_t addr = 0;    // its source
    uint64_t target = 0;  // what peers write over CMA (ExchangeSources)
    const char* mapped = nullptr;
  };
  DirectOptions direct_;
  Direct mode_ = Direct::kSlots;
  std::vector<PeerSource> sources_;
  bool reached_ = false;
  // The collective in progress is a relayed CMA broadcast (rank r writes
  // part r of the result into the receivers; Broadcast). The root proposes
  // it; every rank takes the root's word for it (the kRelay flag) in the
  // exchange.
  bool relay_ = false;
  // The round in which this rank ran the collective in progress's direct
  // work (0: it did not): AwaitPeerWrites.
  uint64_t work_round_ = 0;
  uint64_t peer_bytes_written_ = 0;  // WriteTarget's, for tests
  // A rank's probe of a peer's buffer with process_vm_readv failed (Yama's
  // ptrace_scope, for one): no rank of the group offers CMA any more (all
  // learn it in the same round), so later collectives take the slots
  // without a failed exchange first.
  bool cma_refused_ = false;
  // A CMA collective of this communicator went direct on every rank, and
  // the pid each of this rank's probes reached, per rank (0: none):
  // CmaVerified.
  bool cma_agreed_once_ = false;
  std::vector<int32_t> cma_verified_pid_;
  bool fail_cma_probe_ = false;  // tests
  uint64_t path_tag_ = 0;        // compared in first rounds: 1 = direct
  const char* last_path_ = "slots";
  PeerMappings peer_maps_;
  std::vector<char> scratch_;
};

}  // namespace muster

#endif  // MUSTER_BACKENDS_SHM_COLLECTIVES_H_
