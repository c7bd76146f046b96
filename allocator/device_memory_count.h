// device_memory_count.h — a CUDA device's memory as the system counts it for this process.
//
// A budget on a GPU is about the memory this process holds on the device, whoever allocated it
// (actpack's pool, torch's allocator, cuBLAS workspaces, the CUDA context), and not about other
// processes sharing the GPU. NVML counts per process: nvmlDeviceGetComputeRunningProcesses
// lists each process's used memory on a device (found by the CUDA device's PCI bus id, so
// CUDA_VISIBLE_DEVICES' renumbering does not matter). cudaMemGetInfo counts the whole device,
// every process's memory. DeviceMemoryCounter uses NVML where it can and cudaMemGetInfo where
// it cannot, and says which (description()), so that a report can state what its figures are.
//
// NVML is looked up in the process first (dlsym(RTLD_DEFAULT): a library already loaded
// globally, or the CUDA emulator's shim in test binaries), then loaded (dlopen of
// libnvidia-ml.so.1, the driver's library). It is not used, with the reason in the
// description, where: it cannot be loaded or initialized; it does not list this process on the
// device (a container with its own PID namespace: NVML reports the host's process ids); or it
// does not report per-process memory there (MIG instances).
//
// Example:
//   absl::StatusOr<DeviceMemoryCounter> counter = DeviceMemoryCounter::Create(0);
//   absl::StatusOr<size_t> used = counter->Read();
//   std::string what = counter->description();  // "NVML: this process's memory on GPU ..."
#ifndef ACTPACK_ALLOCATOR_DEVICE_MEMORY_COUNT_H_
#define ACTPACK_ALLOCATOR_DEVICE_MEMORY_COUNT_H_

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace actpack::allocator {

class DeviceMemoryCounter {
 public:
  // Create
  //
  // A counter for CUDA device `device`: NVML's per-process count where it is available and
  // lists this process there now, else cudaMemGetInfo's. kUnimplemented without CUDA; the CUDA
  // error where neither can be read.
  static absl::StatusOr<DeviceMemoryCounter> Create(int device);

  // Read
  //
  // The bytes counted now: this process's on the device (NVML), or the device's used memory
  // (cudaMemGetInfo: total - free).
  absl::StatusOr<size_t> Read() const;

  // Whether Read counts this process only (NVML).
  bool per_process() const { return per_process_; }

  // A short description of what Read counts and, for cudaMemGetInfo, why NVML is not used.
  const std::string& description() const { return description_; }

  int device() const { return device_; }

 private:
  DeviceMemoryCounter(int device, bool per_process, void* nvml_device, std::string description)
      : device_(device),
        per_process_(per_process),
        nvml_device_(nvml_device),
        description_(std::move(description)) {}

  int device_ = 0;
  bool per_process_ = false;
  void* nvml_device_ = nullptr;  // nvmlDevice_t
  std::string description_;
};

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_DEVICE_MEMORY_COUNT_H_
