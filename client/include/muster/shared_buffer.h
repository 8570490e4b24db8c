// Zero-copy collective buffers: memory that the other ranks of this node
// can map. When every rank passes a SharedBuffer (or a part of one) to a
// collective of a node-local group, ranks read each other's buffers in
// place instead of copying through the group's shared-memory slots
// (all_reduce, broadcast, all_gather, reduce_scatter of at least 64 KiB by
// default; MUSTER_SHM_MAPPED_MIN_BYTES). Mixed cases (some ranks shared,
// some not) are correct too, only not zero-copy.
//
//   auto buf = muster::AllocShared(n * sizeof(float));
//   float* x = buf->as<float>();  ...
//   group.AllReduce(buf->tensor(muster::DType::kFloat32))->Wait();
//
// The memory is an anonymous memfd: nothing is left in /dev/shm when a rank
// or the daemon dies; the kernel frees it with its last user.
//
// Thread-safety: AllocShared is thread-safe. A SharedBuffer is a move-only
// owner; its bytes follow the usual rules for a buffer in use by a
// collective (do not touch it until the collective's Work completed).
#ifndef MUSTER_CLIENT_INCLUDE_MUSTER_SHARED_BUFFER_H_
#define MUSTER_CLIENT_INCLUDE_MUSTER_SHARED_BUFFER_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "muster/world.h"

namespace muster {

class SharedAllocation;

class SharedBuffer {
 public:
  SharedBuffer();   // empty
  ~SharedBuffer();  // frees the memory (peers drop their mappings lazily)
  SharedBuffer(SharedBuffer&&) noexcept;
  SharedBuffer& operator=(SharedBuffer&&) noexcept;

  void* data() const;
  size_t size() const;
  explicit operator bool() const { return alloc_ != nullptr; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data());
  }
  // The whole buffer as size() / DTypeSize(dtype) elements of `dtype`.
  Tensor tensor(DType dtype) const;

 private:
  friend absl::StatusOr<SharedBuffer> AllocShared(size_t bytes);
  std::unique_ptr<SharedAllocation> alloc_;
};

// `bytes` of zero-filled shared memory (page-aligned). Errors name the
// system call that failed (e.g. RESOURCE_EXHAUSTED when memory is short).
absl::StatusOr<SharedBuffer> AllocShared(size_t bytes);

}  // namespace muster

#endif  // MUSTER_CLIENT_INCLUDE_MUSTER_SHARED_BUFFER_H_
