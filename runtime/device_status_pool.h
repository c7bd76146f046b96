// The DeviceStatus of every tensor the session packs on a GPU (codecs/deferred.h), and the one
// read-back per step that tells the host what they say.
//
// Statuses live in chunks of device memory from the session's allocator (so they count against
// the budget like the buffers), each mirrored in pinned host memory. A slot is taken when a
// tensor is packed and given back when the packed tensor is released; it is handed out again
// only after the next Collect, whose wait orders every kernel that wrote it.
//
// Nothing here waits for the device except Collect: MirrorOne queues a copy of one status into
// its mirror with an event behind it, and Ready asks that event (a query, never a wait). The
// profile steps' samples of saved tensors come to the host the same way: StageSample queues a
// copy into pinned memory, which Collect's one wait completes. Device memory is taken from the
// factory with no lock held (an allocation at the budget's cap calls the runtime back on this
// thread). Without CUDA compiled in, Acquire says so and nothing else is reachable.
//
// Usage (the session, for a CUDA tensor):
//   absl::StatusOr<DeviceStatusPool::Slot> slot = pool.Acquire(context);
//   codecs::EncodeDeferred(..., slot->device);
//   ... end of step: pool.Collect(); then pool.Mirror(*slot).failures ...
//   pool.Release(*slot);
#ifndef ACTPACK_RUNTIME_DEVICE_STATUS_POOL_H_
#define ACTPACK_RUNTIME_DEVICE_STATUS_POOL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codecs/codec.h"
#include "common/checked_mutex.h"
#include "runtime/buffer.h"

namespace actpack::runtime {

class DeviceStatusPool {
 public:
  struct Slot {
    int chunk = -1;
    int index = -1;
    codecs::DeviceStatus* device = nullptr;
    bool valid() const { return chunk >= 0; }
  };

  // Statuses per chunk: 8 KiB of device memory and as much pinned host memory.
  static constexpr int kSlotsPerChunk = 64;

  // Device memory comes from `factory` on the device of the first Acquire's context.
  explicit DeviceStatusPool(BufferFactory factory);
  ~DeviceStatusPool();
  DeviceStatusPool(const DeviceStatusPool&) = delete;
  DeviceStatusPool& operator=(const DeviceStatusPool&) = delete;

  // A slot for a tensor packed on `context`'s stream (the encode zeroes it). A new chunk takes
  // device memory from the factory and pinned memory from cudaHostAlloc: only while the pool
  // grows (the first steps), never once every slot a step needs has been made.
  absl::StatusOr<Slot> Acquire(const codecs::ExecContext& context);

  // Gives the slot back; it is handed out again after the next Collect.
  void Release(const Slot& slot);

  // Queues a copy of `from`'s status into `to` on `stream`: a decode's own slot starts as its
  // encode's (the parameters the device decided), and what the decode writes (its check's sum,
  // its failures) stays in it, so two decodes of one tensor never sum into one slot.
  absl::Status CopyStatus(const Slot& from, const Slot& to, void* stream);

  // A sample of a saved tensor for the profile steps' measurements: `bytes` at `device` copied
  // into pinned host memory on `stream` (queued: no wait), complete after the next Collect.
  // The staging memory grows in chunks while the first profile steps need it and is reused
  // after; kUnavailable past kMaxStagedBytes (the sample is then left for a later step).
  static constexpr size_t kMaxStagedBytes = size_t{64} << 20;
  struct Sample {
    const uint8_t* host = nullptr;
    int chunk = -1;
  };
  absl::StatusOr<Sample> StageSample(const void* device, size_t bytes, void* stream);
  // Queues zeros over `bytes` of device memory at `device` on `stream`.
  static absl::Status ZeroOnStream(void* device, size_t bytes, void* stream);

  // Gives a sample's staging memory back (after the Collect that completed it, once measured).
  void ReleaseSample(const Sample& sample);

  // Notes a stream that ran deferred work on slots this step: Collect orders its work first.
  void UseStream(void* stream);

  // Queues a copy of one slot's status into its mirror on `stream`, and an event behind it.
  absl::Status MirrorOne(const Slot& slot, void* stream);
  // Whether that copy is done (cudaEventQuery: never waits); false when none was queued.
  bool Ready(const Slot& slot);

  // Makes `waiting` run its next work after everything queued on `producer` so far (an event
  // and cudaStreamWaitEvent: no host wait). A tensor packed on one stream and unpacked on
  // another is decoded after its encode.
  absl::Status Order(void* waiting, void* producer);

  // The codecs' time on the device, measured where the caller asks (the session: on profile
  // steps): events around a slot's encode or decode. Collect reads them (after its wait).
  enum Phase { kEncode = 0, kDecode = 1 };
  absl::Status TimeBegin(const Slot& slot, Phase phase, void* stream);
  absl::Status TimeEnd(const Slot& slot, Phase phase, void* stream);
  // What the timed encodes and decodes took, read by the Collects since the last call.
  uint64_t TakeCodecNanoseconds();

  // Copies every chunk into its mirror behind the work of every stream used since the last
  // Collect, and waits once. Afterwards Mirror() holds every slot's status as the device left
  // it, and slots released before are free again.
  absl::Status Collect();

  // A slot's status as last copied to the host (by Collect, or MirrorOne once Ready).
  const codecs::DeviceStatus& Mirror(const Slot& slot) const;

  // Host waits this pool has made (Collect's), for the report.
  uint64_t waits() const;

  // Slots handed out and not given back (a leak shows here).
  uint64_t slots_in_use() const;

 private:
  struct Chunk;
  struct Staging;
  Slot TakeFreeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UseStreamLocked(void* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  BufferFactory factory_;
  mutable CheckedMutex mu_{"runtime::DeviceStatusPool::mu_"};
  std::vector<std::unique_ptr<Chunk>> chunks_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> free_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> released_ ABSL_GUARDED_BY(mu_);  // free after the next Collect
  std::vector<void*> streams_ ABSL_GUARDED_BY(mu_);  // used since the last Collect
  std::vector<std::unique_ptr<Staging>> staging_ ABSL_GUARDED_BY(mu_);
  int device_index_ ABSL_GUARDED_BY(mu_) = -1;
  void* order_event_ ABSL_GUARDED_BY(mu_) = nullptr;  // Order's, made on first use
  uint64_t waits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t codec_nanoseconds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace actpack::runtime

#endif  // ACTPACK_RUNTIME_DEVICE_STATUS_POOL_H_
