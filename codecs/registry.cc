#include "codecs/registry.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "codecs/identity.h"
#include "codecs/quant.h"

namespace actpack::codecs {
namespace {

std::string KnownNames() {
  std::vector<std::string> names;
  for (const Codec* codec : AllCodecs()) names.emplace_back(codec->name());
  return absl::StrJoin(names, ", ");
}

absl::Status SetOption(absl::string_view spec, absl::string_view key, absl::string_view value,
                       CodecParams* params) {
  int64_t number = 0;
  if (!absl::SimpleAtoi(value, &number)) {
    return absl::InvalidArgumentError(absl::StrCat("actpack: codec spec '", spec, "': option '",
                                                   key, "' needs an integer, got '", value, "'"));
  }
  if (key == "bits") {
    params->bits = static_cast<int>(number);
  } else if (key == "group") {
    params->group_size = static_cast<int>(number);
  } else if (key == "seed") {
    params->seed = static_cast<uint64_t>(number);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("actpack: codec spec '", spec,
                                                   "': unknown option '", key,
                                                   "'; known: bits, group, seed"));
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<const Codec*>& AllCodecs() {
  static const std::vector<const Codec*>* const codecs =
      new std::vector<const Codec*>{IdentityCodec(), QuantCodec()};
  return *codecs;
}

const Codec* FindCodec(CodecId id) {
  for (const Codec* codec : AllCodecs()) {
    if (codec->id() == id) return codec;
  }
  return nullptr;
}

absl::StatusOr<const Codec*> FindCodecByName(absl::string_view name) {
  for (const Codec* codec : AllCodecs()) {
    if (codec->name() == name) return codec;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("actpack: unknown codec '", name, "'; known codecs: ", KnownNames()));
}

absl::StatusOr<CodecParams> ParseCodecSpec(absl::string_view spec) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(spec);
  std::pair<absl::string_view, absl::string_view> name_and_options =
      absl::StrSplit(trimmed, absl::MaxSplits(':', 1));
  absl::string_view name = name_and_options.first;
  CodecParams params;
  // A strength suffix: "quant2" is "quant" with 2 bits.
  int suffix_bits = 0;
  const size_t digits = name.find_first_of("0123456789");
  if (digits != absl::string_view::npos && digits > 0) {
    if (!absl::SimpleAtoi(name.substr(digits), &suffix_bits)) {
      return absl::InvalidArgumentError(absl::StrCat("actpack: unknown codec '", spec,
                                                     "'; known codecs: ", KnownNames()));
    }
    name = name.substr(0, digits);
  }
  absl::StatusOr<const Codec*> codec = FindCodecByName(name);
  if (!codec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("actpack: unknown codec '", spec,
                                                   "'; known codecs: ", KnownNames(),
                                                   " (quant takes a bit suffix: quant2)"));
  }
  params.codec = (*codec)->id();
  if (suffix_bits != 0) params.bits = suffix_bits;
  if (!name_and_options.second.empty()) {
    for (absl::string_view option : absl::StrSplit(name_and_options.second, ',')) {
      std::pair<absl::string_view, absl::string_view> kv =
          absl::StrSplit(option, absl::MaxSplits('=', 1));
      absl::Status set = SetOption(spec, absl::StripAsciiWhitespace(kv.first),
                                   absl::StripAsciiWhitespace(kv.second), &params);
      if (!set.ok()) return set;
    }
  }
  // Validate the numbers now, against a float32 tensor, so a bad spec fails where it is given.
  absl::Status encodable = (*codec)->CheckEncodable(TensorSpec{DType::kFloat32, {}}, params);
  if (!encodable.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("actpack: codec spec '", spec, "': ", absl::StripPrefix(encodable.message(), "actpack: ")));
  }
  return params;
}

std::string FormatCodecSpec(const CodecParams& params) {
  const Codec* codec = FindCodec(params.codec);
  const std::string name = codec == nullptr ? "unknown" : std::string(codec->name());
  if (params.codec == CodecId::kQuant) {
    std::string spec = absl::StrCat(name, params.bits);
    if (params.group_size != 256) absl::StrAppend(&spec, ":group=", params.group_size);
    return spec;
  }
  return name;
}

}  // namespace actpack::codecs
