#include "common/gpu_channel.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/mapping_guard.h"

namespace muster {

struct GpuChannel::Layout {
  static constexpr uint64_t kMagic = 0x6d75737465724743ULL;  // "musterGC"
  uint64_t magic;
  std::atomic<uint32_t> submit;    // rank: requests published
  std::atomic<uint32_t> complete;  // daemon: requests answered
  std::atomic<uint32_t> closed;
  std::atomic<uint32_t> daemon_sleeping;
  // Rings for every request and every Wake(): the daemon sleeps on it, and
  // reads it before looking for work, so no wake-up falls between.
  std::atomic<uint32_t> doorbell;
  std::atomic<uint32_t> rank_sleeping;
  uint32_t request_bytes;
  int32_t status_code;
  uint32_t message_bytes;
  uint64_t launched;
  char message[2048];
  char request[kMaxRequestBytes];
};

namespace {

void FutexWake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t seen, absl::Duration timeout) {
  timespec ts = absl::ToTimespec(timeout);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

}  // namespace

GpuChannel::GpuChannel(std::string name, Layout* layout, bool owner, int guard)
    : name_(std::move(name)), layout_(layout), owner_(owner), guard_(guard) {}

GpuChannel::~GpuChannel() {
  mapping_guard::Unguard(guard_);
  ::munmap(layout_, sizeof(Layout));
  if (owner_) ::shm_unlink(name_.c_str());
}

absl::StatusOr<std::unique_ptr<GpuChannel>> GpuChannel::Create(const std::string& name,
                                                               int64_t owner_uid) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("shm_open ", name, ": ", std::strerror(errno)));
  }
  if (owner_uid >= 0 && static_cast<uid_t>(owner_uid) != ::geteuid() &&
      ::fchown(fd, static_cast<uid_t>(owner_uid), static_cast<gid_t>(-1)) != 0) {
    int e = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return absl::InternalError(
        absl::StrCat("giving ", name, " to uid ", owner_uid, ": ", std::strerror(e)));
  }
  if (::ftruncate(fd, sizeof(Layout)) != 0) {
    int e = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return absl::InternalError(absl::StrCat("ftruncate ", name, ": ", std::strerror(e)));
  }
  void* base = ::mmap(nullptr, sizeof(Layout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return absl::InternalError(absl::StrCat("mmap ", name, ": ", std::strerror(errno)));
  }
  // Guarded before the first access: the rank's user can resize the file.
  int guard;
  if (!mapping_guard::TryGuard(base, sizeof(Layout), &guard)) {
    ::munmap(base, sizeof(Layout));
    ::shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(absl::StrCat(name, ": too many mappings to guard"));
  }
  auto* layout = static_cast<Layout*>(base);  // zero-filled by ftruncate
  layout->magic = Layout::kMagic;
  return std::unique_ptr<GpuChannel>(new GpuChannel(name, layout, true, guard));
}

absl::StatusOr<std::unique_ptr<GpuChannel>> GpuChannel::Open(const std::string& name) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("shm_open ", name, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != sizeof(Layout)) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat(name, " is not a muster GPU channel"));
  }
  void* base = ::mmap(nullptr, sizeof(Layout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    return absl::UnavailableError(absl::StrCat("mmap ", name, ": ", std::strerror(errno)));
  }
  int guard;
  if (!mapping_guard::TryGuard(base, sizeof(Layout), &guard)) {
    ::munmap(base, sizeof(Layout));
    return absl::ResourceExhaustedError(absl::StrCat(name, ": too many mappings to guard"));
  }
  auto* layout = static_cast<Layout*>(base);
  if (layout->magic != Layout::kMagic) {
    mapping_guard::Unguard(guard);
    ::munmap(base, sizeof(Layout));
    return absl::UnavailableError(absl::StrCat(name, " is not a muster GPU channel"));
  }
  return std::unique_ptr<GpuChannel>(new GpuChannel(name, layout, false, guard));
}

absl::StatusOr<uint64_t> GpuChannel::Call(const std::string& request, absl::Time deadline) {
  if (request.size() > kMaxRequestBytes) {
    return absl::ResourceExhaustedError("request too large for the GPU channel");
  }
  if (closed()) return absl::UnavailableError("GPU channel closed");
  const uint32_t n = layout_->submit.load(std::memory_order_relaxed) + 1;
  std::memcpy(layout_->request, request.data(), request.size());
  layout_->request_bytes = static_cast<uint32_t>(request.size());
  layout_->submit.store(n, std::memory_order_seq_cst);
  layout_->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (layout_->daemon_sleeping.load(std::memory_order_seq_cst) != 0) {
    FutexWake(&layout_->doorbell);
  }
  // Spin first: a launch answers in microseconds.
  for (int spin = 0;; ++spin) {
    uint32_t done = layout_->complete.load(std::memory_order_acquire);
    if (done == n) break;
    if (layout_->closed.load(std::memory_order_acquire) != 0) {
      return absl::UnavailableError("GPU channel closed");
    }
    if (spin < 20000) {
      if (spin % 64 == 63) std::this_thread::yield();
      continue;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError("musterd did not answer the GPU collective in time");
    }
    layout_->rank_sleeping.store(1, std::memory_order_seq_cst);
    if (layout_->complete.load(std::memory_order_seq_cst) != n &&
        layout_->closed.load(std::memory_order_seq_cst) == 0) {
      FutexWait(&layout_->complete, done, absl::Milliseconds(10));
    }
    layout_->rank_sleeping.store(0, std::memory_order_relaxed);
  }
  absl::StatusCode code = static_cast<absl::StatusCode>(layout_->status_code);
  if (code != absl::StatusCode::kOk) {
    return absl::Status(code, std::string(layout_->message, layout_->message_bytes));
  }
  return layout_->launched;
}

bool GpuChannel::Poll(std::string* request, absl::Duration spin) {
  absl::Time until = absl::Now() + spin;
  int spins = 0;
  while (true) {
    uint32_t submitted = layout_->submit.load(std::memory_order_acquire);
    if (submitted != served_) {
      served_ = submitted;
      uint32_t bytes = std::min<uint32_t>(layout_->request_bytes, kMaxRequestBytes);
      request->assign(layout_->request, bytes);
      return true;
    }
    if (++spins % 64 == 0) {
      if (absl::Now() >= until) return false;
      std::this_thread::yield();
    }
  }
}

uint32_t GpuChannel::doorbell() const { return layout_->doorbell.load(std::memory_order_seq_cst); }

void GpuChannel::WaitForRequest(uint32_t doorbell_seen, absl::Duration timeout) {
  layout_->daemon_sleeping.store(1, std::memory_order_seq_cst);
  if (layout_->submit.load(std::memory_order_seq_cst) == served_ &&
      layout_->doorbell.load(std::memory_order_seq_cst) == doorbell_seen) {
    FutexWait(&layout_->doorbell, doorbell_seen, timeout);
  }
  layout_->daemon_sleeping.store(0, std::memory_order_relaxed);
}

void GpuChannel::Complete(const absl::Status& status, uint64_t launched) {
  layout_->status_code = static_cast<int32_t>(status.code());
  std::string message(status.message());
  layout_->message_bytes =
      static_cast<uint32_t>(std::min(message.size(), sizeof(layout_->message)));
  std::memcpy(layout_->message, message.data(), layout_->message_bytes);
  layout_->launched = launched;
  layout_->complete.store(served_, std::memory_order_seq_cst);
  if (layout_->rank_sleeping.load(std::memory_order_seq_cst) != 0) FutexWake(&layout_->complete);
}

void GpuChannel::Wake() {
  layout_->doorbell.fetch_add(1, std::memory_order_seq_cst);
  FutexWake(&layout_->doorbell);
}

void GpuChannel::Close() {
  layout_->closed.store(1, std::memory_order_release);
  FutexWake(&layout_->complete);
  Wake();
}

bool GpuChannel::closed() const { return layout_->closed.load(std::memory_order_acquire) != 0; }

}  // namespace muster
