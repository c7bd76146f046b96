// An NVML shim for the emulated devices: the calls actpack makes to read this process's device
// memory, with NVML's names and C ABI, so that a test binary's dlsym(RTLD_DEFAULT, ...) finds
// them as a GPU machine's process finds libnvidia-ml.so.1's.
//
// Devices are found by PCI bus id (cudaDeviceGetPCIBusId's "0000:BB:00.0", BB = 0x10 + the
// ordinal). The running-process list has this process (its allocations and context) and, when
// SetOtherProcessMemory put some there, another process. CUDAEMU_NVML=0 makes nvmlInit_v2
// fail as on a machine without the driver's library.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "testing/cudaemu/internal.h"

namespace {

// nvmlReturn_t's values.
constexpr int kSuccess = 0;
constexpr int kUninitialized = 1;
constexpr int kInvalidArgument = 2;
constexpr int kNotFound = 6;
constexpr int kInsufficientSize = 7;
constexpr int kDriverNotLoaded = 9;

bool initialized = false;

// The device a handle names: the handle is ordinal + 1.
int DeviceOf(void* handle) {
  const auto ordinal = static_cast<int>(reinterpret_cast<uintptr_t>(handle)) - 1;
  return ordinal >= 0 && ordinal < cudaemu::internal::DeviceCount() ? ordinal : -1;
}

// The pid another process's memory is listed under, and the one this process is listed under
// when it is not its own (as from inside a PID namespace).
constexpr unsigned kOtherPid = 4000000;
constexpr unsigned kHostPidOfThisProcess = 4000001;

struct Entry {
  unsigned pid;
  unsigned long long used;
};

// The running processes of `device`: up to two.
int Processes(int device, Entry entries[2]) {
  const cudaemu::internal::DeviceMemoryCounts counts = cudaemu::internal::MemoryCounts(device);
  // This process has a context on every emulated device: it is always listed.
  int n = 0;
  const unsigned pid = cudaemu::internal::NvmlListsThisProcess()
                           ? static_cast<unsigned>(getpid())
                           : kHostPidOfThisProcess;
  entries[n++] = {pid, counts.this_process};
  if (counts.other_processes > 0) entries[n++] = {kOtherPid, counts.other_processes};
  return n;
}

template <typename Info>
int RunningProcesses(const char* api, void* device_handle, unsigned* count, Info* infos) {
  std::lock_guard<std::recursive_mutex> lock(cudaemu::internal::DeviceLock());
  if (const int injected = cudaemu::internal::InjectedFailure(api)) return injected;
  if (!initialized) return kUninitialized;
  const int device = DeviceOf(device_handle);
  if (device < 0 || count == nullptr) return kInvalidArgument;
  Entry entries[2];
  const int n = Processes(device, entries);
  if (*count < static_cast<unsigned>(n)) {
    *count = static_cast<unsigned>(n);
    return kInsufficientSize;
  }
  if (n > 0 && infos == nullptr) return kInvalidArgument;
  for (int i = 0; i < n; ++i) {
    std::memset(&infos[i], 0, sizeof(Info));
    infos[i].pid = entries[i].pid;
    infos[i].usedGpuMemory = entries[i].used;
  }
  *count = static_cast<unsigned>(n);
  return kSuccess;
}

}  // namespace

extern "C" {

struct cudaemu_nvmlProcessInfo_v1 {
  unsigned pid;
  unsigned long long usedGpuMemory;
};

struct cudaemu_nvmlProcessInfo_v2 {
  unsigned pid;
  unsigned long long usedGpuMemory;
  unsigned gpuInstanceId;
  unsigned computeInstanceId;
};

__attribute__((visibility("default"))) int nvmlInit_v2(void) {
  std::lock_guard<std::recursive_mutex> lock(cudaemu::internal::DeviceLock());
  if (const int injected = cudaemu::internal::InjectedFailure("nvmlInit_v2")) return injected;
  const char* env = std::getenv("CUDAEMU_NVML");
  if (env != nullptr && std::strcmp(env, "0") == 0) return kDriverNotLoaded;
  initialized = true;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlShutdown(void) {
  std::lock_guard<std::recursive_mutex> lock(cudaemu::internal::DeviceLock());
  if (!initialized) return kUninitialized;
  initialized = false;
  return kSuccess;
}

__attribute__((visibility("default"))) const char* nvmlErrorString(int result) {
  switch (result) {
    case kSuccess: return "Success";
    case kUninitialized: return "Uninitialized";
    case kInvalidArgument: return "Invalid Argument";
    case kNotFound: return "Not Found";
    case kInsufficientSize: return "Insufficient Size";
    case kDriverNotLoaded: return "Driver Not Loaded";
  }
  return "Unknown Error";
}

__attribute__((visibility("default"))) int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id,
                                                                         void** device) {
  std::lock_guard<std::recursive_mutex> lock(cudaemu::internal::DeviceLock());
  if (const int injected = cudaemu::internal::InjectedFailure("nvmlDeviceGetHandleByPciBusId_v2")) {
    return injected;
  }
  if (!initialized) return kUninitialized;
  if (bus_id == nullptr || device == nullptr) return kInvalidArgument;
  unsigned domain = 0, bus = 0, slot = 0, function = 0;
  if (std::sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4) {
    return kInvalidArgument;
  }
  const int ordinal = static_cast<int>(bus) - 0x10;
  if (domain != 0 || slot != 0 || function != 0 || ordinal < 0 ||
      ordinal >= cudaemu::internal::DeviceCount()) {
    return kNotFound;
  }
  *device = reinterpret_cast<void*>(static_cast<uintptr_t>(ordinal + 1));
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetComputeRunningProcesses_v3(
    void* device, unsigned* count, cudaemu_nvmlProcessInfo_v2* infos) {
  return RunningProcesses("nvmlDeviceGetComputeRunningProcesses_v3", device, count, infos);
}

__attribute__((visibility("default"))) int nvmlDeviceGetComputeRunningProcesses_v2(
    void* device, unsigned* count, cudaemu_nvmlProcessInfo_v2* infos) {
  return RunningProcesses("nvmlDeviceGetComputeRunningProcesses_v2", device, count, infos);
}

__attribute__((visibility("default"))) int nvmlDeviceGetComputeRunningProcesses(
    void* device, unsigned* count, cudaemu_nvmlProcessInfo_v1* infos) {
  return RunningProcesses("nvmlDeviceGetComputeRunningProcesses", device, count, infos);
}

}  // extern "C"
