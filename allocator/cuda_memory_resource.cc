#include "allocator/cuda_memory_resource.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/units.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>

#include "allocator/internal/cuda_device.h"
#include "common/cuda_check.h"
#endif

namespace actpack::allocator {

#if ACTPACK_WITH_CUDA

using internal::ReportCudaError;
using internal::ScopedDevice;

bool CudaSupportCompiledIn() { return true; }

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  return count;
}

namespace {

absl::StatusOr<std::pair<size_t, size_t>> FreeAndTotal(int device) {
  ScopedDevice scoped(device);
  if (!scoped.status().ok()) return scoped.status();
  size_t free_bytes = 0, total_bytes = 0;
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return std::make_pair(free_bytes, total_bytes);
}

}  // namespace

absl::StatusOr<size_t> CudaDeviceTotalMemory(int device) {
  absl::StatusOr<std::pair<size_t, size_t>> info = FreeAndTotal(device);
  if (!info.ok()) return info.status();
  return info->second;
}

absl::StatusOr<size_t> CudaDeviceUsedMemory(int device) {
  absl::StatusOr<std::pair<size_t, size_t>> info = FreeAndTotal(device);
  if (!info.ok()) return info.status();
  return info->second - info->first;
}

absl::StatusOr<void*> CudaMemoryResource::DoAllocate(size_t bytes, Stream stream,
                                                     size_t reserve_limit) {
  const size_t size = RoundUp(bytes, kAllocationAlignment);
  const size_t before = reserved_bytes_.fetch_add(size, std::memory_order_relaxed);
  if (before + size > reserve_limit || before + size < before) {
    reserved_bytes_.fetch_sub(size, std::memory_order_relaxed);
    return ReserveLimitExceeded(absl::StrCat(
        "actpack: cudaMalloc of ", FormatBytes(size), " on device ", device_,
        " would pass the reserve limit of ", FormatBytes(reserve_limit)));
  }
  ScopedDevice scoped(device_);
  void* ptr = nullptr;
  absl::Status status = scoped.status();
  if (status.ok()) status = ACTPACK_CUDA_STATUS(cudaMalloc(&ptr, size));
  if (!status.ok()) {
    reserved_bytes_.fetch_sub(size, std::memory_order_relaxed);
    return status;
  }
  NotifySegmentAllocated(ptr, size, bytes, stream);
  return ptr;
}

void CudaMemoryResource::DoDeallocate(void* ptr, size_t bytes, Stream stream) {
  const size_t size = RoundUp(bytes, kAllocationAlignment);
  NotifySegmentFreed(ptr, size, bytes, stream);
  ScopedDevice scoped(device_);
  ReportCudaError(scoped.status());
  // cudaFree synchronises the device, so work still using `ptr` on any stream has finished.
  ReportCudaError(ACTPACK_CUDA_STATUS(cudaFree(ptr)));
  reserved_bytes_.fetch_sub(size, std::memory_order_relaxed);
}

CudaStreamEvents::~CudaStreamEvents() {
  for (Event event : kept_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

absl::StatusOr<StreamEvents::Event> CudaStreamEvents::Record(Stream stream) {
  ScopedDevice scoped(device_);
  if (!scoped.status().ok()) return scoped.status();
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!kept_.empty()) {
      event = static_cast<cudaEvent_t>(kept_.back());
      kept_.pop_back();
    }
  }
  if (event == nullptr) {
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  absl::Status status =
      ACTPACK_CUDA_STATUS(cudaEventRecord(event, static_cast<cudaStream_t>(stream)));
  if (!status.ok()) {
    (void)cudaEventDestroy(event);
    return status;
  }
  return static_cast<Event>(event);
}

bool CudaStreamEvents::IsComplete(Event event) {
  const cudaError_t error = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (error == cudaSuccess) return true;
  if (error == cudaErrorNotReady) return false;
  // A real error: waiting is the only answer that never reuses memory too early.
  ReportCudaError(ACTPACK_CUDA_STATUS(error));
  Wait(event);
  return true;
}

void CudaStreamEvents::Wait(Event event) {
  ReportCudaError(ACTPACK_CUDA_STATUS(cudaEventSynchronize(static_cast<cudaEvent_t>(event))));
}

absl::Status CudaStreamEvents::StreamWait(Stream stream, Event event) {
  ScopedDevice scoped(device_);
  if (!scoped.status().ok()) return scoped.status();
  return ACTPACK_CUDA_STATUS(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
}

// A released event may still be pending, or waited on by a stream (cudaStreamWaitEvent took
// its state when it was called): recording it again later changes neither.
void CudaStreamEvents::Release(Event event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (kept_.size() < kKeptEvents) {
      kept_.push_back(event);
      return;
    }
  }
  ReportCudaError(ACTPACK_CUDA_STATUS(cudaEventDestroy(static_cast<cudaEvent_t>(event))));
}

#else  // !ACTPACK_WITH_CUDA

namespace {

absl::Status NotCompiledIn() {
  return absl::UnimplementedError("actpack: CUDA support not compiled in");
}

}  // namespace

bool CudaSupportCompiledIn() { return false; }

absl::StatusOr<int> CudaDeviceCount() { return NotCompiledIn(); }

absl::StatusOr<size_t> CudaDeviceTotalMemory(int device) { return NotCompiledIn(); }

absl::StatusOr<size_t> CudaDeviceUsedMemory(int device) { return NotCompiledIn(); }

absl::StatusOr<void*> CudaMemoryResource::DoAllocate(size_t bytes, Stream stream,
                                                     size_t reserve_limit) {
  return NotCompiledIn();
}

// Allocate never succeeds without CUDA, so there is nothing that could be freed.
void CudaMemoryResource::DoDeallocate(void* ptr, size_t bytes, Stream stream) {}

absl::StatusOr<StreamEvents::Event> CudaStreamEvents::Record(Stream stream) {
  return NotCompiledIn();
}

CudaStreamEvents::~CudaStreamEvents() = default;
bool CudaStreamEvents::IsComplete(Event event) { return true; }
void CudaStreamEvents::Wait(Event event) {}
absl::Status CudaStreamEvents::StreamWait(Stream stream, Event event) { return NotCompiledIn(); }
void CudaStreamEvents::Release(Event event) {}

#endif  // ACTPACK_WITH_CUDA

MemoryUsage CudaMemoryResource::DoGetUsage() const {
  const size_t reserved = reserved_bytes_.load(std::memory_order_relaxed);
  return {reserved, reserved};
}

}  // namespace actpack::allocator
