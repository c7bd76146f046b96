#include "allocator/pluggable.h"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/cuda_memory_resource.h"
#include "allocator/host_memory_resource.h"
#include "allocator/system_memory.h"
#include "allocator/units.h"

namespace actpack::allocator {

absl::string_view BackendName(Backend backend) {
  return backend == Backend::kCuda ? "cuda" : "host";
}

namespace {

std::unique_ptr<MemoryResource> MakeBackend(Backend backend, int device) {
  if (backend == Backend::kCuda) return std::make_unique<CudaMemoryResource>(device);
  return std::make_unique<HostMemoryResource>();
}

std::unique_ptr<StreamEvents> MakeEvents(Backend backend, int device) {
  if (backend == Backend::kCuda) return std::make_unique<CudaStreamEvents>(device);
  return std::make_unique<HostStreamEvents>();
}

}  // namespace

AllocatorStack::AllocatorStack(Backend backend, int device, const AllocatorConfig& config)
    : backend_(backend),
      device_(device),
      events_(MakeEvents(backend, device)),
      backend_resource_(MakeBackend(backend, device)),
      pool_(backend_resource_.get(), events_.get()),
      budget_(&pool_, config.budget_bytes),
      faults_(&budget_),
      stats_(&faults_),
      trace_(&stats_, config.trace_capacity) {
  trace_.SetEnabled(config.record_trace);
}

AllocatorStack::~AllocatorStack() = default;

void AllocatorStack::Free(void* ptr) {
  if (ptr == nullptr) return;
  absl::StatusOr<AllocationInfo> info = pool_.Lookup(ptr);
  if (!info.ok()) {
    std::fprintf(stderr, "actpack: Free: %s\n", info.status().ToString().c_str());
    std::abort();
  }
  top().Deallocate(ptr, info->requested_size, info->stream);
}

MemorySnapshot AllocatorStack::Snapshot() const {
  MemorySnapshot snapshot;
  AddToSnapshot(device_, pool_, &trace_, snapshot);
  snapshot.allocator_settings = {
      {"backend", std::string(BackendName(backend_))},
      {"budget_bytes", budget_.budget() == kNoReserveLimit ? std::string("unlimited")
                                                           : absl::StrCat(budget_.budget())},
  };
  return snapshot;
}

// ---- Pressure callbacks ----

namespace {

// Registrations by id (so registration order), each applied to its stack once that is built.
// Lock order: a stack's build lock (device or host state), then this mutex, then the budget
// adaptor's own.
struct PressureRegistry {
  struct Entry {
    int device = kHostDevice;
    BudgetAdaptor::PressureCallback callback;
    AllocatorStack* stack = nullptr;  // where it is registered; nullptr: not built yet
    BudgetAdaptor::CallbackId adaptor_id = 0;
  };
  std::mutex mutex;
  PressureCallbackId next_id = 1;
  std::map<PressureCallbackId, Entry> entries;
};

PressureRegistry& Registry() {
  static auto* registry = new PressureRegistry;
  return *registry;
}

AllocatorStack* FindBuiltStack(int device);

// Called by the builder of `device`'s stack right after publishing it.
void ApplyPendingPressureCallbacks(int device, AllocatorStack* stack) {
  PressureRegistry& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  for (auto& [id, entry] : registry.entries) {
    if (entry.device != device || entry.stack != nullptr) continue;
    entry.adaptor_id = stack->budget().AddPressureCallback(entry.callback);
    entry.stack = stack;
  }
}

// The device stacks were destroyed (tests): their registrations wait for the next ones.
void DetachDevicePressureCallbacks() {
  PressureRegistry& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  for (auto& [id, entry] : registry.entries) {
    if (entry.device != kHostDevice) entry.stack = nullptr;
  }
}

}  // namespace

absl::StatusOr<PressureCallbackId> RegisterPressureCallback(
    int device, BudgetAdaptor::PressureCallback callback) {
  if (device < kHostDevice || device >= kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat("actpack: device ", device,
                                                   " is outside [-1 (host), ", kMaxDevices, ")"));
  }
  if (!callback) return absl::InvalidArgumentError("actpack: the pressure callback is empty");
  PressureRegistry& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  const PressureCallbackId id = registry.next_id++;
  PressureRegistry::Entry& entry = registry.entries[id];
  entry.device = device;
  entry.callback = std::move(callback);
  // A stack published after this load applies the entry itself: its builder takes this mutex
  // after publishing.
  if (AllocatorStack* stack = FindBuiltStack(device)) {
    entry.adaptor_id = stack->budget().AddPressureCallback(entry.callback);
    entry.stack = stack;
  }
  return id;
}

absl::Status UnregisterPressureCallback(PressureCallbackId id) {
  PressureRegistry& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  auto it = registry.entries.find(id);
  if (it == registry.entries.end()) {
    return absl::NotFoundError(
        absl::StrCat("actpack: no pressure callback is registered with id ", id));
  }
  if (it->second.stack != nullptr) {
    it->second.stack->budget().RemovePressureCallback(it->second.adaptor_id);
  }
  registry.entries.erase(it);
  return absl::OkStatus();
}

// ---- The device allocator ----

namespace {

// Process-wide state. Never destroyed: torch frees tensors during process exit, after static
// destructors would have run.
struct DeviceAllocatorState {
  std::mutex mutex;  // guards building stacks and the configuration
  AllocatorConfig config;
  std::array<size_t, kMaxDevices> budgets;  // per device; starts as config.budget_bytes
  std::array<std::atomic<AllocatorStack*>, kMaxDevices> stacks{};

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

thread_local std::string last_error;

void SetLastError(const absl::Status& status) { last_error = std::string(status.message()); }

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
  auto* stack = new AllocatorStack(config.backend, device, config);
  state.stacks[device].store(stack, std::memory_order_release);
  ApplyPendingPressureCallbacks(device, stack);
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

// What the system counts for `stack` now: the resident set (the host backend), or the
// driver's used memory of its device.
absl::StatusOr<size_t> SystemCount(Backend backend, int device) {
  return backend == Backend::kHost ? ResidentBytes() : CudaDeviceUsedMemory(device);
}

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
  absl::StatusOr<size_t> baseline = SystemCount(backend, device);
  if (!baseline.ok()) return baseline.status();
  const int64_t system_start = static_cast<int64_t>(*baseline);
  const int64_t pool_start = static_cast<int64_t>(stack->pool().GetUsage().reserved_bytes);
  const int64_t allowance = static_cast<int64_t>(allowance_bytes);
  stack->pool().SetOutsideCounter([backend, device, system_start, pool_start,
                                   allowance](size_t reserved) -> size_t {
    absl::StatusOr<size_t> now = SystemCount(backend, device);
    if (!now.ok()) return 0;
    // Growth the system counts that the pool's own growth does not explain (signed: either may
    // have shrunk since the start).
    const int64_t outside = (static_cast<int64_t>(*now) - system_start) -
                            (static_cast<int64_t>(reserved) - pool_start) - allowance;
    return outside > 0 ? static_cast<size_t>(outside) : 0;
  });
  return absl::OkStatus();
}

void StopCountingSystemMemory(int device) {
  AllocatorStack* stack = device == kHostDevice ? &HostPool() : FindDeviceAllocator(device);
  if (stack != nullptr) stack->pool().SetOutsideCounter(nullptr);
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
  DetachDevicePressureCallbacks();
  state.config = AllocatorConfig{};
  state.budgets.fill(state.config.budget_bytes);
}

// ---- The host pool ----

namespace {

struct HostPoolState {
  std::mutex mutex;
  size_t budget_bytes = kNoReserveLimit;
  size_t trace_capacity = TracingAdaptor::kDefaultCapacity;
  bool record_trace = true;
  std::atomic<AllocatorStack*> stack{nullptr};
};

HostPoolState& HostState() {
  static auto* state = new HostPoolState;
  return *state;
}

}  // namespace

absl::Status ConfigureHostPool(size_t budget_bytes, size_t trace_capacity, bool record_trace) {
  HostPoolState& state = HostState();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.stack.load(std::memory_order_acquire) != nullptr) {
    return absl::FailedPreconditionError(
        "actpack: the host pool is already in use; configure it before the first allocation "
        "(change its budget with HostPool().budget().SetBudget)");
  }
  state.budget_bytes = budget_bytes;
  state.trace_capacity = trace_capacity;
  state.record_trace = record_trace;
  return absl::OkStatus();
}

AllocatorStack& HostPool() {
  HostPoolState& state = HostState();
  if (AllocatorStack* stack = state.stack.load(std::memory_order_acquire)) return *stack;
  std::lock_guard<std::mutex> lock(state.mutex);
  if (AllocatorStack* stack = state.stack.load(std::memory_order_acquire)) return *stack;
  AllocatorConfig config;
  config.backend = Backend::kHost;
  config.budget_bytes = state.budget_bytes;
  config.trace_capacity = state.trace_capacity;
  config.record_trace = state.record_trace;
  auto* stack = new AllocatorStack(Backend::kHost, 0, config);
  state.stack.store(stack, std::memory_order_release);
  ApplyPendingPressureCallbacks(kHostDevice, stack);
  return *stack;
}

nlohmann::ordered_json HostSnapshot() { return SnapshotDocument(HostPool().Snapshot()); }

namespace {

AllocatorStack* FindBuiltStack(int device) {
  if (device == kHostDevice) return HostState().stack.load(std::memory_order_acquire);
  return FindDeviceAllocator(device);
}

}  // namespace

}  // namespace actpack::allocator

// ---- The C ABI ----

using actpack::allocator::AllocatorStack;
using actpack::allocator::Backend;

extern "C" {

void* actpack_alloc(size_t size, int device, void* stream) {
  actpack::allocator::last_error.clear();
  absl::StatusOr<AllocatorStack*> stack = actpack::allocator::DeviceAllocator(device);
  if (!stack.ok()) {
    actpack::allocator::SetLastError(stack.status());
    return nullptr;
  }
  absl::StatusOr<void*> ptr = (*stack)->Allocate(size, stream);
  if (!ptr.ok()) {
    actpack::allocator::SetLastError(ptr.status());
    return nullptr;
  }
  return *ptr;
}

void actpack_free(void* ptr, size_t size, int device, void* stream) {
  if (ptr == nullptr) return;
  AllocatorStack* stack = actpack::allocator::FindDeviceAllocator(device);
  if (stack == nullptr) {
    std::fprintf(stderr, "actpack: actpack_free(%p) on device %d, which has no allocations\n",
                 ptr, device);
    std::abort();
  }
  stack->Deallocate(ptr, size, stream);
}

void actpack_init(int device_count) {
  if (device_count > actpack::allocator::kMaxDevices) {
    std::fprintf(stderr, "actpack: %d devices; only the first %d are served\n", device_count,
                 actpack::allocator::kMaxDevices);
  }
}

void actpack_empty_cache(void) {
  for (int device = 0; device < actpack::allocator::kMaxDevices; ++device) {
    if (AllocatorStack* stack = actpack::allocator::FindDeviceAllocator(device)) {
      stack->EmptyCache();
    }
  }
}

void actpack_memory_fraction(double fraction, int device) {
  using namespace actpack::allocator;
  last_error.clear();
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    SetLastError(absl::InvalidArgumentError(
        absl::StrCat("actpack: memory fraction ", fraction, " is outside (0, 1]")));
    return;
  }
  absl::StatusOr<size_t> total = DeviceTotalBytes(device);
  if (!total.ok()) {
    SetLastError(total.status());
    return;
  }
  SetDeviceBudget(device, static_cast<size_t>(fraction * static_cast<double>(*total)));
}

void actpack_record_stream(void* ptr, void* stream) {
  using namespace actpack::allocator;
  last_error.clear();
  for (int device = 0; device < kMaxDevices; ++device) {
    AllocatorStack* stack = FindDeviceAllocator(device);
    if (stack != nullptr && stack->pool().RecordStream(ptr, stream).ok()) return;
  }
  SetLastError(absl::NotFoundError(
      absl::StrCat("actpack: record_stream: ", reinterpret_cast<uintptr_t>(ptr),
                   " is not a live allocation")));
}

void* actpack_base_alloc(void* ptr, size_t* size) {
  using namespace actpack::allocator;
  last_error.clear();
  for (int device = 0; device < kMaxDevices; ++device) {
    AllocatorStack* stack = FindDeviceAllocator(device);
    if (stack == nullptr) continue;
    absl::StatusOr<CachingPool::SegmentRange> segment = stack->pool().SegmentContaining(ptr);
    if (!segment.ok()) continue;
    if (size != nullptr) *size = segment->size;
    return reinterpret_cast<void*>(segment->address);
  }
  SetLastError(absl::NotFoundError(absl::StrCat(
      "actpack: base_alloc: ", reinterpret_cast<uintptr_t>(ptr), " is not in a device segment")));
  return ptr;
}

const char* actpack_last_error(void) { return actpack::allocator::last_error.c_str(); }

}  // extern "C"
