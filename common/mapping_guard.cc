#include "common/mapping_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace muster::mapping_guard {
namespace {

// An entry is claimed by a compare-and-swap of `begin` from 0 to 1, then
// filled (end, then begin), and freed by storing 0 before the unmap.
struct Entry {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<bool> replaced{false};
};
constexpr int kEntries = 16384;
Entry entries[kEntries];
std::atomic<bool> installed{false};
struct sigaction before;
uintptr_t page_bytes = 4096;

void OnSigbus(int, siginfo_t* info, void*) {
  // Only an access past a file's end (BUS_ADRERR), not a SIGBUS sent with
  // kill(2) or a hardware error.
  if (info->si_code == BUS_ADRERR) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
    for (Entry& e : entries) {
      const uintptr_t begin = e.begin.load(std::memory_order_acquire);
      if (begin <= 1 || at < begin || at >= e.end.load(std::memory_order_acquire)) continue;
      void* page = reinterpret_cast<void*>(at & ~(page_bytes - 1));
      if (::mmap(page, page_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                 -1, 0) != MAP_FAILED) {
        e.replaced.store(true, std::memory_order_relaxed);
        return;  // the access is retried on the new page
      }
      break;
    }
  }
  // Anything else gets the handler there was before (by default the process
  // dies): a fault by retrying the access, a signal by raising it again.
  installed.store(false, std::memory_order_relaxed);
  ::sigaction(SIGBUS, &before, nullptr);
  if (info->si_code <= 0) ::raise(SIGBUS);
}

}  // namespace

bool Installed() { return installed.load(std::memory_order_acquire); }

bool Install() {
  if (installed.load()) return true;
  page_bytes = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  struct sigaction action {};
  action.sa_sigaction = OnSigbus;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  if (::sigaction(SIGBUS, &action, &before) != 0) return false;
  installed.store(true, std::memory_order_release);
  return true;
}

int Guard(void* base, size_t bytes) {
  if (!installed.load(std::memory_order_acquire)) return -1;
  for (int i = 0; i < kEntries; ++i) {
    uintptr_t free = 0;
    if (!entries[i].begin.compare_exchange_strong(free, 1)) continue;
    entries[i].replaced.store(false, std::memory_order_relaxed);
    entries[i].end.store(reinterpret_cast<uintptr_t>(base) + bytes, std::memory_order_release);
    entries[i].begin.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
    return i;
  }
  return -1;
}

bool TryGuard(void* base, size_t bytes, int* handle) {
  *handle = Guard(base, bytes);
  return *handle >= 0 || !Installed();
}

void Unguard(int handle) {
  if (handle >= 0 && handle < kEntries) entries[handle].begin.store(0, std::memory_order_release);
}

bool Replaced(int handle) {
  return handle >= 0 && handle < kEntries &&
         entries[handle].replaced.load(std::memory_order_relaxed);
}

}  // namespace muster::mapping_guard
