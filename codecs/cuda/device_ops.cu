// What every codec's deferred call shares on the GPU: copies, the payload checksum, the header
// written on the device (FinalizeHeader), the decode's check of a buffer (CheckBuffer), the
// overwrite of a decode that failed it (Poison), and the move of an encoding whose size the
// device decided into the room the host gave it (Place, Gather).
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/cuda_check.h"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/portable.h"

namespace actpack::codecs::cuda {
namespace {

constexpr uint64_t kHeaderBytes = kHeaderWords * 4;

// A grid-stride sum of the payload's checksum terms into *sum. The size is `bytes`, or read
// from `device_bytes` (clamped to `bytes`) when given.
__global__ void ChecksumKernel(const uint8_t* __restrict__ payload, uint64_t bytes,
                               const uint32_t* __restrict__ device_bytes,
                               unsigned long long* __restrict__ sum) {
  if (device_bytes != nullptr) {
    const uint64_t decided = Words64(device_bytes);
    bytes = decided < bytes ? decided : bytes;
  }
  const uint64_t full_words = bytes / 4;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
  uint64_t local = 0;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < full_words; w += stride) {
    local += portable::ChecksumTerm(words[w], w);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && bytes % 4 != 0) {
    uint32_t tail = 0;
    for (uint64_t b = 0; b < bytes % 4; ++b) {
      tail |= static_cast<uint32_t>(payload[full_words * 4 + b]) << (8 * b);
    }
    local += portable::ChecksumTerm(tail, full_words);
  }
  WarpSumToGlobal(local, sum);
}

// One thread: the host's header completed with what the data decided, then its checksum.
__global__ void FinalizeHeaderKernel(HeaderWords header, bool device_sized,
                                     DeviceStatus* __restrict__ status,
                                     uint32_t* __restrict__ out) {
  WriteFinalHeader(header, device_sized, status, out, false);
}

// One thread, after ChecksumKernel summed the payload into status->decode_sum.
__global__ void CheckHeaderKernel(const uint32_t* __restrict__ buffer, uint64_t capacity,
                                  HeaderWords expected, uint32_t known,
                                  DeviceStatus* __restrict__ status) {
  status->failures = BufferFailures(buffer, capacity, expected, known, status->decode_sum, status);
  status->decode_sum = 0;  // the next decode of the same buffer sums afresh
}

template <int Bytes>
__global__ void PoisonKernel(const DeviceStatus* __restrict__ status, void* __restrict__ output,
                             uint64_t numel, uint64_t pattern) {
  if (status->failures == 0) return;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel; i += stride) {
    if constexpr (Bytes == 8) {
      static_cast<uint64_t*>(output)[i] = pattern;
    } else if constexpr (Bytes == 4) {
      static_cast<uint32_t*>(output)[i] = static_cast<uint32_t>(pattern);
    } else if constexpr (Bytes == 2) {
      static_cast<uint16_t*>(output)[i] = static_cast<uint16_t>(pattern);
    } else {
      static_cast<uint8_t*>(output)[i] = static_cast<uint8_t>(pattern);
    }
  }
}

// Vectors a thread loads before it stores any: independent loads in flight.
constexpr int kCopyUnroll = 4;

__device__ __forceinline__ uint64_t VectorTerms(const uint4& v, uint64_t word) {
  return portable::ChecksumTerm(v.x, word) + portable::ChecksumTerm(v.y, word + 1) +
         portable::ChecksumTerm(v.z, word + 2) + portable::ChecksumTerm(v.w, word + 3);
}

// identity's one launch: copies `bytes` from `from` to `to` and sums the checksum terms of the
// bytes as payload words (word 0 at the start), then closes (LaunchClosing). `unit`: 16 (both
// pointers 16-byte aligned: 16-byte vectors, then the words and bytes past the last one), 4
// (both 4-byte aligned: words) or 1 (bytes, assembled into words).
__global__ void __launch_bounds__(256)
    IdentityKernel(const uint8_t* __restrict__ from, uint8_t* __restrict__ to, uint64_t bytes,
                   int unit, LaunchClosing closing, DeviceStatus* __restrict__ status) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  const uint64_t first = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  uint64_t sum = 0;
  uint64_t word = 0;  // the first word past the vectors
  if (unit == 16) {
    const uint4* src = reinterpret_cast<const uint4*>(from);
    uint4* dst = reinterpret_cast<uint4*>(to);
    const uint64_t vectors = bytes / 16;
    uint64_t i = first;
    for (; i + (kCopyUnroll - 1) * stride < vectors; i += kCopyUnroll * stride) {
      uint4 v[kCopyUnroll];
      for (int k = 0; k < kCopyUnroll; ++k) v[k] = src[i + k * stride];
      for (int k = 0; k < kCopyUnroll; ++k) {
        dst[i + k * stride] = v[k];
        sum += VectorTerms(v[k], 4 * (i + k * stride));
      }
    }
    for (; i < vectors; i += stride) {
      const uint4 v = src[i];
      dst[i] = v;
      sum += VectorTerms(v, 4 * i);
    }
    word = vectors * 4;
  }
  const uint64_t words = bytes / 4;
  for (uint64_t w = word + first; w < words; w += stride) {
    uint32_t value = 0;
    if (unit >= 4) {
      value = reinterpret_cast<const uint32_t*>(from)[w];
      reinterpret_cast<uint32_t*>(to)[w] = value;
    } else {
      for (int b = 0; b < 4; ++b) {
        const uint8_t byte = from[4 * w + b];
        to[4 * w + b] = byte;
        value |= static_cast<uint32_t>(byte) << (8 * b);
      }
    }
    sum += portable::ChecksumTerm(value, w);
  }
  if (first == 0 && bytes % 4 != 0) {  // the last word's bytes, zero-padded
    uint32_t tail = 0;
    for (uint64_t b = words * 4; b < bytes; ++b) {
      to[b] = from[b];
      tail |= static_cast<uint32_t>(from[b]) << (8 * (b - words * 4));
    }
    sum += portable::ChecksumTerm(tail, words);
  }
  WarpSumToGlobal(sum, closing.decode ? &status->decode_sum : &status->payload_sum);
  CloseLaunch(closing, status);
}

absl::Status LaunchIdentity(const uint8_t* from, uint8_t* to, uint64_t bytes,
                            const LaunchClosing& closing, DeviceStatus* status, void* stream) {
  const uintptr_t both = reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to);
  const int unit = both % 16 == 0 ? 16 : both % 4 == 0 ? 4 : 1;
  const uint64_t per_thread = unit == 16 ? 16 * kCopyUnroll : 4;
  const int blocks = BlocksFor(bytes / per_thread + 1, 256);
  ACTPACK_LAUNCH(IdentityKernel, blocks, 256, static_cast<cudaStream_t>(stream))(
      from, to, bytes, unit, closing, status);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// The bytes of the encoding at `buffer` (`capacity` bytes): its header and the payload the
// header's size word gives, clamped to the capacity (0 when not even a header fits).
__device__ __forceinline__ uint64_t EncodingBytes(const uint8_t* buffer, uint64_t capacity) {
  if (capacity < kHeaderBytes) return 0;
  const uint64_t payload = Words64(reinterpret_cast<const uint32_t*>(buffer) + kPayloadSizeWord);
  return payload <= capacity - kHeaderBytes ? kHeaderBytes + payload : capacity;
}

// One thread: where the encoding in `staging` goes (status->placement): into the target when
// it fits there, else into the arena, bump-allocated in kArenaAlignment units, else nowhere.
// *arena_used grows by every spill's room, those that did not fit too.
__global__ void PlaceKernel(const uint8_t* __restrict__ staging, uint64_t staging_capacity,
                            uint64_t target_capacity, uint64_t arena_capacity,
                            unsigned long long* __restrict__ arena_used,
                            DeviceStatus* __restrict__ status) {
  const uint64_t bytes = EncodingBytes(staging, staging_capacity);
  unsigned long long placement = kPlacedNowhere;
  if (bytes <= target_capacity) {
    placement = kPlacedInTarget;
  } else if (arena_used != nullptr) {
    const uint64_t room = (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
    const uint64_t offset = atomicAdd(arena_used, static_cast<unsigned long long>(room));
    if (room <= arena_capacity && offset <= arena_capacity - room) {
      placement = offset | kPlacedInArena;
    }
  }
  status->placement = placement;
}

// Copies the encoding between `outer` (the staging buffer, or a gather's destination) and where
// status->placement says (the target, or the arena at its offset): into the placement where
// `into_placement`, out of it otherwise; nothing where it was placed nowhere. Its size is the
// one in the source's header, clamped to both sides' capacities. Unit: the copy's word, which
// every pointer is aligned to.
template <typename Unit>
__global__ void MoveKernel(uint8_t* outer, uint64_t outer_capacity, uint8_t* target,
                           uint64_t target_capacity, uint8_t* arena, uint64_t arena_capacity,
                           const DeviceStatus* __restrict__ status, bool into_placement) {
  const unsigned long long placement = status->placement;
  const unsigned long long kind = placement & kPlacementKindMask;
  const uint64_t offset = placement & ~kPlacementKindMask;
  uint8_t* placed = nullptr;
  uint64_t placed_capacity = 0;
  if (kind == kPlacedInTarget) {
    placed = target;
    placed_capacity = target_capacity;
  } else if (kind == kPlacedInArena && offset < arena_capacity) {
    placed = arena + offset;
    placed_capacity = arena_capacity - offset;
  }
  if (placed == nullptr) return;
  const uint8_t* from = into_placement ? outer : placed;
  uint8_t* to = into_placement ? placed : outer;
  const uint64_t from_capacity = into_placement ? outer_capacity : placed_capacity;
  const uint64_t to_capacity = into_placement ? placed_capacity : outer_capacity;
  const uint64_t found = EncodingBytes(from, from_capacity);
  const uint64_t bytes = found < to_capacity ? found : to_capacity;
  const uint64_t units = bytes / sizeof(Unit);
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  const uint64_t first = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (uint64_t i = first; i < units; i += stride) {
    reinterpret_cast<Unit*>(to)[i] = reinterpret_cast<const Unit*>(from)[i];
  }
  if (first == 0) {
    for (uint64_t b = units * sizeof(Unit); b < bytes; ++b) to[b] = from[b];
  }
}

// The copy's words: 16 bytes where every pointer allows, else 8.
struct alignas(16) Bytes16 {
  uint32_t w[4];
};
struct alignas(8) Bytes8 {
  uint32_t w[2];
};

bool Aligned16(const void* a, const void* b, const void* c) {
  return (reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
          reinterpret_cast<uintptr_t>(c)) % 16 == 0;
}

absl::Status Move(uint8_t* outer, uint64_t outer_capacity, uint8_t* target,
                  uint64_t target_capacity, uint8_t* arena, uint64_t arena_capacity,
                  const DeviceStatus* status, bool into_placement, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // A grid for the largest encoding the outer buffer holds, a grid-stride loop past that.
  const int blocks = static_cast<int>(
      std::min<uint64_t>(1024, std::max<uint64_t>(1, (outer_capacity / 16 + 255) / 256)));
  if (Aligned16(outer, target, arena)) {  // coverage: every branch
    ACTPACK_LAUNCH(MoveKernel<Bytes16>, blocks, 256, s)(outer, outer_capacity, target,
                                                         target_capacity, arena, arena_capacity,
                                                         status, into_placement);
  } else {
    ACTPACK_LAUNCH(MoveKernel<Bytes8>, blocks, 256, s)(outer, outer_capacity, target,
                                                        target_capacity, arena, arena_capacity,
                                                        status, into_placement);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

int ChecksumBlocks(uint64_t bytes) { return BlocksFor(bytes / 4 + 1, 256); }

}  // namespace

int MaxGridBlocks() {
  constexpr int kDefault = 2048;
  static const int limit = [] {
    const char* text = std::getenv("ACTPACK_CUDA_MAX_GRID_BLOCKS");
    if (text == nullptr || *text == '\0') return kDefault;
    int value = 0;
    const char* end = text + std::strlen(text);
    const auto [at, error] = std::from_chars(text, end, value);
    if (error != std::errc() || at != end || value < 1 || value > kDefault) {
      // A test knob: a typo must not leave a test running the default grid unseen.
      std::fprintf(stderr, "actpack: ACTPACK_CUDA_MAX_GRID_BLOCKS=%s: expected an integer in "
                   "[1, %d]\n", text, kDefault);
      std::abort();
    }
    return value;
  }();
  return limit;
}

absl::Status CopyToHost(void* host_dst, const void* device_src, uint64_t bytes, void* stream) {
  if (bytes == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDefault, s));
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

absl::Status CopyOnDevice(void* device_dst, const void* device_src, uint64_t bytes, void* stream) {
  if (bytes == 0) return absl::OkStatus();
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_dst, device_src, bytes,
                                               cudaMemcpyDeviceToDevice,
                                               static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

absl::Status ZeroStatus(DeviceStatus* status, void* stream) {
  ACTPACK_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(status, 0, sizeof(DeviceStatus), static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

absl::Status SetFailureByte(DeviceStatus* status, uint8_t bits, void* stream) {
  ACTPACK_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(&status->failures, bits, 1, static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

absl::Status Checksum(const uint8_t* payload, uint64_t bytes, const uint32_t* device_bytes,
                      unsigned long long* sum, void* stream) {
  ACTPACK_LAUNCH(ChecksumKernel, ChecksumBlocks(bytes), 256, static_cast<cudaStream_t>(stream))(
      payload, bytes, device_bytes, sum);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status FinalizeHeader(const HeaderWords& header, bool device_sized,
                            const DeviceStatus* status, uint8_t* out, void* stream) {
  ACTPACK_LAUNCH(FinalizeHeaderKernel, 1, 1, static_cast<cudaStream_t>(stream))(
      header, device_sized, const_cast<DeviceStatus*>(status), reinterpret_cast<uint32_t*>(out));
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status CheckBuffer(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                         uint32_t known, DeviceStatus* status, void* stream) {
  const uint64_t header_bytes = kHeaderWords * 4;
  // The payload's size: the host's where it knows it, else the header's (clamped).
  const bool size_known = (known >> kPayloadSizeWord & 3u) == 3u;
  const uint64_t bytes =
      size_known ? (expected.w[kPayloadSizeWord] |
                    static_cast<uint64_t>(expected.w[kPayloadSizeWord + 1]) << 32)
                 : capacity - header_bytes;
  const uint32_t* header = reinterpret_cast<const uint32_t*>(buffer);
  absl::Status summed = Checksum(buffer + header_bytes, std::min(bytes, capacity - header_bytes),
                                 size_known ? nullptr : header + kPayloadSizeWord,
                                 &status->decode_sum, stream);
  if (!summed.ok()) return summed;
  ACTPACK_LAUNCH(CheckHeaderKernel, 1, 1, static_cast<cudaStream_t>(stream))(
      header, capacity, expected, known, status);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status IdentityEncode(const void* input, uint64_t bytes, const HeaderWords& header,
                            DeviceStatus* status, uint8_t* out, void* stream) {
  return LaunchIdentity(static_cast<const uint8_t*>(input), out + kHeaderBytes, bytes,
                        EncodeClosing(header, out), status, stream);
}

absl::Status IdentityDecode(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                            uint32_t known, uint64_t bytes, void* output, DeviceStatus* status,
                            void* stream) {
  return LaunchIdentity(buffer + kHeaderBytes, static_cast<uint8_t*>(output),
                        std::min(bytes, capacity - kHeaderBytes),
                        DecodeClosing(buffer, capacity, expected, known), status, stream);
}

absl::Status Poison(const DeviceStatus* status, void* output, uint64_t numel, int element_bytes,
                    uint64_t pattern, void* stream) {
  if (numel == 0) return absl::OkStatus();
  // A fixed grid: the common case is a flag read by every thread and nothing else.
  const int blocks = static_cast<int>(std::min<uint64_t>(32, (numel + 255) / 256));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (element_bytes) {  // coverage: every branch
    case 8: ACTPACK_LAUNCH(PoisonKernel<8>, blocks, 256, s)(status, output, numel, pattern); break;
    case 4: ACTPACK_LAUNCH(PoisonKernel<4>, blocks, 256, s)(status, output, numel, pattern); break;
    case 2: ACTPACK_LAUNCH(PoisonKernel<2>, blocks, 256, s)(status, output, numel, pattern); break;
    default: ACTPACK_LAUNCH(PoisonKernel<1>, blocks, 256, s)(status, output, numel, pattern);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status Place(const uint8_t* staging, uint64_t staging_capacity, uint8_t* target,
                   uint64_t target_capacity, uint8_t* arena, uint64_t arena_capacity,
                   unsigned long long* arena_used, DeviceStatus* status, void* stream) {
  ACTPACK_LAUNCH(PlaceKernel, 1, 1, static_cast<cudaStream_t>(stream))(
      staging, staging_capacity, target_capacity, arena_capacity, arena_used, status);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Move(const_cast<uint8_t*>(staging), staging_capacity, target, target_capacity, arena,
              arena_capacity, status, /*into_placement=*/true, stream);
}

absl::Status Gather(const uint8_t* target, uint64_t target_capacity, const uint8_t* arena,
                    uint64_t arena_capacity, const DeviceStatus* status, uint8_t* dest,
                    uint64_t dest_capacity, void* stream) {
  return Move(dest, dest_capacity, const_cast<uint8_t*>(target), target_capacity,
              const_cast<uint8_t*>(arena), arena_capacity, status, /*into_placement=*/false,
              stream);
}

}  // namespace actpack::codecs::cuda
