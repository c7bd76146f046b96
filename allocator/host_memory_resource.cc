#include "allocator/host_memory_resource.h"

#include <sys/mman.h>

#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "absl/strings/str_cat.h"
#include "allocator/units.h"

namespace actpack::allocator {

absl::StatusOr<void*> HostMemoryResource::DoAllocate(size_t bytes, Stream stream,
                                                     size_t reserve_limit) {
  const size_t size = RoundUp(bytes, kAllocationAlignment);
  // Reserve first, then allocate: the limit check and the accounting are one atomic step, so
  // concurrent callers cannot pass the limit together.
  const size_t before = reserved_bytes_.fetch_add(size, std::memory_order_relaxed);
  if (before + size > reserve_limit || before + size < before) {
    reserved_bytes_.fetch_sub(size, std::memory_order_relaxed);
    return ReserveLimitExceeded(absl::StrCat("actpack: host allocation of ", FormatBytes(size),
                                             " would pass the reserve limit of ",
                                             FormatBytes(reserve_limit), " (",
                                             FormatBytes(before), " reserved)"));
  }
  void* ptr = nullptr;
  if (size >= kMapThreshold) {
    // Page aligned, so also kAllocationAlignment aligned.
    ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED) ptr = nullptr;
  } else if (posix_memalign(&ptr, kAllocationAlignment, size) != 0) {
    ptr = nullptr;
  }
  if (ptr == nullptr) {
    reserved_bytes_.fetch_sub(size, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(
        absl::StrCat("actpack: host allocation of ", FormatBytes(size), " failed"));
  }
  NotifySegmentAllocated(ptr, size, bytes, stream);
  return ptr;
}

void HostMemoryResource::DoDeallocate(void* ptr, size_t bytes, Stream stream) {
  const size_t size = RoundUp(bytes, kAllocationAlignment);
  NotifySegmentFreed(ptr, size, bytes, stream);
  if (size >= kMapThreshold) {
    munmap(ptr, size);
  } else {
    std::free(ptr);
  }
  reserved_bytes_.fetch_sub(size, std::memory_order_relaxed);
}

MemoryUsage HostMemoryResource::DoGetUsage() const {
  const size_t reserved = reserved_bytes_.load(std::memory_order_relaxed);
  return {reserved, reserved};
}

void LimitMallocRetention() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
  mallopt(M_TRIM_THRESHOLD, 256 << 10);
#endif
}

}  // namespace actpack::allocator
