// What the parts of cudaemu share: the runtime (memory, streams), the executor (fibers,
// barriers, collectives) and the race checker.
#ifndef CUDAEMU_INTERNAL_H_
#define CUDAEMU_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cudaemu/control.h"
#include "cudaemu/device.h"

namespace cudaemu::internal {

// Everything the emulator does happens under this lock: one host thread at a time drives the
// emulated devices, and one kernel runs at a time.
std::recursive_mutex& DeviceLock();

// Prints "cudaemu: <message>" and aborts: what a GPU would report as a launch failure or
// leave undefined. Tests of such failures are death tests.
[[noreturn]] void Fatal(const std::string& message);

// ---- memory (runtime.cc) ----

struct Allocation {
  uintptr_t base = 0;
  size_t size = 0;   // as requested
  int device = -1;   // -1: pinned host memory
};

// The allocation (device or pinned host) holding [address, address + bytes), if any.
bool FindAllocation(uintptr_t address, size_t bytes, Allocation* found);

// The live allocation nearest below `address` (for messages about out-of-bounds accesses).
bool NearestAllocationBelow(uintptr_t address, Allocation* found);

// The device memory of `device`: cudaMalloc's and cuMemCreate's charges share it. ChargeDevice
// fails (false, nothing charged) when `bytes` more would pass the device's memory.
bool ChargeDevice(int device, size_t bytes);
void UnchargeDevice(int device, size_t bytes);
int DeviceCount();
int CurrentDevice();

// What the NVML shim reports for `device`: this process's device memory (allocations and the
// context) and other processes' (SetOtherProcessMemory).
struct DeviceMemoryCounts {
  size_t memory = 0;
  size_t this_process = 0;
  size_t other_processes = 0;
};
DeviceMemoryCounts MemoryCounts(int device);
bool NvmlListsThisProcess();

// Fills [p, p + bytes) with a pseudo-random pattern (what fresh device memory holds here).
void FillGarbage(void* p, size_t bytes);

// Records a host call (control.h's HostCalls).
void Record(const char* api, void* caller, bool waits);

// Counts a call of `api` and returns the error an armed FailCall makes it fail with, or 0.
int InjectedFailure(const char* api);

// ---- virtual memory (vmm.cc) ----

// The mapped, accessible virtual memory holding [address, address + bytes), if any, as the
// allocation it belongs to: the contiguous mapped run around it.
bool FindMapping(uintptr_t address, size_t bytes, Allocation* found);

// The driver entry point named `symbol` (cudaGetDriverEntryPoint), or nullptr.
void* DriverEntryPoint(const char* symbol);

// ---- the schedule (runtime.cc) ----

// kConcurrent: `blocks` blocks of a launch run at once, each on a host thread of its own, in an
// order drawn from the launch number; a warp's lanes take turns at every atomic.
enum class ScheduleKind { kForward, kReverse, kRandom, kConcurrent };
struct Schedule {
  ScheduleKind kind = ScheduleKind::kForward;
  uint64_t seed = 0;
  uint32_t blocks = 1;  // blocks resident at once (kConcurrent)
};
const Schedule& CurrentSchedule();

// ---- kernels (executor.cc) ----

struct KernelLaunch {
  const char* name = "";
  dim3 grid, block;
  ThreadBody body = nullptr;
  std::shared_ptr<const void> closure;
  uint64_t id = 0;  // launch number, from 1
  uint64_t schedule_index = 0;  // launches since the schedule was set: what random orders draw from
};

// Runs every thread of every block of `launch` to completion, in the current schedule's order.
void RunKernel(const KernelLaunch& launch);

// The CUDA thread whose fiber runs now, or nullptr outside kernels.
struct ThreadContext {
  const KernelLaunch* launch;
  uint64_t block;     // linear block index
  uint32_t thread;    // linear thread index in the block
  uint32_t threads;   // threads in the block
  uintptr_t stack_lo, stack_hi;
};
const ThreadContext* CurrentThread();

// ---- race checker hooks (race_checker.cc registers itself when it is linked) ----

class RaceObserver {
 public:
  virtual ~RaceObserver() = default;
  virtual void BlockBegin(const KernelLaunch& launch, uint64_t block, uint32_t threads) = 0;
  // Every thread of the block passed a __syncthreads.
  virtual void BlockBarrier() = 0;
  // The lanes of `mask` in `warp` synchronised (__syncwarp, or any warp collective).
  virtual void WarpSync(uint32_t warp, uint32_t mask) = 0;
  virtual void KernelEnd() = 0;
};
void SetRaceObserver(RaceObserver* observer);
RaceObserver* GetRaceObserver();

// ---- memory traffic (traffic.cc, linked with the race checker) ----

class TrafficRecorder {
 public:
  virtual ~TrafficRecorder() = default;
  virtual bool recording() const = 0;
  virtual bool check_races() const = 0;
  virtual void BlockBegin(const KernelLaunch& launch) = 0;
  virtual void KernelEnd() = 0;
  // One access of `bytes` at `address` (global: device or pinned memory; else shared) by the
  // current thread, from the instruction at `pc`.
  virtual void Access(const ThreadContext& thread, uintptr_t address, size_t bytes, bool write,
                      bool global, const void* pc) = 0;
  // A copy or memset the stream ran on device memory: `read` and `written` bytes.
  virtual void Transfer(const char* name, uint64_t read, uint64_t written) = 0;
  // control.h's calls.
  virtual void Start(bool check_races) = 0;
  virtual std::map<std::string, KernelTraffic> Stop() = 0;
  virtual void SetInput(uintptr_t lo, uintptr_t hi) = 0;
};
void SetTrafficRecorder(TrafficRecorder* recorder);
TrafficRecorder* GetTrafficRecorder();  // nullptr: no race checker in this binary

}  // namespace cudaemu::internal

#endif  // CUDAEMU_INTERNAL_H_
