// actpack._C.SavedTensorHooks, the Python layer of the saved-tensor session: torch_plugin's
// SavedTensorPacker (saved_tensors.h, the torch layer, over the runtime's runtime::Session)
// behind Python's saved_tensors_hooks.
//
// Its pack and unpack run once per saved tensor, so they are plain CPython functions
// (SavedTensorHooks.hooks()), not pybind11 methods: pybind11's dispatch and its instance registry cost
// more than the rest of a small tensor's hook. pack(tensor, module) returns the tensor itself
// when it is kept, or an opaque actpack._C.PackedTensor; unpack(handle) turns either back into
// a tensor.
#ifndef ACTPACK_TORCH_PLUGIN_BINDINGS_SAVED_TENSOR_HOOKS_BINDINGS_H_
#define ACTPACK_TORCH_PLUGIN_BINDINGS_SAVED_TENSOR_HOOKS_BINDINGS_H_

#include <torch/extension.h>

namespace actpack::torch_plugin {

// Binds actpack._C.SavedTensorHooks, actpack._C.PackedTensor and actpack._C.build_report(run,
// hooks), the run report (without its allocator section) under the caller's run metadata.
void BindSavedTensorHooks(pybind11::module_& m);

}  // namespace actpack::torch_plugin

#endif  // ACTPACK_TORCH_PLUGIN_BINDINGS_SAVED_TENSOR_HOOKS_BINDINGS_H_
