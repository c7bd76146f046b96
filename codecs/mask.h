// `mask`: lossless, one bit per element, for tensors whose values are all 0 or one value v
// (ReLU masks, dropout masks scaled by 1 / (1 - p), bool tensors).
//
// "0" means all bits zero (-0.0 is a value like any other). Payload: ceil(numel / 32)
// little-endian 32-bit words; bit i % 32 of word i / 32 is set when element i is v. Header
// parameters: bytes 0..3 v's bits in the input dtype (uint32, zero-extended; 0 when every
// element is 0), bytes 4..23 zero. Dtypes: float32, float16, bfloat16, bool, uint8. A tensor
// with two different nonzero values, or whose nonzero value is a NaN, cannot be encoded:
// kFailedPrecondition, and the caller keeps it some other way.
#ifndef ACTPACK_CODECS_MASK_H_
#define ACTPACK_CODECS_MASK_H_

#include "codecs/codec.h"

namespace actpack::codecs {

const Codec* MaskCodec();

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_MASK_H_
