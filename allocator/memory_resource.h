// memory_resource.h — the interface every piece of actpack's allocator implements.
//
// The allocator is a stack of small pieces in the shape of RAPIDS RMM. A *resource* owns memory:
// a backend (HostMemoryResource, CudaMemoryResource) or the CachingPool, which keeps freed blocks
// of its backend for reuse. An *adaptor* wraps an upstream it does not own and adds one concern:
// BudgetAdaptor (a hard cap), StatisticsAdaptor (torch.cuda.memory_stats-shaped counters),
// TracingAdaptor (a ring buffer of actions). Every piece is a MemoryResource, so they stack in
// any order; the usual stack is trace(stats(budget(pool(backend)))).
//
// Example:
//   HostMemoryResource host;
//   HostStreamEvents events;
//   CachingPool pool(&host, &events);
//   StatisticsAdaptor stats(&pool);
//   absl::StatusOr<void*> p = stats.Allocate(4_MiB, stream);
//   if (!p.ok()) return p.status();
//   ...
//   stats.Deallocate(*p, 4_MiB, stream);
#ifndef ACTPACK_ALLOCATOR_MEMORY_RESOURCE_H_
#define ACTPACK_ALLOCATOR_MEMORY_RESOURCE_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace actpack::allocator {

// Stream
//
// An opaque stream handle: a `cudaStream_t` for CUDA resources, any tag for host resources
// (nullptr is the default stream). Opaque so that no allocator header needs CUDA.
using Stream = void*;

// Every pointer a resource returns is aligned to at least this many bytes (cudaMalloc's
// guarantee, and enough for any vectorised CPU load).
inline constexpr size_t kAllocationAlignment = 256;

// The one spelling of "no cap": passed as a reserve limit or a budget, and the cap a pool
// reports when it has none (the runtime's pool interface too).
inline constexpr size_t kNoCap = std::numeric_limits<size_t>::max();

// MemoryUsage
//
// What a resource holds right now. `reserved_bytes` is memory taken from the layer below (the
// device or the OS): the footprint a budget is about. `allocated_bytes` is the part handed out to
// callers (sizes after rounding); the rest (`reserved - allocated`) is cached.
// `upstream_cached_bytes` is what a caching pool's backend keeps for reuse beside the pool's own
// segments (VmmMemoryResource's physical memory no segment maps): device memory all the same,
// counted against a reserve limit, but not part of the pool's reserved bytes or its segment
// statistics. 0 for every other resource.
struct MemoryUsage {
  size_t reserved_bytes = 0;
  size_t allocated_bytes = 0;
  size_t upstream_cached_bytes = 0;

  size_t cached_bytes() const { return reserved_bytes - allocated_bytes; }
  // Everything taken from the device or the OS, the backend's cache included.
  size_t footprint_bytes() const { return reserved_bytes + upstream_cached_bytes; }
};

// MemoryAction
//
// The actions resources report to observers. The first six are the actions of PyTorch's memory
// trace (`torch.cuda.memory._snapshot()["device_traces"]`); kAllocRetry counts the times an
// allocation had to release cached memory and try again (torch's `num_alloc_retries`).
enum class MemoryAction : uint8_t {
  kAlloc,          // a block was handed out
  kFreeRequested,  // the caller freed a block; it may still wait for other streams
  kFreeCompleted,  // the block is back in the cache and can be reused
  kSegmentAlloc,   // memory was reserved from the layer below
  kSegmentFree,    // reserved memory was returned to the layer below
  kOom,            // an allocation failed (recorded by adaptors, not emitted by resources)
  kAllocRetry,     // cached memory was released so that an allocation could be retried
};

// The name PyTorch's trace uses for `action` ("alloc", "free_requested", ..., "oom").
absl::string_view MemoryActionName(MemoryAction action);

// MemoryEvent
//
// One action. For block actions `size` is the block size after rounding and `requested_size`
// the size the caller asked for; for segment actions both are the segment size.
struct MemoryEvent {
  MemoryAction action;
  uintptr_t address = 0;
  size_t size = 0;
  size_t requested_size = 0;
  Stream stream = nullptr;
};

// MemoryObserver
//
// Receives the events of a resource. Resources call it with their internal lock held, in the
// order the actions happened, possibly from many threads: an observer must be thread safe, fast,
// and must not call back into the resource.
class MemoryObserver {
 public:
  virtual ~MemoryObserver() = default;
  virtual void OnMemoryEvent(const MemoryEvent& event) = 0;
};

// MemoryResource
//
// The base class: a non-virtual public interface forwarding to private virtuals.
//
// Stream-ordering contract (the same as RMM's and PyTorch's caching allocator):
//  * `Allocate(bytes, stream)` returns memory that is ready for work enqueued on `stream` after the
//    call. Work on another stream must first be ordered after `stream` by the caller.
//  * `Deallocate(ptr, bytes, stream)` may be called while work on `stream` that uses `ptr` is still
//    pending: the memory is reused only by later allocations on the same `stream` (so the reuse is
//    ordered after that work), or — for a block the caller handed to other streams with
//    `CachingPool::RecordStream` — once an event recorded on each of those streams at free time
//    has completed. `bytes` and `stream` must be the values the memory was allocated with.
//  * Host resources have no asynchronous work: streams are tags and every event has completed.
//
// `Allocate(0, ...)` returns nullptr and `Deallocate(nullptr, ...)` does nothing. All resources
// are thread safe. A resource must outlive every adaptor stacked on it.
class MemoryResource {
 public:
  MemoryResource() = default;
  MemoryResource(const MemoryResource&) = delete;
  MemoryResource& operator=(const MemoryResource&) = delete;
  virtual ~MemoryResource() = default;

  // Allocate
  //
  // At least `bytes` bytes aligned to kAllocationAlignment, ready on `stream`. Fails with
  // kResourceExhausted when memory (or the budget) runs out.
  absl::StatusOr<void*> Allocate(size_t bytes, Stream stream = nullptr) {
    return AllocateWithin(bytes, stream, kNoCap);
  }

  // AllocateWithin
  //
  // Like Allocate, but fails with a reserve-limit error (see IsReserveLimitExceeded) instead of
  // letting this resource's reserved bytes exceed `reserve_limit`. A caching resource first
  // releases cached memory to stay under the limit. This is how BudgetAdaptor caps the footprint
  // of the resources below it: the check and the reservation happen under the lock of the
  // resource that reserves, so concurrent allocations cannot overshoot together.
  absl::StatusOr<void*> AllocateWithin(size_t bytes, Stream stream, size_t reserve_limit) {
    if (bytes == 0) return nullptr;
    return DoAllocate(bytes, stream, reserve_limit);
  }

  // Deallocate
  //
  // Returns memory from Allocate; see the stream-ordering contract above.
  void Deallocate(void* ptr, size_t bytes, Stream stream = nullptr) {
    if (ptr == nullptr) return;
    DoDeallocate(ptr, bytes, stream);
  }

  // Remap
  //
  // Turns the allocation `ptr` of `old_bytes` (free: nothing uses it) into one of `new_bytes`,
  // keeping the memory it already has instead of giving it back and taking fresh memory: the
  // pages of its first min(old, new) bytes move with it, so they are not faulted in (and zeroed)
  // again. The contents are not kept for the caller: it is a fresh allocation. Returns the new
  // address; on failure `ptr` is as it was. Resources that cannot return kUnimplemented (the
  // default; a CUDA allocation cannot be resized).
  absl::StatusOr<void*> Remap(void* ptr, size_t old_bytes, size_t new_bytes,
                              Stream stream = nullptr) {
    return DoRemap(ptr, old_bytes, new_bytes, stream);
  }

  // EmptyCache
  //
  // Returns cached memory to the layer below (torch.cuda.empty_cache); memory still allocated or
  // waiting for stream events stays. Returns the bytes released. Non-caching resources return 0.
  size_t EmptyCache() { return DoEmptyCache(); }

  // GetUsage
  //
  // Reserved and allocated bytes of the resource at the bottom of the caching (adaptors report
  // their upstream's usage).
  MemoryUsage GetUsage() const { return DoGetUsage(); }

  // AllocationGranularity
  //
  // The unit this resource takes memory from the layer below in: a request is held as rounded
  // up to a multiple of it (a VMM backend's 2 MiB granule), so a pool above sizes its segments
  // in whole units rather than leave a remainder the budget would not see. 1 where the
  // resource holds what is asked (rounded to kAllocationAlignment); adaptors report their
  // upstream's.
  size_t AllocationGranularity() const { return DoAllocationGranularity(); }

  // AddObserver / RemoveObserver
  //
  // Subscribes `observer` (not owned) to the events of this resource; adaptors also subscribe it
  // to their upstream. Not synchronised with allocation: call both before the resource is shared
  // between threads and after it is no longer used (adaptors do it in their constructor and
  // destructor).
  void AddObserver(MemoryObserver* observer) { DoAddObserver(observer); }
  void RemoveObserver(MemoryObserver* observer) { DoRemoveObserver(observer); }

 protected:
  // Sends `event` to this resource's observers.
  void Notify(const MemoryEvent& event) const {
    for (MemoryObserver* observer : observers_) observer->OnMemoryEvent(event);
  }
  bool HasObservers() const { return !observers_.empty(); }

  // What a backend reports when it hands out a fresh segment of `size` bytes for a request of
  // `bytes` (segment_alloc, then alloc), and when it takes one back (free_requested,
  // free_completed, segment_free).
  void NotifySegmentAllocated(void* ptr, size_t size, size_t bytes, Stream stream) const {
    if (!HasObservers()) return;
    const auto address = reinterpret_cast<uintptr_t>(ptr);
    Notify({MemoryAction::kSegmentAlloc, address, size, size, stream});
    Notify({MemoryAction::kAlloc, address, size, bytes, stream});
  }
  void NotifySegmentFreed(void* ptr, size_t size, size_t bytes, Stream stream) const {
    if (!HasObservers()) return;
    const auto address = reinterpret_cast<uintptr_t>(ptr);
    Notify({MemoryAction::kFreeRequested, address, size, bytes, stream});
    Notify({MemoryAction::kFreeCompleted, address, size, bytes, stream});
    Notify({MemoryAction::kSegmentFree, address, size, size, stream});
  }

  // The default observer handling: keep them in this resource's own list.
  virtual void DoAddObserver(MemoryObserver* observer);
  virtual void DoRemoveObserver(MemoryObserver* observer);

 private:
  virtual absl::StatusOr<void*> DoAllocate(size_t bytes, Stream stream, size_t reserve_limit) = 0;
  virtual void DoDeallocate(void* ptr, size_t bytes, Stream stream) = 0;
  virtual absl::StatusOr<void*> DoRemap(void* ptr, size_t old_bytes, size_t new_bytes,
                                        Stream stream);
  virtual size_t DoEmptyCache() { return 0; }
  virtual MemoryUsage DoGetUsage() const = 0;
  virtual size_t DoAllocationGranularity() const { return 1; }

  std::vector<MemoryObserver*> observers_;
};

// ResourceAdaptor
//
// Base of the adaptors: holds the upstream (not owned) and forwards everything an adaptor does not
// change. Observers subscribe to the adaptor and to everything below it.
class ResourceAdaptor : public MemoryResource {
 public:
  explicit ResourceAdaptor(MemoryResource* upstream) : upstream_(upstream) {}

  MemoryResource* upstream() const { return upstream_; }

 protected:
  void DoAddObserver(MemoryObserver* observer) override;
  void DoRemoveObserver(MemoryObserver* observer) override;

 private:
  size_t DoEmptyCache() override { return upstream_->EmptyCache(); }
  MemoryUsage DoGetUsage() const override { return upstream_->GetUsage(); }
  size_t DoAllocationGranularity() const override { return upstream_->AllocationGranularity(); }

  MemoryResource* const upstream_;
};

// ReserveLimitExceeded
//
// The kResourceExhausted status a resource returns when an allocation would push its reserved
// bytes past the limit given to AllocateWithin. It carries a payload so that the budget can tell
// its own limit from a device that ran out of memory, and, where the resource knows it,
// `needed_bytes`: the smallest limit under which this allocation would have succeeded now (a
// caching pool: its segments holding live blocks, plus the segment the request needs, plus what
// the system counts outside it, with every cached segment given back).
absl::Status ReserveLimitExceeded(absl::string_view message);
absl::Status ReserveLimitExceeded(absl::string_view message, size_t needed_bytes);

// IsReserveLimitExceeded
//
// True for a status made by ReserveLimitExceeded.
bool IsReserveLimitExceeded(const absl::Status& status);

// ReserveLimitNeeded
//
// The `needed_bytes` a ReserveLimitExceeded status carries; nullopt when it carries none.
std::optional<size_t> ReserveLimitNeeded(const absl::Status& status);

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_MEMORY_RESOURCE_H_
