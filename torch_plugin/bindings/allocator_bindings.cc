// See allocator_bindings.h. Device -1 names the host pool (torch's CPU allocator once
// installed); 0, 1, ... name the device stacks (allocator/device_allocator.h) behind the C ABI
// of allocator/pluggable.h.
#include "torch_plugin/bindings/allocator_bindings.h"

#include <torch/python.h>
#include <c10/util/Exception.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#ifdef ACTPACK_WITH_CUDA
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#endif

#include "absl/status/status.h"
#include "allocator/cuda_memory_resource.h"
#include "allocator/device_allocator.h"
#include "allocator/host_pool.h"
#include "allocator/pluggable.h"
#include "allocator/pressure_callbacks.h"
#include "torch_plugin/bindings/python_json.h"
#include "allocator/statistics_adaptor.h"
#include "allocator/system_memory.h"
#include "torch_plugin/csrc/cpu_allocator.h"
#include "torch_plugin/csrc/pluggable_alloc.h"
#include "torch_plugin/csrc/tensor_adapter.h"

namespace actpack::torch_plugin {
namespace {

namespace py = pybind11;
using allocator::AllocatorStack;
using allocator::HostPool;
using allocator::kHostDevice;
using allocator::kNoCap;

size_t BudgetBytes(std::optional<size_t> budget) { return budget.value_or(kNoCap); }

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
  size_t budget = kNoCap;
  if (device == kHostDevice) {
    budget = HostPool().budget().budget();
  } else {
    CheckDevice(device);
    budget = allocator::DeviceBudget(device);  // built or not (a budget set before the build)
  }
  if (budget == kNoCap) return std::nullopt;
  return budget;
}

void ResetPeak(int device) {
  if (AllocatorStack* stack = FindStack(device)) stack->stats().ResetPeak();
}

// The allocated and reserved peaks since the last call, for a budget's step (the peaks a user
// reads and resets are left alone); zeros where the device has no stack.
std::pair<int64_t, int64_t> TakeWindowPeaks(int device) {
  AllocatorStack* stack = FindStack(device);
  if (stack == nullptr) return {0, 0};
  const allocator::WindowPeaks peaks = stack->stats().TakeWindowPeaks();
  return {peaks.allocated_bytes, peaks.reserved_bytes};
}

void ResetAccumulated(int device) {
  if (AllocatorStack* stack = FindStack(device)) stack->stats().ResetAccumulated();
}

size_t EmptyCache(int device) {
  AllocatorStack* stack = FindStack(device);
  return stack != nullptr ? stack->EmptyCache() : 0;
}

// Forgets the recorded trace of `device` (the start of a recording window).
void ClearTrace(int device) {
  if (AllocatorStack* stack = FindStack(device)) stack->trace().Clear();
}

// Entries the trace of `device` overwrote because its ring was full.
uint64_t TraceDropped(int device) {
  const AllocatorStack* stack = FindStack(device);
  return stack != nullptr ? stack->trace().dropped() : 0;
}

// ---- Pressure callbacks from Python ----

// A Python callable that C++ copies share without touching its reference count (they may run
// on threads without the GIL); the last owner takes the GIL to drop it.
using PythonCallable = std::shared_ptr<py::object>;

PythonCallable HoldPython(py::object callable) {
  return PythonCallable(new py::object(std::move(callable)), [](py::object* held) {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      delete held;
    } else {
      held->release();  // the interpreter is gone: nothing to drop the reference in
      delete held;
    }
  });
}

size_t AllocatedBytes(int device) {
  const AllocatorStack* stack =
      device == kHostDevice ? &HostPool() : allocator::FindDeviceAllocator(device);
  return stack != nullptr ? stack->pool().GetUsage().allocated_bytes : 0;
}

// Runs a Python pressure callback from inside an allocation: with the GIL (any thread may
// allocate: autograd's backward threads hold none), never letting a Python exception cross the
// allocator. A callback that raises is reported through sys.unraisablehook (printed to stderr
// by default) and counts as having freed nothing, so the next callback (or the failure) follows.
// The bytes freed are what it returned, or what it visibly freed if that is more (a callback
// that drops tensors and returns None still gets the retry it earned).
size_t RunPythonPressureCallback(const PythonCallable& callable, int device, size_t needed) {
  if (!Py_IsInitialized()) return 0;
  py::gil_scoped_acquire gil;
  const size_t before = AllocatedBytes(device);
  size_t returned = 0;
  try {
    const py::object result = (*callable)(needed);
    if (!result.is_none()) {
      const bool is_count = py::isinstance<py::int_>(result) &&
                            !py::isinstance<py::bool_>(result) &&
                            PyObject_RichCompareBool(result.ptr(), py::int_(0).ptr(), Py_GE) == 1;
      if (!is_count) {
        throw py::type_error("actpack: a pressure callback returns the bytes it freed (an int "
                             ">= 0) or None, not " + std::string(py::repr(result)));
      }
      returned = result.cast<size_t>();
    }
  } catch (py::error_already_set& error) {
    error.discard_as_unraisable("actpack pressure callback");
    return 0;
  } catch (const py::builtin_exception& error) {
    error.set_error();
    py::error_already_set().discard_as_unraisable("actpack pressure callback");
    return 0;
  } catch (const std::exception& error) {  // a failed cast (an int over 2^64)
    PyErr_SetString(PyExc_OverflowError, error.what());
    py::error_already_set().discard_as_unraisable("actpack pressure callback");
    return 0;
  }
  const size_t after = AllocatedBytes(device);
  return std::max(returned, before > after ? before - after : size_t{0});
}

int64_t AddPressureCallback(int device, py::function callback) {
  CheckDevice(device);
  PythonCallable held = HoldPython(std::move(callback));
  absl::StatusOr<allocator::PressureCallbackId> id =
      allocator::RegisterPressureCallback(device, [held, device](size_t needed) {
        return RunPythonPressureCallback(held, device, needed);
      });
  ThrowIfError(id.status());
  return *id;
}

void RemovePressureCallback(int64_t id) {
  const absl::Status status = allocator::UnregisterPressureCallback(id);
  TORCH_CHECK_VALUE(status.ok(), status.message());
}

// ---- torch's CUDAPluggableAllocator hooks ----

#ifdef ACTPACK_WITH_CUDA
// Note [pluggable hooks]: torch 2.13's CUDAPluggableAllocator calls optional hooks for init,
// emptyCache (torch.cuda.empty_cache), setMemoryFraction
// (torch.cuda.set_per_process_memory_fraction), recordStream (Tensor.record_stream),
// getBaseAllocation (CUDA IPC) and the CUDA-graph pool calls, but its Python object
// (torch._C._cuda_CUDAAllocator) exposes no setter: only C++ can set them. Everything else
// (memory_stats, reset_peak_memory_stats, reset_accumulated_memory_stats, snapshots,
// _record_memory_history, cacheInfo, OOM observers) has no hook and raises in torch: actpack.*
// provides those.
void WirePluggableHooks(const py::object& allocator_object) {
  using torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
  const auto base =
      allocator_object.cast<std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator>>();
  const auto pluggable = std::dynamic_pointer_cast<CUDAPluggableAllocator>(base);
  TORCH_CHECK_VALUE(pluggable != nullptr, "actpack: expected torch's CUDAPluggableAllocator, got ",
                    base == nullptr ? std::string("None") : base->name());
  pluggable->set_init_fn([](int device_count) { actpack_init(device_count); });
  pluggable->set_reset_fn([] { actpack_empty_cache(); });
  pluggable->set_memory_fraction_fn([](double fraction, int device) {
    actpack_memory_fraction(fraction, device);
    const std::string error = actpack_last_error();
    TORCH_CHECK_VALUE(error.empty(), error);
  });
  pluggable->set_record_stream_fn([](void* ptr, cudaStream_t stream) {
    actpack_record_stream(ptr, stream);
    const std::string error = actpack_last_error();
    TORCH_CHECK(error.empty(), error);
  });
  pluggable->set_base_alloc_fn([](void* ptr, size_t* size) { return actpack_base_alloc(ptr, size); });
  // actpack has no private pools: a CUDA graph captured on it would see its blocks reused behind
  // its back. Refuse clearly rather than corrupt memory silently.
  pluggable->set_begin_allocate_to_pool(
      [](int device, c10::cuda::MempoolId_t, std::function<bool(cudaStream_t)>) {
        TORCH_CHECK(false, "actpack: CUDA graph capture (and torch.cuda.use_mem_pool) into a "
                           "private pool is not supported on device ", device,
                           " while actpack's allocator is installed; capture without "
                           "actpack.install_allocator");
      });
}
#endif

// torch's snapshot holds every device; so does the device one here.
py::object Snapshot(int device) {
  CheckDevice(device);
  return ToPython(device == kHostDevice ? allocator::HostSnapshot() : allocator::DeviceSnapshot());
}

}  // namespace

void BindAllocator(py::module& m) {
  m.attr("_HOST_DEVICE") = kHostDevice;
  m.attr("_HOST_OUTSIDE_ALLOWANCE_BYTES") = allocator::kHostOutsideAllowanceBytes;
  py::class_<allocator::ResidentPeakMeter>(m, "ResidentPeakMeter",
                                           "The resident set's peak above its size at start, "
                                           "per window (allocator/system_memory.h)")
      .def(py::init<>())
      .def("start", &allocator::ResidentPeakMeter::Start)
      .def("take_peak", &allocator::ResidentPeakMeter::TakePeak);
  m.def("_resident_bytes", []() -> py::object {
    // The process's resident set (allocator::ResidentBytes); None where it cannot be read.
    absl::StatusOr<size_t> resident = allocator::ResidentBytes();
    return resident.ok() ? py::object(py::int_(*resident)) : py::object(py::none());
  });
  m.def("_device_used_bytes", [](int device) {
    absl::StatusOr<size_t> used = allocator::CudaDeviceUsedMemory(device);
    ThrowIfError(used.status());
    return *used;
  }, py::arg("device"));
  m.def("_count_system_memory", [](int device, size_t allowance_bytes) {
    ThrowIfError(allocator::CountSystemMemory(device, allowance_bytes));
  }, py::arg("device"), py::arg("allowance_bytes") = 0);
  m.def("_stop_counting_system_memory", &allocator::StopCountingSystemMemory, py::arg("device"));
  m.def("_counts_system_memory", &allocator::CountsSystemMemory, py::arg("device"));
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
  m.def("_take_window_peaks", &TakeWindowPeaks, py::arg("device"));
  m.def("_empty_cache", &EmptyCache, py::arg("device"));
  m.def("_snapshot", &Snapshot, py::arg("device"));
  // The reason of the last failed device allocation: actpack_torch_alloc's where it ran (torch's
  // allocator is actpack's), else the C ABI's actpack_alloc's (a torch.cuda.MemPool region,
  // ctypes). A process uses one of them: install_allocator refuses a MemPool region.
  m.def("_last_allocator_error", [] {
    return LastTorchAllocError().value_or(std::string(actpack_last_error()));
  });
  // For tests: calls the allocation function at `address` (what memory.py hands torch's
  // CUDAPluggableAllocator, its address found as torch finds it, by ctypes) as torch's
  // allocator does: through a std::function, on the default stream, whatever it throws left to
  // reach Python as torch maps it. The pointer it returned, as an int.
  m.def("_call_alloc_fn", [](uintptr_t address, size_t size, int device) {
    const std::function<void*(size_t, int, void*)> alloc_fn =
        reinterpret_cast<void* (*)(size_t, int, void*)>(address);
    return reinterpret_cast<uintptr_t>(alloc_fn(size, device, nullptr));
  }, py::arg("address"), py::arg("size"), py::arg("device"));
  m.def("_reset_accumulated_memory_stats", &ResetAccumulated, py::arg("device"));
  // For tests (tests/test_allocation_faults.py): fail the k-th allocation of a stack from now
  // (0: none), and read how many it has counted since and whether the failure happened.
  m.def("_fail_allocation_at", [](int device, uint64_t k) {
    AllocatorStack* stack = FindStack(device);
    TORCH_CHECK_VALUE(stack != nullptr, "actpack: device ", device, " has no allocator yet");
    stack->faults().FailAt(k);
  }, py::arg("device"), py::arg("k"));
  m.def("_allocations_counted", [](int device) -> py::tuple {
    AllocatorStack* stack = FindStack(device);
    TORCH_CHECK_VALUE(stack != nullptr, "actpack: device ", device, " has no allocator yet");
    return py::make_tuple(stack->faults().allocations(), stack->faults().failed());
  }, py::arg("device"));
  m.def("_clear_trace", &ClearTrace, py::arg("device"));
  m.def("_trace_dropped", &TraceDropped, py::arg("device"));
  m.def("_add_pressure_callback", &AddPressureCallback, py::arg("device"), py::arg("callback"));
  m.def("_remove_pressure_callback", &RemovePressureCallback, py::arg("id"));
#ifdef ACTPACK_WITH_CUDA
  m.def("_wire_pluggable_hooks", &WirePluggableHooks, py::arg("allocator"));
#endif
}

}  // namespace actpack::torch_plugin
