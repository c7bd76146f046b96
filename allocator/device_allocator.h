// device_allocator.h — the process-wide device stacks, one per device, built on first use.
//
// Behind the C ABI torch's CUDAPluggableAllocator loads (pluggable.h). The backend is CUDA, or
// the host (for tests and for running the CUDA path's logic on a CPU-only machine). Configure
// before the first allocation; the budget may change at any time. Through CUDAPluggableAllocator
// torch's own memory_stats and snapshots do not work: read them here (stats(), DeviceSnapshot()).
//
// Example:
//   AllocatorConfig config;
//   config.budget_bytes = 6_GiB;
//   absl::Status s = ConfigureDeviceAllocator(config);
//   // torch.cuda.memory.CUDAPluggableAllocator(lib, "actpack_alloc", "actpack_free")
//   ...
//   MemoryStats stats = (*DeviceAllocator(0))->stats().GetStats();
#ifndef ACTPACK_ALLOCATOR_DEVICE_ALLOCATOR_H_
#define ACTPACK_ALLOCATOR_DEVICE_ALLOCATOR_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/allocator_stack.h"
#include "nlohmann/json.hpp"

namespace actpack::allocator {

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
// will when it is built (kNoCap: none).
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

// ---- What the system counts (for budgets as the operating system or driver sees them) ----

// CountSystemMemory
//
// From now on the pool of `device` (kHostDevice: the host pool) counts against its budget what
// the system holds outside it: the growth since now of the process's resident set (host) or of
// this process's memory on the device (a device: NVML's per-process count, else the device's
// used memory from cudaMemGetInfo; SystemMemorySource says which), less the growth of what the
// pool holds (its reserved bytes and its backend's cache). Checked when the pool reserves a segment under its budget
// (CachingPool::SetOutsideCounter). Gives the pool's cache back first, so that the count starts
// from memory in use. Builds a device stack that is not built yet.
// kInvalidArgument for a device outside [-1, kMaxDevices); kUnavailable when the system's count
// cannot be read. The first `allowance_bytes` outside the pool are not counted (on the host,
// kHostOutsideAllowanceBytes: torch's one-time initialization).
absl::Status CountSystemMemory(int device, size_t allowance_bytes = 0);

// StopCountingSystemMemory
//
// Undoes CountSystemMemory for `device`; nothing when it was not counting.
void StopCountingSystemMemory(int device);

// Whether the pool of `device` counts what the system holds now (false for a stack not built).
bool CountsSystemMemory(int device);

// SystemMemorySource
//
// What CountSystemMemory counts (or would count now) for `device`, in a few words, for reports:
// "the process's resident set (VmRSS)", "NVML: this process's memory on GPU 0000:17:00.0 ...",
// or "cudaMemGetInfo: device 0's used memory, every process's (NVML not used: ...)".
std::string SystemMemorySource(int device);

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_DEVICE_ALLOCATOR_H_
