// system_memory.h — memory as the operating system counts it for this process.
//
// A budget on the host is about what `top` and the kernel's OOM killer see: the resident set
// size, not an allocator's own count. These read it from /proc/self/status (VmRSS, and its peak
// VmHWM), and restart the peak through /proc/self/clear_refs, so that a step's peak can be read
// alone. (For a CUDA device the driver's count is CudaDeviceUsedMemory.)
//
// Example:
//   ResetPeakResident();
//   const size_t start = *ResidentBytes();
//   ... a training step ...
//   const size_t step_peak = *PeakResidentBytes() - start;
#ifndef ACTPACK_ALLOCATOR_SYSTEM_MEMORY_H_
#define ACTPACK_ALLOCATOR_SYSTEM_MEMORY_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace actpack::allocator {

// What a process's resident set grows by, once, the first time torch runs its CPU kernels after
// the budget was entered (oneDNN's and OpenMP's lazily built state: 26-27 MiB measured on the
// demo's models, tools/budget_check.py): a budget holds on the host as resident set above its
// size at enter <= budget + this. Memory outside the pool counts against a budget beyond it.
inline constexpr size_t kHostOutsideAllowanceBytes = size_t{32} << 20;

// The host's physical memory: what a share of the host ("80%") is taken of. 0 where the
// system cannot tell. (A CUDA device's total is CudaDeviceTotalMemory; device_allocator.h's
// DeviceTotalBytes answers for either.)
size_t PhysicalMemoryBytes();

// The process's resident set size now (VmRSS); kUnavailable where /proc is not Linux's.
absl::StatusOr<size_t> ResidentBytes();

// The largest resident set size since the process started or since ResetPeakResident (VmHWM).
absl::StatusOr<size_t> PeakResidentBytes();

// Restarts the peak at the current resident size (Linux 4.0 and later).
absl::Status ResetPeakResident();

// ResidentPeakMeter
//
// The resident size's peak above where it stood at Start, one window (a training step) at a
// time. Reads 0 where the system cannot tell (not Linux). Not thread safe; one per process at a
// time (the peak is the process's).
class ResidentPeakMeter {
 public:
  // Takes the current resident size as zero and starts a window.
  void Start();

  // The window's peak above the start, and a new window.
  size_t TakePeak();

 private:
  bool available_ = false;
  size_t start_ = 0;
};

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_SYSTEM_MEMORY_H_
