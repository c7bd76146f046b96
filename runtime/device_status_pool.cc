#include "runtime/device_status_pool.h"

#include <algorithm>
#include <utility>

#ifdef ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>

#include "common/cuda_check.h"
#endif

namespace actpack::runtime {

#ifdef ACTPACK_WITH_CUDA

namespace {

// Makes `device` current for the scope (Collect may run on a thread whose current device is
// another).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess || previous_ == device) {
      previous_ = -1;
      return;
    }
    cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

}  // namespace

struct DeviceStatusPool::Chunk {
  std::unique_ptr<Buffer> device;            // kSlotsPerChunk statuses
  codecs::DeviceStatus* mirror = nullptr;    // pinned
  cudaEvent_t mirrored[kSlotsPerChunk] = {};  // MirrorOne's events, made on first use
  bool pending[kSlotsPerChunk] = {};          // a MirrorOne not yet seen Ready
  // TimeBegin/TimeEnd's events per slot: [phase][begin, end], made on first use; which phases
  // were timed since the last Collect.
  cudaEvent_t timing[kSlotsPerChunk][2][2] = {};
  bool timed[kSlotsPerChunk][2] = {};

  ~Chunk() {
    for (cudaEvent_t event : mirrored) {
      if (event != nullptr) cudaEventDestroy(event);
    }
    for (auto& slot : timing) {
      for (auto& phase : slot) {
        for (cudaEvent_t event : phase) {
          if (event != nullptr) cudaEventDestroy(event);
        }
      }
    }
    if (mirror != nullptr) cudaFreeHost(mirror);
  }
  codecs::DeviceStatus* Device(int index) const {
    return reinterpret_cast<codecs::DeviceStatus*>(device->data()) + index;
  }
};

DeviceStatusPool::DeviceStatusPool(BufferFactory factory) : factory_(std::move(factory)) {}

DeviceStatusPool::~DeviceStatusPool() {
  CheckedLock lock(&mu_);
  if (device_index_ >= 0) {
    DeviceScope scope(device_index_);
    // Work queued on the statuses may still run: let it finish before the memory goes.
    for (void* stream : streams_) cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
    chunks_.clear();
  }
  if (order_event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(order_event_));
}

absl::Status DeviceStatusPool::Order(void* waiting, void* producer) {
  if (waiting == producer) return absl::OkStatus();
  CheckedLock lock(&mu_);
  if (order_event_ == nullptr) {
    cudaEvent_t event;
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    order_event_ = event;
  }
  const cudaEvent_t event = static_cast<cudaEvent_t>(order_event_);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, static_cast<cudaStream_t>(producer)));
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiting), event, 0));
  return absl::OkStatus();
}

absl::StatusOr<DeviceStatusPool::Slot> DeviceStatusPool::Acquire(
    const codecs::ExecContext& context) {
  {
    CheckedLock lock(&mu_);
    if (device_index_ < 0) device_index_ = context.device_index;
    if (context.device_index != device_index_) {
      return absl::InvalidArgumentError(
          "actpack: a device status pool serves one device; this tensor is on another");
    }
    if (!free_.empty()) return TakeFreeLocked();
  }
  // A new chunk, made with no lock held: its device memory comes from the budget's allocator,
  // which may call the runtime back on this thread (pressure relief) before it returns.
  CheckNoneHeld("allocating device statuses");
  auto chunk = std::make_unique<Chunk>();
  absl::StatusOr<std::unique_ptr<Buffer>> memory =
      factory_(kSlotsPerChunk * sizeof(codecs::DeviceStatus), context);
  if (!memory.ok()) return memory.status();
  chunk->device = std::move(*memory);
  void* mirror = nullptr;
  ACTPACK_CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&mirror, kSlotsPerChunk * sizeof(codecs::DeviceStatus), 0));
  chunk->mirror = static_cast<codecs::DeviceStatus*>(mirror);
  CheckedLock lock(&mu_);
  const int c = static_cast<int>(chunks_.size());
  chunks_.push_back(std::move(chunk));
  // Handed out from the front: the free list is popped from the back.
  for (int i = kSlotsPerChunk - 1; i >= 0; --i) {
    free_.push_back(Slot{c, i, chunks_[c]->Device(i)});
  }
  return TakeFreeLocked();
}

DeviceStatusPool::Slot DeviceStatusPool::TakeFreeLocked() {
  const Slot slot = free_.back();
  free_.pop_back();
  chunks_[slot.chunk]->pending[slot.index] = false;
  return slot;
}

absl::Status DeviceStatusPool::CopyStatus(const Slot& from, const Slot& to, void* stream) {
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(to.device, from.device,
                                               sizeof(codecs::DeviceStatus),
                                               cudaMemcpyDeviceToDevice,
                                               static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

// Pinned host memory samples are copied into: bump-allocated, reused once every sample in it
// has been given back.
struct DeviceStatusPool::Staging {
  static constexpr size_t kBytes = size_t{8} << 20;
  uint8_t* host = nullptr;
  size_t size = 0;
  size_t used = 0;
  int live = 0;
  ~Staging() {
    if (host != nullptr) cudaFreeHost(host);
  }
};

absl::StatusOr<DeviceStatusPool::Sample> DeviceStatusPool::StageSample(const void* device,
                                                                       size_t bytes,
                                                                       void* stream) {
  CheckedLock lock(&mu_);
  // 256-byte aligned, as any element type wants.
  const size_t rounded = (bytes + 255) / 256 * 256;
  int chosen = -1;
  size_t total = 0;
  for (size_t i = 0; i < staging_.size(); ++i) {
    total += staging_[i]->size;
    if (chosen < 0 && staging_[i]->size - staging_[i]->used >= rounded) chosen = static_cast<int>(i);
  }
  if (chosen < 0) {
    const size_t size = std::max(Staging::kBytes, rounded);
    if (total + size > kMaxStagedBytes) {
      return absl::UnavailableError(
          "actpack: the profile step's samples fill their staging memory");
    }
    auto staging = std::make_unique<Staging>();
    void* host = nullptr;
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&host, size, 0));
    staging->host = static_cast<uint8_t*>(host);
    staging->size = size;
    staging_.push_back(std::move(staging));
    chosen = static_cast<int>(staging_.size() - 1);
  }
  Staging& staging = *staging_[chosen];
  uint8_t* host = staging.host + staging.used;
  // Pinned destination: queued, no wait; Collect's wait orders it (the stream is noted).
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost,
                                               static_cast<cudaStream_t>(stream)));
  staging.used += rounded;
  ++staging.live;
  UseStreamLocked(stream);
  return Sample{host, chosen};
}

absl::Status DeviceStatusPool::ZeroOnStream(void* device, size_t bytes, void* stream) {
  ACTPACK_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(device, 0, bytes, static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

void DeviceStatusPool::ReleaseSample(const Sample& sample) {
  if (sample.chunk < 0) return;
  CheckedLock lock(&mu_);
  Staging& staging = *staging_[sample.chunk];
  if (--staging.live == 0) staging.used = 0;
}

void DeviceStatusPool::Release(const Slot& slot) {
  if (!slot.valid()) return;
  CheckedLock lock(&mu_);
  released_.push_back(slot);
}

void DeviceStatusPool::UseStream(void* stream) {
  CheckedLock lock(&mu_);
  UseStreamLocked(stream);
}

void DeviceStatusPool::UseStreamLocked(void* stream) {
  for (void* known : streams_) {
    if (known == stream) return;
  }
  streams_.push_back(stream);
}

absl::Status DeviceStatusPool::MirrorOne(const Slot& slot, void* stream) {
  CheckedLock lock(&mu_);
  Chunk& chunk = *chunks_[slot.chunk];
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaEvent_t& event = chunk.mirrored[slot.index];
  if (event == nullptr) {
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  // Pinned destination: queued, no wait.
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(chunk.mirror + slot.index, slot.device,
                                               sizeof(codecs::DeviceStatus),
                                               cudaMemcpyDeviceToHost, s));
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, s));
  chunk.pending[slot.index] = true;
  return absl::OkStatus();
}

bool DeviceStatusPool::Ready(const Slot& slot) {
  CheckedLock lock(&mu_);
  Chunk& chunk = *chunks_[slot.chunk];
  if (!chunk.pending[slot.index]) return false;
  return cudaEventQuery(chunk.mirrored[slot.index]) == cudaSuccess;
}

absl::Status DeviceStatusPool::TimeBegin(const Slot& slot, Phase phase, void* stream) {
  CheckedLock lock(&mu_);
  Chunk& chunk = *chunks_[slot.chunk];
  for (cudaEvent_t& event : chunk.timing[slot.index][phase]) {
    if (event == nullptr) ACTPACK_CUDA_RETURN_IF_ERROR(cudaEventCreate(&event));
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(
      cudaEventRecord(chunk.timing[slot.index][phase][0], static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

absl::Status DeviceStatusPool::TimeEnd(const Slot& slot, Phase phase, void* stream) {
  CheckedLock lock(&mu_);
  Chunk& chunk = *chunks_[slot.chunk];
  ACTPACK_CUDA_RETURN_IF_ERROR(
      cudaEventRecord(chunk.timing[slot.index][phase][1], static_cast<cudaStream_t>(stream)));
  chunk.timed[slot.index][phase] = true;
  return absl::OkStatus();
}

uint64_t DeviceStatusPool::TakeCodecNanoseconds() {
  CheckedLock lock(&mu_);
  const uint64_t taken = codec_nanoseconds_;
  codec_nanoseconds_ = 0;
  return taken;
}

absl::Status DeviceStatusPool::Collect() {
  CheckedLock lock(&mu_);
  if (streams_.empty()) return absl::OkStatus();
  DeviceScope scope(device_index_);
  // The last stream copies, behind the others' work (stream-ordered: no host wait).
  const cudaStream_t copier = static_cast<cudaStream_t>(streams_.back());
  for (size_t i = 0; i + 1 < streams_.size(); ++i) {
    cudaEvent_t done;
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    cudaError_t error = cudaEventRecord(done, static_cast<cudaStream_t>(streams_[i]));
    if (error == cudaSuccess) error = cudaStreamWaitEvent(copier, done, 0);
    cudaEventDestroy(done);
    ACTPACK_CUDA_RETURN_IF_ERROR(error);
  }
  for (const std::unique_ptr<Chunk>& chunk : chunks_) {
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(chunk->mirror, chunk->device->data(),
                                                 kSlotsPerChunk * sizeof(codecs::DeviceStatus),
                                                 cudaMemcpyDeviceToHost, copier));
  }
  // The step's one wait.
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copier));
  ++waits_;
  for (const std::unique_ptr<Chunk>& chunk : chunks_) {
    for (int i = 0; i < kSlotsPerChunk; ++i) {
      for (int phase = 0; phase < 2; ++phase) {
        if (!chunk->timed[i][phase]) continue;
        chunk->timed[i][phase] = false;
        float ms = 0;
        // Every stream's work before the copies is done: the events have been reached.
        if (cudaEventElapsedTime(&ms, chunk->timing[i][phase][0], chunk->timing[i][phase][1]) ==
            cudaSuccess) {
          codec_nanoseconds_ += static_cast<uint64_t>(ms * 1e6);
        }
      }
    }
  }
  streams_.clear();
  for (const Slot& slot : released_) {
    chunks_[slot.chunk]->pending[slot.index] = false;
    free_.push_back(slot);
  }
  released_.clear();
  return absl::OkStatus();
}

const codecs::DeviceStatus& DeviceStatusPool::Mirror(const Slot& slot) const {
  CheckedLock lock(&mu_);
  return chunks_[slot.chunk]->mirror[slot.index];
}

uint64_t DeviceStatusPool::waits() const {
  CheckedLock lock(&mu_);
  return waits_;
}

uint64_t DeviceStatusPool::slots_in_use() const {
  CheckedLock lock(&mu_);
  return chunks_.size() * kSlotsPerChunk - free_.size() - released_.size();
}

#else  // !ACTPACK_WITH_CUDA

struct DeviceStatusPool::Chunk {};
struct DeviceStatusPool::Staging {};

DeviceStatusPool::DeviceStatusPool(BufferFactory factory) : factory_(std::move(factory)) {}
DeviceStatusPool::~DeviceStatusPool() = default;

absl::StatusOr<DeviceStatusPool::Slot> DeviceStatusPool::Acquire(const codecs::ExecContext&) {
  return absl::UnimplementedError(
      "actpack: packing a CUDA tensor needs CUDA support, which is not compiled into this build");
}
void DeviceStatusPool::Release(const Slot&) {}
absl::Status DeviceStatusPool::CopyStatus(const Slot&, const Slot&, void*) {
  return absl::OkStatus();
}
absl::StatusOr<DeviceStatusPool::Sample> DeviceStatusPool::StageSample(const void*, size_t,
                                                                       void*) {
  return absl::UnimplementedError("actpack: staging a sample needs CUDA");
}
absl::Status DeviceStatusPool::ZeroOnStream(void*, size_t, void*) {
  return absl::UnimplementedError("actpack: zeroing device memory needs CUDA");
}
void DeviceStatusPool::ReleaseSample(const Sample&) {}
void DeviceStatusPool::UseStream(void*) {}
absl::Status DeviceStatusPool::Order(void*, void*) { return absl::OkStatus(); }
absl::Status DeviceStatusPool::MirrorOne(const Slot&, void*) { return absl::OkStatus(); }
bool DeviceStatusPool::Ready(const Slot&) { return false; }
absl::Status DeviceStatusPool::TimeBegin(const Slot&, Phase, void*) { return absl::OkStatus(); }
absl::Status DeviceStatusPool::TimeEnd(const Slot&, Phase, void*) { return absl::OkStatus(); }
uint64_t DeviceStatusPool::TakeCodecNanoseconds() { return 0; }
absl::Status DeviceStatusPool::Collect() { return absl::OkStatus(); }
const codecs::DeviceStatus& DeviceStatusPool::Mirror(const Slot&) const {
  static const codecs::DeviceStatus none{};
  return none;
}
uint64_t DeviceStatusPool::waits() const { return 0; }
uint64_t DeviceStatusPool::slots_in_use() const { return 0; }

#endif  // ACTPACK_WITH_CUDA

}  // namespace actpack::runtime
