// fault_injection_adaptor.h — fails a chosen allocation, to test every failure path.
//
// SQLite's way of testing out-of-memory handling, in RMM's adaptor shape: count the
// allocations a piece of work makes, then run it again once per k, failing the k-th with
// kResourceExhausted (as a full device or budget would), and check that each failure is
// survived: a clear error, memory back where it was, the next attempt working.
//
// Example:
//   FaultInjectionAdaptor faults(&pool);
//   RunStep(&faults);                       // faults.allocations(): N
//   for (uint64_t k = 1; k <= N; ++k) {
//     faults.FailAt(k);                     // the k-th allocation from now fails
//     RunStep(&faults);                     // must fail cleanly or complete
//   }
#ifndef ACTPACK_ALLOCATOR_FAULT_INJECTION_ADAPTOR_H_
#define ACTPACK_ALLOCATOR_FAULT_INJECTION_ADAPTOR_H_

#include <cstddef>
#include <cstdint>
#include <atomic>

#include "allocator/memory_resource.h"

namespace actpack::allocator {

class FaultInjectionAdaptor final : public ResourceAdaptor {
 public:
  explicit FaultInjectionAdaptor(MemoryResource* upstream) : ResourceAdaptor(upstream) {}

  // Makes the k-th allocation from now (1 for the next) fail, once; 0 fails none. Restarts the
  // count. An allocation running on another thread meanwhile may count toward either side.
  void FailAt(uint64_t k);

  // Allocations asked for since the last FailAt (or construction), the failed one included.
  uint64_t allocations() const;

  // Whether the failure armed by the last FailAt has happened.
  bool failed() const;

 private:
  absl::StatusOr<void*> DoAllocate(size_t bytes, Stream stream, size_t reserve_limit) override;
  void DoDeallocate(void* ptr, size_t bytes, Stream stream) override;

  // Atomics, not a lock: every stack (allocator/allocator_stack.h) has one in its path, unarmed
  // nearly always, and pays one atomic increment per allocation for it.
  std::atomic<uint64_t> fail_at_{0};
  std::atomic<uint64_t> allocations_{0};
  std::atomic<bool> failed_{false};
};

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_FAULT_INJECTION_ADAPTOR_H_
