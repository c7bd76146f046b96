// `cast`: float32 stored as float16 or bfloat16, decoded back to float32.
//
// Each value is rounded to nearest even (portable::FloatToHalf / FloatToBf16); decode widens it
// exactly. Payload: ceil(numel / 2) little-endian 32-bit words, element 2w in the low half of
// word w and element 2w + 1 in the high half (the high half of the last word is zero when numel
// is odd). Header parameters: byte 0 the storage DType (2 float16, 3 bfloat16), bytes 1..23 zero.
// A finite value that would round to infinity (|x| > 65504 for float16, the top of the float
// range for bfloat16) cannot be kept: encoding such a tensor is kFailedPrecondition and the
// caller keeps it exact. NaN and infinity are kept (NaN stays a quiet NaN, infinity keeps its
// sign).
#ifndef ACTPACK_CODECS_CAST_H_
#define ACTPACK_CODECS_CAST_H_

#include "codecs/codec.h"

namespace actpack::codecs {

const Codec* CastCodec();

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_CAST_H_
