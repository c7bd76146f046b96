// allocator_stack.h — one complete allocator: trace(stats(faults(budget(pool(backend))))).
//
// The process keeps two kinds of these (device_allocator.h: one per device, behind the C ABI in
// pluggable.h; host_pool.h: torch's CPU allocator); tests and benchmarks build their own.
//
// Example:
//   AllocatorConfig config;
//   config.backend = Backend::kHost;
//   config.budget_bytes = 64_MiB;
//   AllocatorStack stack(Backend::kHost, 0, config);
//   absl::StatusOr<void*> p = stack.Allocate(4096);
//   stack.Free(*p);  // size looked up: c10's deleter only has the pointer
#ifndef ACTPACK_ALLOCATOR_ALLOCATOR_STACK_H_
#define ACTPACK_ALLOCATOR_ALLOCATOR_STACK_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allocator/budget_adaptor.h"
#include "allocator/caching_pool.h"
#include "allocator/fault_injection_adaptor.h"
#include "allocator/memory_resource.h"
#include "allocator/snapshot.h"
#include "allocator/statistics_adaptor.h"
#include "allocator/stream_events.h"
#include "allocator/tracing_adaptor.h"

namespace actpack::allocator {

// The most devices the device allocator serves.
inline constexpr int kMaxDevices = 64;

// Where a function takes either, this device index names the host pool.
inline constexpr int kHostDevice = -1;

// Backend
//
// Where a stack's memory comes from.
enum class Backend { kCuda, kHost };

absl::string_view BackendName(Backend backend);  // "cuda", "host"

// CudaMemory
//
// Where a kCuda stack's memory comes from. kVirtual: the driver's virtual memory management
// (VmmMemoryResource: at the cap a segment given back becomes part of the next one without
// cudaFree, cudaMalloc or a synchronizing call); kMalloc: cudaMalloc/cudaFree
// (CudaMemoryResource). kAuto is kVirtual where the device and driver support it, else
// kMalloc; kVirtual falls back to kMalloc too where it cannot be had (backend_description says
// so). The process-wide device stacks take ACTPACK_CUDA_MEMORY=auto|vmm|malloc over the
// configured value.
enum class CudaMemory { kAuto, kVirtual, kMalloc };

// AllocatorConfig
//
// How a process-wide stack is built. `budget_bytes` caps each device's reserved memory
// (kNoCap: no cap).
struct AllocatorConfig {
  Backend backend = Backend::kCuda;
  size_t budget_bytes = kNoCap;
  size_t trace_capacity = TracingAdaptor::kDefaultCapacity;
  // Whether the trace records from the start (it costs ~15 ns per allocation on the host; switch
  // it later with AllocatorStack::trace().SetEnabled).
  bool record_trace = true;
  CudaMemory cuda_memory = CudaMemory::kAuto;
};

// AllocatorStack
//
// One complete allocator: backend, caching pool, budget, statistics and trace, owned together.
// Allocate and free through it (the top of the stack); reach the layers for configuration and
// reading. Thread safe.
class AllocatorStack {
 public:
  // `device` selects the CUDA device (ignored by the host backend).
  AllocatorStack(Backend backend, int device, const AllocatorConfig& config);
  ~AllocatorStack();
  AllocatorStack(const AllocatorStack&) = delete;
  AllocatorStack& operator=(const AllocatorStack&) = delete;

  absl::StatusOr<void*> Allocate(size_t bytes, Stream stream = nullptr) {
    return top().Allocate(bytes, stream);
  }
  void Deallocate(void* ptr, size_t bytes, Stream stream = nullptr) {
    top().Deallocate(ptr, bytes, stream);
  }

  // Free
  //
  // Frees `ptr` knowing only the pointer: its size and stream are looked up in the pool. Aborts
  // if `ptr` is not a live allocation of this stack (as Deallocate does).
  void Free(void* ptr);

  // EmptyCache
  //
  // Returns cached segments to the backend; returns the bytes released.
  size_t EmptyCache() { return top().EmptyCache(); }

  // The top of the stack, as a MemoryResource for code that takes one.
  MemoryResource& top() { return trace_; }

  CachingPool& pool() { return pool_; }
  BudgetAdaptor& budget() { return budget_; }
  // Unarmed unless a test arms it: fails a chosen allocation as the budget would, after the
  // budget's own relief (tests/test_allocation_faults.py).
  FaultInjectionAdaptor& faults() { return faults_; }
  StatisticsAdaptor& stats() { return stats_; }
  TracingAdaptor& trace() { return trace_; }
  const CachingPool& pool() const { return pool_; }
  const StatisticsAdaptor& stats() const { return stats_; }
  const TracingAdaptor& trace() const { return trace_; }

  Backend backend() const { return backend_; }
  int device() const { return device_; }

  // backend_description
  //
  // Where the memory comes from, in a few words, and why where there was a choice:
  // "CUDA virtual memory (cuMemCreate/cuMemMap, 2.00 MiB granules)", "cudaMalloc (virtual
  // memory management unavailable: ...)", "host (mmap)".
  const std::string& backend_description() const { return backend_description_; }

  // Snapshot
  //
  // This stack's segments and trace as device `device()` (see snapshot.h).
  MemorySnapshot Snapshot() const;

 private:
  const Backend backend_;
  const int device_;
  std::string backend_description_;
  std::unique_ptr<StreamEvents> events_;
  std::unique_ptr<MemoryResource> backend_resource_;
  CachingPool pool_;
  BudgetAdaptor budget_;
  FaultInjectionAdaptor faults_;
  StatisticsAdaptor stats_;
  TracingAdaptor trace_;
};

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_ALLOCATOR_STACK_H_
