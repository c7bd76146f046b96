#include "torch_plugin/csrc/cpu_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <mutex>

#include "absl/status/status.h"
#include "allocator/host_memory_resource.h"
#include "allocator/host_pool.h"
#include "torch_plugin/csrc/tensor_adapter.h"

namespace actpack::torch_plugin {
namespace {

void FreeToHostPool(void* ptr) {
  if (ptr != nullptr) allocator::HostPool().Free(ptr);
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
    absl::StatusOr<void*> ptr = allocator::HostPool().Allocate(nbytes);
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

}  // namespace

void InstallCpuAllocator() {
  CpuInstallState& state = CpuState();
  std::lock_guard<std::mutex> lock(state.mutex);
  c10::Allocator* current = c10::GetAllocator(c10::DeviceType::CPU);
  if (current == &TheHostPoolAllocator()) return;
  // The budget is what the operating system sees: what other code frees goes back to it too.
  allocator::LimitMallocRetention();
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

// The host pool is configured before its first allocation and re-budgeted after.
void SetHostBudget(std::optional<size_t> budget) {
  const size_t bytes = budget.value_or(allocator::kNoCap);
  const absl::Status configured = allocator::ConfigureHostPool(bytes);
  if (absl::IsFailedPrecondition(configured)) {
    allocator::HostPool().budget().SetBudget(bytes);
    return;
  }
  ThrowIfError(configured);
}

}  // namespace actpack::torch_plugin
