// pressure_callbacks.h — the runtime's way to make room when a process-wide stack's budget
// refuses a request: callbacks registered by device index (kHostDevice: the host pool), before
// or after that stack is built.
#ifndef ACTPACK_ALLOCATOR_PRESSURE_CALLBACKS_H_
#define ACTPACK_ALLOCATOR_PRESSURE_CALLBACKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/allocator_stack.h"

namespace actpack::allocator {

using PressureCallbackId = int64_t;

// RegisterPressureCallback
//
// Registers `callback` (see BudgetAdaptor::PressureCallback: called with the bytes a request
// lacks, returns the bytes it freed) with the budget of the host pool (`device` kHostDevice) or
// of device `device`'s stack. A stack that is not built yet gets the callback when it is built,
// so the runtime can register at start without building a stack (which would freeze its
// configuration). Callbacks of one stack run in registration order. Returns the id that
// unregisters it; kInvalidArgument for a device outside [-1, kMaxDevices).
//
// Example:
//   absl::StatusOr<PressureCallbackId> id = RegisterPressureCallback(
//       0, [&](size_t needed) { return session.CompressHarder(needed); });
//   ...
//   UnregisterPressureCallback(*id);
absl::StatusOr<PressureCallbackId> RegisterPressureCallback(
    int device, BudgetAdaptor::PressureCallback callback);

// UnregisterPressureCallback
//
// Removes a callback; as BudgetAdaptor::RemovePressureCallback, a run already started on another
// thread finishes, and no new one starts. kNotFound for an id that is not registered.
absl::Status UnregisterPressureCallback(PressureCallbackId id);

// For the builders of the process-wide stacks (device_allocator.cc, host_pool.cc):

// AttachPressureCallbacks
//
// `stack` is now `device`'s (kHostDevice: the host pool's): the callbacks registered for it so
// far are added to its budget, and later registrations go straight to it. Call right after
// publishing the stack.
void AttachPressureCallbacks(int device, AllocatorStack* stack);

// DetachDevicePressureCallbacks
//
// The device stacks were destroyed (tests): their registrations wait for the next ones.
void DetachDevicePressureCallbacks();

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_PRESSURE_CALLBACKS_H_
