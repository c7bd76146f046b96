// `identity`: the tensor's bytes as they are. Lossless; used for exact fallbacks and parity
// tests. Accepts every dtype. Payload: numel * element size bytes.
#ifndef ACTPACK_CODECS_IDENTITY_H_
#define ACTPACK_CODECS_IDENTITY_H_

#include "codecs/codec.h"

namespace actpack::codecs {

const Codec* IdentityCodec();

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_IDENTITY_H_
