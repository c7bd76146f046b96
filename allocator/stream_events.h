// stream_events.h — events that tell the caching pool when other streams are done with a block.
//
// A block the caller used on other streams (CachingPool::RecordStream) may only be reused after
// the work enqueued on those streams before the free has finished. The pool records an event on
// each such stream at free time and reuses the block once every event has completed. The events
// come from a StreamEvents implementation matching the backend: CudaStreamEvents (cudaEvent_t)
// for device memory, HostStreamEvents for host memory, where there is no asynchronous work.
//
// Example:
//   HostStreamEvents events;
//   absl::StatusOr<StreamEvents::Event> e = events.Record(stream);
//   if (e.ok() && events.IsComplete(*e)) events.Release(*e);
#ifndef ACTPACK_ALLOCATOR_STREAM_EVENTS_H_
#define ACTPACK_ALLOCATOR_STREAM_EVENTS_H_

#include "absl/status/statusor.h"
#include "allocator/memory_resource.h"

namespace actpack::allocator {

// StreamEvents
//
// Record, query, wait for and release events on streams. Thread safe.
class StreamEvents {
 public:
  using Event = void*;

  virtual ~StreamEvents() = default;

  // Records an event after the work enqueued on `stream` so far.
  virtual absl::StatusOr<Event> Record(Stream stream) = 0;

  // True once the work before `event` has finished. An implementation that cannot tell (a device
  // error) waits for the event instead of answering false forever.
  virtual bool IsComplete(Event event) = 0;

  // Blocks until the work before `event` has finished.
  virtual void Wait(Event event) = 0;

  // StreamWait
  //
  // Orders the work enqueued on `stream` after this call behind the work before `event`,
  // without blocking the host (cudaStreamWaitEvent); `event` may be released right after. How
  // the caching pool hands a block whose other streams have not caught up to its own stream at
  // the limit, where it used to wait. An error leaves nothing ordered: the caller falls back to
  // Wait. The default blocks the host (Wait), which orders the same work for any
  // implementation.
  virtual absl::Status StreamWait(Stream stream, Event event) {
    Wait(event);
    return absl::OkStatus();
  }

  // Frees the event; it must not be used afterwards.
  virtual void Release(Event event) = 0;
};

// HostStreamEvents
//
// Host memory has no asynchronous work: every event has completed when it is recorded.
class HostStreamEvents final : public StreamEvents {
 public:
  absl::StatusOr<Event> Record(Stream stream) override { return nullptr; }
  bool IsComplete(Event event) override { return true; }
  void Wait(Event event) override {}
  absl::Status StreamWait(Stream stream, Event event) override { return absl::OkStatus(); }
  void Release(Event event) override {}
};

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_STREAM_EVENTS_H_
