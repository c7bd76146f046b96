#include "allocator/host_memory_resource.h"

#include <sys/mman.h>

#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "absl/strings/str_cat.h"
#include "allocator/units.h"

namespace actpack::allocator {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// `size` bytes of fresh pages, page aligned (so also kAllocationAlignment aligned), or nullptr.
// From kHugePage up they start on a huge-page boundary and ask the kernel for transparent huge
// pages (honoured when /sys/kernel/mm/transparent_hugepage/enabled is "always" or "madvise"):
// under a budget the pool releases and reserves segments every step, and the first touch of a
// fresh segment costs a page fault per 4 KiB, 64,000 a step on the suite's ResNet-50 (0.15 s of
// its 1.1 s), against one per 2 MiB in huge pages. The resident size is what was touched, as
// before: a segment's blocks are written once handed out. PyTorch's own CPU allocator does the
// same behind THP_MEM_ALLOC_ENABLE.
void* MapPages(size_t size) {
  constexpr int kProtection = PROT_READ | PROT_WRITE;
  constexpr int kFlags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (size < kHugePage) {
    void* ptr = mmap(nullptr, size, kProtection, kFlags, -1, 0);
    return ptr == MAP_FAILED ? nullptr : ptr;
  }
  // Map a huge page more than asked and unmap the ends outside the aligned range.
  const size_t mapped = size + kHugePage;
  void* raw = mmap(nullptr, mapped, kProtection, kFlags, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(begin, kHugePage);
  if (aligned > begin) munmap(raw, aligned - begin);
  const uintptr_t end = begin + mapped;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  void* ptr = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
  madvise(ptr, size, MADV_HUGEPAGE);  // advice: refused or ignored, the pages are small ones
#endif
  return ptr;
}

}  // namespace

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
    ptr = MapPages(size);
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
