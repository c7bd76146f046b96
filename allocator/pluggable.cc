#include "allocator/pluggable.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "allocator/device_allocator.h"

namespace {

// Why this thread's last failing call failed (actpack_last_error).
thread_local std::string last_error;

void SetLastError(const absl::Status& status) { last_error = std::string(status.message()); }

}  // namespace

using actpack::allocator::AllocatorStack;
using actpack::allocator::Backend;

extern "C" {

void* actpack_alloc(size_t size, int device, void* stream) {
  last_error.clear();
  absl::StatusOr<AllocatorStack*> stack = actpack::allocator::DeviceAllocator(device);
  if (!stack.ok()) {
    SetLastError(stack.status());
    return nullptr;
  }
  absl::StatusOr<void*> ptr = (*stack)->Allocate(size, stream);
  if (!ptr.ok()) {
    SetLastError(ptr.status());
    return nullptr;
  }
  return *ptr;
}

void actpack_free(void* ptr, size_t size, int device, void* stream) {
  if (ptr == nullptr) return;
  AllocatorStack* stack = actpack::allocator::FindDeviceAllocator(device);
  if (stack == nullptr) {
    std::fprintf(stderr, "actpack: actpack_free(%p) on device %d, which has no allocations\n",
                 ptr, device);
    std::abort();
  }
  stack->Deallocate(ptr, size, stream);
}

void actpack_init(int device_count) {
  if (device_count > actpack::allocator::kMaxDevices) {
    std::fprintf(stderr, "actpack: %d devices; only the first %d are served\n", device_count,
                 actpack::allocator::kMaxDevices);
  }
}

void actpack_empty_cache(void) {
  for (int device = 0; device < actpack::allocator::kMaxDevices; ++device) {
    if (AllocatorStack* stack = actpack::allocator::FindDeviceAllocator(device)) {
      stack->EmptyCache();
    }
  }
}

void actpack_memory_fraction(double fraction, int device) {
  using namespace actpack::allocator;
  last_error.clear();
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    SetLastError(absl::InvalidArgumentError(
        absl::StrCat("actpack: memory fraction ", fraction, " is outside (0, 1]")));
    return;
  }
  absl::StatusOr<size_t> total = DeviceTotalBytes(device);
  if (!total.ok()) {
    SetLastError(total.status());
    return;
  }
  SetDeviceBudget(device, static_cast<size_t>(fraction * static_cast<double>(*total)));
}

void actpack_record_stream(void* ptr, void* stream) {
  using namespace actpack::allocator;
  last_error.clear();
  for (int device = 0; device < kMaxDevices; ++device) {
    AllocatorStack* stack = FindDeviceAllocator(device);
    if (stack != nullptr && stack->pool().RecordStream(ptr, stream).ok()) return;
  }
  SetLastError(absl::NotFoundError(
      absl::StrCat("actpack: record_stream: ", reinterpret_cast<uintptr_t>(ptr),
                   " is not a live allocation")));
}

void* actpack_base_alloc(void* ptr, size_t* size) {
  using namespace actpack::allocator;
  last_error.clear();
  for (int device = 0; device < kMaxDevices; ++device) {
    AllocatorStack* stack = FindDeviceAllocator(device);
    if (stack == nullptr) continue;
    absl::StatusOr<CachingPool::SegmentRange> segment = stack->pool().SegmentContaining(ptr);
    if (!segment.ok()) continue;
    if (size != nullptr) *size = segment->size;
    return reinterpret_cast<void*>(segment->address);
  }
  SetLastError(absl::NotFoundError(absl::StrCat(
      "actpack: base_alloc: ", reinterpret_cast<uintptr_t>(ptr), " is not in a device segment")));
  return ptr;
}

const char* actpack_last_error(void) { return last_error.c_str(); }

}  // extern "C"
