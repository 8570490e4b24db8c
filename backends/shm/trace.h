// The flight recorder: each rank's ring of its last collectives on one
// group, kept in the group's shared-memory segment (see segment.h) so that
// musterd reads it at any time without asking the rank (`musterctl trace`,
// `musterctl why`, the dumps of a broken group).
//
// Layout (per segment rank, at GroupSegment::trace_ring(i)):
//   TraceRingHeader | TraceRecord x capacity
// Record ids count from 1 per rank; record `id` lives at (id - 1) % capacity.
//
// Consistency without locks: every record has a version word (a per-record
// seqlock). A writer takes it by moving it from even to odd (compare and
// swap, so the rare writers of the same slot, e.g. a long-pending receive
// completing after the ring wrapped, exclude each other), writes the fields
// and releases it (even again). A reader copies the record between two
// reads of the word and keeps the copy only if the word was even and
// unchanged, and the copy's id is the one it expected. A new segment is
// zero-filled: every record starts with version 0 and id 0 (none).
//
// Thread-safety: TraceWriter is thread-safe (ids come from an atomic
// counter in the ring header; each record is written under its version
// word). Only one process writes a rank's ring: the rank itself. Readers
// (ReadTrace) never block writers and may run in any process.
#ifndef MUSTER_BACKENDS_SHM_TRACE_H_
#define MUSTER_BACKENDS_SHM_TRACE_H_

#include <time.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "common/fast_clock.h"

namespace muster {

class GroupSegment;

// The recorder's clock: Unix time in nanoseconds (FastRealtimeNanos: the
// time-stamp counter where the kernel keeps time with it, else
// clock_gettime(CLOCK_REALTIME); common/fast_clock.h). Every time in a
// record comes from it, so a record's times are ordered. Not absl::Now():
// read between two collectives, absl's calibrated cycle clock cost ~70 ns
// more per read than clock_gettime (muster-bench collectives
// --trace-compare; docs/benchmarks.md), and clock_gettime ~30 ns more than
// FastRealtimeNanos.
inline int64_t TraceClockNanos() { return FastRealtimeNanos(); }

// The same clock to the kernel's tick (CLOCK_REALTIME_COARSE: no
// time-stamp counter read, ~10 ns against the exact clock's ~60 ns within
// a collective on the VM of docs/benchmarks.md), never ahead of the exact
// clock and at most TraceCoarseResolutionNanos() behind it.
inline int64_t TraceCoarseClockNanos() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
int64_t TraceCoarseResolutionNanos();  // the tick, e.g. 4 ms at HZ=250

// What a record describes: the SDK's calls (not the communicator's steps:
// an all_gather_object is one record).
enum class TraceOp : uint8_t {
  kUnknown = 0,
  kAllReduce,
  kAllReduceCoalesced,
  kBroadcast,
  kReduce,
  kAllGather,
  kAllGatherCoalesced,
  kGather,
  kScatter,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kMonitoredBarrier,
  kBroadcastObject,
  kAllGatherObject,
  kGatherObject,
  kScatterObject,
  kSend,
  kRecv,
  kBatchP2P,
  kNumOps,
};
// "all_reduce", "send", ...
const char* TraceOpName(TraceOp op);

enum class TraceState : uint8_t {
  kSubmitted = 0,  // queued, not started
  kStarted = 1,    // running (entered the communicator)
  kCompleted = 2,
  kFailed = 3,
};
const char* TraceStateName(TraceState state);  // "submitted", ...

// One collective as this rank issued it. In shared memory, written between
// the version word's odd and even values. Every field is an atomic accessed
// with relaxed order (plain moves on x86-64): the version word orders them,
// and a reader racing a writer reads no torn word (and race detectors see
// none).
struct alignas(64) TraceRecord {
  std::atomic<uint32_t> version;      // odd while a writer holds the record
  std::atomic<uint8_t> op;            // TraceOp
  std::atomic<uint8_t> dtype;         // muster::DType
  std::atomic<uint8_t> device;        // muster::Device (0 cpu, 1 cuda)
  std::atomic<uint8_t> state;         // TraceState
  std::atomic<uint64_t> id;           // record number on this ring, from 1
  std::atomic<uint64_t> seq;          // the group's collective sequence number; 0 for p2p
  std::atomic<uint64_t> count;        // elements (of the input, per rank)
  std::atomic<int32_t> root;          // root, or peer group rank (p2p; -2: any source), else -1
  std::atomic<int32_t> error;         // absl::StatusCode of a failed one
  std::atomic<uint64_t> tag;          // p2p tag
  std::atomic<int64_t> submitted_ns;  // Unix time, nanoseconds
  std::atomic<int64_t> started_ns;    // 0 until started
  std::atomic<int64_t> completed_ns;  // 0 until completed or failed
};
static_assert(sizeof(TraceRecord) == 128, "two cache lines per record");

struct alignas(64) TraceRingHeader {
  std::atomic<uint64_t> next;      // the last record id begun (0: none)
  std::atomic<uint32_t> capacity;  // records this rank keeps (<= the segment's; 0: off)
  std::atomic<int32_t> pid;        // the writing process
};

// A consistent copy of one record (ReadTrace).
struct TraceEntry {
  uint64_t id = 0;
  uint64_t seq = 0;
  TraceOp op = TraceOp::kUnknown;
  uint8_t dtype = 0;
  uint8_t device = 0;
  TraceState state = TraceState::kSubmitted;
  uint64_t count = 0;
  int32_t root = -1;
  int32_t error = 0;
  uint64_t tag = 0;
  int64_t submitted_ns = 0, started_ns = 0, completed_ns = 0;
};

// What a collective is, for TraceWriter::Begin.
struct TraceCall {
  TraceOp op = TraceOp::kUnknown;
  uint8_t dtype = 0;
  uint8_t device = 0;
  uint64_t count = 0;
  int32_t root = -1;
  uint64_t tag = 0;
};

// Writes one rank's ring. The segment outlives the writer.
class TraceWriter {
 public:
  // Records at most `capacity` (clamped to the segment's) collectives of
  // segment rank `rank`; resumes after the ring's last id (an earlier
  // handle of this rank may have written it). capacity 0: records nothing.
  TraceWriter(GroupSegment* segment, int rank, uint64_t capacity);
  bool enabled() const { return capacity_ > 0; }
  uint64_t capacity() const { return capacity_; }
  // Starts a record (state submitted); returns its id (0 when disabled).
  uint64_t Begin(uint64_t seq, const TraceCall& call, int64_t now_ns);
  // Begin and Started in one write, for a call that enters its
  // communicator right away (the SDK's blocking path): state started.
  uint64_t BeginStarted(uint64_t seq, const TraceCall& call, int64_t submitted_ns,
                        int64_t started_ns);
  // The collective entered its communicator.
  void Started(uint64_t id, int64_t now_ns);
  // It ended; `code` is its absl::StatusCode (0: completed).
  void Finished(uint64_t id, int code, int64_t now_ns);

 private:
  uint64_t Write(uint64_t seq, const TraceCall& call, TraceState state, int64_t submitted_ns,
                 int64_t started_ns);
  // Null if the slot holds another record now, or stayed taken by another
  // writer for kMaxWriterWaits yields (the record is then not kept).
  TraceRecord* Lock(uint64_t id);
  static constexpr int kMaxWriterWaits = 1000;
  static void Unlock(TraceRecord* r);
  // Where record `id` lives. A power-of-two capacity (the default's) takes
  // a mask: the 64-bit division cost ~10 ns a record on the VM of
  // docs/benchmarks.md, three per collective.
  TraceRecord* Slot(uint64_t id) const {
    return &records_[mask_ != 0 ? (id - 1) & mask_ : (id - 1) % capacity_];
  }
  TraceRingHeader* header_ = nullptr;
  TraceRecord* records_ = nullptr;
  uint64_t capacity_ = 0;
  uint64_t mask_ = 0;  // capacity_ - 1 when that is a power of two, else 0
};

// The last `last` records (0: all kept) of segment rank `rank`, oldest
// first. Records being written at the moment are retried briefly (a few
// dozen retries per read in all, whatever the ring holds), then left out.
std::vector<TraceEntry> ReadTrace(GroupSegment& segment, int rank, uint64_t last = 0);

// The ids a ring held when it was read: records oldest..next (none when
// next is 0). Ids below `oldest` were overwritten.
struct TraceRange {
  uint64_t oldest = 1;
  uint64_t next = 0;
};
// The records of segment rank `rank` from id `first` on (those the ring
// still keeps), oldest first, and the range the ring held (`range`, may be
// null). For readers that follow a ring, e.g. musterd's metrics.
std::vector<TraceEntry> ReadTraceFrom(GroupSegment& segment, int rank, uint64_t first,
                                      TraceRange* range);

}  // namespace muster

#endif  // MUSTER_BACKENDS_SHM_TRACE_H_
