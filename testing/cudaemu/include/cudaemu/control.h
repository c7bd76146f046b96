// cudaemu's control surface for tests: the emulated machine's shape and what it did.
//
// The defaults come from the environment, so a whole test binary runs on another machine
// shape without code changes:
//   CUDAEMU_DEVICES=N             devices (default 2)
//   CUDAEMU_DEVICE_MEMORY=BYTES   memory per device, with an optional K/M/G suffix (default 8G)
//   CUDAEMU_SCHEDULE=forward|reverse|random:SEED
//                                 the order threads and blocks run in, and (random) the order
//                                 in which independent streams make progress (default forward)
//   CUDAEMU_STREAMS=deferred|eager
//                                 deferred (default): work runs when something waits for it or
//                                 a query nudges its stream; eager: at once, as the prototype did
//
// Example:
//   cudaemu::SetDeviceMemory(0, 64 << 20);     // cudaMalloc fails past 64 MiB on device 0
//   kernel<<<...>>>;                            // queued, not run
//   EXPECT_EQ(cudaemu::PendingOperations(stream), 1u);
//   cudaStreamSynchronize(stream);              // runs it
#ifndef CUDAEMU_CONTROL_H_
#define CUDAEMU_CONTROL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cuda_runtime_api.h"

namespace cudaemu {

// The memory of `device`: cudaMalloc fails with cudaErrorMemoryAllocation once the allocations
// (rounded up to the allocation granularity) plus the context's share would pass it.
void SetDeviceMemory(int device, size_t bytes);

// Memory the emulated CUDA context holds on `device` (cuBLAS workspaces, the context itself):
// counted as used by cudaMemGetInfo and against the device memory, outside any allocator.
void SetContextMemory(int device, size_t bytes);

// cudaMalloc charges whole multiples of this (the driver maps device memory in pages); 2 MiB.
inline constexpr size_t kAllocationGranularity = size_t{2} << 20;

// Bytes cudaMalloc and cuMemCreate have charged on `device` (allocations rounded to the
// granularity; physical memory until it is released and unmapped).
size_t DeviceAllocatedBytes(int device);

// Memory another process holds on `device`: cudaMemGetInfo counts it as used (and it is not
// free for this process), NVML lists it under another process id.
void SetOtherProcessMemory(int device, size_t bytes);

// ---- failures on demand ----
//
// FailCall makes the k-th call of `api` from now (1: the next) fail, once, with `error`: a
// cudaError_t for runtime calls ("cudaMalloc"), a CUresult for driver calls ("cuMemCreate"), an
// nvmlReturn_t for NVML ("nvmlInit_v2"); 0 gives the out-of-memory code (2 for the runtime and
// the driver alike; NVML_ERROR_UNKNOWN for NVML). The failing call does nothing else. Several
// may be armed at once. The calls that can fail this way: cudaMalloc, cudaFree, cudaMemGetInfo,
// cudaDeviceGetPCIBusId, cudaGetDriverEntryPoint(ByVersion), cudaEventCreateWithFlags,
// cudaEventRecord, cudaEventQuery, cudaEventSynchronize, cudaEventDestroy, cudaStreamWaitEvent,
// cudaStreamSynchronize, every cu* driver call and every nvml* call.
void FailCall(const std::string& api, uint64_t k, int error = 0);
void ClearFailures();
// Calls of `api` (one of those above) since the process started, failed ones included.
uint64_t CallCount(const std::string& api);

// ---- virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap, ...) ----
//
// The driver calls a program reaches through cudaGetDriverEntryPoint. A physical allocation
// (cuMemCreate) is a range of a per-device memory file, charged against the device's memory and
// filled with garbage; cuMemMap maps it (MAP_SHARED) into a reservation (cuMemAddressReserve:
// PROT_NONE address space), so one allocation mapped at two addresses is the same memory at
// both, as on a GPU; cuMemSetAccess makes a mapping readable and writable (and device memory to
// the runtime's calls and kernels); cuMemUnmap puts PROT_NONE address space back at once. The
// emulator does not run queued work for cuMemUnmap: work queued on an address range that is
// unmapped before it runs faults when it does (a GPU would fault or read another allocation),
// so an allocator that unmaps too early crashes its test.

// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED of `device` (default: supported;
// CUDAEMU_VMM=0 makes every device start unsupported).
void SetVirtualMemorySupported(int device, bool supported);
// Physical allocations of `device` not yet freed (created, and not both released and unmapped).
size_t PhysicalAllocations(int device);
// Bytes of `device`'s physical allocations mapped, summed over their mappings.
size_t MappedBytes(int device);
// Address space reserved (cuMemAddressReserve) and not freed, every device together.
size_t ReservedAddressBytes();

// ---- NVML (the shim in testing/cudaemu/nvml.cc) ----
//
// nvmlInit_v2, nvmlDeviceGetHandleByPciBusId_v2 and nvmlDeviceGetComputeRunningProcesses (v1,
// _v2, _v3) answer for the emulated devices: this process's used memory (its allocations and
// SetContextMemory's context) under its process id, SetOtherProcessMemory's under another.
// CUDAEMU_NVML=0 makes nvmlInit_v2 fail as on a machine without the NVIDIA driver's library.

// Whether NVML lists this process under its own id (false: as from inside a container with its
// own PID namespace, where NVML reports the host's ids).
void SetNvmlListsThisProcess(bool listed);

// Operations queued on `stream` that have not run yet.
size_t PendingOperations(cudaStream_t stream);

// Runs the oldest queued operation of `stream` (and what it waits for); false when none.
bool RunOne(cudaStream_t stream);

// Kernels queued and kernels executed since the process started.
uint64_t KernelsLaunched();
uint64_t KernelsExecuted();
// Kernels, memsets and copies queued on streams since the process started: the operations a
// profiler's trace of the device shows, each at least a launch's time.
uint64_t DeviceOperationsQueued();

// The schedule in force, as CUDAEMU_SCHEDULE spells it ("forward", "reverse", "random:7").
std::string ScheduleName();

// Sets the schedule for the launches that follow (tests of the emulator itself).
void SetSchedule(const std::string& spelling);

// Whether this binary runs the race checker (kernels built with --config=cudaemu_race).
bool RaceCheckerActive();

// Whether this binary can run the concurrent schedule: not under the race checker (it watches
// one host thread) nor under AddressSanitizer (it misreads the worker threads' fiber stacks).
bool ConcurrentScheduleAvailable();

// ---- the host's calls, as a profiler's API trace counts them ----
//
// A host wait is a call that returns only once queued device work is done: cudaStreamSynchronize,
// cudaEventSynchronize, cudaDeviceSynchronize, cudaMemcpy, cudaMemcpyAsync to or from pageable
// host memory, cudaFree and cudaFreeHost (they synchronize the device), cudaMalloc (it may),
// and cuMemSetAccess and cuMemUnmap (CUDA documents both as synchronous for most uses).
// Queries (cudaEventQuery, cudaStreamQuery) and stream-ordered calls are not. Every wait, every
// device or pinned allocation and every virtual memory call (cuMemCreate, cuMemRelease,
// cuMemMap, cuMemAddressReserve, cuMemAddressFree, recorded as not waiting) is recorded with
// the API's name, the caller's return address and the region a test named (RegionScope); a
// test reads them to say, as nsys would, which code made the host wait.
struct HostCall {
  std::string api;     // "cudaStreamSynchronize"
  std::string region;  // the innermost RegionScope's name when it was made ("" outside one)
  void* caller;        // the return address into the code that called the API
  bool waits;          // a host wait (else an allocation or a free that does not wait)
};

// Calls recorded since the process started or the last ResetHostCalls.
std::vector<HostCall> HostCalls();
void ResetHostCalls();

// Host waits (or all calls of `api`, when given) recorded in `region` since the last reset.
uint64_t CountHostWaits(const std::string& region);
uint64_t CountCalls(const std::string& api, const std::string& region);

// The function holding `address` (dladdr; the symbol where the binary exports it, else the
// address in hex) for messages.
std::string DescribeCaller(void* address);

// ---- memory traffic, as a profiler's memory workload analysis counts it ----
//
// In race checker builds (--config=cudaemu_race) every load and store a kernel makes is seen.
// While recording, the accesses of a warp are grouped by instruction (the access site) and by
// the lane's count of that instruction, as a GPU issues one request per warp-wide instruction:
// per request, the 32-byte sectors its lanes touched (against the fewest that hold the bytes
// asked for: the ideal of a contiguous request), and for shared memory, the wavefronts its
// banks need (1: conflict-free).
struct KernelTraffic {
  uint64_t launches = 0;
  uint64_t requests = 0;          // warp-wide instructions on global (device or pinned) memory
  uint64_t bytes = 0;             // bytes their lanes asked for (read + write)
  uint64_t read_bytes = 0;
  uint64_t sectors = 0;           // 32-byte sectors the requests touched
  uint64_t ideal_sectors = 0;     // the fewest sectors holding each request's distinct bytes
  uint64_t unique_sectors = 0;    // distinct sectors per launch, summed: what DRAM must move
  uint64_t input_read_bytes = 0;  // sectors read inside SetTrafficInput's range, in bytes
  uint64_t shared_requests = 0;
  uint64_t shared_wavefronts = 0;  // per shared request, the most words in one bank
};

// Starts recording (clearing what was recorded); `check_races` false skips the race checks
// (faster; the traffic is the same). False when the binary has no race checker.
bool StartTrafficRecording(bool check_races);
// Stops, and returns the traffic per kernel name (as launched: "QuantEncodeKernel<...>").
std::map<std::string, KernelTraffic> StopTrafficRecording();
// The range whose reads count as input_read_bytes (passes over the input).
void SetTrafficInput(const void* data, size_t bytes);

// Names the region host calls are recorded under while it lives, on this thread. Nests.
class RegionScope {
 public:
  explicit RegionScope(std::string name);
  ~RegionScope();
  RegionScope(const RegionScope&) = delete;
  RegionScope& operator=(const RegionScope&) = delete;

 private:
  std::string previous_;
};

}  // namespace cudaemu

#endif  // CUDAEMU_CONTROL_H_
