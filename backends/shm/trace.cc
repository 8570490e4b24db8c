#include "backends/shm/trace.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "backends/shm/segment.h"

namespace muster {

const char* TraceOpName(TraceOp op) {
  static const char* const kNames[] = {
      "unknown",
      "all_reduce",
      "all_reduce_coalesced",
      "broadcast",
      "reduce",
      "all_gather",
      "all_gather_coalesced",
      "gather",
      "scatter",
      "reduce_scatter",
      "all_to_all",
      "barrier",
      "monitored_barrier",
      "broadcast_object",
      "all_gather_object",
      "gather_object",
      "scatter_object",
      "send",
      "recv",
      "batch_isend_irecv",
  };
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(TraceOp::kNumOps), "");
  size_t i = static_cast<size_t>(op);
  return i < static_cast<size_t>(TraceOp::kNumOps) ? kNames[i] : "unknown";
}

const char* TraceStateName(TraceState state) {
  switch (state) {
    case TraceState::kSubmitted:
      return "submitted";
    case TraceState::kStarted:
      return "started";
    case TraceState::kCompleted:
      return "completed";
    case TraceState::kFailed:
      return "failed";
  }
  return "unknown";
}

TraceWriter::TraceWriter(GroupSegment* segment, int rank, uint64_t capacity) {
  if (segment == nullptr || rank < 0 || rank >= segment->nranks()) return;
  capacity_ = std::min<uint64_t>(capacity, segment->trace_records());
  if (capacity_ == 0) return;
  if ((capacity_ & (capacity_ - 1)) == 0 && capacity_ > 1) mask_ = capacity_ - 1;
  header_ = &segment->trace_ring(rank);
  records_ = segment->trace_records(rank);
  header_->pid.store(static_cast<int32_t>(::getpid()), std::memory_order_relaxed);
  header_->capacity.store(static_cast<uint32_t>(capacity_), std::memory_order_release);
}

int64_t TraceCoarseResolutionNanos() {
  static const int64_t resolution = [] {
    timespec ts{0, 0};
    clock_getres(CLOCK_REALTIME_COARSE, &ts);
    int64_t ns = static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
    return ns > 0 ? ns : int64_t{10000000};  // unknown: assume HZ=100
  }();
  return resolution;
}

TraceRecord* TraceWriter::Lock(uint64_t id) {
  TraceRecord* r = Slot(id);
  uint32_t v = r->version.load(std::memory_order_relaxed);
  for (int waits = 0;;) {
    if ((v & 1) == 0) {
      if (r->version.compare_exchange_weak(v, v + 1, std::memory_order_acquire,
                                           std::memory_order_relaxed)) {
        break;
      }
      continue;
    }
    // Another writer of this slot (rare), briefly. A slot that stays taken
    // (its writer died mid-record) costs this record, not a hang.
    if (++waits > kMaxWriterWaits) return nullptr;
    std::this_thread::yield();
    v = r->version.load(std::memory_order_relaxed);
  }
  // Fields written after the version turned odd are seen by a reader only
  // together with the odd (or a later) version.
  std::atomic_thread_fence(std::memory_order_release);
  if (r->id.load(std::memory_order_relaxed) > id) {  // the ring wrapped: a later record lives here
    Unlock(r);
    return nullptr;
  }
  return r;
}

void TraceWriter::Unlock(TraceRecord* r) {
  r->version.store(r->version.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

uint64_t TraceWriter::Begin(uint64_t seq, const TraceCall& call, int64_t now_ns) {
  return Write(seq, call, TraceState::kSubmitted, now_ns, 0);
}

uint64_t TraceWriter::BeginStarted(uint64_t seq, const TraceCall& call, int64_t submitted_ns,
                                   int64_t started_ns) {
  return Write(seq, call, TraceState::kStarted, submitted_ns, started_ns);
}

uint64_t TraceWriter::Write(uint64_t seq, const TraceCall& call, TraceState state,
                            int64_t submitted_ns, int64_t started_ns) {
  if (capacity_ == 0) return 0;
  uint64_t id = header_->next.fetch_add(1, std::memory_order_relaxed) + 1;
  TraceRecord* r = Lock(id);
  if (r == nullptr) return 0;
  constexpr auto kRelaxed = std::memory_order_relaxed;
  r->id.store(id, kRelaxed);
  r->seq.store(seq, kRelaxed);
  r->op.store(static_cast<uint8_t>(call.op), kRelaxed);
  r->dtype.store(call.dtype, kRelaxed);
  r->device.store(call.device, kRelaxed);
  r->state.store(static_cast<uint8_t>(state), kRelaxed);
  r->count.store(call.count, kRelaxed);
  r->root.store(call.root, kRelaxed);
  r->error.store(0, kRelaxed);
  r->tag.store(call.tag, kRelaxed);
  r->submitted_ns.store(submitted_ns, kRelaxed);
  r->started_ns.store(started_ns, kRelaxed);
  r->completed_ns.store(0, kRelaxed);
  Unlock(r);
  // The next record's lines were last written `capacity` collectives ago
  // and are likely out of cache; a locked instruction on a missing line
  // stalls for the whole miss (~100 ns). Fetch them now, for writing, so
  // the next Begin finds them.
  TraceRecord* next = Slot(id + 1);
  __builtin_prefetch(next, 1, 3);
  __builtin_prefetch(reinterpret_cast<char*>(next) + 64, 1, 3);
  return id;
}

void TraceWriter::Started(uint64_t id, int64_t now_ns) {
  if (id == 0) return;
  TraceRecord* r = Lock(id);
  if (r == nullptr) return;
  if (r->id.load(std::memory_order_relaxed) == id) {
    r->state.store(static_cast<uint8_t>(TraceState::kStarted), std::memory_order_relaxed);
    // (Its submit time may come from another thread's clock: not before it.)
    r->started_ns.store(std::max(now_ns, r->submitted_ns.load(std::memory_order_relaxed)),
                        std::memory_order_relaxed);
  }
  Unlock(r);
}

void TraceWriter::Finished(uint64_t id, int code, int64_t now_ns) {
  if (id == 0) return;
  TraceRecord* r = Lock(id);
  if (r == nullptr) return;
  constexpr auto kRelaxed = std::memory_order_relaxed;
  if (r->id.load(kRelaxed) == id) {
    r->state.store(static_cast<uint8_t>(code == 0 ? TraceState::kCompleted : TraceState::kFailed),
                   kRelaxed);
    r->error.store(code, kRelaxed);
    now_ns = std::max({now_ns, r->submitted_ns.load(kRelaxed), r->started_ns.load(kRelaxed)});
    if (r->started_ns.load(kRelaxed) == 0) r->started_ns.store(now_ns, kRelaxed);
    r->completed_ns.store(now_ns, kRelaxed);
  }
  Unlock(r);
}

namespace {

// Retries (a record being written: its version odd or changed during the
// copy) per ring read, all records together. Honest writers hold a record
// for nanoseconds; a reader meets a few such at most.
constexpr int kMaxReadRetries = 64;

// Records [first, next] of `rank` (clamped to what the ring keeps); `last`
// > 0 keeps only the last `last` of them. The ring is written by the
// group's ranks, which musterd does not trust: ids are clamped to the
// ring's capacity, and the retries of records being written share one
// budget per read (kMaxReadRetries), so a ring whose version words stay odd
// or keep changing costs one pass over it.
std::vector<TraceEntry> ReadRange(GroupSegment& segment, int rank, uint64_t first, uint64_t last,
                                  TraceRange* range) {
  std::vector<TraceEntry> out;
  if (range != nullptr) *range = TraceRange{};
  if (rank < 0 || rank >= segment.nranks() || segment.trace_records() == 0) return out;
  TraceRingHeader& header = segment.trace_ring(rank);
  uint64_t capacity =
      std::min<uint64_t>(header.capacity.load(std::memory_order_acquire), segment.trace_records());
  if (capacity == 0) return out;
  const uint64_t next = header.next.load(std::memory_order_acquire);
  uint64_t kept = std::min(next, capacity);
  if (last > 0) kept = std::min(kept, last);
  uint64_t begin = next - kept + 1;
  if (range != nullptr) {
    range->oldest = next - std::min(next, capacity) + 1;
    range->next = next;
  }
  begin = std::max(begin, first);
  if (kept == 0 || begin > next) return out;
  TraceRecord* records = segment.trace_records(rank);
  int retries = kMaxReadRetries;
  // From begin to next, both included: at most `kept` ids, and no wrap past
  // 2^64 - 1 (the ring's header is written by the group's ranks).
  for (uint64_t id = begin;; ++id) {
    TraceRecord* r = &records[(id - 1) % capacity];
    for (bool first = true; first || retries-- > 0; first = false) {
      uint32_t v1 = r->version.load(std::memory_order_acquire);
      if (v1 & 1) {
        std::this_thread::yield();
        continue;
      }
      // A copy of a record a writer may be changing: kept only if the
      // version says nobody did meanwhile (seqlock).
      constexpr auto kRelaxed = std::memory_order_relaxed;
      TraceEntry e;
      e.id = r->id.load(kRelaxed);
      e.seq = r->seq.load(kRelaxed);
      uint8_t op = r->op.load(kRelaxed);
      e.op = op < static_cast<uint8_t>(TraceOp::kNumOps) ? static_cast<TraceOp>(op)
                                                         : TraceOp::kUnknown;
      e.dtype = r->dtype.load(kRelaxed);
      e.device = r->device.load(kRelaxed);
      e.state = static_cast<TraceState>(std::min<uint8_t>(r->state.load(kRelaxed), 3));
      e.count = r->count.load(kRelaxed);
      e.root = r->root.load(kRelaxed);
      e.error = r->error.load(kRelaxed);
      e.tag = r->tag.load(kRelaxed);
      e.submitted_ns = r->submitted_ns.load(kRelaxed);
      e.started_ns = r->started_ns.load(kRelaxed);
      e.completed_ns = r->completed_ns.load(kRelaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (r->version.load(kRelaxed) != v1) continue;
      if (e.id != id) break;  // not written yet, or overwritten: left out
      out.push_back(e);
      break;
    }
    if (id == next) break;
  }
  return out;
}

}  // namespace

std::vector<TraceEntry> ReadTrace(GroupSegment& segment, int rank, uint64_t last) {
  return ReadRange(segment, rank, 0, last, nullptr);
}

std::vector<TraceEntry> ReadTraceFrom(GroupSegment& segment, int rank, uint64_t first,
                                      TraceRange* range) {
  return ReadRange(segment, rank, first, 0, range);
}

}  // namespace muster
