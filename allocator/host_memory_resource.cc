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
// `size` bytes mapped with `protection` and `flags` from a huge-page boundary, or nullptr: a huge
// page more is mapped and the ends outside the aligned range unmapped.
void* MapOnHugePageBoundary(size_t size, int protection, int flags) {
  const size_t mapped = size + kHugePage;
  void* raw = mmap(nullptr, mapped, protection, flags, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(begin, kHugePage);
  if (aligned > begin) munmap(raw, aligned - begin);
  const uintptr_t end = begin + mapped;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  return reinterpret_cast<void*>(aligned);
}

void AdviseHugePages(void* ptr, size_t size) {
#ifdef MADV_HUGEPAGE
  madvise(ptr, size, MADV_HUGEPAGE);  // advice: refused or ignored, the pages are small ones
#endif
}

void* MapPages(size_t size) {
  constexpr int kProtection = PROT_READ | PROT_WRITE;
  constexpr int kFlags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (size < kHugePage) {
    void* ptr = mmap(nullptr, size, kProtection, kFlags, -1, 0);
    return ptr == MAP_FAILED ? nullptr : ptr;
  }
  void* ptr = MapOnHugePageBoundary(size, kProtection, kFlags);
  if (ptr != nullptr) AdviseHugePages(ptr, size);
  return ptr;
}

// The mapping [ptr, ptr + old_size) resized to `new_size`, its pages kept, or nullptr (then it is
// as it was). Shrinking stays in place; growing does where the addresses after it are free, and
// otherwise moves onto a fresh huge-page boundary from kHugePage up (as MapPages places a
// mapping), where the kernel moves whole huge pages as they are.
void* ResizeMapping(void* ptr, size_t old_size, size_t new_size) {
  const bool wants_huge_pages = new_size >= kHugePage;
  void* resized = MAP_FAILED;
  if (!wants_huge_pages || reinterpret_cast<uintptr_t>(ptr) % kHugePage == 0) {
    resized = mremap(ptr, old_size, new_size, 0);  // in place
  }
  if (resized == MAP_FAILED && !wants_huge_pages) {
    resized = mremap(ptr, old_size, new_size, MREMAP_MAYMOVE);
  } else if (resized == MAP_FAILED) {
    // Reserve aligned addresses (no memory: PROT_NONE) and move onto them.
    void* target = MapOnHugePageBoundary(new_size, PROT_NONE,
                                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE);
    if (target == nullptr) return nullptr;
    resized = mremap(ptr, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, target);
    if (resized == MAP_FAILED) munmap(target, new_size);
  }
  if (resized == MAP_FAILED) return nullptr;
  if (wants_huge_pages) AdviseHugePages(resized, new_size);
  return resized;
}

}  // namespace

absl::StatusOr<void*> HostMemoryResource::DoRemap(void* ptr, size_t old_bytes, size_t new_bytes,
                                                  Stream stream) {
  const size_t old_size = RoundUp(old_bytes, kAllocationAlignment);
  const size_t new_size = RoundUp(new_bytes, kAllocationAlignment);
  if (old_size < kMapThreshold || new_size < kMapThreshold) {
    return absl::UnimplementedError(absl::StrCat(
        "actpack: host allocations below ", FormatBytes(kMapThreshold),
        " come from the C library and cannot be remapped (", FormatBytes(old_size), " to ",
        FormatBytes(new_size), ")"));
  }
  void* resized = ResizeMapping(ptr, old_size, new_size);
  if (resized == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("actpack: host remap of ",
                                                     FormatBytes(old_size), " to ",
                                                     FormatBytes(new_size), " failed"));
  }
  NotifySegmentFreed(ptr, old_size, old_bytes, stream);
  if (new_size > old_size) {
    reserved_bytes_.fetch_add(new_size - old_size, std::memory_order_relaxed);
  } else {
    reserved_bytes_.fetch_sub(old_size - new_size, std::memory_order_relaxed);
  }
  NotifySegmentAllocated(resized, new_size, new_bytes, stream);
  return resized;
}

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
