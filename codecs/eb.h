// `eb`: strict error-bounded prediction coding (cuSZ/cuSZp style dual quantization).
//
// Every finite value decodes within the bound: `eb:abs=B` (absolute), or `eb:rel=R` (default
// `eb` = `eb:rel=1e-2`: R times max - min of the tensor's finite values), checked in float on the
// value as the decoded tensor's dtype holds it. Non-finite values, and the rare value no bin
// fits, are stored exactly. Zero decodes to +0 and no other value changes sign or decodes to 0.
// Values become integer bin codes, the codes are predicted inside blocks of 128 (8 x 16 tiles
// over the last two dims when those are at least 8 and 16, else runs of 128 along the flattened
// tensor) by the narrowest of three predictors, and the residuals are bit-packed with one width
// per block; blocks that would not shrink are stored verbatim, so a buffer is never much larger
// than the raw tensor. internal/eb_math.h has the arithmetic, FORMAT.md the payload.
// Dtypes: float32, float16, bfloat16. In float16 a bound only a few float16 steps wide turns
// some values into outliers (a bin centre rounded to float16 can land outside it), which costs
// ratio, never the bound.
//
// MaxEncodedSize is the worst case (about the raw size); the buffer is shrunk to what Encode
// returns (runtime::Buffer::ShrinkTo).
//
// Header parameters: byte 0 the bound mode (1 absolute, 2 relative), byte 1 the block layout
// (1 runs of 128, 2 tiles of 8 x 16), bytes 4..7 the half-bin q (float32), bytes 8..11 the
// absolute bound that holds (float32), bytes 16..23 the outlier count (uint64), others zero.
#ifndef ACTPACK_CODECS_EB_H_
#define ACTPACK_CODECS_EB_H_

#include "codecs/codec.h"

namespace actpack::codecs {

const Codec* EbCodec();

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_EB_H_
