// pluggable.h — the C ABI torch.cuda.memory.CUDAPluggableAllocator loads: the device stacks of
// device_allocator.h behind the signatures torch expects (stream is a cudaStream_t). On failure
// actpack_alloc returns nullptr and actpack_last_error() tells why, on any thread: backward
// allocates on autograd's device threads, and the error is read on the thread that called
// backward.
#ifndef ACTPACK_ALLOCATOR_PLUGGABLE_H_
#define ACTPACK_ALLOCATOR_PLUGGABLE_H_

#include <cstddef>

extern "C" {
void* actpack_alloc(size_t size, int device, void* stream);
void actpack_free(void* ptr, size_t size, int device, void* stream);
// init_fn: torch passes the number of devices.
void actpack_init(int device_count);
// reset_fn: torch.cuda.empty_cache().
void actpack_empty_cache(void);
// memory_fraction_fn: torch.cuda.set_per_process_memory_fraction(fraction, device): the budget
// becomes `fraction` of the device's total memory.
void actpack_memory_fraction(double fraction, int device);
// record_stream_fn: Tensor.record_stream(stream).
void actpack_record_stream(void* ptr, void* stream);
// base_alloc_fn: torch's getBaseAllocation (CUDA IPC shares whole segments): the start of the
// segment holding `ptr`, its size in *size. `ptr` itself, *size untouched, when no device stack
// holds it (torch's answer when no hook is set).
void* actpack_base_alloc(void* ptr, size_t* size);
// Why the most recent failing call to actpack_alloc, actpack_memory_fraction,
// actpack_record_stream or actpack_base_alloc in this process failed, whichever thread made
// it; "" when none failed or a later one succeeded. The string stays valid until this thread
// calls actpack_last_error or actpack_last_device_error again. (Two threads that each need
// their own call's outcome use device_allocator.h's C++ calls, which return it.)
const char* actpack_last_error(void);
// The same for the calls about `device` (actpack_alloc and actpack_memory_fraction on it, and
// record_stream and base_alloc calls that found their pointer on it); "" for a device outside
// [0, 64).
const char* actpack_last_device_error(int device);
}


#endif  // ACTPACK_ALLOCATOR_PLUGGABLE_H_
