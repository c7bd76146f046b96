// pluggable.h — actpack's process-wide allocators and the C ABI torch loads.
//
// Two process-wide allocator stacks, each trace(stats(faults(budget(pool(backend))))):
//  * the device allocator, one stack per device, behind the C functions with the signatures of
//    torch.cuda.memory.CUDAPluggableAllocator (actpack_alloc / actpack_free and the init,
//    empty-cache, memory-fraction and record-stream hooks). Its backend is CUDA, or the host
//    (for tests and for running the CUDA path's logic on a CPU-only machine);
//  * the host pool (HostPool()), the same stack on host memory, for torch's CPU allocator
//    (c10::SetAllocator), so that CPU training runs through exactly the same pool, budget and
//    statistics.
// Configure a stack before its first allocation (a later ConfigureDeviceAllocator or
// ConfigureHostPool fails with kFailedPrecondition); the budget may change at any time.
// Through CUDAPluggableAllocator torch's own memory_stats and snapshots do not work: read them
// here (AllocatorStack::stats(), DeviceSnapshot()).
//
// Example (C++; the torch glue in torch_plugin does this):
//   AllocatorConfig config;
//   config.budget_bytes = 6_GiB;
//   absl::Status s = ConfigureDeviceAllocator(config);
//   // torch.cuda.memory.CUDAPluggableAllocator(lib, "actpack_alloc", "actpack_free")
//   ...
//   MemoryStats stats = (*DeviceAllocator(0))->stats().GetStats();
//
// Example (host pool as torch's CPU allocator):
//   AllocatorStack& host = HostPool();
//   absl::StatusOr<void*> p = host.Allocate(nbytes);
//   host.Free(*p);  // size looked up: c10's deleter only has the pointer
#ifndef ACTPACK_ALLOCATOR_PLUGGABLE_H_
#define ACTPACK_ALLOCATOR_PLUGGABLE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/budget_adaptor.h"
#include "allocator/caching_pool.h"
#include "allocator/fault_injection_adaptor.h"
#include "allocator/memory_resource.h"
#include "allocator/snapshot.h"
#include "allocator/statistics_adaptor.h"
#include "allocator/stream_events.h"
#include "allocator/tracing_adaptor.h"

namespace actpack::allocator {

// Backend
//
// Where a stack's memory comes from.
enum class Backend { kCuda, kHost };

absl::string_view BackendName(Backend backend);  // "cuda", "host"

// AllocatorConfig
//
// How a process-wide stack is built. `budget_bytes` caps each device's reserved memory
// (kNoReserveLimit: no cap).
struct AllocatorConfig {
  Backend backend = Backend::kCuda;
  size_t budget_bytes = kNoReserveLimit;
  size_t trace_capacity = TracingAdaptor::kDefaultCapacity;
  // Whether the trace records from the start (it costs ~15 ns per allocation on the host; switch
  // it later with AllocatorStack::trace().SetEnabled).
  bool record_trace = true;
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

  // Snapshot
  //
  // This stack's segments and trace as device `device()` (see snapshot.h).
  MemorySnapshot Snapshot() const;

 private:
  const Backend backend_;
  const int device_;
  std::unique_ptr<StreamEvents> events_;
  std::unique_ptr<MemoryResource> backend_resource_;
  CachingPool pool_;
  BudgetAdaptor budget_;
  FaultInjectionAdaptor faults_;
  StatisticsAdaptor stats_;
  TracingAdaptor trace_;
};

// ---- The device allocator (behind the C ABI) ----

// The most devices the device allocator serves.
inline constexpr int kMaxDevices = 64;

// Where a function takes either, this device index names the host pool.
inline constexpr int kHostDevice = -1;

// ConfigureDeviceAllocator
//
// Sets how device stacks are built. kFailedPrecondition once a device stack exists (after the
// first allocation: torch installs a pluggable allocator only before its first CUDA allocation
// too); kInvalidArgument for a CUDA backend in a build without CUDA.
absl::Status ConfigureDeviceAllocator(const AllocatorConfig& config);

// DeviceAllocatorConfig
//
// The configuration device stacks are (or will be) built with.
AllocatorConfig DeviceAllocatorConfig();

// DeviceAllocator
//
// The stack of `device`, built on first use. kInvalidArgument for a device outside
// [0, kMaxDevices).
absl::StatusOr<AllocatorStack*> DeviceAllocator(int device);

// FindDeviceAllocator
//
// The stack of `device` if it has been built, else nullptr (reading stats builds nothing).
AllocatorStack* FindDeviceAllocator(int device);

// SetDeviceBudget
//
// Changes the budget of `device` (-1: every device), built or not.
void SetDeviceBudget(int device, size_t budget_bytes);

// DeviceBudget
//
// The budget of `device` (0 <= device < kMaxDevices), built or not: what its stack caps at, or
// will when it is built (kNoReserveLimit: none).
size_t DeviceBudget(int device);

// DeviceSnapshot
//
// A snapshot of every built device stack, shaped like torch.cuda.memory._snapshot().
nlohmann::ordered_json DeviceSnapshot();

// DeviceTotalBytes
//
// The memory a share of `device` ("80%") is taken of: the host's physical memory for
// kHostDevice (and for devices whose stacks use the host backend), else the CUDA device's
// total (kUnimplemented in a build without CUDA).
absl::StatusOr<size_t> DeviceTotalBytes(int device);

// ResetDeviceAllocatorForTesting
//
// Destroys every device stack and restores the default configuration. Only for tests: memory
// still allocated from the stacks is released with them.
void ResetDeviceAllocatorForTesting();

// ---- The host pool (for torch's CPU allocator) ----

// ConfigureHostPool
//
// Sets the budget and trace of the host pool (the backend is always the host).
// kFailedPrecondition once HostPool() has been called.
absl::Status ConfigureHostPool(size_t budget_bytes,
                               size_t trace_capacity = TracingAdaptor::kDefaultCapacity,
                               bool record_trace = true);

// HostPool
//
// The process-wide host stack, built on first call. Never destroyed, so that memory freed during
// process exit (static tensors) still has its allocator.
AllocatorStack& HostPool();

// HostSnapshot
//
// A snapshot of the host pool (as device 0), shaped like torch.cuda.memory._snapshot().
nlohmann::ordered_json HostSnapshot();

// ---- What the system counts (for budgets as the operating system or driver sees them) ----

// CountSystemMemory
//
// From now on the pool of `device` (kHostDevice: the host pool) counts against its budget what
// the system holds outside it: the growth since now of the process's resident set (host) or of
// the device's used memory as the CUDA driver counts it (a device), less the growth of the
// pool's own reserved bytes. Checked when the pool reserves a segment under its budget
// (CachingPool::SetOutsideCounter). Builds a device stack that is not built yet.
// kInvalidArgument for a device outside [-1, kMaxDevices); kUnavailable when the system's count
// cannot be read. The first `allowance_bytes` outside the pool are not counted (on the host,
// kHostOutsideAllowanceBytes: torch's one-time initialization).
absl::Status CountSystemMemory(int device, size_t allowance_bytes = 0);

// StopCountingSystemMemory
//
// Undoes CountSystemMemory for `device`; nothing when it was not counting.
void StopCountingSystemMemory(int device);

// ---- Pressure callbacks (for the runtime) ----

using PressureCallbackId = int64_t;

// RegisterPressureCallback
//
// Registers `callback` (see BudgetAdaptor::PressureCallback: called with the bytes a request
// lacks, returns the bytes it freed) with the budget of the host pool (`device` kHostDevice) or
// of device `device`'s stack. A stack that is not built yet gets the callback when it is built,
// so the runtime can register at start without building a stack (which would freeze its
// configuration). Callbacks of one stack run in registration order. Returns the id that
// unregisters it; kInvalidArgument for a device outside [-1, kMaxDevices).
//
// Example:
//   absl::StatusOr<PressureCallbackId> id = RegisterPressureCallback(
//       0, [&](size_t needed) { return session.CompressHarder(needed); });
//   ...
//   UnregisterPressureCallback(*id);
absl::StatusOr<PressureCallbackId> RegisterPressureCallback(
    int device, BudgetAdaptor::PressureCallback callback);

// UnregisterPressureCallback
//
// Removes a callback; as BudgetAdaptor::RemovePressureCallback, a run already started on another
// thread finishes, and no new one starts. kNotFound for an id that is not registered.
absl::Status UnregisterPressureCallback(PressureCallbackId id);

}  // namespace actpack::allocator

// The C ABI for torch.cuda.memory.CUDAPluggableAllocator (stream is a cudaStream_t). On failure
// actpack_alloc returns nullptr and actpack_last_error() tells why.
extern "C" {
void* actpack_alloc(size_t size, int device, void* stream);
void actpack_free(void* ptr, size_t size, int device, void* stream);
// init_fn: torch passes the number of devices.
void actpack_init(int device_count);
// reset_fn: torch.cuda.empty_cache().
void actpack_empty_cache(void);
// memory_fraction_fn: torch.cuda.set_per_process_memory_fraction(fraction, device): the budget
// becomes `fraction` of the device's total memory.
void actpack_memory_fraction(double fraction, int device);
// record_stream_fn: Tensor.record_stream(stream).
void actpack_record_stream(void* ptr, void* stream);
// base_alloc_fn: torch's getBaseAllocation (CUDA IPC shares whole segments): the start of the
// segment holding `ptr`, its size in *size. `ptr` itself, *size untouched, when no device stack
// holds it (torch's answer when no hook is set).
void* actpack_base_alloc(void* ptr, size_t* size);
// Why this thread's last call to actpack_alloc, actpack_memory_fraction, actpack_record_stream
// or actpack_base_alloc failed; "" when it succeeded.
const char* actpack_last_error(void);
}

#endif  // ACTPACK_ALLOCATOR_PLUGGABLE_H_
