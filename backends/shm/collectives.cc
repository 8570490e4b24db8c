#include "backends/shm/collectives.h"

#include <immintrin.h>
#include <sched.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/process.h"
#include "common/status_macros.h"

namespace muster {
namespace {

inline void CpuRelax() { _mm_pause(); }

// Meta words of the direct paths (RankControl::meta).
enum SourceWord { kFlags = 0, kPid, kFd, kInode, kOffset, kAddr, kTarget };
constexpr uint64_t kAcceptMapped = 1, kAcceptCma = 2, kShared = 4, kWroteFirst = 8,
                   kCmaVerified = 16, kRelay = 32, kCmaVerifiedRelayed = 64;
constexpr int kReachedWord = 0;  // second round: 1 = reached every source

// An OpSignature and a path bit in the two words RankControl keeps per
// round parity: word 0 = the sequence's low 32 bits | root + 1 (16 bits) |
// kind (8) | dtype (8); word 1 = count (56 bits) | reduce op (7) | path (1).
// Exact for every value a segment can see (ranks < 2^16, counts < 2^56);
// sequences are compared modulo 2^32.
struct PackedSignature {
  static constexpr uint64_t kPathBit = uint64_t{1} << 63;
  static constexpr uint64_t kCountMask = (uint64_t{1} << 56) - 1;
  uint64_t words[2] = {0, 0};

  bool SameOp(const PackedSignature& o) const {
    return words[0] == o.words[0] && (words[1] & ~kPathBit) == (o.words[1] & ~kPathBit);
  }
  uint64_t path() const { return words[1] >> 63; }
  // The signature back, with the high bits of the sequence from `near`.
  OpSignature Unpack(uint64_t near) const {
    OpSignature s;
    s.sequence = (near & ~uint64_t{0xffffffff}) | (words[0] & 0xffffffff);
    s.root = static_cast<int32_t>((words[0] >> 32) & 0xffff) - 1;
    s.kind = static_cast<uint32_t>((words[0] >> 48) & 0xff);
    s.dtype = static_cast<uint32_t>(words[0] >> 56);
    s.count = words[1] & kCountMask;
    s.reduce_op = static_cast<uint32_t>((words[1] >> 56) & 0x7f);
    return s;
  }
};

PackedSignature Pack(const OpSignature& s, uint64_t path) {
  PackedSignature p;
  p.words[0] = (s.sequence & 0xffffffff) | (static_cast<uint64_t>((s.root + 1) & 0xffff) << 32) |
               (static_cast<uint64_t>(s.kind & 0xff) << 48) |
               (static_cast<uint64_t>(s.dtype & 0xff) << 56);
  p.words[1] = (s.count & PackedSignature::kCountMask) |
               (static_cast<uint64_t>(s.reduce_op & 0x7f) << 56) |
               (path != 0 ? PackedSignature::kPathBit : 0);
  return p;
}

// Work unit of the direct reductions: the accumulator stays in cache while
// every rank's piece is combined into it (and, in an all_reduce over CMA,
// written into the peers' buffers). 256 KiB: fewer system calls than 64
// KiB (world-2 CMA all_reduce 4-64 MiB 6-12 % faster), as fast as 512 KiB.
constexpr size_t kBlockBytes = 256 << 10;

// An all_gather output at least this large is written out of the slots
// with non-temporal stores (CopyPastCache): it cannot stay in cache anyway.
constexpr size_t kPastCacheOutputBytes = 32 << 20;

// memcpy with non-temporal (streaming) stores from the first 16-byte
// aligned byte of `dst`, then a store fence.
void CopyPastCache(char* dst, const char* src, size_t n) {
  size_t i = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  if (i > n) i = n;
  std::memcpy(dst, src, i);
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  for (; i + 16 <= n; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
}

// The byte count in environment variable `name` (ParseByteCount); nothing
// when it is unset or empty, or (with a warning naming it) does not parse.
std::optional<size_t> EnvBytes(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return std::nullopt;
  size_t bytes = 0;
  if (ParseByteCount(v, &bytes)) return bytes;
  std::fprintf(stderr,
               "muster: %s='%s' is not a byte count (digits with an optional K, M or G, or "
               "off); ignored\n",
               name, v);
  return std::nullopt;
}

// Rank r's part of `count` elements split n ways: [*off, *off + return).
size_t Part(size_t count, int n, int r, size_t* off) {
  size_t part = count / n;
  *off = part * r;
  return r == n - 1 ? count - part * r : part;
}

}  // namespace

bool ParseByteCount(const std::string& text, size_t* bytes) {
  if (text == "off") {
    *bytes = SIZE_MAX;
    return true;
  }
  absl::string_view digits = text;
  int shift = 0;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'K':
      case 'k':
        shift = 10;
        break;
      case 'M':
      case 'm':
        shift = 20;
        break;
      case 'G':
      case 'g':
        shift = 30;
        break;
      default:
        break;
    }
  }
  if (shift > 0) digits.remove_suffix(1);
  if (digits.empty()) return false;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;  // no sign, no space
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(digits, &n) || n > (SIZE_MAX >> shift)) return false;
  *bytes = static_cast<size_t>(n) << shift;
  return true;
}

DirectOptions DirectOptions::FromEnv() {
  DirectOptions o;
  if (std::optional<size_t> b = EnvBytes("MUSTER_SHM_MAPPED_MIN_BYTES")) o.mapped_min_bytes = *b;
  if (std::optional<size_t> b = EnvBytes("MUSTER_SHM_CMA_MIN_BYTES")) o.SetCmaMinBytes(*b);
  return o;
}

void DirectOptions::SetCmaMinBytes(size_t min_bytes) {
  for (CmaRanges* set : {&cma, &cma_oversubscribed}) {
    for (ByteRange* r :
         {&set->all_reduce, &set->broadcast, &set->all_gather, &set->reduce_scatter}) {
      *r = ByteRange{min_bytes, SIZE_MAX};
    }
  }
  cma_broadcast_pair = ByteRange{min_bytes, SIZE_MAX};
}

ByteRange CmaRanges::For(CollectiveKind kind) const {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return all_reduce;
    case CollectiveKind::kBroadcast:
      return broadcast;
    case CollectiveKind::kAllGather:
      return all_gather;
    case CollectiveKind::kReduceScatter:
      return reduce_scatter;
    default:
      return ByteRange{};
  }
}

WaitPolicy WaitPolicy::For(int ranks, unsigned cpus) {
  WaitPolicy p;
  p.oversubscribed = static_cast<unsigned>(ranks) > std::max(1u, cpus);
  if (p.oversubscribed) {
    // Spinning only pays while every rank can have its own core. With more
    // ranks than CPUs a waiter looks once between yields: the ranks it
    // waits for often share its CPU, and a burst of pauses before each
    // yield only delayed them (world 4 on 2 vCPUs, barrier p50 9.7-9.9 ->
    // 7.0-8.9 us; docs/benchmarks.md, "the oversubscribed barrier").
    p.poll_burst = 1;
    p.spin_us = 2;
    p.inside_spin_us = 2;
  }
  return p;
}

ShmCommunicator::ShmCommunicator(GroupSegment* segment, int rank, std::string group_name,
                                 std::vector<int> global_ranks)
    : segment_(segment),
      rank_(rank),
      size_(segment->nranks()),
      group_name_(std::move(group_name)),
      global_ranks_(std::move(global_ranks)),
      direct_(DirectOptions::FromEnv()) {
  // The daemon's count (the same for every rank; one rank's own affinity
  // may be one bound core), else the machine's.
  wait_ = WaitPolicy::For(size_, segment->node_cpus() != 0 ? segment->node_cpus()
                                                           : std::thread::hardware_concurrency());
  if (global_ranks_.size() != static_cast<size_t>(size_)) {
    global_ranks_.resize(size_);
    for (int i = 0; i < size_; ++i) global_ranks_[i] = i;
  }
  segment_->rank(rank_).pid.store(static_cast<int32_t>(::getpid()));
  cma_verified_pid_.assign(size_, 0);
  // Resume where the group is (a communicator may be created after others
  // already used the segment, e.g. by an earlier handle of this rank).
  round_ = std::max(segment_->rank(rank_).released.load(std::memory_order_acquire),
                    segment_->rank(rank_).last_round.load(std::memory_order_acquire));
  sequence_ = segment_->rank(rank_).completed.load(std::memory_order_acquire);
}

OpSignature ShmCommunicator::Begin(CollectiveKind kind, DType dtype, uint64_t count, int root,
                                   ReduceOp op) {
  OpSignature s = MakeSignature(++sequence_, kind, dtype, count, root, op);
  current_ = s;
  first_round_ = round_ + 1;
  path_tag_ = 0;
  relay_ = false;
  work_round_ = 0;
  last_path_ = "slots";
  segment_->rank(rank_).submitted.store(s.sequence, std::memory_order_release);
  return s;
}

absl::Status ShmCommunicator::Finish(absl::Status status) {
  if (!status.ok() && work_round_ != 0) status = AwaitPeerWrites(std::move(status));
  segment_->rank(rank_).last_round.store(round_, std::memory_order_release);
  segment_->rank(rank_).completed.store(sequence_, std::memory_order_release);
  return status;
}

// How long a waiting rank yields its CPU (after its spin) before it sleeps.
constexpr int64_t kYieldBudgetUs = 1000;

bool ShmCommunicator::SharesCpuWithLate(std::atomic<uint64_t> RankControl::*field,
                                        uint64_t target) {
  int cpu = sched_getcpu();
  RankControl& me = segment_->rank(rank_);
  if (me.cpu.load(std::memory_order_relaxed) != cpu) {
    me.cpu.store(cpu, std::memory_order_relaxed);  // rarely: the line is read every round
  }
  if (cpu < 0) return false;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    const RankControl& other = segment_->rank(j);
    if (!Reached(j, field, target) && other.cpu.load(std::memory_order_relaxed) == cpu) {
      return true;
    }
  }
  return false;
}

bool ShmCommunicator::Decide(std::atomic<uint64_t>& outcome, uint64_t round, bool failed) {
  uint64_t mine = (round << 1) | (failed ? 1 : 0);
  uint64_t seen = outcome.load(std::memory_order_acquire);
  while ((seen >> 1) < round) {
    if (outcome.compare_exchange_weak(seen, mine, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      return failed;
    }
  }
  // Decided before. A later round is decided only by members that completed
  // this one (a failed round ends the collective on everyone).
  return (seen >> 1) == round && (seen & 1) != 0;
}

bool ShmCommunicator::AnyGaveUp(std::atomic<uint64_t> RankControl::*gave_up, uint64_t round) const {
  // seq_cst loads (plain loads on x86) after those of the arrivals or
  // releases: with GiveUp's store and fence, a member that gives up either
  // is seen here or sees every arrival (release) seen here.
  for (int j = 0; j < size_; ++j) {
    if ((segment_->rank(j).*gave_up).load(std::memory_order_seq_cst) >= round) return true;
  }
  return false;
}

void ShmCommunicator::AnnounceGivingUp(std::atomic<uint64_t> RankControl::*gave_up,
                                       uint64_t round) {
  std::atomic<uint64_t>& mine = segment_->rank(rank_).*gave_up;
  if (mine.load(std::memory_order_relaxed) >= round) return;  // and fenced then
  mine.store(round, std::memory_order_seq_cst);
  // The peers store their progress and then read the gave_up words with no
  // fence between (WakeSleepers): a plain fence here would let a peer's
  // store still sit in its store buffer while this rank looks, and the peer
  // miss this announcement. FenceAllWakers drains theirs too (membarrier;
  // with release stores on a multi-copy-atomic machine, x86 or ARMv8, every
  // rank then sees what the peer saw). Where it cannot (no membarrier in
  // this process, which its peers may have), a store buffer drains in far
  // less than this sleep, and giving up is rare.
  if (!segment_->FenceAllWakers()) absl::SleepFor(absl::Milliseconds(1));
}

bool ShmCommunicator::GiveUp(std::atomic<uint64_t> RankControl::*field, uint64_t target,
                             uint64_t round, std::vector<int>* missing) {
  const bool arrivals = field == &RankControl::arrived;
  AnnounceGivingUp(arrivals ? &RankControl::gave_up : &RankControl::gave_up_release, target);
  std::vector<int> late;
  for (int j = 0; j < size_; ++j) {
    if (!Reached(j, field, target)) late.push_back(global_ranks_[j]);
  }
  // Every member there after all: the wait sees them on its next look (and
  // takes the decision there).
  if (late.empty()) return false;
  if (missing != nullptr) *missing = std::move(late);
  if (arrivals) return Decide(segment_->header().outcome, round, /*failed=*/true);
  if (release_give_up_pause_ != absl::ZeroDuration()) absl::SleepFor(release_give_up_pause_);
  // A member that saw every release decided first: the releases it saw show
  // here on a next look.
  if (!Decide(segment_->header().release_outcome, target, /*failed=*/true)) return false;
  FailRound(round);
  return true;
}

void ShmCommunicator::FailRound(uint64_t round) {
  // No member can see every arrival at `round` (this one will not arrive),
  // so nobody looks for this gave_up word under a race: no fence for it.
  std::atomic<uint64_t>& mine = segment_->rank(rank_).gave_up;
  if (mine.load(std::memory_order_relaxed) < round) mine.store(round, std::memory_order_seq_cst);
  Decide(segment_->header().outcome, round, /*failed=*/true);
}

// How long a rank whose round another member failed waits for the reason.
constexpr absl::Duration kFailureReasonGrace = absl::Seconds(1);

absl::Status ShmCommunicator::Aborted() const {
  // A member that failed the round at its deadline or on a failed copy
  // aborts the segment right after deciding: wait for its reason. One that
  // gave up because its musterd went away (a local abort) aborts nothing;
  // this rank shares that musterd, and its own session says so within
  // moments: wait for that too, so the caller learns that its musterd is
  // gone rather than that some member failed.
  const absl::Time until = absl::Now() + kFailureReasonGrace;
  for (int i = 0; !segment_->aborted() && !segment_->locally_aborted(); ++i) {
    if (i < 1000) {
      std::this_thread::yield();
    } else if (absl::Now() < until) {
      absl::SleepFor(absl::Microseconds(200));
    } else {
      return absl::AbortedError(absl::StrCat(DescribeSignature(current_), " on group '",
                                             group_name_, "' failed on another member"));
    }
  }
  if (!segment_->aborted()) return LocalAbortStatus();
  return segment_->AbortStatus(
      absl::StrCat(DescribeSignature(current_), " on group '", group_name_, "' aborted"));
}

absl::Status ShmCommunicator::LocalAbortStatus() const {
  absl::Status local = segment_->local_abort_status();
  return absl::Status(local.code(), absl::StrCat(DescribeSignature(current_), " on group '",
                                                 group_name_, "': ", local.message()));
}

bool ShmCommunicator::Reached(int j, std::atomic<uint64_t> RankControl::*field,
                              uint64_t target) const {
  const RankControl& other = segment_->rank(j);
  if ((other.*field).load(std::memory_order_seq_cst) >= target) return true;
  return field == &RankControl::released && other.arrived.load(std::memory_order_seq_cst) > target;
}

absl::Status ShmCommunicator::WaitAll(std::atomic<uint64_t> RankControl::*field, uint64_t target,
                                      absl::Time deadline, const char* what) {
  // Waiting for arrivals at round `target` decides that round; a wait for
  // releases of round `target` decides that wait (release_outcome), and
  // failing it fails the next round too.
  const bool arrivals = field == &RankControl::arrived;
  const uint64_t round = arrivals ? target : target + 1;
  absl::Time spin_until = absl::InfinitePast();
  int polls = 0;
  while (true) {
    uint32_t epoch = segment_->header().epoch.load(std::memory_order_acquire);
    bool all = true;
    for (int j = 0; j < size_; ++j) {
      if (!Reached(j, field, target)) {
        all = false;
        break;
      }
    }
    if (all) {
      // Every member arrived, but one may have given up on the round
      // already (a late arrival): then it failed here too. Only a member
      // that gave up writes the decision; while none did (their gave_up
      // words sit on the lines just read) the round completed.
      if (arrivals) {
        if (AnyGaveUp(&RankControl::gave_up, round) &&
            Decide(segment_->header().outcome, round, /*failed=*/false)) {
          return Aborted();
        }
        return absl::OkStatus();
      }
      // Releases are decided alike, in their own words.
      if (target > 0 && AnyGaveUp(&RankControl::gave_up_release, target) &&
          Decide(segment_->header().release_outcome, target, /*failed=*/false)) {
        return Aborted();
      }
      // Every member released, but one failed reading (it decided the next
      // round failed before releasing): not OK here either.
      if (segment_->header().outcome.load(std::memory_order_acquire) == ((round << 1) | 1)) {
        return Aborted();
      }
      return absl::OkStatus();
    }
    if (segment_->locally_aborted()) {
      // Announced like any other give-up, unless the round completed after
      // all (then this rank goes on with it, as peers that saw every
      // arrival do, and fails at its next wait): a peer must not run a
      // round's work, which may write into this rank's buffer, after this
      // rank returned its buffer to the caller.
      if (!GiveUp(field, target, round)) continue;
      return LocalAbortStatus();
    }
    if (segment_->aborted()) {
      // Unless the round completed (every member arrived, or a member that
      // saw them all decided so: visible here on the next look).
      if (!GiveUp(field, target, round)) continue;
      return segment_->AbortStatus(
          absl::StrCat(DescribeSignature(current_), " on group '", group_name_, "' aborted"));
    }
    if (++polls < wait_.poll_burst) {
      CpuRelax();
      continue;
    }
    polls = 0;
    absl::Time now = absl::Now();
    if (spin_until == absl::InfinitePast()) {
      // Spinning helps only while the ranks waited for can run: one last
      // seen on this CPU cannot while this rank spins on it. Past the
      // collective's first arrival every late rank is inside it, copying or
      // reducing its share, and arrives within that work: spin longer there
      // rather than yield, for a yield on a CPU shared with a busy process
      // hands it a whole time slice (4 ms), which the peers then wait out
      // (docs/benchmarks.md, "the mid-size cliff under the hog").
      const bool late_are_inside = arrivals ? target > first_round_ : target >= first_round_;
      const int budget_us = late_are_inside ? wait_.inside_spin_us : wait_.spin_us;
      spin_until = SharesCpuWithLate(field, target) ? now : now + absl::Microseconds(budget_us);
    }
    if (now >= deadline) {
      std::vector<int> missing;
      if (!GiveUp(field, target, round, &missing)) continue;  // it completed
      std::string message = absl::StrCat(DescribeSignature(current_), " on group '", group_name_,
                                         "' timed out waiting for ranks ",
                                         absl::StrJoin(missing, ", "), " to ", what);
      segment_->Abort(absl::StrCat("rank ", global_ranks_[rank_], ": ", message));
      return absl::DeadlineExceededError(message);
    }
    if (now < spin_until) continue;
    // Then yield the CPU for a while before sleeping on the futex (a wake-up
    // costs a scheduler round trip per rank, and far more when the CPU it
    // wakes on is busy): whoever else wants this CPU (the ranks waited for,
    // a data loader) gets it; when nobody does, the yield returns at once
    // and the wait sees the others arrive as a spin would.
    if (now < spin_until + absl::Microseconds(kYieldBudgetUs)) {
      std::this_thread::yield();
      continue;
    }
    absl::Duration left = deadline - now;
    int64_t sleep_us = std::min<int64_t>(absl::ToInt64Microseconds(left) + 1, 1000);
    // Progress is announced by WakeSleepers (nothing shared is written while
    // nobody sleeps): look once more after counting ourselves a sleeper.
    segment_->SleepUnless(epoch, std::max<int64_t>(sleep_us, 1), [&] {
      if (segment_->aborted() || segment_->locally_aborted()) return true;
      for (int j = 0; j < size_; ++j) {
        if (!Reached(j, field, target)) return false;
      }
      return true;
    });
  }
}

namespace {

// Slot parts (Via::kSlotParts): a collective is parted when it fills at
// least two of its smallest parts. A part is an eighth of the collective's
// bytes, between `smallest` and an eighth of a slot, in whole cache lines.
size_t PartBytes(size_t slot_bytes, size_t bytes, size_t smallest) {
  size_t largest = slot_bytes / 8 / 64 * 64;
  size_t eighth = (bytes / 8 + 63) / 64 * 64;
  return std::clamp(eighth, smallest, std::max(smallest, largest));
}

bool Parted(size_t bytes, size_t smallest) { return smallest > 0 && bytes >= 2 * smallest; }

}  // namespace

ShmCommunicator::Via ShmCommunicator::ViaFor(size_t bytes) const {
  if (bytes > GroupSegment::kLaneBytes || GoesDirect(bytes)) return SlotsVia(bytes);
  return bytes <= GroupSegment::kWordLaneBytes ? Via::kWordLanes : Via::kLanes;
}

size_t ShmCommunicator::SmallestPart(int divisor) const {
  return segment_->slot_bytes() / divisor / 64 * 64;
}

ShmCommunicator::Via ShmCommunicator::WholeSlots(Via via) {
  return via == Via::kSlotParts ? Via::kSlots : via;
}

ShmCommunicator::Via ShmCommunicator::SlotsVia(size_t bytes) const {
  return Parted(bytes, SmallestPart(64)) ? Via::kSlotParts : Via::kSlots;
}

size_t ShmCommunicator::ChunkFor(size_t bytes, size_t es, int divisor) const {
  size_t slot = segment_->slot_bytes(), smallest = SmallestPart(divisor);
  return std::max<size_t>(1,
                          (Parted(bytes, smallest) ? PartBytes(slot, bytes, smallest) : slot) / es);
}

template <typename Write, typename Read>
absl::Status ShmCommunicator::Round(const OpSignature* signature, absl::Time deadline, Write write,
                                    Read read, Via via, SlotPart part) {
  uint64_t k = ++round_;
  via_ = via;
  part_offset_ = part.offset;
  const bool slots = via == Via::kSlots || via == Via::kSlotParts;
  RankControl& me = segment_->rank(rank_);
  // A broken group fails every later collective at once, on every member.
  if (segment_->aborted() && !segment_->locally_aborted()) {
    return segment_->AbortStatus(
        absl::StrCat(DescribeSignature(current_), " on group '", group_name_, "' aborted"));
  }
  if (slots) {
    // After lane rounds this rank's release is published here (it finished
    // reading round k-1 when it returned from it).
    if (me.released.load(std::memory_order_relaxed) < k - 1) {
      me.released.store(k - 1, std::memory_order_release);
      segment_->WakeSleepers();
    }
    // The readers of the round that last used this buffer (the previous
    // one, or for a slot part the round that used the same part).
    const uint64_t read_round = k > part.lag ? k - part.lag : 0;
    if (absl::Status s =
            WaitAll(&RankControl::released, read_round, deadline, "finish the previous round");
        !s.ok()) {
      return s;
    }
  }
  write(Buffer(rank_));
  PackedSignature packed;
  if (signature != nullptr) {
    packed = Pack(*signature, path_tag_);
    me.signature[k & 1][0] = packed.words[0];
    me.signature[k & 1][1] = packed.words[1];
  }
  me.arrived.store(k, std::memory_order_release);
  segment_->WakeSleepers();
  absl::Status status = WaitAll(&RankControl::arrived, k, deadline, "arrive");
  if (!status.ok()) return status;
  if (signature != nullptr) {
    for (int j = 0; j < size_ && status.ok(); ++j) {
      PackedSignature other{
          {segment_->rank(j).signature[k & 1][0], segment_->rank(j).signature[k & 1][1]}};
      if (!packed.SameOp(other)) {
        status = absl::FailedPreconditionError(absl::StrCat(
            "collectives on group '", group_name_, "' do not match: rank ", global_ranks_[rank_],
            " called ", DescribeSignature(*signature), " but rank ", global_ranks_[j], " called ",
            DescribeSignature(other.Unpack(signature->sequence))));
      } else if (other.path() != path_tag_) {
        status = absl::FailedPreconditionError(absl::StrCat(
            DescribeSignature(*signature), " on group '", group_name_, "': rank ",
            global_ranks_[rank_], " takes the ", path_tag_ ? "direct" : "slot", " path but rank ",
            global_ranks_[j], " the ", path_tag_ ? "slot" : "direct",
            " path (MUSTER_SHM_MAPPED_MIN_BYTES / MUSTER_SHM_CMA_MIN_BYTES differ between ranks)"));
      }
    }
  }
  if (read_delay_ != absl::ZeroDuration()) absl::SleepFor(read_delay_);
  if (status.ok()) status = read();
  // A lane round's release is not published: nobody waits for it, and the
  // store would pull this line from the peers spinning on it for `arrived`
  // once more per round.
  if (slots) {
    me.released.store(k, std::memory_order_release);
    segment_->WakeSleepers();
  }
  return status;
}

template <typename Write, typename Read>
absl::Status ShmCommunicator::Chunked(const OpSignature* signature, size_t count, size_t chunk,
                                      absl::Time deadline, Write write, Read read, size_t start,
                                      Via via, size_t part_bytes) {
  if (start > 0 && start >= count) return absl::OkStatus();
  // Slot parts: piece p goes through part p mod `parts`, last used (and
  // read) `parts` rounds before; the first pieces only wait for the
  // rounds before the collective (the exchange round was piece 0's).
  const size_t parts = via == Via::kSlotParts && part_bytes > 0
                           ? std::max<size_t>(1, segment_->slot_bytes() / part_bytes)
                           : 1;
  size_t off = start;
  bool first = true;
  do {  // at least one round, so zero-length collectives still synchronize
    size_t len = std::min(chunk, count - off);
    const size_t piece = off / chunk;
    SlotPart part;
    if (via == Via::kSlotParts) {
      part.lag = std::min(piece + 1, parts);
      part.offset = piece % parts * part_bytes;
    }
    absl::Status s = Round(
        first ? signature : nullptr, deadline, [&](char* buffer) { write(buffer, off, len); },
        [&] { return read(off, len); }, via, part);
    if (!s.ok()) return s;
    first = false;
    off += len;
  } while (off < count);
  return absl::OkStatus();
}

bool ShmCommunicator::GoesDirect(size_t bytes) const {
  switch (static_cast<CollectiveKind>(current_.kind)) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
      break;
    default:
      // No direct path (reduce, gather, ...): the thresholds must not choose
      // their lanes or slots either, for they may differ between ranks and
      // these kinds carry no path tag to catch that.
      return false;
  }
  return size_ > 1 && bytes > 0 && (bytes >= direct_.mapped_min_bytes || OffersCma(bytes));
}

bool ShmCommunicator::OffersCma(size_t bytes) const {
  const CmaRanges& ranges = wait_.oversubscribed ? direct_.cma_oversubscribed : direct_.cma;
  const auto kind = static_cast<CollectiveKind>(current_.kind);
  const ByteRange range = kind == CollectiveKind::kBroadcast && PairWithCpus()
                              ? direct_.cma_broadcast_pair
                              : ranges.For(kind);
  return !cma_refused_ && range.Contains(bytes);
}

bool ShmCommunicator::CmaVerified(int root, bool relayed) const {
  if (!cma_agreed_once_) return false;
  for (int j = 0; j < size_; ++j) {
    if (!Touches(j, root, relayed)) continue;
    int32_t verified = cma_verified_pid_[j];
    if (verified == 0 || verified != segment_->rank(j).pid.load(std::memory_order_relaxed)) {
      return false;
    }
  }
  return true;
}

template <typename Fn>
absl::Status ShmCommunicator::RunDirectWork(Fn work) {
  last_path_ = mode_ == Direct::kMapped ? "mapped" : "cma";
  work_round_ = round_;
  absl::Status st = work();
  if (!st.ok()) {
    // The others go on to the next round: make them fail too.
    FailRound(round_ + 1);
    segment_->Abort(absl::StrCat("rank ", global_ranks_[rank_], ": ", st.message()));
  }
  return st;
}

template <typename WriteFirst, typename ReadFirst, typename Work>
absl::StatusOr<ShmCommunicator::Direct> ShmCommunicator::ExchangeSources(
    const OpSignature& signature, const void* source, const void* target, size_t bytes, int root,
    absl::Time deadline, WriteFirst write_first, ReadFirst read_first, Work direct_work) {
  path_tag_ = 1;
  peer_maps_.Sweep();
  Direct mode = Direct::kSlots;
  absl::Status s = Round(
      &signature, deadline,
      [&](char* slot) {
        uint64_t* meta = segment_->rank(rank_).meta;
        SharedRef ref;
        bool shared = FindSharedAllocation(source, bytes, &ref);
        bool needed = root < 0 || root == rank_;
        bool cma = OffersCma(bytes);
        // Ranks whose buffer will not be read directly write the slot
        // path's first round now: when no rank is shared, that round is
        // done (no extra round for ordinary buffers).
        bool write = !cma && !(shared && needed);
        if (write) write_first(slot);
        meta[kFlags] = (bytes >= direct_.mapped_min_bytes ? kAcceptMapped : 0) |
                       (cma ? kAcceptCma : 0) | (shared ? kShared : 0) | (write ? kWroteFirst : 0) |
                       // Verified both ways: whether a broadcast is
                       // relayed is the root's word, read below, not this
                       // rank's relay_.
                       (cma && CmaVerified(root, false) ? kCmaVerified : 0) |
                       (cma && CmaVerified(root, true) ? kCmaVerifiedRelayed : 0) |
                       (relay_ && rank_ == root ? kRelay : 0);
        meta[kPid] = static_cast<uint64_t>(::getpid());
        meta[kFd] = shared ? static_cast<uint64_t>(ref.fd) : 0;
        meta[kInode] = shared ? ref.inode : 0;
        meta[kOffset] = shared ? ref.offset : 0;
        meta[kAddr] = reinterpret_cast<uintptr_t>(source);
        meta[kTarget] = reinterpret_cast<uintptr_t>(target);
      },
      [&] {
        // Every rank computes the same answer from the same words.
        const bool relay = root >= 0 && (segment_->rank(root).meta[kFlags] & kRelay) != 0;
        bool mapped = true, cma = true, wrote = true, verified = true;
        for (int j = 0; j < size_; ++j) {
          uint64_t flags = segment_->rank(j).meta[kFlags];
          bool needed = root < 0 || j == root;
          mapped &= (flags & kAcceptMapped) != 0 && (!needed || (flags & kShared) != 0);
          cma &= (flags & kAcceptCma) != 0;
          wrote &= (flags & kWroteFirst) != 0;
          verified &= (flags & (relay ? kCmaVerifiedRelayed : kCmaVerified)) != 0;
        }
        mode = mapped  ? Direct::kMapped
               : cma   ? Direct::kCma
               : wrote ? Direct::kSlotsFirstDone
                       : Direct::kSlots;
        if (mode == Direct::kSlotsFirstDone) return read_first();
        relay_ = relay;
        reached_ = true;
        sources_.assign(size_, PeerSource{});
        for (int j = 0; j < size_ && (mode == Direct::kMapped || mode == Direct::kCma); ++j) {
          if (!Touches(j, root, mode == Direct::kCma && relay_)) continue;
          const uint64_t* meta = segment_->rank(j).meta;
          PeerSource& p = sources_[j];
          p.pid = static_cast<int32_t>(meta[kPid]);
          p.addr = meta[kAddr];
          p.target = meta[kTarget];
          if (mode == Direct::kMapped) {
            SharedRef ref;
            ref.pid = p.pid;
            ref.fd = static_cast<int32_t>(meta[kFd]);
            ref.inode = meta[kInode];
            ref.offset = meta[kOffset];
            auto at = peer_maps_.Resolve(ref, bytes);
            if (at.ok()) {
              p.mapped = *at;
            } else {
              reached_ = false;
            }
          } else if (!(mode == Direct::kCma && verified)) {
            char probe;
            iovec local{&probe, 1}, remote{reinterpret_cast<void*>(p.addr), 1};
            if (fail_cma_probe_ || ::process_vm_readv(p.pid, &local, 1, &remote, 1, 0) != 1) {
              reached_ = false;
            }
          }
        }
        // Every rank reached the peers it reads in an earlier collective
        // (their pids unchanged): no probe, no agreement round; the work
        // runs now, before this round's release.
        if (mode == Direct::kCma && verified) {
          mode_ = mode = Direct::kCmaDone;
          return RunDirectWork(direct_work);
        }
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  mode_ = mode;
  return mode;
}

template <typename Fn>
absl::Status ShmCommunicator::DirectRound(absl::Time deadline, bool* fallback, Fn work) {
  *fallback = false;
  absl::Status s = Round(
      nullptr, deadline, [&](char*) { segment_->rank(rank_).meta[kReachedWord] = reached_; },
      [&]() -> absl::Status {
        for (int j = 0; j < size_; ++j) {
          if (segment_->rank(j).meta[kReachedWord] == 0) *fallback = true;
        }
        // Every rank sees the same words, so all stop offering CMA together
        // (ranks that disagree on GoesDirect would fail as mismatched), or
        // all remember that each reached the peers it probed.
        if (*fallback && mode_ == Direct::kCma) cma_refused_ = true;
        if (*fallback) return absl::OkStatus();
        if (mode_ == Direct::kCma) {
          cma_agreed_once_ = true;
          for (int j = 0; j < size_; ++j) {
            if (sources_[j].pid != 0) cma_verified_pid_[j] = sources_[j].pid;
          }
        }
        return RunDirectWork(work);
      });
  return s;
}

bool ShmCommunicator::PushesAllGather(size_t part_bytes) const {
  // Four ranks on two vCPUs, in turns with reading (docs/benchmarks.md,
  // "all_gather pushes"): pushing 64 KiB-1 MiB parts took 0.76-0.89x the
  // time; 4 MiB parts 1.09x in one set of rounds, even in a later one.
  return !wait_.oversubscribed || part_bytes <= (size_t{1} << 20);
}

bool ShmCommunicator::PeerWritesHere(int j) const {
  if (j == rank_ || (mode_ != Direct::kCma && mode_ != Direct::kCmaDone)) return false;
  switch (static_cast<CollectiveKind>(current_.kind)) {
    case CollectiveKind::kAllReduce:
      return true;
    case CollectiveKind::kAllGather:
      return PushesAllGather(current_.count * DTypeSize(static_cast<DType>(current_.dtype)));
    case CollectiveKind::kBroadcast:
      return relay_ && rank_ != current_.root;
    default:
      return false;
  }
}

namespace {

// How long a failed collective waits for peers still writing its buffer.
constexpr absl::Duration kPeerWritesGrace = absl::Seconds(10);

}  // namespace

absl::Status ShmCommunicator::AwaitPeerWrites(absl::Status status) {
  const uint64_t w = work_round_;
  work_round_ = 0;
  const absl::Time give_up = absl::Now() + kPeerWritesGrace;
  for (int j = 0; j < size_; ++j) {
    if (!PeerWritesHere(j)) continue;
    const RankControl& peer = segment_->rank(j);
    while (peer.released.load(std::memory_order_acquire) < w &&
           peer.arrived.load(std::memory_order_acquire) <= w &&
           peer.gave_up.load(std::memory_order_acquire) <= w && !ProcessGone(sources_[j].pid)) {
      if (absl::Now() >= give_up) {
        return absl::Status(
            status.code(),
            absl::StrCat(status.message(), " (rank ", global_ranks_[j], ", pid ", sources_[j].pid,
                         ", was still writing into rank ", global_ranks_[rank_], "'s buffer after ",
                         absl::FormatDuration(kPeerWritesGrace), ")"));
      }
      absl::SleepFor(absl::Microseconds(50));
    }
  }
  return status;
}

absl::Status ShmCommunicator::ReadSource(int j, size_t offset, size_t len, char* dst) {
  const PeerSource& p = sources_[j];
  if (p.mapped != nullptr) {
    std::memcpy(dst, p.mapped + offset, len);
    return absl::OkStatus();
  }
  return CmaCopy(j, p.addr + offset, len, dst, /*write=*/false);
}

absl::Status ShmCommunicator::WriteTarget(int j, size_t offset, size_t len, const char* src) {
  if (write_delay_ != absl::ZeroDuration()) absl::SleepFor(write_delay_);
  RETURN_IF_ERROR(
      CmaCopy(j, sources_[j].target + offset, len, const_cast<char*>(src), /*write=*/true));
  peer_bytes_written_ += len;
  return absl::OkStatus();
}

absl::Status ShmCommunicator::CmaCopy(int j, uint64_t remote_addr, size_t len, char* local,
                                      bool write) {
  const PeerSource& p = sources_[j];
  size_t done = 0;
  while (done < len) {
    iovec mine{local + done, len - done};
    iovec remote{reinterpret_cast<void*>(remote_addr + done), len - done};
    ssize_t n = write ? ::process_vm_writev(p.pid, &mine, 1, &remote, 1, 0)
                      : ::process_vm_readv(p.pid, &mine, 1, &remote, 1, 0);
    if (n <= 0) {
      return ErrnoToStatus(n < 0 ? errno : EFAULT,
                           absl::StrCat(DescribeSignature(current_), " on group '", group_name_,
                                        "': ", write ? "writing" : "reading", " rank ",
                                        global_ranks_[j], "'s buffer (pid ", p.pid, ") with ",
                                        write ? "process_vm_writev" : "process_vm_readv"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<const char*> ShmCommunicator::Source(int j, const char* own, size_t offset,
                                                    size_t len, char* tmp) {
  if (j == rank_) return own + offset;
  if (sources_[j].mapped != nullptr) return sources_[j].mapped + offset;
  if (absl::Status s = ReadSource(j, offset, len, tmp); !s.ok()) return s;
  return tmp;
}

absl::Status ShmCommunicator::WaitReaders(absl::Time deadline) {
  return WaitAll(&RankControl::released, round_, deadline,
                 "finish reading or writing this rank's buffer");
}

absl::Status ShmCommunicator::CheckRoot(int root) const {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("root ", root, " is outside group '", group_name_, "' of size ", size_));
  }
  return absl::OkStatus();
}

absl::Status ShmCommunicator::Barrier(absl::Time deadline) {
  OpSignature sig = Begin(CollectiveKind::kBarrier, DType::kUInt8, 0, -1, ReduceOp::kSum);
  return Finish(Round(
      &sig, deadline, [](char*) {}, [] { return absl::OkStatus(); }, Via::kLanes));
}

absl::Status ShmCommunicator::AllReduce(void* data, size_t count, DType dtype, ReduceOp op,
                                        double scale, absl::Time deadline) {
  if (absl::Status s = CheckReduce(dtype, op); !s.ok()) return s;
  OpSignature sig = Begin(CollectiveKind::kAllReduce, dtype, count, -1, op);
  size_t es = DTypeSize(dtype);
  char* bytes = static_cast<char*>(data);
  const OpSignature* first = &sig;
  // The slot paths. Small: one round per slot of data; every rank reduces it
  // from all slots. Large: reduce-scatter then all-gather per chunk. Each
  // slot is split in an input half and an output half; rank r reduces
  // segment r of the chunk from every input half into its output half (1/n
  // of the work), then everyone copies all segments out. Two rounds per
  // chunk instead of one, but each rank moves ~3 chunk sizes instead of n+2.
  // Large is more than a 16th of a slot (256 KiB of the default 4 MiB: on
  // 2 vCPUs reduce-scatter + all-gather was 1.7x faster than one round at
  // 1 MiB and slower at 256 KiB), in pieces of an eighth of the buffer
  // between 256 and 512 KiB (read while they are still in cache). With
  // more ranks than CPUs, more than a 64th (64 KiB): the ranks' reductions
  // then share the CPUs, and one round has every rank reduce the whole
  // buffer from every slot (world 3 and 4 on 2 vCPUs, 256 KiB: 1.3-1.6x
  // faster in two rounds; docs/benchmarks.md, "the oversubscribed barrier").
  bool small = size_ == 1 || count * es <= SmallestPart(wait_.oversubscribed ? 64 : 16);
  size_t half = segment_->slot_bytes() / 2;
  size_t chunk = small ? segment_->slot_bytes() / es
                       : std::min(ChunkFor(count * es, es, 16), std::max<size_t>(1, half / es));
  auto segment = [this](size_t len, int r, size_t* seg_off) {
    size_t seg = len / size_;
    *seg_off = seg * r;
    return r == size_ - 1 ? len - seg * r : seg;
  };
  auto copy_in = [&](char* slot, size_t off, size_t len) {
    std::memcpy(slot, bytes + off * es, len * es);
  };
  auto reduce_all = [&](size_t off, size_t len) {
    char* acc = bytes + off * es;
    ReduceInit(acc, Buffer(0), len, dtype, op, scale);
    for (int j = 1; j < size_; ++j) ReduceInto(acc, Buffer(j), len, dtype, op, scale);
    ReduceFinish(acc, len, dtype, op, size_);
    return absl::OkStatus();
  };
  auto reduce_segment = [&](size_t, size_t len) {
    size_t seg_off;
    size_t seg_len = segment(len, rank_, &seg_off);
    char* acc = Buffer(rank_) + half + seg_off * es;
    ReduceInit(acc, Buffer(0) + seg_off * es, seg_len, dtype, op, scale);
    for (int j = 1; j < size_; ++j) {
      ReduceInto(acc, Buffer(j) + seg_off * es, seg_len, dtype, op, scale);
    }
    ReduceFinish(acc, seg_len, dtype, op, size_);
    return absl::OkStatus();
  };
  auto gather_segments = [&](size_t off, size_t len) {
    for (int j = 0; j < size_; ++j) {
      size_t seg_off;
      size_t seg_len = segment(len, j, &seg_off);
      std::memcpy(bytes + (off + seg_off) * es, Buffer(j) + half + seg_off * es, seg_len * es);
    }
    return absl::OkStatus();
  };
  size_t first_len = std::min(chunk, count);
  size_t start = 0;  // elements whose first round the exchange round was
  if (GoesDirect(count * es)) {
    // Direct: rank r reduces part r of every rank's buffer into its own
    // buffer, in rank order, block by block through a cached accumulator;
    // over CMA it writes each block into every peer's buffer too (one round
    // and one pass over the buffer fewer than having the peers read it
    // afterwards: 1.1-2.6x faster at 16 KiB-64 MiB, world 2; docs/
    // benchmarks.md, "all_reduce owners write their part").
    // Ranks 0 and 1 accumulate in their own buffer: for ops whose combine
    // is exactly commutative, c1 op c0 == c0 op c1, so rank 1 may start
    // from its own contribution (one pass less over its part). Not
    // PREMUL_SUM on 16-bit floats: the first contribution's scaled value is
    // rounded to 16 bits on its own, a later one's only within the sum.
    const bool half_width = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
    bool commutative = op == ReduceOp::kSum || op == ReduceOp::kAvg ||
                       (op == ReduceOp::kPremulSum && !half_width) || op == ReduceOp::kProduct ||
                       op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
    bool in_own = rank_ == 0 || (rank_ == 1 && commutative);
    // Later ranks fold the contributions before their own into the scratch
    // block, then combine that into their own buffer (own op fold == fold
    // op own for these ops) and go on there: the result lands in place
    // without a copy out of the scratch block. Not PREMUL_SUM, whose scaled
    // own contribution would be rounded on its own, nor bool, whose own
    // bytes ReduceInit normalizes.
    const bool fold_into_own =
        !in_own && commutative && op != ReduceOp::kPremulSum && dtype != DType::kBool;
    size_t part_off;
    size_t part_len = Part(count, size_, rank_, &part_off);
    auto reduce_own_part = [&]() -> absl::Status {
      // Over CMA the rank then writes each reduced block into every peer's
      // buffer while it is still in cache (no rank reads part r of another
      // rank's buffer but rank r, so nobody else touches it meanwhile);
      // mapped, the peers copy it out of this rank's buffer afterwards.
      const bool write_peers = mode_ != Direct::kMapped;
      size_t block = std::max<size_t>(1, kBlockBytes / es);
      scratch_.resize(2 * block * es);
      char* tmp = scratch_.data() + block * es;
      for (size_t done = 0; done < part_len; done += block) {
        size_t len = std::min(block, part_len - done);
        size_t off = (part_off + done) * es;
        char* own = bytes + off;
        if (fold_into_own) {
          char* fold = scratch_.data();
          auto c0 = Source(0, bytes, off, len * es, fold);
          if (!c0.ok()) return c0.status();
          ReduceInit(fold, *c0, len, dtype, op, scale);
          for (int j = 1; j < size_; ++j) {
            if (j == rank_) {
              ReduceInto(own, fold, len, dtype, op, scale);
              fold = own;
              continue;
            }
            auto cj = Source(j, bytes, off, len * es, tmp);
            if (!cj.ok()) return cj.status();
            ReduceInto(fold, *cj, len, dtype, op, scale);
          }
          ReduceFinish(own, len, dtype, op, size_);
        } else {
          char* acc = in_own ? own : scratch_.data();
          int start = in_own ? rank_ : 0;  // the contribution acc starts from
          auto c0 = Source(start, bytes, off, len * es, acc);
          if (!c0.ok()) return c0.status();
          ReduceInit(acc, *c0, len, dtype, op, scale);
          for (int j = 0; j < size_; ++j) {
            if (j == start) continue;
            auto cj = Source(j, bytes, off, len * es, tmp);
            if (!cj.ok()) return cj.status();
            ReduceInto(acc, *cj, len, dtype, op, scale);
          }
          ReduceFinish(acc, len, dtype, op, size_);
          if (acc != own) std::memcpy(own, acc, len * es);
        }
        if (write_peers) {
          for (int k = 1; k < size_; ++k) {  // from the next rank on: writers spread out
            RETURN_IF_ERROR(WriteTarget((rank_ + k) % size_, off, len * es, own));
          }
        }
      }
      return absl::OkStatus();
    };
    auto mode = ExchangeSources(
        sig, data, data, count * es, -1, deadline, [&](char* slot) { copy_in(slot, 0, first_len); },
        [&] { return small ? reduce_all(0, first_len) : reduce_segment(0, first_len); },
        reduce_own_part);
    if (!mode.ok()) return Finish(mode.status());
    first = nullptr;
    if (*mode == Direct::kSlotsFirstDone) start = first_len;
    if (*mode == Direct::kMapped || *mode == Direct::kCma || *mode == Direct::kCmaDone) {
      bool fallback = false;
      absl::Status s;
      if (*mode != Direct::kCmaDone) s = DirectRound(deadline, &fallback, reduce_own_part);
      if (!s.ok()) return Finish(s);
      // Over CMA every part is in every buffer once the peers are done
      // (their release of the round that ran the work).
      if (!fallback && *mode != Direct::kMapped) return Finish(WaitReaders(deadline));
      if (!fallback) {
        // Mapped: everyone copies the other ranks' reduced parts from their buffers.
        s = Round(
            nullptr, deadline, [](char*) {},
            [&]() -> absl::Status {
              for (int j = 0; j < size_; ++j) {
                if (j == rank_) continue;
                size_t off;
                size_t len = Part(count, size_, j, &off);
                if (absl::Status st = ReadSource(j, off * es, len * es, bytes + off * es);
                    !st.ok()) {
                  // The others wait for this rank's release (WaitReaders):
                  // the decision tells them it failed.
                  FailRound(round_ + 1);
                  segment_->Abort(absl::StrCat("rank ", global_ranks_[rank_], ": ", st.message()));
                  return st;
                }
              }
              return absl::OkStatus();
            });
        if (s.ok()) s = WaitReaders(deadline);
        return Finish(s);
      }
    }
  }
  if (small) {
    Via via = first != nullptr ? WholeSlots(ViaFor(count * es)) : Via::kSlots;
    return Finish(Chunked(first, count, chunk, deadline, copy_in, reduce_all, start, via));
  }
  // A piece's first round needs no wait for the previous piece's gather:
  // that round reads only the output halves, which this round writes after
  // every rank arrived (so finished it); the input halves were last read a
  // round before. The first piece waits for the rounds before the
  // collective as usual.
  size_t off = 0;
  while (off < count) {
    size_t len = std::min(chunk, count - off);
    SlotPart part{off == 0 ? 1u : 2u, 0};
    absl::Status s;
    if (off > 0 || start == 0) {  // else the exchange round was this round
      s = Round(
          first, deadline, [&](char* slot) { copy_in(slot, off, len); },
          [&] { return reduce_segment(off, len); }, Via::kSlotParts, part);
      if (!s.ok()) return Finish(s);
    }
    s = Round(
        nullptr, deadline, [](char*) {}, [&] { return gather_segments(off, len); }, Via::kSlotParts,
        part);
    if (!s.ok()) return Finish(s);
    first = nullptr;
    off += len;
  }
  return Finish(absl::OkStatus());
}

absl::Status ShmCommunicator::Broadcast(void* data, size_t count, DType dtype, int root,
                                        absl::Time deadline) {
  if (absl::Status s = CheckRoot(root); !s.ok()) return s;
  OpSignature sig = Begin(CollectiveKind::kBroadcast, dtype, count, root, ReduceOp::kSum);
  size_t es = DTypeSize(dtype);
  char* bytes = static_cast<char*>(data);
  const OpSignature* first = &sig;
  size_t chunk = ChunkFor(count * es, es);
  auto write = [&](char* slot, size_t off, size_t len) {
    if (rank_ == root) std::memcpy(slot, bytes + off * es, len * es);
  };
  auto read = [&](size_t off, size_t len) {
    if (rank_ != root) std::memcpy(bytes + off * es, Buffer(root), len * es);
    return absl::OkStatus();
  };
  size_t first_len = std::min(chunk, count);
  size_t start = 0;
  if (GoesDirect(count * es)) {
    // Relayed over CMA (two ranks, or more ranks than CPUs): rank r owns
    // part r of the result. The root writes its part into every receiver;
    // a receiver reads its part from the root block by block and writes
    // each block into every other receiver while it is in cache. Each byte
    // is read from the root once, and every rank copies (world 2: the root
    // writes half while the receiver reads the other half, two CPUs copying
    // instead of one; docs/benchmarks.md, "the broadcast root copies too"
    // and "the relayed broadcast"). The root proposes it, the exchange
    // makes every rank take the root's word (relay_). Mapped sources are
    // read in place and the receivers' buffers need not be shared: there
    // each receiver copies it all.
    relay_ = RelaysBroadcast();
    auto read_root = [&]() -> absl::Status {
      const bool cma = mode_ == Direct::kCma || mode_ == Direct::kCmaDone;
      const size_t total = count * es;
      if (cma && relay_) {
        size_t part_off;
        const size_t part_len = Part(count, size_, rank_, &part_off);
        const bool others = size_ > 2;
        const size_t block = others ? std::max<size_t>(1, kBlockBytes / es) : part_len;
        for (size_t done = 0; done < part_len; done += block) {
          const size_t len = std::min(block, part_len - done) * es;
          const size_t off = (part_off + done) * es;
          char* own = bytes + off;
          if (rank_ != root) RETURN_IF_ERROR(ReadSource(root, off, len, own));
          for (int k = 1; k < size_; ++k) {
            const int t = (rank_ + k) % size_;
            if (t != root) RETURN_IF_ERROR(WriteTarget(t, off, len, own));
          }
        }
        return absl::OkStatus();
      }
      if (rank_ == root) return absl::OkStatus();
      if (!cma || size_ <= 2) return ReadSource(root, 0, total, bytes);
      // Several receivers over CMA: each pins the root's pages under its
      // page-table lock while it reads, so they start in different parts
      // (page-aligned) and go round, rather than queue on the same pages.
      const int receivers = size_ - 1;
      const int me = (rank_ - root - 1 + size_) % size_;
      const size_t part = ((total + receivers - 1) / receivers + 4095) / 4096 * 4096;
      for (int k = 0; k < receivers; ++k) {
        const size_t from = std::min(total, ((me + k) % receivers) * part);
        const size_t len = std::min(part, total - from);
        if (len > 0) RETURN_IF_ERROR(ReadSource(root, from, len, bytes + from));
      }
      return absl::OkStatus();
    };
    auto mode = ExchangeSources(
        sig, data, data, count * es, root, deadline, [&](char* slot) { write(slot, 0, first_len); },
        [&] { return read(0, first_len); }, read_root);
    if (!mode.ok()) return Finish(mode.status());
    first = nullptr;
    if (*mode == Direct::kSlotsFirstDone) start = first_len;
    if (*mode == Direct::kCmaDone) return Finish(WaitReaders(deadline));
    if (*mode == Direct::kMapped || *mode == Direct::kCma) {
      bool fallback = false;
      absl::Status s = DirectRound(deadline, &fallback, read_root);
      if (s.ok() && !fallback) s = WaitReaders(deadline);
      if (!s.ok() || !fallback) return Finish(s);
    }
  }
  Via via = first != nullptr ? ViaFor(count * es) : SlotsVia(count * es);
  return Finish(Chunked(first, count, chunk, deadline, write, read, start, via, chunk * es));
}

absl::Status ShmCommunicator::Reduce(void* data, size_t count, DType dtype, ReduceOp op,
                                     double scale, int root, absl::Time deadline) {
  if (absl::Status s = CheckReduce(dtype, op); !s.ok()) return s;
  if (absl::Status s = CheckRoot(root); !s.ok()) return s;
  OpSignature sig = Begin(CollectiveKind::kReduce, dtype, count, root, op);
  size_t es = DTypeSize(dtype);
  char* bytes = static_cast<char*>(data);
  return Finish(Chunked(
      &sig, count, ChunkFor(count * es, es), deadline,
      [&](char* slot, size_t off, size_t len) { std::memcpy(slot, bytes + off * es, len * es); },
      [&](size_t off, size_t len) {
        if (rank_ != root) return absl::OkStatus();
        char* acc = bytes + off * es;
        ReduceInit(acc, Buffer(0), len, dtype, op, scale);
        for (int j = 1; j < size_; ++j) ReduceInto(acc, Buffer(j), len, dtype, op, scale);
        ReduceFinish(acc, len, dtype, op, size_);
        return absl::OkStatus();
      },
      0, ViaFor(count * es), ChunkFor(count * es, es) * es));
}

absl::Status ShmCommunicator::AllGather(const void* in, void* out, size_t count, DType dtype,
                                        absl::Time deadline) {
  OpSignature sig = Begin(CollectiveKind::kAllGather, dtype, count, -1, ReduceOp::kSum);
  size_t es = DTypeSize(dtype);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  const OpSignature* first = &sig;
  // Whole slots: every rank writes and reads as much, so pieces overlap
  // nothing (measured: slot parts were slower at 16 MiB, world 4).
  size_t chunk = segment_->slot_bytes() / es;
  auto write = [&](char* slot, size_t off, size_t len) {
    std::memcpy(slot, src + off * es, len * es);
  };
  const bool past_cache = count * es * size_ >= kPastCacheOutputBytes;
  auto read = [&](size_t off, size_t len) {
    for (int j = 0; j < size_; ++j) {
      if (past_cache) {
        CopyPastCache(dst + (j * count + off) * es, Buffer(j), len * es);
      } else {
        std::memcpy(dst + (j * count + off) * es, Buffer(j), len * es);
      }
    }
    return absl::OkStatus();
  };
  size_t first_len = std::min(chunk, count);
  size_t start = 0;
  if (GoesDirect(count * es)) {
    auto gather_sources = [&]() -> absl::Status {
      const size_t part = count * es;
      char* own = dst + rank_ * part;
      if ((mode_ == Direct::kCma || mode_ == Direct::kCmaDone) && PushesAllGather(part)) {
        // Over CMA each rank pushes (PushesAllGather): it copies its input
        // into its part of its output block by block and writes each block,
        // while it is in cache, into its part of every peer's output
        // (nobody else writes part r anywhere). Per rank one read of its
        // input and n writes, against n reads and n writes when each reads
        // its peers' inputs (world 2, 4-64 MiB: the copies alone 0.87-0.94x
        // the time, the all_gather 0.91-0.99x; docs/benchmarks.md,
        // "all_gather pushes"). Writers start at the next rank, so they
        // spread over the targets.
        for (size_t done = 0; done < part; done += kBlockBytes) {
          const size_t len = std::min(kBlockBytes, part - done);
          if (own != src) std::memcpy(own + done, src + done, len);
          for (int k = 1; k < size_; ++k) {
            RETURN_IF_ERROR(WriteTarget((rank_ + k) % size_, rank_ * part + done, len, own + done));
          }
        }
        return absl::OkStatus();
      }
      // Mapped, or large parts over CMA with more ranks than CPUs: each
      // rank reads the peers' inputs. With three or more ranks each starts
      // at the next rank, so that the ranks read different sources at a
      // time: a CMA read pins the source's pages under its page-table
      // lock, and all reading rank 0 first made them queue on it.
      for (int k = 0; k < size_; ++k) {
        const int j = size_ > 2 ? (rank_ + 1 + k) % size_ : k;
        char* to = dst + j * part;
        if (j != rank_) {
          RETURN_IF_ERROR(ReadSource(j, 0, part, to));
        } else if (to != src) {
          std::memcpy(to, src, part);
        }
      }
      return absl::OkStatus();
    };
    auto mode = ExchangeSources(
        sig, in, out, count * es, -1, deadline, [&](char* slot) { write(slot, 0, first_len); },
        [&] { return read(0, first_len); }, gather_sources);
    if (!mode.ok()) return Finish(mode.status());
    first = nullptr;
    if (*mode == Direct::kSlotsFirstDone) start = first_len;
    if (*mode == Direct::kCmaDone) return Finish(WaitReaders(deadline));
    if (*mode == Direct::kMapped || *mode == Direct::kCma) {
      bool fallback = false;
      absl::Status s = DirectRound(deadline, &fallback, gather_sources);
      if (s.ok() && !fallback) s = WaitReaders(deadline);
      if (!s.ok() || !fallback) return Finish(s);
    }
  }
  Via via = first != nullptr ? WholeSlots(ViaFor(count * es)) : Via::kSlots;
  return Finish(Chunked(first, count, chunk, deadline, write, read, start, via));
}

absl::Status ShmCommunicator::Gather(const void* in, void* out, size_t count, DType dtype, int root,
                                     absl::Time deadline) {
  if (absl::Status s = CheckRoot(root); !s.ok()) return s;
  OpSignature sig = Begin(CollectiveKind::kGather, dtype, count, root, ReduceOp::kSum);
  size_t es = DTypeSize(dtype);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  return Finish(Chunked(
      &sig, count, ChunkFor(count * es, es), deadline,
      [&](char* slot, size_t off, size_t len) { std::memcpy(slot, src + off * es, len * es); },
      [&](size_t off, size_t len) {
        for (int j = 0; rank_ == root && j < size_; ++j) {
          std::memcpy(dst + (j * count + off) * es, Buffer(j), len * es);
        }
        return absl::OkStatus();
      },
      0, ViaFor(count * es), ChunkFor(count * es, es) * es));
}

absl::Status ShmCommunicator::Scatter(const void* in, void* out, size_t count, DType dtype,
                                      int root, absl::Time deadline) {
  if (absl::Status s = CheckRoot(root); !s.ok()) return s;
  OpSignature sig = Begin(CollectiveKind::kScatter, dtype, count, root, ReduceOp::kSum);
  size_t es = DTypeSize(dtype);
  size_t chunk = std::max<size_t>(1, segment_->slot_bytes() / es / size_);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  return Finish(Chunked(
      &sig, count, chunk, deadline,
      [&](char* slot, size_t off, size_t len) {
        for (int j = 0; rank_ == root && j < size_; ++j) {
          std::memcpy(slot + j * chunk * es, src + (j * count + off) * es, len * es);
        }
      },
      [&](size_t off, size_t len) {
        std::memcpy(dst + off * es, segment_->slot(root) + rank_ * chunk * es, len * es);
        return absl::OkStatus();
      }));
}

absl::Status ShmCommunicator::ReduceScatter(const void* in, void* out, size_t count, DType dtype,
                                            ReduceOp op, double scale, absl::Time deadline) {
  if (absl::Status s = CheckReduce(dtype, op); !s.ok()) return s;
  OpSignature sig = Begin(CollectiveKind::kReduceScatter, dtype, count, -1, op);
  size_t es = DTypeSize(dtype);
  // Each round moves `chunk` elements for every rank: a slot holds size_
  // blocks. (Whole slots, as all_gather.)
  size_t chunk = std::max<size_t>(1, segment_->slot_bytes() / es / size_);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  const OpSignature* first = &sig;
  auto write = [&](char* slot, size_t off, size_t len) {
    for (int j = 0; j < size_; ++j) {
      std::memcpy(slot + j * chunk * es, src + (j * count + off) * es, len * es);
    }
  };
  auto read = [&](size_t off, size_t len) {
    char* acc = dst + off * es;
    size_t region = rank_ * chunk * es;
    ReduceInit(acc, Buffer(0) + region, len, dtype, op, scale);
    for (int j = 1; j < size_; ++j) {
      ReduceInto(acc, Buffer(j) + region, len, dtype, op, scale);
    }
    ReduceFinish(acc, len, dtype, op, size_);
    return absl::OkStatus();
  };
  size_t first_len = std::min(chunk, count);
  size_t start = 0;
  if (GoesDirect(count * es * size_)) {
    // Direct: block r of every rank's input, reduced in rank order into
    // `out`. An output inside this rank's own input (in place: out = block
    // r of in) is only written after a block's contributions were all
    // read, so the accumulator is then scratch memory.
    auto lo = reinterpret_cast<uintptr_t>(src), hi = lo + count * es * size_;
    auto out_lo = reinterpret_cast<uintptr_t>(dst), out_hi = out_lo + count * es;
    bool aliased = out_lo < hi && lo < out_hi;
    auto reduce_own_block = [&]() -> absl::Status {
      size_t block = std::max<size_t>(1, kBlockBytes / es);
      scratch_.resize((aliased ? 2 : 1) * block * es);
      char* tmp = scratch_.data();
      for (size_t done = 0; done < count; done += block) {
        size_t len = std::min(block, count - done);
        size_t off = (rank_ * count + done) * es;
        char* acc = aliased ? scratch_.data() + block * es : dst + done * es;
        auto c0 = Source(0, src, off, len * es, acc);
        if (!c0.ok()) return c0.status();
        ReduceInit(acc, *c0, len, dtype, op, scale);
        for (int j = 1; j < size_; ++j) {
          auto cj = Source(j, src, off, len * es, tmp);
          if (!cj.ok()) return cj.status();
          ReduceInto(acc, *cj, len, dtype, op, scale);
        }
        ReduceFinish(acc, len, dtype, op, size_);
        if (aliased) std::memcpy(dst + done * es, acc, len * es);
      }
      return absl::OkStatus();
    };
    auto mode = ExchangeSources(
        sig, in, nullptr, count * es * size_, -1, deadline,
        [&](char* slot) { write(slot, 0, first_len); }, [&] { return read(0, first_len); },
        reduce_own_block);
    if (!mode.ok()) return Finish(mode.status());
    first = nullptr;
    if (*mode == Direct::kSlotsFirstDone) start = first_len;
    if (*mode == Direct::kCmaDone) return Finish(WaitReaders(deadline));
    if (*mode == Direct::kMapped || *mode == Direct::kCma) {
      bool fallback = false;
      absl::Status s = DirectRound(deadline, &fallback, reduce_own_block);
      if (s.ok() && !fallback) s = WaitReaders(deadline);
      if (!s.ok() || !fallback) return Finish(s);
    }
  }
  return Finish(Chunked(first, count, chunk, deadline, write, read, start));
}

absl::Status ShmCommunicator::AllToAll(const void* in, const std::vector<size_t>& send_counts,
                                       void* out, const std::vector<size_t>& recv_counts,
                                       DType dtype, absl::Time deadline) {
  if (send_counts.size() != static_cast<size_t>(size_) ||
      recv_counts.size() != static_cast<size_t>(size_)) {
    return absl::InvalidArgumentError(absl::StrCat("all_to_all on group '", group_name_, "' needs ",
                                                   size_, " send and receive counts"));
  }
  if (static_cast<uint64_t>(size_) * 2 * sizeof(uint64_t) > segment_->slot_bytes()) {
    return absl::InvalidArgumentError("group too large for all_to_all metadata");
  }
  OpSignature sig = Begin(CollectiveKind::kAllToAll, dtype, size_, -1, ReduceOp::kSum);
  size_t es = DTypeSize(dtype);
  // Round 1: everyone publishes its counts; every rank checks the matrix.
  std::vector<uint64_t> matrix(static_cast<size_t>(size_) * size_);  // [sender][receiver]
  absl::Status s = Round(
      &sig, deadline,
      [&](char* slot) {
        auto* words = reinterpret_cast<uint64_t*>(slot);
        for (int j = 0; j < size_; ++j) {
          words[j] = send_counts[j];
          words[size_ + j] = recv_counts[j];
        }
      },
      [&]() -> absl::Status {
        for (int j = 0; j < size_; ++j) {
          const auto* words = reinterpret_cast<const uint64_t*>(segment_->slot(j));
          for (int i = 0; i < size_; ++i) matrix[j * size_ + i] = words[i];
        }
        for (int j = 0; j < size_; ++j) {
          const auto* words = reinterpret_cast<const uint64_t*>(segment_->slot(j));
          for (int i = 0; i < size_; ++i) {
            uint64_t expects = words[size_ + i];  // rank j expects from rank i
            if (matrix[i * size_ + j] != expects) {
              return absl::InvalidArgumentError(
                  absl::StrCat("all_to_all on group '", group_name_, "': rank ", global_ranks_[i],
                               " sends ", matrix[i * size_ + j], " elements to rank ",
                               global_ranks_[j], ", which expects ", expects));
            }
          }
        }
        return absl::OkStatus();
      });
  if (!s.ok()) return Finish(s);
  uint64_t largest = *std::max_element(matrix.begin(), matrix.end());
  size_t chunk = std::max<size_t>(1, segment_->slot_bytes() / es / size_);
  std::vector<size_t> send_off(size_ + 1, 0), recv_off(size_ + 1, 0);
  for (int j = 0; j < size_; ++j) {
    send_off[j + 1] = send_off[j] + send_counts[j];
    recv_off[j + 1] = recv_off[j] + recv_counts[j];
  }
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (uint64_t off = 0; off < largest; off += chunk) {
    s = Round(
        nullptr, deadline,
        [&](char* slot) {
          for (int j = 0; j < size_; ++j) {
            if (send_counts[j] <= off) continue;
            size_t len = std::min<uint64_t>(chunk, send_counts[j] - off);
            std::memcpy(slot + j * chunk * es, src + (send_off[j] + off) * es, len * es);
          }
        },
        [&] {
          for (int j = 0; j < size_; ++j) {
            if (recv_counts[j] <= off) continue;
            size_t len = std::min<uint64_t>(chunk, recv_counts[j] - off);
            std::memcpy(dst + (recv_off[j] + off) * es, segment_->slot(j) + rank_ * chunk * es,
                        len * es);
          }
          return absl::OkStatus();
        });
    if (!s.ok()) return Finish(s);
  }
  return Finish(absl::OkStatus());
}

}  // namespace muster
