// cuda_memory_resource.h — a backend that owns CUDA device memory, and CUDA stream events.
//
// CudaMemoryResource hands out cudaMalloc allocations of one device and frees them with cudaFree;
// it does not cache (stack a CachingPool on it). CudaStreamEvents records cudaEvents for the
// pool's stream-ordered reuse. Without CUDA compiled in (the CPU build), both exist and fail with
// kUnimplemented "CUDA support not compiled in", so that callers need no #ifdefs.
//
// Example:
//   CudaMemoryResource device(/*device=*/0);
//   CudaStreamEvents events(/*device=*/0);
//   CachingPool pool(&device, &events);
//   absl::StatusOr<void*> p = pool.Allocate(64_MiB, stream);
#ifndef ACTPACK_ALLOCATOR_CUDA_MEMORY_RESOURCE_H_
#define ACTPACK_ALLOCATOR_CUDA_MEMORY_RESOURCE_H_

#include <atomic>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/memory_resource.h"
#include "allocator/stream_events.h"

namespace actpack::allocator {

// CudaSupportCompiledIn
//
// Whether this build has CUDA (ACTPACK_WITH_CUDA).
bool CudaSupportCompiledIn();

// CudaDeviceCount
//
// The number of visible CUDA devices; kUnimplemented without CUDA, the CUDA error if the driver
// cannot be reached.
absl::StatusOr<int> CudaDeviceCount();

// CudaDeviceTotalMemory
//
// The total memory of `device` in bytes (for memory fractions).
absl::StatusOr<size_t> CudaDeviceTotalMemory(int device);

// CudaDeviceUsedMemory
//
// The memory of `device` in use as the driver counts it (cudaMemGetInfo: total - free): every
// allocator of every process, the CUDA context, libraries' workspaces.
absl::StatusOr<size_t> CudaDeviceUsedMemory(int device);

// CudaMemoryResource
//
// cudaMalloc / cudaFree on `device` (made current for the call and restored afterwards).
// Thread safe.
class CudaMemoryResource final : public MemoryResource {
 public:
  explicit CudaMemoryResource(int device) : device_(device) {}
  ~CudaMemoryResource() override = default;

  int device() const { return device_; }

 private:
  absl::StatusOr<void*> DoAllocate(size_t bytes, Stream stream, size_t reserve_limit) override;
  void DoDeallocate(void* ptr, size_t bytes, Stream stream) override;
  MemoryUsage DoGetUsage() const override;

  const int device_;
  std::atomic<size_t> reserved_bytes_{0};
};

// CudaStreamEvents
//
// cudaEvent_t (timing disabled) on `device`. Released events are kept for the next Record (up
// to kKeptEvents), as PyTorch's allocator keeps its own, so that a free in steady state creates
// none. StreamWait is cudaStreamWaitEvent. Thread safe.
class CudaStreamEvents final : public StreamEvents {
 public:
  static constexpr size_t kKeptEvents = 1024;

  explicit CudaStreamEvents(int device) : device_(device) {}
  ~CudaStreamEvents() override;

  absl::StatusOr<Event> Record(Stream stream) override;
  bool IsComplete(Event event) override;
  void Wait(Event event) override;
  absl::Status StreamWait(Stream stream, Event event) override;
  void Release(Event event) override;

 private:
  const int device_;
  std::mutex mutex_;
  std::vector<Event> kept_;  // released events, to record again
};

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_CUDA_MEMORY_RESOURCE_H_
