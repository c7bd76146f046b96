// host_pool.h — the process-wide host stack, for torch's CPU allocator (c10::SetAllocator),
// so that CPU training runs through the same pool, budget and statistics as the device.
//
// Example:
//   AllocatorStack& host = HostPool();
//   absl::StatusOr<void*> p = host.Allocate(nbytes);
//   host.Free(*p);  // size looked up: c10's deleter only has the pointer
#ifndef ACTPACK_ALLOCATOR_HOST_POOL_H_
#define ACTPACK_ALLOCATOR_HOST_POOL_H_

#include <cstddef>

#include "absl/status/status.h"
#include "allocator/allocator_stack.h"
#include "nlohmann/json.hpp"

namespace actpack::allocator {

// ConfigureHostPool
//
// Sets the budget and trace of the host pool (the backend is always the host).
// kFailedPrecondition once HostPool() has been called.
absl::Status ConfigureHostPool(size_t budget_bytes,
                               size_t trace_capacity = TracingAdaptor::kDefaultCapacity,
                               bool record_trace = true);

// HostPool
//
// The process-wide host stack, built on first call. Never destroyed, so that memory freed during
// process exit (static tensors) still has its allocator.
AllocatorStack& HostPool();

// HostSnapshot
//
// A snapshot of the host pool (as device 0), shaped like torch.cuda.memory._snapshot().
nlohmann::ordered_json HostSnapshot();

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_HOST_POOL_H_
