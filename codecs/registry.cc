#include "codecs/registry.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "codecs/cast.h"
#include "codecs/division.h"
#include "codecs/identity.h"
#include "codecs/mask.h"
#include "codecs/pool.h"
#include "codecs/quant.h"

namespace actpack::codecs {
namespace {

std::string KnownNames() {
  std::vector<std::string> names;
  for (const Codec* codec : AllCodecs()) names.emplace_back(codec->name());
  return absl::StrJoin(names, ", ");
}

// "fp16", "float16", "bf16", "bfloat16": a storage type of `cast`.
bool ParseCastTarget(absl::string_view name, DType* dtype) {
  if (name == "fp16" || name == "float16") {
    *dtype = DType::kFloat16;
  } else if (name == "bf16" || name == "bfloat16") {
    *dtype = DType::kBFloat16;
  } else {
    return false;
  }
  return true;
}

absl::Status SetOption(absl::string_view spec, absl::string_view key, absl::string_view value,
                       CodecParams* params) {
  // cast takes its storage type as a bare option ("cast:bf16") or as to=bf16.
  if (params->codec == CodecId::kCast && (key == "to" || value.empty())) {
    if (ParseCastTarget(value.empty() ? key : value, &params->cast_to)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("actpack: codec spec '", spec,
                                                   "': cast stores fp16 or bf16, not '",
                                                   value.empty() ? key : value, "'"));
  }
  int64_t number = 0;
  if (!absl::SimpleAtoi(value, &number)) {
    return absl::InvalidArgumentError(absl::StrCat("actpack: codec spec '", spec, "': option '",
                                                   key, "' needs an integer, got '", value, "'"));
  }
  if (number < -(int64_t{1} << 31) || number > (int64_t{1} << 31) - 1) {
    if (key != "seed") {
      return absl::InvalidArgumentError(absl::StrCat("actpack: codec spec '", spec,
                                                     "': option '", key, "' is out of range"));
    }
  }
  if (key == "bits") {
    params->bits = static_cast<int>(number);
  } else if (key == "group") {
    params->group_size = static_cast<int>(number);
  } else if (key == "seed") {
    params->seed = static_cast<uint64_t>(number);
  } else if (key == "k") {
    params->pool_window = static_cast<int>(number);
  } else if (key == "block") {
    params->block = static_cast<int>(number);
  } else if (key == "keep") {
    params->keep = static_cast<int>(number);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("actpack: codec spec '", spec,
                                                   "': unknown option '", key,
                                                   "'; known: bits, group, seed (quant, "
                                                   "division), k (pool), block (division), "
                                                   "keep (division_fft), to (cast)"));
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<const Codec*>& AllCodecs() {
  static const std::vector<const Codec*>* const codecs =
      new std::vector<const Codec*>{IdentityCodec(), QuantCodec(),    CastCodec(),
                                    MaskCodec(),     PoolCodec(),     DivisionCodec(),
                                    DivisionFftCodec()};
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
  // "fp16" and "bf16" are short for "cast:fp16" and "cast:bf16".
  if (ParseCastTarget(name, &params.cast_to)) {
    if (!name_and_options.second.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("actpack: codec spec '", spec, "': ", name, " takes no options"));
    }
    params.codec = CodecId::kCast;
    return params;
  }
  // A strength suffix: "quant2" is "quant" with 2 bits, "pool4" is "pool" with k = 4.
  int suffix = 0;
  const size_t digits = name.find_first_of("0123456789");
  if (digits != absl::string_view::npos && digits > 0) {
    if (!absl::SimpleAtoi(name.substr(digits), &suffix)) {
      return absl::InvalidArgumentError(absl::StrCat("actpack: unknown codec '", spec,
                                                     "'; known codecs: ", KnownNames()));
    }
    name = name.substr(0, digits);
  }
  absl::StatusOr<const Codec*> codec = FindCodecByName(name);
  if (!codec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("actpack: unknown codec '", spec,
                                                   "'; known codecs: ", KnownNames(),
                                                   " (quant and pool take a suffix: quant2, "
                                                   "pool4; cast: fp16, bf16)"));
  }
  params.codec = (*codec)->id();
  if (params.codec == CodecId::kDivision || params.codec == CodecId::kDivisionFft) {
    params.group_size = kDivisionDefaultGroup;
  }
  if (digits != absl::string_view::npos && digits > 0) {
    if (params.codec == CodecId::kQuant) {
      params.bits = suffix;
    } else if (params.codec == CodecId::kPool) {
      params.pool_window = suffix;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("actpack: codec spec '", spec, "': ", name,
                                                     " takes no number suffix"));
    }
  }
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
  if (params.codec == CodecId::kPool) return absl::StrCat(name, params.pool_window);
  if (params.codec == CodecId::kDivision || params.codec == CodecId::kDivisionFft) {
    const bool fft = params.codec == CodecId::kDivisionFft;
    const int lfc = fft ? params.keep : params.block;
    const int default_lfc = fft ? kDivisionDefaultKeep : kDivisionDefaultBlock;
    if (lfc == default_lfc && params.bits == 2 && params.group_size == kDivisionDefaultGroup) {
      return name;
    }
    std::string spec = absl::StrCat(name, fft ? ":keep=" : ":block=", lfc, ",bits=", params.bits);
    if (params.group_size != kDivisionDefaultGroup) {
      absl::StrAppend(&spec, ",group=", params.group_size);
    }
    return spec;
  }
  if (params.codec == CodecId::kCast) {
    return absl::StrCat(name, params.cast_to == DType::kBFloat16 ? ":bf16" : ":fp16");
  }
  return name;
}

}  // namespace actpack::codecs
