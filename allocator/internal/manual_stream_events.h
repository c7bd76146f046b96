// manual_stream_events.h — StreamEvents whose completion a test controls.
//
// Host streams have no asynchronous work, so HostStreamEvents completes every event at once and
// the caching pool's "wait for other streams" path never runs. ManualStreamEvents lets a test say
// when a stream has caught up: events recorded on a stream complete when the test calls
// CompleteStream (or, with set_complete_after_queries, after a number of queries, which makes the
// waiting path run by itself under stress). Waiting for an event completes it, as a host
// synchronisation would.
//
// Example:
//   ManualStreamEvents events;
//   CachingPool pool(&host, &events);
//   ...  // free a block recorded on stream B
//   events.CompleteStream(B);  // now the block can be reused
#ifndef ACTPACK_ALLOCATOR_INTERNAL_MANUAL_STREAM_EVENTS_H_
#define ACTPACK_ALLOCATOR_INTERNAL_MANUAL_STREAM_EVENTS_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>

#include "absl/status/status.h"
#include "allocator/stream_events.h"

namespace actpack::allocator::internal {

class ManualStreamEvents final : public StreamEvents {
 public:
  absl::StatusOr<Event> Record(Stream stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fail_records_) return absl::InternalError("recording an event failed (test)");
    ++recorded_;
    ++live_;
    return static_cast<Event>(new ManualEvent{stream, ++sequence_[stream], 0});
  }

  bool IsComplete(Event event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto* e = static_cast<ManualEvent*>(event);
    if (complete_after_queries_ > 0 && ++e->queries >= complete_after_queries_) {
      CompleteUpTo(e->stream, e->sequence);
    }
    return completed_[e->stream] >= e->sequence;
  }

  void Wait(Event event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto* e = static_cast<ManualEvent*>(event);
    ++waits_;
    CompleteUpTo(e->stream, e->sequence);
  }

  // The stream does not catch up: it is ordered behind the event, which stays pending.
  absl::Status StreamWait(Stream stream, Event event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fail_stream_waits_) return absl::InternalError("ordering a stream failed (test)");
    ++stream_waits_;
    return absl::OkStatus();
  }

  void Release(Event event) override {
    std::lock_guard<std::mutex> lock(mutex_);
    --live_;
    delete static_cast<ManualEvent*>(event);
  }

  // Completes every event recorded on `stream` so far.
  void CompleteStream(Stream stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    CompleteUpTo(stream, sequence_[stream]);
  }

  // From now on an event completes by itself on its `queries`-th IsComplete (0: never).
  void set_complete_after_queries(int queries) {
    std::lock_guard<std::mutex> lock(mutex_);
    complete_after_queries_ = queries;
  }

  void set_fail_records(bool fail) {
    std::lock_guard<std::mutex> lock(mutex_);
    fail_records_ = fail;
  }

  void set_fail_stream_waits(bool fail) {
    std::lock_guard<std::mutex> lock(mutex_);
    fail_stream_waits_ = fail;
  }

  int64_t recorded() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return recorded_;
  }
  int64_t live() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_;
  }
  int64_t waits() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return waits_;
  }
  // StreamWait calls that ordered a stream (no host wait).
  int64_t stream_waits() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stream_waits_;
  }

 private:
  struct ManualEvent {
    Stream stream;
    uint64_t sequence;
    int queries;
  };

  void CompleteUpTo(Stream stream, uint64_t sequence) {
    completed_[stream] = std::max(completed_[stream], sequence);
  }

  mutable std::mutex mutex_;
  std::map<Stream, uint64_t> sequence_;   // events recorded per stream
  std::map<Stream, uint64_t> completed_;  // events completed per stream, in order
  int complete_after_queries_ = 0;
  bool fail_records_ = false;
  bool fail_stream_waits_ = false;
  int64_t recorded_ = 0;
  int64_t live_ = 0;
  int64_t waits_ = 0;
  int64_t stream_waits_ = 0;
};

}  // namespace actpack::allocator::internal

#endif  // ACTPACK_ALLOCATOR_INTERNAL_MANUAL_STREAM_EVENTS_H_
