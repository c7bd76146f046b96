// `quant`: per-group stochastic quantization (ActNN, GACT).
//
// The flattened tensor is cut into groups of `group_size` values (the last may be partial).
// Each group stores one 32-bit word (min and step as bfloat16) and `group_size * bits / 32`
// words of codes, `bits` per value, little-endian within a word. Payload:
//   [ceil(numel / group_size) parameter words][the groups' code words, group after group]
// Header parameters: byte 0 bits, bytes 4..7 group_size, bytes 8..15 seed.
// Non-finite values cannot be quantized: encoding such a tensor is kFailedPrecondition and the
// caller keeps it exact.
#ifndef ACTPACK_CODECS_QUANT_H_
#define ACTPACK_CODECS_QUANT_H_

#include "codecs/codec.h"

namespace actpack::codecs {

const Codec* QuantCodec();

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_QUANT_H_
