// actpack's host pool (allocator/host_pool.h) as torch's CPU allocator, so that CPU
// training runs through the same pool, budget and statistics as the CUDA path. Shared by the
// Python bindings (actpack.install_cpu_allocator) and the C++ guard actpack::Budget.
#ifndef ACTPACK_TORCH_PLUGIN_CSRC_CPU_ALLOCATOR_H_
#define ACTPACK_TORCH_PLUGIN_CSRC_CPU_ALLOCATOR_H_

#include <cstddef>
#include <optional>

namespace actpack::torch_plugin {

// Serves every new CPU tensor from the host pool (a no-op when it does already). Throws when
// another allocator registered for the CPU with a higher priority keeps ours out.
void InstallCpuAllocator();

// Gives CPU allocation back to the allocator torch had before; false if ours was not installed.
// Tensors the pool allocated stay valid and return to it when freed.
bool UninstallCpuAllocator();

bool CpuAllocatorInstalled();

// Caps the host pool's reserved bytes (nullopt: no cap); configures it before its first
// allocation, re-budgets it after.
void SetHostBudget(std::optional<size_t> budget);

}  // namespace actpack::torch_plugin

#endif  // ACTPACK_TORCH_PLUGIN_CSRC_CPU_ALLOCATOR_H_
