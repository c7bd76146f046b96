// `division` and `division_dct`: DIVISION dual-precision compression.
//
// A tensor is split into a low-frequency component (LFC), kept at 16 bits but small, and the
// high-frequency residual x - LFC, quantized to `bits` bits with stochastic rounding (one
// bfloat16 min/step pair per group of at most `group` values of a plane, draws seeded as in
// `quant`). Decode = LFC + dequantized residual, so every value lies within one step of its
// input.
//   division:     LFC = B x B average pooling (edge windows average what they hold), stored
//                 as bfloat16 means and upsampled by repetition. CPU and CUDA.
//   division_dct: LFC = the lowest k x k frequencies of each plane's 2-D cosine transform
//                 (DCT-II; at most a quarter of an axis' frequencies), stored as bfloat16 and
//                 reconstructed by the inverse sum of cosines, computed directly (no FFT) in
//                 a fixed order. CPU and CUDA, byte for byte.
// The low-pass runs over the last two dims of an NCHW (ndim >= 4) tensor, along dim -2
// (tokens) of a 2-D or 3-D tensor, and along a 1-D tensor (division_math.h; FORMAT.md has the
// layout and the measurements behind these choices). Non-finite inputs are kFailedPrecondition
// (the caller keeps the tensor exact).
//
// Usage:
//   absl::StatusOr<CodecParams> p = ParseCodecSpec("division");  // block=8, bits=2, group=128
//   absl::StatusOr<CodecParams> f = ParseCodecSpec("division_dct:keep=8,bits=2");  // keep 1 by default
#ifndef ACTPACK_CODECS_DIVISION_H_
#define ACTPACK_CODECS_DIVISION_H_

#include "codecs/codec.h"

namespace actpack::codecs {

// Defaults of the specs "division" and "division_dct" (ParseCodecSpec applies them).
inline constexpr int kDivisionDefaultBlock = 8;
inline constexpr int kDivisionDefaultKeep = 1;
inline constexpr int kDivisionDefaultGroup = 128;

const Codec* DivisionCodec();
const Codec* DivisionDctCodec();

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_DIVISION_H_
