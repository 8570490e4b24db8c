// BlockCache<kBytes, kAlign>: a per-thread stack of freed memory blocks of
// one size, for objects made and dropped once per collective (the SDK's
// Work and its shared_ptr block): a block freed on a thread is reused by
// that thread's next allocation instead of going through malloc and free
// (~60 ns a collective on the VM of docs/benchmarks.md). Each thread keeps
// at most kKeep blocks, returned to the heap when the thread ends; a block
// may be freed on another thread than the one that allocated it.
//
// Thread-safe (the state is per thread).
#ifndef MUSTER_COMMON_BLOCK_CACHE_H_
#define MUSTER_COMMON_BLOCK_CACHE_H_

#include <cstddef>
#include <new>

namespace muster {

template <size_t kBytes, size_t kAlign = alignof(std::max_align_t)>
class BlockCache {
 public:
  static void* Allocate() {
    Stack& s = stack;
    if (s.count > 0) return s.blocks[--s.count];
    return ::operator new(kBytes, std::align_val_t(kAlign));
  }

  static void Free(void* block) {
    Stack& s = stack;
    if (!s.ended && s.count < kKeep) {
      if (s.count == 0 && !s.registered) {
        s.registered = true;
        static thread_local Drain drain;  // frees the stack's blocks at thread end
        (void)drain;
      }
      s.blocks[s.count++] = block;
      return;
    }
    ::operator delete(block, std::align_val_t(kAlign));
  }

 private:
  static constexpr size_t kKeep = 16;
  // Trivially destructible, so usable until the thread's very end.
  struct Stack {
    void* blocks[kKeep];
    size_t count;
    bool registered;
    bool ended;  // the thread is ending: free to the heap
  };
  struct Drain {
    ~Drain() {
      Stack& s = stack;
      s.ended = true;
      while (s.count > 0) ::operator delete(s.blocks[--s.count], std::align_val_t(kAlign));
    }
  };
  static thread_local Stack stack;
};

template <size_t kBytes, size_t kAlign>
thread_local typename BlockCache<kBytes, kAlign>::Stack BlockCache<kBytes, kAlign>::stack{};

}  // namespace muster

#endif  // MUSTER_COMMON_BLOCK_CACHE_H_
