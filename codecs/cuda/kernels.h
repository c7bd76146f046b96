// Host-callable entry points of the CUDA kernels: what the codecs' CPU sources call for a
// tensor on a GPU. Plain C++ and Abseil (no CUDA types), so that the CPU sources can declare the
// calls; they exist only in builds with ACTPACK_WITH_CUDA.
//
// Every call only queues work on `stream` and never waits for the device, except CopyToHost.
// What the host would otherwise wait for goes into a DeviceStatus (internal/device_status.h):
// the encoders sum their checksum and counts into the one they are given (zeroed first by the
// caller, ZeroStatus, or by the encode's own first launch where the codec says so: division),
// and put there the header fields the data decides. Every call returns an
// absl::Status from common/cuda_check.h: the failing CUDA call with its file and line,
// kResourceExhausted for an out-of-memory error.
#ifndef ACTPACK_CODECS_CUDA_KERNELS_H_
#define ACTPACK_CODECS_CUDA_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "codecs/internal/device_status.h"
#include "codecs/internal/division_math.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/quant_math.h"

namespace actpack::codecs::cuda {

// Copies device memory to pageable host memory and waits for `stream`: the synchronous API's
// reads (codec.h's ReadHeader, Encode's and Decode's status), never a deferred call's.
absl::Status CopyToHost(void* host_dst, const void* device_src, uint64_t bytes, void* stream);

// Device to device, queued.
absl::Status CopyOnDevice(void* device_dst, const void* device_src, uint64_t bytes, void* stream);

// Zeroes `status`, queued.
absl::Status ZeroStatus(DeviceStatus* status, void* stream);

// Sets the low byte of status->failures to `bits` (a DecodeFailure below 256), queued.
absl::Status SetFailureByte(DeviceStatus* status, uint8_t bits, void* stream);

// Sums format.h's payload checksum terms of `payload` into *sum. The payload's size is `bytes`,
// or, with `device_bytes` (the size as two little-endian words in device memory), that size,
// clamped to `bytes`.
absl::Status Checksum(const uint8_t* payload, uint64_t bytes, const uint32_t* device_bytes,
                      unsigned long long* sum, void* stream);

// Writes the buffer's header at `out` from the host's `header`: its parameter words ORed with
// status->params, its payload size status->payload_bytes where `device_sized`, the
// unrepresentable flag where the status counts such values, and the checksum from
// status->payload_sum. Byte for byte what the CPU's Encode writes for the same payload.
absl::Status FinalizeHeader(const HeaderWords& header, bool device_sized,
                            const DeviceStatus* status, uint8_t* out, void* stream);

// Checks the buffer at `buffer` (`capacity` bytes) on the device: its header words against
// `expected` where bit j of `known` is set (the words the host knows), its flags, its payload
// size against the capacity, and its checksum. Sets DecodeFailure bits in status->failures:
// kFailLost alone where status->placement says the encoding was placed nowhere.
absl::Status CheckBuffer(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                         uint32_t known, DeviceStatus* status, void* stream);

// Overwrites the `numel` elements of `element_bytes` bytes at `output` with `pattern` when
// status->failures is not 0 (NaN for floating-point tensors, 0 for the others).
absl::Status Poison(const DeviceStatus* status, void* output, uint64_t numel, int element_bytes,
                    uint64_t pattern, void* stream);

// Queues the move of the encoding at `staging` (`staging_capacity` bytes; its size is its
// header's) into `target` when it fits in `target_capacity` bytes, else into the arena
// (`arena_capacity` bytes at `arena`, bump-allocated with an atomicAdd on *arena_used in
// kArenaAlignment units; no arena where arena_used is null), else nowhere; status->placement
// says which. Every pointer 8-byte aligned.
absl::Status Place(const uint8_t* staging, uint64_t staging_capacity, uint8_t* target,
                   uint64_t target_capacity, uint8_t* arena, uint64_t arena_capacity,
                   unsigned long long* arena_used, DeviceStatus* status, void* stream);

// Queues the copy of the encoding status->placement says where (the target, or the arena at its
// offset) into `dest` (`dest_capacity` bytes); nothing where it was placed nowhere.
absl::Status Gather(const uint8_t* target, uint64_t target_capacity, const uint8_t* arena,
                    uint64_t arena_capacity, const DeviceStatus* status, uint8_t* dest,
                    uint64_t dest_capacity, void* stream);

// identity's encode in one launch: copies `bytes` from `input` to the payload (at `out` + the
// header) summing its checksum terms into status->payload_sum, and the launch's last block
// writes the header at `out` from `header` (what FinalizeHeader writes). 16-byte accesses where
// input and payload are 16-byte aligned.
absl::Status IdentityEncode(const void* input, uint64_t bytes, const HeaderWords& header,
                            DeviceStatus* status, uint8_t* out, void* stream);

// identity's decode in one launch: copies the first `bytes` of the payload of the buffer at
// `buffer` (`capacity` bytes; clamped to it) to `output` and checks the buffer as CheckBuffer
// does, its failures in status->failures, which Poison reads after it.
absl::Status IdentityDecode(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                            uint32_t known, uint64_t bytes, void* output, DeviceStatus* status,
                            void* stream);

// Per-group stochastic quantization in one launch: the payload of the CPU reference (quant.cc)
// at `out` + the header, and the header at `out` (what FinalizeHeader writes, from `header`).
// status: payload_sum; nonfinite; unrepresentable = groups whose range overflows float.
absl::Status QuantEncode(const void* input, const quant_math::Layout& layout,
                         elements::Kind kind, const HeaderWords& header, uint8_t* out,
                         DeviceStatus* status, void* stream);

// quant's decode of the buffer at `buffer` (`capacity` bytes, its payload laid out as `layout`)
// in one launch, which checks the buffer as CheckBuffer does (failures in status->failures, for
// Poison after it).
absl::Status QuantDecode(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                         uint32_t known, const quant_math::Layout& layout, elements::Kind kind,
                         void* output, DeviceStatus* status, void* stream);

// `cast`: float32 to float16 (to_bf16 = 0) or bfloat16 (1), the payload of cast.cc, in one
// launch that writes the header at `out` from `header` too (its payload follows it). status:
// payload_sum; unrepresentable = finite values that became infinite.
absl::Status CastEncode(const float* input, uint64_t numel, int to_bf16, const HeaderWords& header,
                        uint8_t* out, DeviceStatus* status, void* stream);

// cast's decode in one launch that checks the buffer at `buffer` (`capacity` bytes) as
// CheckBuffer does, its failures in status->failures (Poison after it).
absl::Status CastDecode(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                        uint32_t known, uint64_t numel, int from_bf16, float* output,
                        DeviceStatus* status, void* stream);

// `mask` of a tensor of `dtype` (dtype.h's code): one bit per element, set where its bits are
// not zero, the payload of mask.cc, in one launch that writes the header at `out` from `header`
// too. status: payload_sum; params word 0 = the nonzero value's bits (0 when every element is
// zero); unrepresentable = 1 when the tensor holds two nonzero values, a NaN one, or a bool
// byte other than 1.
absl::Status MaskEncode(const void* input, uint64_t numel, int dtype, const HeaderWords& header,
                        uint8_t* out, DeviceStatus* status, void* stream);

// Writes the value in the parameters of the buffer's header (in device memory, at `buffer`,
// `capacity` bytes) where a bit is set and zero elsewhere, in one launch that checks the buffer
// as CheckBuffer does, and its value: one the dtype cannot hold sets kFailParams (unless the
// encoding was placed nowhere: PlacedNowhere). The failures go in status->failures (Poison
// after it).
absl::Status MaskDecode(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                        uint32_t known, uint64_t numel, int dtype, void* output,
                        DeviceStatus* status, void* stream);

// `bitpack` of an integer tensor of `kind` (bitpack_math::Kind): each element's offset from the
// smallest in the bits the range needs, the payload of bitpack.cc; scratch is the status's work
// words. status: payload_sum; params = base (words 0..1) and bits (word 2); payload_bytes.
absl::Status BitpackEncode(const void* input, uint64_t numel, int kind, uint8_t* payload,
                           DeviceStatus* status, void* stream);

// Writes base + each stored offset, with base and bits from `header` (the buffer's header, in
// device memory). Parameters the dtype cannot hold set kFailParams (unless the encoding was
// placed nowhere); nothing is written while status->failures is not 0.
absl::Status BitpackDecode(const uint8_t* header, uint64_t numel, int kind, DeviceStatus* status,
                           void* output, void* stream);

struct PoolLayout {
  uint64_t rows;
  uint64_t row_length;
  uint32_t window;
  int element_kind;  // elements::Kind
};

// `pool`: window means along the rows, the payload of pool.cc, in one launch that writes the
// header at `out` from `header` too. status: payload_sum; nonfinite = non-finite means.
absl::Status PoolEncode(const void* input, const PoolLayout& layout, const HeaderWords& header,
                        uint8_t* out, DeviceStatus* status, void* stream);

// Repeats each mean over its window, in one launch that checks the buffer at `buffer`
// (`capacity` bytes) as CheckBuffer does, its failures in status->failures (Poison after it).
absl::Status PoolDecode(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                        uint32_t known, const PoolLayout& layout, void* output,
                        DeviceStatus* status, void* stream);

// `division` and `division_dct`: the LFC (pooled means, or the kept cosine-transform
// coefficients where layout.kept_rows > 0: division_math::MakePoolLayout, MakeDctLayout), then
// the residual quantized per group: the payload of division.cc for `layout` and an
// elements::Kind, and the header at `out` from `header` (two launches, the first zeroing
// `status`, so the caller need not). status: payload_sum; nonfinite = non-finite
// inputs; unrepresentable = LFC values not finite in bfloat16 (also counted in work[0]) and
// groups whose residual range overflows float.
absl::Status DivisionEncode(const void* input, const division_math::Layout& layout,
                            int element_kind, const HeaderWords& header, uint8_t* out,
                            DeviceStatus* status, void* stream);

// LFC approximation + dequantized residual, in one launch that checks the buffer at `buffer`
// (`capacity` bytes) as CheckBuffer does, its failures in status->failures (Poison after it).
absl::Status DivisionDecode(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                            uint32_t known, const division_math::Layout& layout,
                            int element_kind, void* output, DeviceStatus* status, void* stream);

struct EbShape {
  int dims;  // 2: 8 x 16 tiles over [planes, rows, cols]; 1: runs of 128 (planes = rows = 1)
  uint64_t planes;
  uint64_t rows;
  uint64_t cols;
  int element_kind;  // elements::Kind
};

// `eb` under bound mode `mode` (EbMode) and `value`: the payload of eb.cc, with the quantizer
// computed on the device from the finite values' range (eb_math::QuantizerFor). `scratch`
// (8-byte aligned, 16 bytes per chunk of 32 blocks) holds each chunk's look-back state (its
// sums, then the sums up to it), zeroed here first. status: payload_sum;
// params = half bin, bound (words 1..2) and the outlier count (words 4..5); payload_bytes.
absl::Status EbEncode(const void* input, const EbShape& shape, int mode, double value,
                      uint8_t* payload, uint8_t* scratch, DeviceStatus* status, void* stream);

// What an `eb` decode needs besides the shape: the values the encode's data decided, from the
// host (a resolved encoding's header) or, where `from_status`, from the encode's DeviceStatus
// on the device (params words 1 and 4..5, payload_bytes; checked there against `max_outliers`
// and `max_bytes`, the most the shape allows, and against the buffer's header).
struct EbPayload {
  bool from_status = false;
  float half_bin = 0.0f;
  uint64_t data_words = 0;
  uint64_t outliers = 0;
  uint64_t max_outliers = 0;
  uint64_t max_bytes = 0;
};

// `eb`: validates the block headers, the chunk index and the outliers of the payload (kFailEb*
// bits in status->failures; from the status, also its values: kFailParams, kFailEbOutlier,
// kFailHeader), then writes the output unless status->failures is not 0. The payload follows
// its header (kHeaderWords words), which the checks of values from the status read.
absl::Status EbDecode(const uint8_t* payload, const EbShape& shape, const EbPayload& values,
                      DeviceStatus* status, void* output, void* stream);

}  // namespace actpack::codecs::cuda

#endif  // ACTPACK_CODECS_CUDA_KERNELS_H_
