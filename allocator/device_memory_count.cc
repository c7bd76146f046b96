#include "allocator/device_memory_count.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/cuda_memory_resource.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <mutex>
#include <vector>

#include "allocator/internal/cuda_device.h"
#include "common/cuda_check.h"
#endif

namespace actpack::allocator {

#if ACTPACK_WITH_CUDA

namespace {

// NVML's C ABI, as libnvidia-ml.so.1 exports it (nvml.h is not needed to build).
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ull;

// The entries of nvmlDeviceGetComputeRunningProcesses_v2 and _v3.
struct NvmlProcessInfo {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

// The entries of the unversioned nvmlDeviceGetComputeRunningProcesses (NVML's first ABI).
struct NvmlProcessInfoV1 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
};

struct Nvml {
  int (*init)() = nullptr;
  const char* (*error_string)(int) = nullptr;
  int (*handle_by_bus_id)(const char*, void**) = nullptr;
  int (*processes)(void*, unsigned*, NvmlProcessInfo*) = nullptr;
  int (*processes_v1)(void*, unsigned*, NvmlProcessInfoV1*) = nullptr;
  const char* processes_name = "";
  const char* where = "";

  std::string Error(int result) const {
    const char* text = error_string != nullptr ? error_string(result) : nullptr;
    return text != nullptr ? absl::StrCat(text, " (", result, ")") : absl::StrCat("error ", result);
  }
};

// NVML, found and initialized once per process (a failure is tried again next time).
absl::StatusOr<const Nvml*> LoadNvml() {
  static std::mutex mutex;
  static const Nvml* loaded = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded != nullptr) return loaded;
  auto nvml = std::make_unique<Nvml>();
  void* library = RTLD_DEFAULT;
  nvml->where = "the process";
  if (dlsym(RTLD_DEFAULT, "nvmlInit_v2") == nullptr) {
    library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* error = dlerror();
      return absl::UnavailableError(
          absl::StrCat("cannot load libnvidia-ml.so.1: ", error != nullptr ? error : "?"));
    }
    nvml->where = "libnvidia-ml.so.1";
  }
  auto symbol = [library](const char* name) { return dlsym(library, name); };
  nvml->init = reinterpret_cast<int (*)()>(symbol("nvmlInit_v2"));
  nvml->error_string = reinterpret_cast<const char* (*)(int)>(symbol("nvmlErrorString"));
  nvml->handle_by_bus_id =
      reinterpret_cast<int (*)(const char*, void**)>(symbol("nvmlDeviceGetHandleByPciBusId_v2"));
  for (const char* name : {"nvmlDeviceGetComputeRunningProcesses_v3",
                           "nvmlDeviceGetComputeRunningProcesses_v2"}) {
    if (void* f = symbol(name)) {
      nvml->processes = reinterpret_cast<int (*)(void*, unsigned*, NvmlProcessInfo*)>(f);
      nvml->processes_name = name;
      break;
    }
  }
  if (nvml->processes == nullptr) {
    nvml->processes_v1 = reinterpret_cast<int (*)(void*, unsigned*, NvmlProcessInfoV1*)>(
        symbol("nvmlDeviceGetComputeRunningProcesses"));
    nvml->processes_name = "nvmlDeviceGetComputeRunningProcesses";
  }
  if (nvml->init == nullptr || nvml->handle_by_bus_id == nullptr ||
      (nvml->processes == nullptr && nvml->processes_v1 == nullptr)) {
    return absl::UnavailableError(absl::StrCat("NVML in ", nvml->where, " lacks the calls needed"));
  }
  if (const int result = nvml->init(); result != kNvmlSuccess) {
    return absl::UnavailableError(absl::StrCat("nvmlInit_v2 failed: ", nvml->Error(result)));
  }
  loaded = nvml.release();
  return loaded;
}

// The used memory NVML lists for process `pid` on `device`; kNotFound when it lists none.
absl::StatusOr<size_t> NvmlProcessMemory(const Nvml& nvml, void* device, unsigned pid) {
  // Room for the processes and then some: an entry layout larger than the one declared here
  // (a later NVML) must not write past the buffer.
  unsigned capacity = 32;
  for (int attempt = 0; attempt < 4; ++attempt) {
    unsigned count = capacity;
    int result = 0;
    std::vector<std::pair<unsigned, unsigned long long>> entries;
    if (nvml.processes != nullptr) {
      std::vector<NvmlProcessInfo> infos(2 * static_cast<size_t>(capacity));
      result = nvml.processes(device, &count, infos.data());
      if (result == kNvmlSuccess) {
        for (unsigned i = 0; i < count; ++i) {
          entries.emplace_back(infos[i].pid, infos[i].used_gpu_memory);
        }
      }
    } else {
      std::vector<NvmlProcessInfoV1> infos(2 * static_cast<size_t>(capacity));
      result = nvml.processes_v1(device, &count, infos.data());
      if (result == kNvmlSuccess) {
        for (unsigned i = 0; i < count; ++i) {
          entries.emplace_back(infos[i].pid, infos[i].used_gpu_memory);
        }
      }
    }
    if (result == kNvmlInsufficientSize) {
      capacity = count + 16;
      continue;
    }
    if (result != kNvmlSuccess) {
      return absl::UnavailableError(
          absl::StrCat(nvml.processes_name, " failed: ", nvml.Error(result)));
    }
    for (const auto& [entry_pid, used] : entries) {
      if (entry_pid != pid) continue;
      if (used == kNvmlValueNotAvailable) {
        return absl::UnavailableError(
            "NVML does not report per-process memory on this device (a MIG instance?)");
      }
      return static_cast<size_t>(used);
    }
    return absl::NotFoundError(
        "this process is not in NVML's list for the device (a container with its own PID "
        "namespace?)");
  }
  return absl::UnavailableError(
      absl::StrCat(nvml.processes_name, " kept asking for more room"));
}

absl::StatusOr<size_t> MemGetInfoUsed(int device) { return CudaDeviceUsedMemory(device); }

}  // namespace

absl::StatusOr<DeviceMemoryCounter> DeviceMemoryCounter::Create(int device) {
  // Why NVML is not used, if it is not.
  std::string why;
  char bus_id[64] = {};
  absl::Status bus = ACTPACK_CUDA_STATUS(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device));
  absl::StatusOr<const Nvml*> nvml = LoadNvml();
  if (!bus.ok()) {
    why = std::string(bus.message());
  } else if (!nvml.ok()) {
    why = std::string(nvml.status().message());
  } else {
    void* handle = nullptr;
    const int result = (*nvml)->handle_by_bus_id(bus_id, &handle);
    if (result != kNvmlSuccess) {
      why = absl::StrCat("nvmlDeviceGetHandleByPciBusId_v2(", bus_id,
                         ") failed: ", (*nvml)->Error(result));
    } else {
      absl::StatusOr<size_t> used =
          NvmlProcessMemory(**nvml, handle, static_cast<unsigned>(getpid()));
      if (used.ok()) {
        return DeviceMemoryCounter(
            device, true, handle,
            absl::StrCat("NVML: this process's memory on GPU ", bus_id, " (",
                         (*nvml)->processes_name, ")"));
      }
      why = std::string(used.status().message());
    }
  }
  absl::StatusOr<size_t> used = MemGetInfoUsed(device);
  if (!used.ok()) return used.status();
  return DeviceMemoryCounter(
      device, false, nullptr,
      absl::StrCat("cudaMemGetInfo: device ", device,
                   "'s used memory, every process's (NVML not used: ", why, ")"));
}

absl::StatusOr<size_t> DeviceMemoryCounter::Read() const {
  if (!per_process_) return MemGetInfoUsed(device_);
  absl::StatusOr<const Nvml*> nvml = LoadNvml();
  if (!nvml.ok()) return nvml.status();
  return NvmlProcessMemory(**nvml, nvml_device_, static_cast<unsigned>(getpid()));
}

#else  // !ACTPACK_WITH_CUDA

absl::StatusOr<DeviceMemoryCounter> DeviceMemoryCounter::Create(int device) {
  return absl::UnimplementedError("actpack: CUDA support not compiled in");
}

absl::StatusOr<size_t> DeviceMemoryCounter::Read() const {
  return absl::UnimplementedError("actpack: CUDA support not compiled in");
}

#endif  // ACTPACK_WITH_CUDA

}  // namespace actpack::allocator
