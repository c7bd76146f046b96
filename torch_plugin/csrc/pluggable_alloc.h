// The allocation function torch's CUDAPluggableAllocator calls when actpack's allocator is
// torch's (actpack.install_allocator): allocator/pluggable.h's C ABI, except that a request
// that fails throws the PyTorch error instead of returning nullptr.
//
// torch's CUDAPluggableAllocator wraps whatever its alloc_fn returns in a DataPtr without a
// check: a nullptr there is a tensor at address 0, and the first kernel that touches it ends
// the process's CUDA context (cudaErrorIllegalAddress). An exception thrown from alloc_fn passes
// through torch's allocator before it records anything, and reaches Python as the exception
// type torch maps it to: c10::OutOfMemoryError is torch.OutOfMemoryError, which is what
// training loops, Lightning and the Trainer catch.
//
// A torch.cuda.MemPool region (actpack.mem_pool) keeps allocator/pluggable.h's actpack_alloc:
// there torch's own caching allocator calls it for segments, and on a nullptr gives back the
// region's cached blocks and retries before it raises torch.OutOfMemoryError itself.
#ifndef ACTPACK_TORCH_PLUGIN_CSRC_PLUGGABLE_ALLOC_H_
#define ACTPACK_TORCH_PLUGIN_CSRC_PLUGGABLE_ALLOC_H_

#include <cstddef>
#include <optional>
#include <string>

extern "C" {
// alloc_fn for torch.cuda.memory.CUDAPluggableAllocator: `size` bytes on CUDA device `device`
// for use on `stream` (a cudaStream_t), from allocator::DeviceAllocator(device). Throws
// c10::OutOfMemoryError when the device or its budget cannot hold the request (the message
// starts "CUDA out of memory." as torch's own does, then gives actpack's reason whole: what was
// requested, in use and cached, the budget and the smallest budget that would have fitted),
// c10::ValueError for a device outside actpack's range, c10::Error for any other failure.
// Never returns nullptr for a request of a byte or more.
void* actpack_torch_alloc(size_t size, int device, void* stream);
}

namespace actpack::torch_plugin {

// Why the last actpack_torch_alloc that failed did ("" when none failed since the last one
// that succeeded), or nullopt when actpack_torch_alloc has not been called in this process. One
// per process, not per thread: backward allocates on autograd's device threads, and the reason
// is read on the thread that catches the error.
std::optional<std::string> LastTorchAllocError();

}  // namespace actpack::torch_plugin

#endif  // ACTPACK_TORCH_PLUGIN_CSRC_PLUGGABLE_ALLOC_H_
