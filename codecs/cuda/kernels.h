// Host-callable entry points of the CUDA kernels: what the codecs' CPU sources call for a
// tensor on a GPU. Plain C++ and Abseil (no CUDA types), so that the CPU sources can declare the
// calls; they exist only in builds with ACTPACK_WITH_CUDA.
//
// Every call returns an absl::Status from common/cuda_check.h: the failing CUDA call with its
// file and line, kResourceExhausted for an out-of-memory error. Calls that report totals (a
// checksum, counts) sum them into `counters`: kCounterWords 64-bit words of device memory the
// caller provides from its allocator (codecs/internal/device_counters.h), which the call zeroes
// on `stream` first. Such calls wait for `stream` to read the totals; the others only queue
// work on it.
#ifndef ACTPACK_CODECS_CUDA_KERNELS_H_
#define ACTPACK_CODECS_CUDA_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "codecs/internal/division_math.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/quant_math.h"

namespace actpack::codecs::cuda {

inline constexpr int kCounterWords = 8;

// Synchronous copies (they wait for `stream`).
absl::Status CopyToHost(void* host_dst, const void* device_src, uint64_t bytes, void* stream);
absl::Status CopyToDevice(void* device_dst, const void* host_src, uint64_t bytes, void* stream);

// format.h's PayloadChecksum of device memory.
absl::Status PayloadChecksum(const uint8_t* payload, uint64_t bytes, unsigned long long* counters,
                             void* stream, uint64_t* checksum);

// Per-group stochastic quantization; writes the same payload as the CPU reference (quant.cc)
// and reports the checksum and the counts of non-finite values and of groups whose range
// overflows float.
absl::Status QuantEncode(const void* input, const quant_math::Layout& layout,
                         elements::Kind kind, uint8_t* payload, unsigned long long* counters,
                         void* stream, uint64_t* payload_checksum, uint64_t* nonfinite,
                         uint64_t* overflow_groups);

absl::Status QuantDecode(const uint8_t* payload, const quant_math::Layout& layout,
                         elements::Kind kind, void* output, void* stream);

// `cast`: float32 to float16 (to_bf16 = 0) or bfloat16 (1), the payload of cast.cc; reports the
// checksum and the count of finite values that became infinite.
absl::Status CastEncode(const float* input, uint64_t numel, int to_bf16, uint8_t* payload,
                        unsigned long long* counters, void* stream, uint64_t* payload_checksum,
                        uint64_t* overflow);

absl::Status CastDecode(const uint8_t* payload, uint64_t numel, int from_bf16, float* output,
                        void* stream);

// `mask`: one bit per element (set where the element's `width`-byte bits are not zero), the
// payload of mask.cc; reports the checksum and the largest and smallest nonzero element bits
// (both 0 when every element is zero).
absl::Status MaskEncode(const void* input, uint64_t numel, int width, uint8_t* payload,
                        unsigned long long* counters, void* stream, uint64_t* payload_checksum,
                        uint32_t* max_bits, uint32_t* min_bits);

// Writes `value` where a bit is set and zero elsewhere.
absl::Status MaskDecode(const uint8_t* payload, uint64_t numel, int width, uint32_t value,
                        void* output, void* stream);

// `bitpack`: the smallest and largest element of an integer tensor of `kind`
// (bitpack_math::Kind) as signed 64-bit values; numel must not be 0.
absl::Status BitpackRange(const void* input, uint64_t numel, int kind,
                          unsigned long long* counters, void* stream, int64_t* min,
                          int64_t* max);

// `bitpack`: each element's offset from `base` in `bits` bits, the payload of bitpack.cc;
// reports the checksum. Every element must lie in [base, base + 2^bits - 1].
absl::Status BitpackEncode(const void* input, uint64_t numel, int kind, int64_t base,
                           uint32_t bits, uint8_t* payload, unsigned long long* counters,
                           void* stream, uint64_t* payload_checksum);

// Writes base + each stored offset.
absl::Status BitpackDecode(const uint8_t* payload, uint64_t numel, int kind, int64_t base,
                           uint32_t bits, void* output, void* stream);

struct PoolLayout {
  uint64_t rows;
  uint64_t row_length;
  uint32_t window;
  int element_kind;  // elements::Kind
};

// `pool`: window means along the rows, the payload of pool.cc; reports the checksum and the
// count of non-finite means.
absl::Status PoolEncode(const void* input, const PoolLayout& layout, uint8_t* payload,
                        unsigned long long* counters, void* stream, uint64_t* payload_checksum,
                        uint64_t* nonfinite);

// Repeats each mean over its window.
absl::Status PoolDecode(const uint8_t* payload, const PoolLayout& layout, void* output,
                        void* stream);

// `division`: the pooled bfloat16 LFC, then the residual quantized per group: the payload of
// division.cc for `layout` (division_math::MakePoolLayout) and an elements::Kind; reports the
// checksum and the counts of non-finite inputs, of LFC means that are not finite in bfloat16,
// and of groups whose residual range overflows float.
absl::Status DivisionEncode(const void* input, const division_math::Layout& layout,
                            int element_kind, uint8_t* payload, unsigned long long* counters,
                            void* stream, uint64_t* payload_checksum, uint64_t* nonfinite,
                            uint64_t* nonfinite_lfc, uint64_t* overflow_groups);

// Upsampled LFC + dequantized residual.
absl::Status DivisionDecode(const uint8_t* payload, const division_math::Layout& layout,
                            int element_kind, void* output, void* stream);

struct EbShape {
  int dims;  // 2: 8 x 16 tiles over [planes, rows, cols]; 1: runs of 128 (planes = rows = 1)
  uint64_t planes;
  uint64_t rows;
  uint64_t cols;
  int element_kind;  // elements::Kind
};

// `eb`: the smallest and largest finite value and the count of finite values (lo = +inf and
// hi = -inf when there is none).
absl::Status EbRange(const void* input, uint64_t numel, int element_kind,
                     unsigned long long* counters, void* stream, float* lo, float* hi,
                     uint64_t* finite);

// `eb`: writes the payload of eb.cc for the quantizer (half_bin, bound), using `scratch`
// (8-byte aligned, 16 bytes per chunk of 32 blocks) for the chunk sums; reports the payload's
// size in words, the outlier count and the checksum.
absl::Status EbEncode(const void* input, const EbShape& shape, float half_bin, float bound,
                      uint8_t* payload, uint8_t* scratch, unsigned long long* counters,
                      void* stream, uint64_t* payload_words, uint64_t* outliers,
                      uint64_t* payload_checksum);

// Failure bits of EbDecode.
inline constexpr uint32_t kEbBadBlockHeader = 1;
inline constexpr uint32_t kEbBadChunkIndex = 2;
inline constexpr uint32_t kEbBadOutlier = 4;

// `eb`: validates the block headers, the chunk index and the outliers of a payload with
// `data_words` words of block data; writes the output only when *failures is 0.
absl::Status EbDecode(const uint8_t* payload, const EbShape& shape, float half_bin,
                      uint64_t data_words, uint64_t outliers, unsigned long long* counters,
                      void* output, void* stream, uint32_t* failures);

}  // namespace actpack::codecs::cuda

#endif  // ACTPACK_CODECS_CUDA_KERNELS_H_
