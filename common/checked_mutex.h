// CheckedMutex: a mutex that knows which thread holds it, so that a re-entry that would
// deadlock stops the program with the mutex's name instead of hanging it.
//
// The runtime's locks are taken on threads that also allocate, and an allocation at the
// budget's cap calls the runtime back on the same thread (the allocator's pressure callbacks)
// to free memory. absl::Mutex is not reentrant, and its deadlock detection is compiled out of
// release builds: a callback that takes a lock its caller holds waits for itself forever. Two
// rules keep that from happening, and this header checks both in every build:
//  - locking a CheckedMutex the thread already holds aborts, naming it;
//  - code about to do something that may call back into the runtime (allocate device or host
//    memory, run a pressure callback) calls CheckNoneHeld first, which aborts naming the lock
//    held. That turns "would deadlock if the cap were hit here" into a failure on every run,
//    cap or not.
// The cost is a thread-local array of a few pointers, updated per lock and unlock.
//
// Example:
//   CheckedMutex mu{"Session::mu_"};
//   int value ABSL_GUARDED_BY(mu);
//   { CheckedLock lock(&mu); ++value; }
//   CheckNoneHeld("allocating a buffer");  // nothing held: returns
#ifndef ACTPACK_COMMON_CHECKED_MUTEX_H_
#define ACTPACK_COMMON_CHECKED_MUTEX_H_

#include <cstdio>
#include <cstdlib>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace actpack {

class CheckedMutex;

namespace checked_mutex_internal {

// The checked mutexes this thread holds, in the order it took them.
struct Held {
  static constexpr int kCapacity = 16;
  const CheckedMutex* mutexes[kCapacity] = {};
  int count = 0;
};

inline Held& ThisThread() {
  thread_local Held held;
  return held;
}

[[noreturn]] inline void Fail(const char* before, const char* name, const char* after) {
  std::fprintf(stderr, "actpack: %s%s%s\n", before, name, after);
  std::fflush(stderr);
  std::abort();
}

}  // namespace checked_mutex_internal

class ABSL_LOCKABLE CheckedMutex {
 public:
  explicit CheckedMutex(const char* name) : name_(name) {}
  CheckedMutex(const CheckedMutex&) = delete;
  CheckedMutex& operator=(const CheckedMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    checked_mutex_internal::Held& held = checked_mutex_internal::ThisThread();
    if (HeldBy(held)) {
      checked_mutex_internal::Fail(
          "re-entered ", name_,
          ": this thread already holds it, and locking it again would wait forever (a callback"
          " from inside an allocation, or a destructor, took a lock its caller holds)");
    }
    if (held.count == checked_mutex_internal::Held::kCapacity) {
      checked_mutex_internal::Fail("too many locks held to take ", name_, "");
    }
    mu_.Lock();
    held.mutexes[held.count++] = this;
  }

  void Unlock() ABSL_UNLOCK_FUNCTION() {
    checked_mutex_internal::Held& held = checked_mutex_internal::ThisThread();
    // Usually the innermost: search from the end.
    for (int i = held.count; i-- > 0;) {
      if (held.mutexes[i] != this) continue;
      for (int j = i; j + 1 < held.count; ++j) held.mutexes[j] = held.mutexes[j + 1];
      --held.count;
      break;
    }
    mu_.Unlock();
  }

  // Whether the calling thread holds it.
  bool HeldByThisThread() const { return HeldBy(checked_mutex_internal::ThisThread()); }

  const char* name() const { return name_; }

 private:
  bool HeldBy(const checked_mutex_internal::Held& held) const {
    for (int i = 0; i < held.count; ++i) {
      if (held.mutexes[i] == this) return true;
    }
    return false;
  }

  absl::Mutex mu_;
  const char* const name_;
};

class ABSL_SCOPED_LOCKABLE CheckedLock {
 public:
  explicit CheckedLock(CheckedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~CheckedLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  CheckedLock(const CheckedLock&) = delete;
  CheckedLock& operator=(const CheckedLock&) = delete;

 private:
  CheckedMutex* const mu_;
};

// The innermost checked mutex this thread holds; nullptr when it holds none.
inline const CheckedMutex* InnermostHeldByThisThread() {
  const checked_mutex_internal::Held& held = checked_mutex_internal::ThisThread();
  return held.count == 0 ? nullptr : held.mutexes[held.count - 1];
}

// Aborts, naming the mutex and `what`, when this thread holds a checked mutex: for code about to
// allocate or otherwise call back into the runtime.
inline void CheckNoneHeld(const char* what) {
  if (const CheckedMutex* held = InnermostHeldByThisThread()) {
    std::fprintf(stderr, "actpack: %s while holding %s\n", what, held->name());
    checked_mutex_internal::Fail(
        "the allocator's pressure callbacks would run on this thread and take ", held->name(),
        " again (a deadlock at the budget's cap): release it first");
  }
}

}  // namespace actpack

#endif  // ACTPACK_COMMON_CHECKED_MUTEX_H_
