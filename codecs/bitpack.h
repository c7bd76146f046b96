// `bitpack`: lossless, for integer tensors whose values span a narrow range (max_pool2d's int64
// indices lie in [0, H * W): 10 to 12 bits each instead of 64).
//
// Dtypes: uint8, int8, int16, int32, int64. Values are read as signed 64-bit numbers (uint8 as
// its value). b is the bit width of max - min as an unsigned 64-bit number (0 when every value
// is equal, else 1..64), and base = min(min, T_max - (2^b - 1)) for the dtype's largest value
// T_max: the smallest value, lowered only where min + 2^b - 1 would pass T_max (int8 values
// 100..127 need 5 bits: base 96), so that every offset a buffer can hold decodes to a value of
// the dtype. Header parameters: bytes 0..7 base (int64), byte 8 b, bytes 9..23 zero.
//
// Payload: element i's offset v - base as b bits at bit i * b of little-endian 32-bit words,
// least significant bit first, zero-padded to a whole word: ceil(numel * b / 32) words, none
// when b = 0 (32 elements fill exactly b words, so the kernels work a group of 32 at a time).
// A decoder rejects (kDataLoss) b wider than the dtype, a base whose b-bit offsets would leave
// the dtype, nonzero unused parameter bytes and a payload size other than the one numel and b
// give. codecs/internal/bitpack_math.h holds the arithmetic the CPU and the CUDA kernels share.
#ifndef ACTPACK_CODECS_BITPACK_H_
#define ACTPACK_CODECS_BITPACK_H_

#include "codecs/codec.h"

namespace actpack::codecs {

const Codec* BitpackCodec();

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_BITPACK_H_
