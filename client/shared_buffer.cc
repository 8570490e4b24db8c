#include "muster/shared_buffer.h"

#include "backends/shm/shared_memory.h"

namespace muster {

SharedBuffer::SharedBuffer() = default;
SharedBuffer::~SharedBuffer() = default;
SharedBuffer::SharedBuffer(SharedBuffer&&) noexcept = default;
SharedBuffer& SharedBuffer::operator=(SharedBuffer&&) noexcept = default;

void* SharedBuffer::data() const { return alloc_ ? alloc_->data() : nullptr; }

size_t SharedBuffer::size() const { return alloc_ ? alloc_->size() : 0; }

Tensor SharedBuffer::tensor(DType dtype) const {
  return Tensor{data(), size() / DTypeSize(dtype), dtype};
}

absl::StatusOr<SharedBuffer> AllocShared(size_t bytes) {
  auto alloc = SharedAllocation::Create(bytes);
  if (!alloc.ok()) return alloc.status();
  SharedBuffer buffer;
  buffer.alloc_ = std::move(*alloc);
  return buffer;
}

}  // namespace muster
