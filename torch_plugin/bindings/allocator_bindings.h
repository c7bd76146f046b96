// actpack._C's allocator functions: actpack's host pool as torch's CPU allocator, and the
// configuration, statistics and snapshots of the process-wide stacks (allocator/device_allocator.h, allocator/host_pool.h).
// torch_plugin/python/actpack/memory.py is the Python API over them.
#ifndef ACTPACK_TORCH_PLUGIN_BINDINGS_ALLOCATOR_BINDINGS_H_
#define ACTPACK_TORCH_PLUGIN_BINDINGS_ALLOCATOR_BINDINGS_H_

#include <pybind11/pybind11.h>

namespace actpack::torch_plugin {

// BindAllocator
//
// Adds the allocator functions (all named `_...`: private to the actpack package) to `m`.
void BindAllocator(pybind11::module& m);

}  // namespace actpack::torch_plugin

#endif  // ACTPACK_TORCH_PLUGIN_BINDINGS_ALLOCATOR_BINDINGS_H_
