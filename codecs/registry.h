// The codec registry: every codec compiled into this build, found by id or by name.
//
// Usage:
//   const Codec* quant = FindCodec(CodecId::kQuant);                 // nullptr if unknown
//   absl::StatusOr<CodecParams> p = ParseCodecSpec("quant:bits=4,group=128");
#ifndef ACTPACK_CODECS_REGISTRY_H_
#define ACTPACK_CODECS_REGISTRY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codecs/codec.h"

namespace actpack::codecs {

// All codecs of this build, in id order.
const std::vector<const Codec*>& AllCodecs();

// The codec with this id, or nullptr.
const Codec* FindCodec(CodecId id);

// The codec with this name ("identity", "quant", ...); kInvalidArgument listing the known
// names otherwise.
absl::StatusOr<const Codec*> FindCodecByName(absl::string_view name);

// Parses a codec spec: a name, a name with a strength suffix ("quant2" is quant with 2 bits), or
// a name with options ("quant:bits=4,group=128,seed=7"). kInvalidArgument names the bad part.
absl::StatusOr<CodecParams> ParseCodecSpec(absl::string_view spec);

// The spec that ParseCodecSpec would turn back into `params` (for reports): "quant2", ...
std::string FormatCodecSpec(const CodecParams& params);

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_REGISTRY_H_
