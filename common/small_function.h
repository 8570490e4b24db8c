// SmallFunction<R(Args...)>: a move-only callable like std::function, that
// keeps a callable of up to kInlineBytes (64) inside itself instead of on
// the heap. std::function allocates for anything over 16 bytes, which a
// collective's lambda (a Tensor and its arguments: ~48 bytes) always is: a
// malloc and a free per call on a path that takes under a microsecond.
// Larger callables go to the heap.
//
// Thread-safety: like any value; one thread at a time per object.
#ifndef MUSTER_COMMON_SMALL_FUNCTION_H_
#define MUSTER_COMMON_SMALL_FUNCTION_H_

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace muster {

template <typename Signature>
class SmallFunction;

template <typename R, typename... Args>
class SmallFunction<R(Args...)> {
 public:
  static constexpr size_t kInlineBytes = 64;

  SmallFunction() = default;
  template <typename F,
            typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, SmallFunction> &&
                                        std::is_invocable_r_v<R, std::decay_t<F>&, Args...>>>
  SmallFunction(F&& f) {  // NOLINT: converts like std::function
    using Target = std::decay_t<F>;
    if constexpr (kFits<Target>) {
      ::new (static_cast<void*>(storage_)) Target(std::forward<F>(f));
    } else {
      *reinterpret_cast<Target**>(storage_) = new Target(std::forward<F>(f));
    }
    ops_ = &kOps<Target>;
  }
  SmallFunction(SmallFunction&& other) noexcept { Take(other); }
  SmallFunction& operator=(SmallFunction&& other) noexcept {
    if (this != &other) {
      Reset();
      Take(other);
    }
    return *this;
  }
  SmallFunction(const SmallFunction&) = delete;
  SmallFunction& operator=(const SmallFunction&) = delete;
  ~SmallFunction() { Reset(); }

  explicit operator bool() const { return ops_ != nullptr; }
  R operator()(Args... args) { return ops_->invoke(storage_, std::forward<Args>(args)...); }

 private:
  struct Ops {
    R (*invoke)(void* storage, Args&&... args);
    // Moves the callable from `from` into the empty `to`; `from` is left empty.
    void (*relocate)(void* from, void* to);
    void (*destroy)(void* storage);
  };
  template <typename T>
  static constexpr bool kFits =
      sizeof(T) <= kInlineBytes &&
      alignof(T) <= alignof(std::max_align_t) && std::is_nothrow_move_constructible_v<T>;
  template <typename T>
  static T* Inline(void* storage) {
    return std::launder(reinterpret_cast<T*>(storage));
  }
  template <typename T>
  static T*& Heap(void* storage) {
    return *reinterpret_cast<T**>(storage);
  }
  template <typename T>
  static constexpr Ops MakeOps() {
    if constexpr (kFits<T>) {
      return Ops{
          [](void* s, Args&&... a) -> R { return (*Inline<T>(s))(std::forward<Args>(a)...); },
          [](void* from, void* to) {
            ::new (to) T(std::move(*Inline<T>(from)));
            Inline<T>(from)->~T();
          },
          [](void* s) { Inline<T>(s)->~T(); }};
    } else {
      return Ops{[](void* s, Args&&... a) -> R { return (*Heap<T>(s))(std::forward<Args>(a)...); },
                 [](void* from, void* to) { Heap<T>(to) = Heap<T>(from); },
                 [](void* s) { delete Heap<T>(s); }};
    }
  }
  template <typename T>
  static constexpr Ops kOps = MakeOps<T>();

  void Take(SmallFunction& other) {
    if (other.ops_ == nullptr) return;
    other.ops_->relocate(other.storage_, storage_);
    ops_ = other.ops_;
    other.ops_ = nullptr;
  }
  void Reset() {
    if (ops_ == nullptr) return;
    ops_->destroy(storage_);
    ops_ = nullptr;
  }

  alignas(std::max_align_t) unsigned char storage_[kInlineBytes];
  const Ops* ops_ = nullptr;
};

}  // namespace muster

#endif  // MUSTER_COMMON_SMALL_FUNCTION_H_
