#include "allocator/pluggable.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "allocator/device_allocator.h"
#include "allocator/units.h"

namespace {

using actpack::allocator::kMaxDevices;

// Why the last failing call failed, for the process and per device. Never destroyed: torch
// frees (and may fail) during process exit.
struct LastErrors {
  std::mutex mutex;
  std::string process;
  std::array<std::string, kMaxDevices> devices;
  // Whether each is set: a successful call (every allocation) takes the lock only to clear
  // one that is.
  std::atomic<bool> process_set{false};
  std::array<std::atomic<bool>, kMaxDevices> device_set{};
};

LastErrors& Errors() {
  static auto* errors = new LastErrors;
  return *errors;
}

bool ValidDevice(int device) { return device >= 0 && device < kMaxDevices; }

// A call about `device` (-1: none found) failed with `status`.
void SetLastError(const absl::Status& status, int device = -1) {
  LastErrors& errors = Errors();
  std::lock_guard<std::mutex> lock(errors.mutex);
  errors.process = std::string(status.message());
  errors.process_set.store(true, std::memory_order_release);
  if (ValidDevice(device)) {
    errors.devices[device] = errors.process;
    errors.device_set[device].store(true, std::memory_order_release);
  }
}

// A call about `device` (-1: none in particular) succeeded.
void ClearLastError(int device = -1) {
  LastErrors& errors = Errors();
  const bool device_set =
      ValidDevice(device) && errors.device_set[device].load(std::memory_order_acquire);
  if (!device_set && !errors.process_set.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(errors.mutex);
  errors.process.clear();
  errors.process_set.store(false, std::memory_order_release);
  if (ValidDevice(device)) {
    errors.devices[device].clear();
    errors.device_set[device].store(false, std::memory_order_release);
  }
}

// What actpack_last_error* return: this thread's copy, so that another thread's failure
// meanwhile does not change the string under the caller.
thread_local std::string returned_error;

}  // namespace

using actpack::allocator::AllocatorStack;
using actpack::allocator::Backend;

extern "C" {

void* actpack_alloc(size_t size, int device, void* stream) {
  absl::StatusOr<AllocatorStack*> stack = actpack::allocator::DeviceAllocator(device);
  if (!stack.ok()) {
    SetLastError(stack.status(), device);
    return nullptr;
  }
  absl::StatusOr<void*> ptr = (*stack)->Allocate(size, stream);
  if (!ptr.ok()) {
    SetLastError(ptr.status(), device);
    return nullptr;
  }
  ClearLastError(device);
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
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    SetLastError(absl::InvalidArgumentError(
                     absl::StrCat("actpack: memory fraction ", fraction, " is outside (0, 1]")),
                 device);
    return;
  }
  absl::StatusOr<size_t> total = DeviceTotalBytes(device);
  if (!total.ok()) {
    SetLastError(total.status(), device);
    return;
  }
  SetDeviceBudget(device, ShareOf(fraction, *total));
  ClearLastError(device);
}

void actpack_record_stream(void* ptr, void* stream) {
  using namespace actpack::allocator;
  for (int device = 0; device < kMaxDevices; ++device) {
    AllocatorStack* stack = FindDeviceAllocator(device);
    if (stack != nullptr && stack->pool().RecordStream(ptr, stream).ok()) {
      ClearLastError(device);
      return;
    }
  }
  SetLastError(absl::NotFoundError(
      absl::StrCat("actpack: record_stream: ", reinterpret_cast<uintptr_t>(ptr),
                   " is not a live allocation")));
}

void* actpack_base_alloc(void* ptr, size_t* size) {
  using namespace actpack::allocator;
  for (int device = 0; device < kMaxDevices; ++device) {
    AllocatorStack* stack = FindDeviceAllocator(device);
    if (stack == nullptr) continue;
    absl::StatusOr<CachingPool::SegmentRange> segment = stack->pool().SegmentContaining(ptr);
    if (!segment.ok()) continue;
    if (size != nullptr) *size = segment->size;
    ClearLastError(device);
    return reinterpret_cast<void*>(segment->address);
  }
  SetLastError(absl::NotFoundError(absl::StrCat(
      "actpack: base_alloc: ", reinterpret_cast<uintptr_t>(ptr), " is not in a device segment")));
  return ptr;
}

const char* actpack_last_error(void) {
  LastErrors& errors = Errors();
  std::lock_guard<std::mutex> lock(errors.mutex);
  returned_error = errors.process;
  return returned_error.c_str();
}

const char* actpack_last_device_error(int device) {
  LastErrors& errors = Errors();
  std::lock_guard<std::mutex> lock(errors.mutex);
  returned_error = ValidDevice(device) ? errors.devices[device] : std::string();
  return returned_error.c_str();
}

}  // extern "C"
