// host_memory_resource.h — a backend that owns host memory.
//
// Every Allocate is one aligned allocation from the C library (posix_memalign), aligned to
// kAllocationAlignment (256 B) and rounded up to a multiple of it; every Deallocate frees it.
// It does not cache: stack a CachingPool on it for that. Streams are tags. Each allocation is its
// own segment, so observers see segment_alloc + alloc on Allocate and free_requested +
// free_completed + segment_free on Deallocate.
//
// Example:
//   HostMemoryResource host;
//   absl::StatusOr<void*> p = host.Allocate(1_MiB);
//   ...
//   host.Deallocate(*p, 1_MiB);
#ifndef ACTPACK_ALLOCATOR_HOST_MEMORY_RESOURCE_H_
#define ACTPACK_ALLOCATOR_HOST_MEMORY_RESOURCE_H_

#include <atomic>

#include "allocator/memory_resource.h"

namespace actpack::allocator {

// HostMemoryResource
//
// Aligned host memory from the C library. Thread safe.
class HostMemoryResource final : public MemoryResource {
 public:
  HostMemoryResource() = default;
  ~HostMemoryResource() override = default;

 private:
  absl::StatusOr<void*> DoAllocate(size_t bytes, Stream stream, size_t reserve_limit) override;
  void DoDeallocate(void* ptr, size_t bytes, Stream stream) override;
  MemoryUsage DoGetUsage() const override;

  std::atomic<size_t> reserved_bytes_{0};
};

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_HOST_MEMORY_RESOURCE_H_
