// What a codec call on a GPU leaves for the host to read later, instead of waiting for it: the
// DeviceStatus of one encoded tensor (codecs/deferred.h), in device memory the caller provides,
// and the header as 32 words, the form in which the kernels write and check it.
//
// This header is included by nvcc: it must not include Abseil or anything nvcc cannot parse.
#ifndef ACTPACK_CODECS_INTERNAL_DEVICE_STATUS_H_
#define ACTPACK_CODECS_INTERNAL_DEVICE_STATUS_H_

#include <cstdint>

#include "codecs/internal/portable.h"

namespace actpack::codecs {

// Why a deferred decode wrote NaN (zeros for integer and bool tensors) in place of the tensor:
// the bits of DeviceStatus::failures.
enum DecodeFailure : uint64_t {
  kFailHeader = 1,            // the buffer's header is not the one the host kept
  kFailChecksum = 2,          // header or payload bytes changed after they were written
  kFailUnrepresentable = 4,   // the encoder met values its codec cannot hold (header flag)
  kFailParams = 8,            // a parameter the data decided (mask's value, bitpack's bits,
                              // eb's half-bin or payload size) is invalid
  kFailEbBlockHeader = 16,    // eb: a block header is invalid
  kFailEbChunkIndex = 32,     // eb: the chunk index does not match the blocks
  kFailEbOutlier = 64,        // eb: an outlier slot or value, or the outlier count, is invalid
  kFailLost = 128,            // the encoding did not fit the room its size was given
                              // (PlaceDeferred placed it nowhere)
};

// One encoded tensor's status: zeroed before the encode (codec.h's EncodeZeroesStatus); the
// encode kernels sum into it, PlaceDeferred records where it moved the encoding, the decode's
// check writes `failures`. 128 bytes, 8-byte aligned.
struct DeviceStatus {
  unsigned long long payload_sum;      // the payload's checksum terms (format.h)
  unsigned long long nonfinite;        // non-finite values the codec could not keep
  unsigned long long unrepresentable;  // other values out of the codec's reach (range overflow,
                                       // mask's second value)
  unsigned long long payload_bytes;    // the payload's size, where the data decides it
  uint32_t params[6];                  // header bytes 80..103 the data decided (else 0)
  unsigned long long failures;         // DecodeFailure bits of the last deferred decode
  unsigned long long decode_sum;       // the decode check's payload sum (reset after use)
  unsigned long long work[6];          // a codec's own accumulators during an encode (the host
                                       // reads some after it: mask's and division's Refusal)
  unsigned long long placement;        // where PlaceDeferred put the encoding: kPlaced* in
                                       // the low byte, the arena offset (a multiple of 256)
                                       // above it; 0 where it was never placed
};
static_assert(sizeof(DeviceStatus) == 128, "DeviceStatus is 16 words");

// DeviceStatus::placement's low byte.
inline constexpr unsigned long long kPlacementKindMask = 0xff;
inline constexpr unsigned long long kPlacedInTarget = 1;
inline constexpr unsigned long long kPlacedInArena = 2;  // | the offset
inline constexpr unsigned long long kPlacedNowhere = 3;
inline constexpr unsigned long long kArenaAlignment = 256;

// The header as little-endian 32-bit words (format.h's byte offsets / 4).
inline constexpr int kHeaderWords = 32;
inline constexpr int kFlagsWord = 2;         // dtype, ndim, then the flags in the high half
inline constexpr int kParamsWord = 20;       // 6 words of codec parameters
inline constexpr int kPayloadSizeWord = 26;  // 2 words
inline constexpr int kChecksumWord = 30;     // 2 words; the checksum covers the words before
// Header flag bit 0: the encoder met values it could not represent; the payload does not hold
// them, and a decoder writes NaN (zeros for integer and bool tensors) over the whole tensor.
inline constexpr uint32_t kFlagUnrepresentable = 1;

struct HeaderWords {
  uint32_t w[kHeaderWords];
};

// A decode's check of a buffer (kernels.h's CheckBuffer, and the decodes that check their own)
// is given the header words the host knows as bits 0..29 of a mask; this bit asks it to leave
// the payload's sum in DeviceStatus::decode_sum (a synchronous decode reads it back for its
// error) instead of zeroing it for the next decode of the same buffer.
inline constexpr uint32_t kKnownKeepsSum = 1u << 31;

// The header's checksum contribution (format.h's HeaderChecksum) from its words.
ACTPACK_HD uint64_t HeaderWordsSum(const uint32_t* w) {
  uint64_t sum = 0;
  for (uint32_t j = 0; j < kChecksumWord; ++j) sum += portable::HeaderChecksumTerm(w[j], j);
  return sum;
}

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_INTERNAL_DEVICE_STATUS_H_
