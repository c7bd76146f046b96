// budget_adaptor.h — a hard cap on the memory reserved below it.
//
// BudgetAdaptor keeps the reserved bytes of its upstream stack (what the pool took from the
// device: the real footprint) at or below a budget. It passes the budget down as the reserve limit
// of AllocateWithin, so the check happens atomically where memory is reserved. When a request
// does not fit, in this order:
//  1. the pool below has already given back what the request lacks (a CachingPool releases
//     cached segments, smallest covering one first, before it fails a limited request); the
//     adaptor does not empty the rest of the cache: what stays cached is what later requests
//     reuse without going to the device (on CUDA, a cudaFree that synchronizes the device and
//     a cudaMalloc, or the VMM backend's mapping calls);
//  2. each registered pressure callback runs, in registration order, with the bytes needed; this
//     is where the runtime compresses saved activations harder. After each callback that frees
//     something the request is retried; the callbacks run again, round after round (at most
//     16), while a round frees something, as freed memory may not be contiguous with what the
//     request needs;
//  3. the request fails with kResourceExhausted and a message giving the request, the bytes in
//     use, the bytes cached (the backend's cache included), the budget and the smallest budget
//     under which the request would have fitted now:
//     "actpack: out of budget: requested 4.00 MiB with 5.98 GiB in use and 0 B cached;
//      budget 6.00 GiB; the smallest budget that would have fitted it: 6.00 GiB".
//     The last figure is also the status's payload: SmallestFittingBudget(status) reads it
//     (what the torch layer puts in its torch.OutOfMemoryError). It is the pool's segments that
//     hold live blocks, plus the segment the request needed, plus what the system counts outside
//     the pool, with every cached segment given back: the budget to set for this state.
// Callbacks run without any allocator lock held, so they may free memory of this stack; a
// callback that allocates from this stack and runs out again gets the error without re-entering
// the callbacks. Only memory allocated through the adaptor is capped: allocate through it.
//
// Example:
//   BudgetAdaptor budget(&pool, 6_GiB);
//   budget.AddPressureCallback([&](size_t needed) { return session.CompressHarder(needed); });
//   absl::StatusOr<void*> p = budget.Allocate(4_MiB, stream);
#ifndef ACTPACK_ALLOCATOR_BUDGET_ADAPTOR_H_
#define ACTPACK_ALLOCATOR_BUDGET_ADAPTOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "allocator/memory_resource.h"

namespace actpack::allocator {

// SmallestFittingBudget
//
// The smallest budget under which the request a BudgetAdaptor refused would have fitted (see
// the file comment), from the refusal's status; nullopt for any other status (a device that
// ran out of memory within the budget carries none).
std::optional<size_t> SmallestFittingBudget(const absl::Status& status);

// BudgetAdaptor
//
// See the file comment. Thread safe; the budget may change at any time.
class BudgetAdaptor final : public ResourceAdaptor {
 public:
  // PressureCallback
  //
  // Called when a request does not fit. `needed` is how many bytes in use would have to be freed
  // for the request to fit the budget (the request size when the budget has room but
  // fragmentation or the device stands in the way). Returns the bytes it freed (0: nothing).
  using PressureCallback = std::function<size_t(size_t needed)>;
  using CallbackId = int64_t;

  // `budget_bytes` caps the reserved bytes of `upstream` (not owned); kNoCap for none.
  BudgetAdaptor(MemoryResource* upstream, size_t budget_bytes);

  size_t budget() const { return budget_.load(std::memory_order_relaxed); }

  // SetBudget
  //
  // Changes the cap for later requests. Memory already reserved above a lowered budget stays until
  // it is freed; EmptyCache releases what is cached.
  void SetBudget(size_t budget_bytes) { budget_.store(budget_bytes, std::memory_order_relaxed); }

  // AddPressureCallback / RemovePressureCallback
  //
  // Registers a callback and returns the id that removes it. A callback may be removed while
  // another thread is running it; it is not called after RemovePressureCallback returns to a
  // thread that has not already started it.
  CallbackId AddPressureCallback(PressureCallback callback);
  void RemovePressureCallback(CallbackId id);

 private:
  absl::StatusOr<void*> DoAllocate(size_t bytes, Stream stream, size_t reserve_limit) override;
  void DoDeallocate(void* ptr, size_t bytes, Stream stream) override;

  absl::Status OutOfBudget(size_t bytes, const absl::Status& last_error) const;

  std::atomic<size_t> budget_;
  std::mutex callbacks_mutex_;
  CallbackId next_callback_id_ = 1;
  std::vector<std::pair<CallbackId, std::shared_ptr<const PressureCallback>>> callbacks_;
};

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_BUDGET_ADAPTOR_H_
