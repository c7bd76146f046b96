// host_memory_resource.h — a backend that owns host memory.
//
// Every Allocate is one allocation aligned to kAllocationAlignment (256 B) and rounded up to a
// multiple of it; every Deallocate gives it back. Allocations of kMapThreshold bytes or more
// (every segment of a caching pool) are mapped from the operating system and unmapped when
// freed, so the operating system stops counting them at once: the C library's allocator keeps
// freed blocks of up to 32 MiB in its heap (its mmap threshold rises to the largest block freed)
// and the process's resident size would stay above any budget. Smaller ones come from the C
// library. It does not cache: stack a CachingPool on it for that. Streams are tags. Each
// allocation is its own segment, so observers see segment_alloc + alloc on Allocate and
// free_requested + free_completed + segment_free on Deallocate.
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
// Aligned host memory: mapped pages from kMapThreshold up, the C library below; mapped
// allocations can be resized in place of a free and a fresh allocation (Remap). Thread safe.
class HostMemoryResource final : public MemoryResource {
 public:
  // From the smallest segment of its own a budgeted CachingPool reserves (512 KiB + 512 B):
  // mapped, so that Remap can move its pages.
  static constexpr size_t kMapThreshold = size_t{512} << 10;

  HostMemoryResource() = default;
  ~HostMemoryResource() override = default;

 private:
  absl::StatusOr<void*> DoAllocate(size_t bytes, Stream stream, size_t reserve_limit) override;
  void DoDeallocate(void* ptr, size_t bytes, Stream stream) override;
  // Mapped allocations only (both sizes at least kMapThreshold): mremap, onto a huge-page
  // boundary from 2 MiB as MapPages places them.
  absl::StatusOr<void*> DoRemap(void* ptr, size_t old_bytes, size_t new_bytes,
                                Stream stream) override;
  MemoryUsage DoGetUsage() const override;

  std::atomic<size_t> reserved_bytes_{0};
};

// LimitMallocRetention
//
// Fixes the C library's mmap threshold at 128 KiB (and its trim threshold at 256 KiB) for the
// whole process, so that large blocks other code mallocs and frees (oneDNN's, the codecs'
// scratch) go back to the operating system too instead of staying in the heap. glibc raises the
// threshold to the largest block freed, up to 32 MiB; setting it turns that off. Process-wide and
// not undone: called when actpack's pool is put under torch's CPU allocator, whose budget is
// about what the operating system sees. A no-op without glibc.
void LimitMallocRetention();

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_HOST_MEMORY_RESOURCE_H_
