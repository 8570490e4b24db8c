#include "backends/shm/segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/mapping_guard.h"
#include "common/status_macros.h"

namespace muster {
namespace {

constexpr uint32_t kVersion = 8;

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

uint64_t SlotsOffset(int nranks) {
  return RoundUp(sizeof(SegmentHeader) + sizeof(RankControl) * nranks, 4096);
}

}  // namespace

bool GroupSegment::truncated() const { return mapping_guard::Replaced(guard_); }

GroupSegment::GroupSegment(std::string name, void* base, size_t bytes, const Layout& layout,
                           int guard)
    : name_(std::move(name)), base_(base), bytes_(bytes), guard_(guard), layout_(layout) {
  header_ = static_cast<SegmentHeader*>(base);
  controls_ = reinterpret_cast<RankControl*>(static_cast<char*>(base) + sizeof(SegmentHeader));
  slots_ = static_cast<char*>(base) + layout_.slots_offset;
}

GroupSegment::Layout GroupSegment::Layout::Of(const SegmentHeader& h) {
  Layout l;
  l.nranks = static_cast<int>(h.nranks);
  l.slot_bytes = h.slot_bytes;
  l.slots_offset = h.slots_offset;
  l.mailbox_bytes = h.mailbox_bytes;
  l.mailboxes_offset = h.mailboxes_offset;
  l.trace_records = h.trace_records;
  l.trace_offset = h.trace_offset;
  l.trace_stride = h.trace_stride;
  return l;
}

void GroupSegment::Layout::WriteTo(SegmentHeader* h) const {
  h->nranks = static_cast<uint32_t>(nranks);
  h->slot_bytes = slot_bytes;
  h->slots_offset = slots_offset;
  h->mailbox_bytes = mailbox_bytes;
  h->mailboxes_offset = mailboxes_offset;
  h->trace_records = trace_records;
  h->trace_offset = trace_offset;
  h->trace_stride = trace_stride;
}

GroupSegment::~GroupSegment() {
  mapping_guard::Unguard(guard_);
  ::munmap(base_, bytes_);
}

absl::StatusOr<std::unique_ptr<GroupSegment>> GroupSegment::Create(const std::string& name,
                                                                   int nranks, uint64_t slot_bytes,
                                                                   uint64_t mailbox_bytes,
                                                                   int64_t owner_uid,
                                                                   uint64_t trace_records) {
  if (nranks < 1 || nranks > kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("a shared-memory group has 1..", kMaxRanks, " ranks, not ", nranks));
  }
  slot_bytes = RoundUp(slot_bytes, 4096);
  mailbox_bytes = RoundUp(std::max<uint64_t>(mailbox_bytes, 4096), 4096);
  uint64_t offset = SlotsOffset(nranks);
  uint64_t mailboxes_offset = offset + slot_bytes * nranks;
  uint64_t mailbox_stride = sizeof(MailboxHeader) + mailbox_bytes;
  trace_records = std::min(trace_records, kMaxTraceRecords);
  // Untouched pages of tmpfs cost nothing: unused mailboxes are free, and
  // a trace ring costs what its rank has written.
  uint64_t trace_offset = RoundUp(mailboxes_offset + mailbox_stride * nranks * nranks, 4096);
  uint64_t trace_stride =
      trace_records == 0
          ? 0
          : RoundUp(sizeof(TraceRingHeader) + sizeof(TraceRecord) * trace_records, 4096);
  uint64_t bytes = trace_offset + trace_stride * nranks;
  // O_EXCL: a file someone made under that name beforehand (and may still
  // hold open) is never taken over.
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("shm_open ", name));
  if (owner_uid >= 0 && static_cast<uid_t>(owner_uid) != ::geteuid() &&
      ::fchown(fd, static_cast<uid_t>(owner_uid), static_cast<gid_t>(-1)) != 0) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return ErrnoToStatus(err, absl::StrCat("giving shared memory ", name, " to uid ", owner_uid));
  }
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return ErrnoToStatus(err, absl::StrCat("sizing shared memory ", name, " to ", bytes, " bytes"));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return ErrnoToStatus(err, absl::StrCat("mmap ", name));
  }
  int guard;
  if (!mapping_guard::TryGuard(base, bytes, &guard)) {
    ::munmap(base, bytes);
    ::shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("shared memory ", name, ": too many mappings to guard"));
  }
  Layout layout;
  layout.nranks = nranks;
  layout.slot_bytes = slot_bytes;
  layout.slots_offset = offset;
  layout.mailbox_bytes = mailbox_bytes;
  layout.mailboxes_offset = mailboxes_offset;
  layout.trace_records = trace_records;
  layout.trace_offset = trace_offset;
  layout.trace_stride = trace_stride;
  auto* h = new (base) SegmentHeader();
  h->version = kVersion;
  layout.WriteTo(h);
  h->aborted.store(0);
  h->epoch.store(0);
  h->sleepers.store(0);
  h->outcome.store(0);
  h->release_outcome.store(0);
  std::memset(h->abort_reason, 0, sizeof(h->abort_reason));
  h->node_cpus = 0;
  auto* controls = reinterpret_cast<RankControl*>(static_cast<char*>(base) + sizeof(SegmentHeader));
  for (int i = 0; i < nranks; ++i) {
    auto* c = new (&controls[i]) RankControl();
    c->arrived.store(0);
    c->released.store(0);
    c->gave_up_release.store(0);
    c->submitted.store(0);
    c->completed.store(0);
    c->last_round.store(0);
    c->cpu.store(-1);
    c->gave_up.store(0);
    c->pid.store(0);
  }
  for (int i = 0; i < nranks * nranks; ++i) {
    auto* m =
        new (static_cast<char*>(base) + mailboxes_offset + i * mailbox_stride) MailboxHeader();
    m->written.store(0);
    m->read.store(0);
  }
  // The file is zero-filled (ftruncate of a new object): every record's
  // version and id are 0; only the ring headers are constructed here.
  for (int i = 0; trace_records > 0 && i < nranks; ++i) {
    auto* ring = new (static_cast<char*>(base) + trace_offset + trace_stride * i) TraceRingHeader();
    ring->next.store(0);
    ring->capacity.store(0);
    ring->pid.store(0);
  }
  std::atomic_thread_fence(std::memory_order_release);
  reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->store(kMagic, std::memory_order_release);
  return std::unique_ptr<GroupSegment>(new GroupSegment(name, base, bytes, layout, guard));
}

absl::StatusOr<std::unique_ptr<GroupSegment>> GroupSegment::Open(const std::string& name,
                                                                 int expected_nranks) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening group shared memory ", name));
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(SegmentHeader))) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat("shared memory ", name, " is too small"));
  }
  void* base = ::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) return ErrnoToStatus(err, absl::StrCat("mmap ", name));
  int guard;
  if (!mapping_guard::TryGuard(base, st.st_size, &guard)) {
    ::munmap(base, st.st_size);
    return absl::ResourceExhaustedError(
        absl::StrCat("shared memory ", name, ": too many mappings to guard"));
  }
  auto* h = static_cast<SegmentHeader*>(base);
  uint64_t magic =
      reinterpret_cast<std::atomic<uint64_t>*>(&h->magic)->load(std::memory_order_acquire);
  // One copy of the layout, checked, then used (the header stays writable).
  const Layout l = Layout::Of(*h);
  const auto size = static_cast<uint64_t>(st.st_size);
  const auto n = static_cast<uint64_t>(expected_nranks);
  if (magic != kMagic || h->version != kVersion || l.nranks != expected_nranks ||
      expected_nranks < 1 || expected_nranks > kMaxRanks || l.slot_bytes > size ||
      l.slots_offset != SlotsOffset(expected_nranks) || l.slots_offset + l.slot_bytes * n > size ||
      l.mailbox_bytes > size || l.mailboxes_offset > size ||
      l.mailboxes_offset + (sizeof(MailboxHeader) + l.mailbox_bytes) * n * n > size ||
      l.trace_records > kMaxTraceRecords ||
      (l.trace_records > 0 &&
       (l.trace_stride < sizeof(TraceRingHeader) + sizeof(TraceRecord) * l.trace_records ||
        l.trace_stride > size || l.trace_offset > size ||
        l.trace_offset + l.trace_stride * n > size))) {
    mapping_guard::Unguard(guard);
    ::munmap(base, st.st_size);
    return absl::DataLossError(absl::StrCat("shared memory ", name, " is not a ", expected_nranks,
                                            "-rank muster group segment"));
  }
  return std::unique_ptr<GroupSegment>(new GroupSegment(name, base, st.st_size, l, guard));
}

void GroupSegment::Unlink(const std::string& name) { ::shm_unlink(name.c_str()); }

int GroupSegment::RemoveStale() {
  int removed = 0;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name.rfind("muster.", 0) != 0) continue;
    size_t dot = name.find('.', 7);
    if (dot == std::string::npos) continue;
    char* end = nullptr;
    long pid = std::strtol(name.c_str() + 7, &end, 10);
    if (end != name.c_str() + dot || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (::shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

MailboxHeader& GroupSegment::mailbox(int from, int to) {
  uint64_t stride = sizeof(MailboxHeader) + layout_.mailbox_bytes;
  return *reinterpret_cast<MailboxHeader*>(static_cast<char*>(base_) + layout_.mailboxes_offset +
                                           stride * (static_cast<uint64_t>(from) * nranks() + to));
}

namespace {

// The abort word while the first aborter writes its reason: concurrent
// aborters lose the claim and write nothing, so the reason is one
// aborter's, whole, and matches the kind published after it.
constexpr uint32_t kAbortClaimed = 0xffffffffu;

}  // namespace

void GroupSegment::Abort(const std::string& reason, AbortKind kind) {
  uint32_t expected = 0;
  static_assert(sizeof(header_->abort_reason) > 1, "");
  if (header_->aborted.compare_exchange_strong(expected, kAbortClaimed,
                                               std::memory_order_acq_rel)) {
    std::strncpy(header_->abort_reason, reason.c_str(), sizeof(header_->abort_reason) - 1);
    header_->aborted.store(static_cast<uint32_t>(kind), std::memory_order_release);
  }
  Wake();
}

uint32_t GroupSegment::SettledAbortWord() const {
  // The claimer is a few stores from publishing the kind; only one that
  // died in between leaves the claim (after 100 ms: read as ABORTED).
  absl::Time give_up = absl::InfiniteFuture();
  for (int i = 0;; ++i) {
    uint32_t word = header_->aborted.load(std::memory_order_acquire);
    if (word != kAbortClaimed) return word;
    if (i < 1000) {
      std::this_thread::yield();
    } else if (give_up == absl::InfiniteFuture()) {
      give_up = absl::Now() + absl::Milliseconds(100);
    } else if (absl::Now() >= give_up) {
      return word;
    } else {
      absl::SleepFor(absl::Microseconds(50));
    }
  }
}

absl::Status GroupSegment::AbortStatus(absl::string_view context) const {
  std::string message = absl::StrCat(context, ": ", abort_reason());
  if (SettledAbortWord() == static_cast<uint32_t>(AbortKind::kUnavailable)) {
    return absl::UnavailableError(message);
  }
  return absl::AbortedError(message);
}

void GroupSegment::AbortLocally(absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(local_mu_);
    if (local_abort_.load(std::memory_order_relaxed)) return;
    local_status_ = std::move(status);
    local_abort_.store(true, std::memory_order_release);
  }
  Wake();
}

absl::Status GroupSegment::local_abort_status() const {
  std::lock_guard<std::mutex> lock(local_mu_);
  return local_status_;
}

std::string GroupSegment::abort_reason(bool wait) const {
  const uint32_t word =
      wait ? SettledAbortWord() : header_->aborted.load(std::memory_order_acquire);
  if (word == kAbortClaimed) {
    return wait ? "(the aborting process stopped before it recorded why)"
                : "(the aborting process had not recorded why yet)";
  }
  return std::string(header_->abort_reason,
                     strnlen(header_->abort_reason, sizeof(header_->abort_reason)));
}

void GroupSegment::Wake() {
  header_->epoch.fetch_add(1, std::memory_order_acq_rel);
  if (header_->sleepers.load(std::memory_order_acquire) > 0) {
    ::syscall(SYS_futex, &header_->epoch, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

namespace {

long Membarrier(int command) { return ::syscall(SYS_membarrier, command, 0, 0); }

// Whether this kernel lets a sleeper fence every registered process.
bool GlobalMembarrierAvailable() {
  static const bool available = [] {
    long commands = Membarrier(MEMBARRIER_CMD_QUERY);
    constexpr long kNeeded =
        MEMBARRIER_CMD_GLOBAL_EXPEDITED | MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED;
    return commands >= 0 && (commands & kNeeded) == kNeeded;
  }();
  return available;
}

// Whether this process is registered, so that it may wake without a fence
// (once per process; registration cannot be undone).
bool WakerRegistered() {
  static const bool registered =
      GlobalMembarrierAvailable() && Membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0;
  return registered;
}

}  // namespace

void GroupSegment::WakeSleepers() {
  if (WakerRegistered()) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  if (header_->sleepers.load(std::memory_order_relaxed) == 0) return;
  Wake();
}

bool GroupSegment::FenceAllWakers() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return GlobalMembarrierAvailable() && Membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0;
}

void GroupSegment::Sleep(uint32_t seen, int64_t timeout_us) {
  header_->sleepers.fetch_add(1, std::memory_order_acq_rel);
  FutexWait(seen, timeout_us);
  header_->sleepers.fetch_sub(1, std::memory_order_acq_rel);
}

void GroupSegment::FutexWait(uint32_t seen, int64_t timeout_us) {
  timespec ts{static_cast<time_t>(timeout_us / 1000000),
              static_cast<long>((timeout_us % 1000000) * 1000)};
  ::syscall(SYS_futex, &header_->epoch, FUTEX_WAIT, seen, &ts, nullptr, 0);
}

}  // namespace muster
