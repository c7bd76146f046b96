#include "allocator/host_pool.h"

#include <atomic>
#include <mutex>

#include "allocator/pressure_callbacks.h"

namespace actpack::allocator {

namespace {

struct HostPoolState {
  std::mutex mutex;
  size_t budget_bytes = kNoCap;
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
  AttachPressureCallbacks(kHostDevice, stack);
  return *stack;
}

nlohmann::ordered_json HostSnapshot() { return SnapshotDocument(HostPool().Snapshot()); }

}  // namespace actpack::allocator
