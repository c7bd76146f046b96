#include "allocator/pressure_callbacks.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace actpack::allocator {

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
  // The built stacks, by device + 1 (0: the host pool), as their builders attached them.
  std::array<AllocatorStack*, kMaxDevices + 1> built{};
};

PressureRegistry& Registry() {
  static auto* registry = new PressureRegistry;
  return *registry;
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
  if (AllocatorStack* stack = registry.built[device + 1]) {
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

void AttachPressureCallbacks(int device, AllocatorStack* stack) {
  PressureRegistry& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.built[device + 1] = stack;
  for (auto& [id, entry] : registry.entries) {
    if (entry.device != device || entry.stack != nullptr) continue;
    entry.adaptor_id = stack->budget().AddPressureCallback(entry.callback);
    entry.stack = stack;
  }
}

void DetachDevicePressureCallbacks() {
  PressureRegistry& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  std::fill(registry.built.begin() + 1, registry.built.end(), nullptr);
  for (auto& [id, entry] : registry.entries) {
    if (entry.device != kHostDevice) entry.stack = nullptr;
  }
}

}  // namespace actpack::allocator
