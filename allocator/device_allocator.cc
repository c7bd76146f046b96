#include "allocator/device_allocator.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/cuda_memory_resource.h"
#include "allocator/device_memory_count.h"
#include "allocator/host_pool.h"
#include "allocator/pressure_callbacks.h"
#include "allocator/system_memory.h"

namespace actpack::allocator {

namespace {

// Process-wide state. Never destroyed: torch frees tensors during process exit, after static
// destructors would have run.
struct DeviceAllocatorState {
  std::mutex mutex;  // guards building stacks, the configuration and the count sources
  AllocatorConfig config;
  std::array<size_t, kMaxDevices> budgets;  // per device; starts as config.budget_bytes
  std::array<std::atomic<AllocatorStack*>, kMaxDevices> stacks{};
  // What CountSystemMemory counts per device (empty: not counting).
  std::array<std::string, kMaxDevices> count_sources;

  DeviceAllocatorState() { budgets.fill(config.budget_bytes); }
};

DeviceAllocatorState& DeviceState() {
  static auto* state = new DeviceAllocatorState;
  return *state;
}

bool AnyDeviceStackLocked(const DeviceAllocatorState& state) {
  for (const auto& stack : state.stacks) {
    if (stack.load(std::memory_order_acquire) != nullptr) return true;
  }
  return false;
}

}  // namespace

absl::Status ConfigureDeviceAllocator(const AllocatorConfig& config) {
  if (config.backend == Backend::kCuda && !CudaSupportCompiledIn()) {
    return absl::InvalidArgumentError(
        "actpack: the CUDA backend needs CUDA support, which is not compiled in");
  }
  DeviceAllocatorState& state = DeviceState();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (AnyDeviceStackLocked(state)) {
    return absl::FailedPreconditionError(
        "actpack: the device allocator is already in use; configure it before the first "
        "allocation");
  }
  state.config = config;
  state.budgets.fill(config.budget_bytes);
  return absl::OkStatus();
}

AllocatorConfig DeviceAllocatorConfig() {
  DeviceAllocatorState& state = DeviceState();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.config;
}

AllocatorStack* FindDeviceAllocator(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return DeviceState().stacks[device].load(std::memory_order_acquire);
}

absl::StatusOr<AllocatorStack*> DeviceAllocator(int device) {
  if (device < 0 || device >= kMaxDevices) {
    return absl::InvalidArgumentError(
        absl::StrCat("actpack: device ", device, " is outside [0, ", kMaxDevices, ")"));
  }
  DeviceAllocatorState& state = DeviceState();
  if (AllocatorStack* stack = state.stacks[device].load(std::memory_order_acquire)) return stack;
  std::lock_guard<std::mutex> lock(state.mutex);
  if (AllocatorStack* stack = state.stacks[device].load(std::memory_order_acquire)) return stack;
  AllocatorConfig config = state.config;
  config.budget_bytes = state.budgets[device];
  if (const char* memory = std::getenv("ACTPACK_CUDA_MEMORY")) {
    const std::string choice = memory;
    if (choice == "vmm") config.cuda_memory = CudaMemory::kVirtual;
    if (choice == "malloc") config.cuda_memory = CudaMemory::kMalloc;
    if (choice == "auto") config.cuda_memory = CudaMemory::kAuto;
  }
  auto* stack = new AllocatorStack(config.backend, device, config);
  state.stacks[device].store(stack, std::memory_order_release);
  AttachPressureCallbacks(device, stack);
  return stack;
}

void SetDeviceBudget(int device, size_t budget_bytes) {
  DeviceAllocatorState& state = DeviceState();
  std::lock_guard<std::mutex> lock(state.mutex);
  for (int d = 0; d < kMaxDevices; ++d) {
    if (device != -1 && d != device) continue;
    state.budgets[d] = budget_bytes;
    if (AllocatorStack* stack = state.stacks[d].load(std::memory_order_acquire)) {
      stack->budget().SetBudget(budget_bytes);
    }
  }
}

size_t DeviceBudget(int device) {
  DeviceAllocatorState& state = DeviceState();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.budgets[device];
}

absl::StatusOr<size_t> DeviceTotalBytes(int device) {
  if (device == kHostDevice || DeviceAllocatorConfig().backend == Backend::kHost) {
    return PhysicalMemoryBytes();
  }
  return CudaDeviceTotalMemory(device);
}

namespace {

constexpr const char* kResidentSetSource = "the process's resident set (VmRSS)";

// What the system counts for a stack: the resident set (the host backend), or this process's
// memory on its device.
class SystemCounter {
 public:
  static absl::StatusOr<SystemCounter> Create(Backend backend, int device) {
    if (backend == Backend::kHost) return SystemCounter(std::nullopt);
    absl::StatusOr<DeviceMemoryCounter> counter = DeviceMemoryCounter::Create(device);
    if (!counter.ok()) return counter.status();
    return SystemCounter(*std::move(counter));
  }
  absl::StatusOr<size_t> Read() const {
    return device_.has_value() ? device_->Read() : ResidentBytes();
  }
  std::string description() const {
    return device_.has_value() ? device_->description() : kResidentSetSource;
  }

 private:
  explicit SystemCounter(std::optional<DeviceMemoryCounter> device) : device_(std::move(device)) {}
  std::optional<DeviceMemoryCounter> device_;
};

}  // namespace

absl::Status CountSystemMemory(int device, size_t allowance_bytes) {
  AllocatorStack* stack = nullptr;
  if (device == kHostDevice) {
    stack = &HostPool();
  } else {
    absl::StatusOr<AllocatorStack*> built = DeviceAllocator(device);
    if (!built.ok()) return built.status();
    stack = *built;
  }
  const Backend backend = stack->backend();
  // From a pool without cache: a cached segment never written is reserved but not resident,
  // and given back later it would shrink the pool and not the system's count (a replayed
  // trace's 40 MiB so counted as memory outside the pool in the next budget's run).
  stack->EmptyCache();
  absl::StatusOr<SystemCounter> counter = SystemCounter::Create(backend, device);
  if (!counter.ok()) return counter.status();
  absl::StatusOr<size_t> baseline = counter->Read();
  if (!baseline.ok()) return baseline.status();
  const int64_t system_start = static_cast<int64_t>(*baseline);
  const int64_t pool_start = static_cast<int64_t>(stack->pool().GetUsage().footprint_bytes());
  const int64_t allowance = static_cast<int64_t>(allowance_bytes);
  if (device != kHostDevice) {
    DeviceAllocatorState& state = DeviceState();
    std::lock_guard<std::mutex> lock(state.mutex);
    state.count_sources[device] = counter->description();
  }
  stack->pool().SetOutsideCounter([counter = *std::move(counter), system_start, pool_start,
                                   allowance](size_t held) -> size_t {
    absl::StatusOr<size_t> now = counter.Read();
    if (!now.ok()) return 0;
    // Growth the system counts that the pool's own growth does not explain (signed: either may
    // have shrunk since the start).
    const int64_t outside = (static_cast<int64_t>(*now) - system_start) -
                            (static_cast<int64_t>(held) - pool_start) - allowance;
    return outside > 0 ? static_cast<size_t>(outside) : 0;
  });
  return absl::OkStatus();
}

void StopCountingSystemMemory(int device) {
  AllocatorStack* stack = device == kHostDevice ? &HostPool() : FindDeviceAllocator(device);
  if (stack != nullptr) stack->pool().SetOutsideCounter(nullptr);
  if (device >= 0 && device < kMaxDevices) {
    DeviceAllocatorState& state = DeviceState();
    std::lock_guard<std::mutex> lock(state.mutex);
    state.count_sources[device].clear();
  }
}

bool CountsSystemMemory(int device) {
  AllocatorStack* stack = device == kHostDevice ? &HostPool() : FindDeviceAllocator(device);
  return stack != nullptr && stack->pool().CountsOutside();
}

std::string SystemMemorySource(int device) {
  if (device == kHostDevice || DeviceAllocatorConfig().backend == Backend::kHost) {
    return kResidentSetSource;
  }
  if (device < 0 || device >= kMaxDevices) return "no such device";
  {
    DeviceAllocatorState& state = DeviceState();
    std::lock_guard<std::mutex> lock(state.mutex);
    if (!state.count_sources[device].empty()) return state.count_sources[device];
  }
  absl::StatusOr<DeviceMemoryCounter> counter = DeviceMemoryCounter::Create(device);
  if (!counter.ok()) return absl::StrCat("nothing (", counter.status().message(), ")");
  return counter->description();
}

nlohmann::ordered_json DeviceSnapshot() {
  MemorySnapshot snapshot;
  for (int device = 0; device < kMaxDevices; ++device) {
    if (const AllocatorStack* stack = FindDeviceAllocator(device)) {
      AddToSnapshot(device, stack->pool(), &stack->trace(), snapshot);
    }
  }
  const AllocatorConfig config = DeviceAllocatorConfig();
  snapshot.allocator_settings = {{"backend", std::string(BackendName(config.backend))}};
  return SnapshotDocument(snapshot);
}

void ResetDeviceAllocatorForTesting() {
  DeviceAllocatorState& state = DeviceState();
  std::lock_guard<std::mutex> lock(state.mutex);
  for (auto& slot : state.stacks) delete slot.exchange(nullptr);
  for (std::string& source : state.count_sources) source.clear();
  DetachDevicePressureCallbacks();
  state.config = AllocatorConfig{};
  state.budgets.fill(state.config.budget_bytes);
}

}  // namespace actpack::allocator
