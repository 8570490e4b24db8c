#include "daemon/gpu/ipc_cache.h"

#include "absl/strings/str_cat.h"

namespace muster {

IpcCache::IpcCache(IpcOpener* opener, std::string kind, size_t handle_bytes)
    : opener_(opener), kind_(std::move(kind)), handle_bytes_(handle_bytes) {}

IpcCache::~IpcCache() {
  for (auto& [key, opened] : open_) opener_->Close(opened.ptr);
}

absl::StatusOr<IpcResource> IpcCache::Get(const std::string& owner, const std::string& handle) {
  if (handle.size() != handle_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA IPC ", kind_, " handle has ", handle.size(), " bytes, expected ", handle_bytes_));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find({owner, handle});
    if (it != open_.end()) return it->second;
  }
  // Opened outside the lock: it may take a while. Two threads opening the
  // same handle at once keep the first and close the second.
  absl::StatusOr<IpcResource> opened = opener_->Open(handle);
  if (!opened.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("opening CUDA IPC ", kind_, " handle: ", opened.status().message()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = open_.emplace(std::make_pair(owner, handle), *opened);
  if (!inserted) {
    opener_->Close(opened->ptr);
  } else {
    ++opens_;
  }
  return it->second;
}

bool IpcCache::Release(const std::string& owner, const std::string& handle) {
  void* opened = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find({owner, handle});
    if (it == open_.end()) return false;
    opened = it->second.ptr;
    open_.erase(it);
  }
  opener_->Close(opened);
  return true;
}

int IpcCache::ReleaseOwner(const std::string& owner) {
  std::vector<void*> closing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.lower_bound({owner, std::string()});
    while (it != open_.end() && it->first.first == owner) {
      closing.push_back(it->second.ptr);
      it = open_.erase(it);
    }
  }
  for (void* opened : closing) opener_->Close(opened);
  return static_cast<int>(closing.size());
}

int IpcCache::open_count(const std::string& owner) const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (auto it = open_.lower_bound({owner, std::string()});
       it != open_.end() && it->first.first == owner; ++it) {
    ++n;
  }
  return n;
}

int IpcCache::total_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(open_.size());
}

uint64_t IpcCache::opens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return opens_;
}

}  // namespace muster
