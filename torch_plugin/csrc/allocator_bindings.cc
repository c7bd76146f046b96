// See allocator_bindings.h. Device -1 names the host pool (torch's CPU allocator once
// installed); 0, 1, ... name the device stacks behind the C ABI of allocator/pluggable.h.
#include "torch_plugin/csrc/allocator_bindings.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <pybind11/stl.h>

#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "allocator/pluggable.h"
#include "allocator/statistics_adaptor.h"
#include "torch_plugin/csrc/tensor_adapter.h"

namespace actpack::torch_plugin {
namespace {

namespace py = pybind11;
using allocator::AllocatorStack;
using allocator::HostPool;
using allocator::kNoReserveLimit;

constexpr int kHostDevice = -1;

void FreeToHostPool(void* ptr) {
  if (ptr != nullptr) HostPool().Free(ptr);
}

// HostPoolAllocator
//
// torch's CPU allocator over actpack's host pool. Storages keep a pointer to the allocator that
// made them (resize_ allocates through it), and their DataPtrs carry FreeToHostPool: both must
// outlive any uninstall, so the one instance is never destroyed and keeps working after it.
class HostPoolAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    // Empty tensors are common; they need no block.
    if (nbytes == 0) return {nullptr, nullptr, &FreeToHostPool, cpu};
    absl::StatusOr<void*> ptr = HostPool().Allocate(nbytes);
    // Out of budget becomes torch.OutOfMemoryError with the budget adaptor's message.
    ThrowIfError(ptr.status());
    return {*ptr, *ptr, &FreeToHostPool, cpu};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &FreeToHostPool; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

HostPoolAllocator& TheHostPoolAllocator() {
  static auto* instance = new HostPoolAllocator;
  return *instance;
}

struct CpuInstallState {
  std::mutex mutex;
  c10::Allocator* previous = nullptr;  // torch's allocator before ours; nullptr: not installed
};

CpuInstallState& CpuState() {
  static auto* state = new CpuInstallState;
  return *state;
}

void InstallCpuAllocator() {
  CpuInstallState& state = CpuState();
  std::lock_guard<std::mutex> lock(state.mutex);
  c10::Allocator* current = c10::GetAllocator(c10::DeviceType::CPU);
  if (current == &TheHostPoolAllocator()) return;
  // Priority 0 is torch's own default; a higher-priority allocator set by someone else wins
  // silently inside c10, so check that ours took.
  c10::SetAllocator(c10::DeviceType::CPU, &TheHostPoolAllocator(), /*priority=*/0);
  TORCH_CHECK(c10::GetAllocator(c10::DeviceType::CPU) == &TheHostPoolAllocator(),
              "actpack: could not install the CPU allocator: another allocator was registered "
              "for CPU with a higher priority");
  state.previous = current;
}

bool UninstallCpuAllocator() {
  CpuInstallState& state = CpuState();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.previous == nullptr) return false;
  c10::SetAllocator(c10::DeviceType::CPU, state.previous, /*priority=*/0);
  state.previous = nullptr;
  return true;
}

bool CpuAllocatorInstalled() {
  return c10::GetAllocator(c10::DeviceType::CPU) == &TheHostPoolAllocator();
}

size_t BudgetBytes(std::optional<size_t> budget) { return budget.value_or(kNoReserveLimit); }

// The host pool is configured before its first allocation and re-budgeted after.
void SetHostBudget(std::optional<size_t> budget) {
  const absl::Status configured = allocator::ConfigureHostPool(BudgetBytes(budget));
  if (absl::IsFailedPrecondition(configured)) {
    HostPool().budget().SetBudget(BudgetBytes(budget));
    return;
  }
  ThrowIfError(configured);
}

void ConfigureDeviceAllocator(const std::string& backend, std::optional<size_t> budget) {
  allocator::AllocatorConfig config;
  if (backend == "cuda") {
    config.backend = allocator::Backend::kCuda;
  } else if (backend == "host") {
    config.backend = allocator::Backend::kHost;
  } else {
    TORCH_CHECK_VALUE(false, "actpack: unknown allocator backend '", backend,
                      "'; expected 'cuda' or 'host'");
  }
  config.budget_bytes = BudgetBytes(budget);
  ThrowIfError(allocator::ConfigureDeviceAllocator(config));
}

void CheckDevice(int device) {
  TORCH_CHECK_VALUE(device >= kHostDevice && device < allocator::kMaxDevices,
                    "actpack: device ", device, " is outside [-1 (host), ",
                    allocator::kMaxDevices, ")");
}

// The stack of `device`, or nullptr for a device stack not built yet (reading builds nothing).
AllocatorStack* FindStack(int device) {
  CheckDevice(device);
  if (device == kHostDevice) return &HostPool();
  return allocator::FindDeviceAllocator(device);
}

void SetDeviceBudget(int device, std::optional<size_t> budget) {
  TORCH_CHECK_VALUE(device >= kHostDevice && device < allocator::kMaxDevices,
                    "actpack: device ", device, " is outside [-1 (all), ",
                    allocator::kMaxDevices, ")");
  allocator::SetDeviceBudget(device, BudgetBytes(budget));
}

void SetDeviceBudgetFraction(int device, double fraction) {
  CheckDevice(device);
  TORCH_CHECK_VALUE(device != kHostDevice, "actpack: a budget fraction needs a device index");
  actpack_memory_fraction(fraction, device);
  const std::string error = actpack_last_error();
  TORCH_CHECK_VALUE(error.empty(), error);
}

bool DeviceAllocatorInUse() {
  for (int device = 0; device < allocator::kMaxDevices; ++device) {
    if (allocator::FindDeviceAllocator(device) != nullptr) return true;
  }
  return false;
}

py::dict MemoryStats(int device) {
  const AllocatorStack* stack = FindStack(device);
  const allocator::MemoryStats stats =
      stack != nullptr ? stack->stats().GetStats() : allocator::MemoryStats{};
  py::dict result;
  for (const auto& [name, value] : allocator::ToTorchMemoryStats(stats)) {
    result[py::str(name)] = value;
  }
  return result;
}

std::optional<size_t> Budget(int device) {
  size_t budget = kNoReserveLimit;
  if (device == kHostDevice) {
    budget = HostPool().budget().budget();
  } else if (AllocatorStack* stack = FindStack(device)) {
    budget = stack->budget().budget();
  } else {
    // Not built yet: its budget is still only in the configuration.
    budget = allocator::DeviceAllocatorConfig().budget_bytes;
  }
  if (budget == kNoReserveLimit) return std::nullopt;
  return budget;
}

void ResetPeak(int device) {
  if (AllocatorStack* stack = FindStack(device)) stack->stats().ResetPeak();
}

size_t EmptyCache(int device) {
  AllocatorStack* stack = FindStack(device);
  return stack != nullptr ? stack->EmptyCache() : 0;
}

// torch's snapshot holds every device; so does the device one here.
std::string SnapshotJson(int device) {
  CheckDevice(device);
  return device == kHostDevice ? allocator::HostSnapshotJson() : allocator::DeviceSnapshotJson();
}

}  // namespace

void BindAllocator(py::module& m) {
  m.attr("_HOST_DEVICE") = kHostDevice;
  m.def("_install_cpu_allocator", &InstallCpuAllocator);
  m.def("_uninstall_cpu_allocator", &UninstallCpuAllocator);
  m.def("_cpu_allocator_installed", &CpuAllocatorInstalled);
  m.def("_set_host_budget", &SetHostBudget, py::arg("budget_bytes"));
  m.def("_configure_device_allocator", &ConfigureDeviceAllocator, py::arg("backend"),
        py::arg("budget_bytes"));
  m.def("_set_device_budget", &SetDeviceBudget, py::arg("device"), py::arg("budget_bytes"));
  m.def("_set_device_budget_fraction", &SetDeviceBudgetFraction, py::arg("device"),
        py::arg("fraction"));
  m.def("_device_allocator_in_use", &DeviceAllocatorInUse);
  m.def("_memory_stats", &MemoryStats, py::arg("device"));
  m.def("_budget", &Budget, py::arg("device"));
  m.def("_reset_peak_memory_stats", &ResetPeak, py::arg("device"));
  m.def("_empty_cache", &EmptyCache, py::arg("device"));
  m.def("_snapshot_json", &SnapshotJson, py::arg("device"));
  m.def("_last_allocator_error", [] { return std::string(actpack_last_error()); });
}

}  // namespace actpack::torch_plugin
