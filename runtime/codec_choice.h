// What codec a saved tensor gets by the user's settings: a fixed codec or "auto" (the policy
// chooses), by default or by a rule over module names.
//
// Usage:
//   absl::StatusOr<CodecChoice> choice = ParseCodecChoice("quant4");   // or "auto"
//   std::vector<CodecRule> rules = {{"encoder.*", *choice}};
//   CodecChoice c = ChoiceFor(rules, default_choice, "encoder.layers.0");
#ifndef ACTPACK_RUNTIME_CODEC_CHOICE_H_
#define ACTPACK_RUNTIME_CODEC_CHOICE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codecs/codec.h"
#include "common/not_packed.h"

namespace actpack::runtime {

using ::actpack::kNotPacked;  // common/not_packed.h

// A fixed codec, "auto" (the policy chooses per tensor), or "none" (kept as they are).
struct CodecChoice {
  bool automatic = false;
  bool keep = false;           // "none"
  codecs::CodecParams params;  // when neither

  // "auto", "none" or the codec's spec ("quant:bits=2,group=256").
  std::string Name() const;
};

// Saved tensors produced inside modules whose name matches `pattern` (a glob: * and ?, as in
// fnmatch, over names such as "layer1.0.conv1") get `choice`.
struct CodecRule {
  std::string pattern;
  CodecChoice choice;
};

// "auto", "none" or a codec spec ("quant2", "eb:rel=1e-2"), with the error naming the text.
absl::StatusOr<CodecChoice> ParseCodecChoice(absl::string_view text);

// The first rule whose pattern matches `module`, else `fallback`.
const CodecChoice& ChoiceFor(const std::vector<CodecRule>& rules, const CodecChoice& fallback,
                             absl::string_view module);

// fnmatch-style matching of module names: * any run of characters, ? one character.
bool GlobMatch(absl::string_view pattern, absl::string_view text);

}  // namespace actpack::runtime

#endif  // ACTPACK_RUNTIME_CODEC_CHOICE_H_
