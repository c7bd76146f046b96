// `pool`: average pooling by k along the last dimension (Barley & Fröning); lossy, no residual.
//
// The tensor is viewed as [rows, n] with n its last dimension (a 0-d tensor is [1, 1]). Each row
// is cut into windows of k values (the last window of a row may be shorter) and stores the mean
// of each window: a left-to-right float32 sum divided by the window's element count, stored in
// the input dtype (float32 stays float32; float16 and bfloat16 round to nearest even). Decode
// repeats each mean over its window. Payload: rows * ceil(n / k) means, row after row, packed
// little-endian (two 16-bit means per 32-bit word, low half first), zero-padded to a multiple of
// 4 bytes. Header parameters: bytes 0..3 k (uint32, 2..64), bytes 4..23 zero.
// A tensor with non-finite values, or a window whose sum overflows, cannot be pooled:
// kFailedPrecondition, and the caller keeps it exact.
#ifndef ACTPACK_CODECS_POOL_H_
#define ACTPACK_CODECS_POOL_H_

#include "codecs/codec.h"

namespace actpack::codecs {

const Codec* PoolCodec();

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_POOL_H_
