#include "codecs/registry.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "codecs/bitpack.h"
#include "codecs/cast.h"
#include "codecs/division.h"
#include "codecs/eb.h"
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
  // eb takes its bound as a real number: rel=1e-3 or abs=0.01.
  if (params->codec == CodecId::kEb && (key == "rel" || key == "abs")) {
    double bound = 0;
    if (!absl::SimpleAtod(value, &bound)) {
      return absl::InvalidArgumentError(absl::StrCat("actpack: codec spec '", spec, "': option '",
                                                     key, "' needs a number, got '", value, "'"));
    }
    params->eb_mode = key == "rel" ? EbMode::kRelative : EbMode::kAbsolute;
    params->error_bound = bound;
    return absl::OkStatus();
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
                                                   "keep (division_dct), to (cast), rel or abs "
                                                   "(eb)"));
  }
  return absl::OkStatus();
}

// The shortest "1e-2" / "2.5e-1" form of v that reads back as v.
std::string ShortestNumber(double v) {
  std::string text;
  for (int digits = 0; digits <= 17; ++digits) {
    text = absl::StrFormat("%.*e", digits, v);
    double back = 0;
    if (absl::SimpleAtod(text, &back) && back == v) break;
  }
  // "1e-02" -> "1e-2", "5e+00" -> "5e0".
  const size_t e = text.find('e');
  if (e == std::string::npos) return text;
  std::string exponent = text.substr(e + 1);
  const bool negative = !exponent.empty() && exponent[0] == '-';
  if (!exponent.empty() && (exponent[0] == '-' || exponent[0] == '+')) exponent.erase(0, 1);
  exponent.erase(0, std::min(exponent.find_first_not_of('0'), exponent.size() - 1));
  return absl::StrCat(text.substr(0, e), "e", negative ? "-" : "", exponent);
}

}  // namespace

const std::vector<const Codec*>& AllCodecs() {
  static const std::vector<const Codec*>* const codecs =
      new std::vector<const Codec*>{IdentityCodec(), QuantCodec(),    CastCodec(),
                                    MaskCodec(),     PoolCodec(),     EbCodec(),
                                    DivisionCodec(), BitpackCodec(), DivisionDctCodec()};
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
  if (params.codec == CodecId::kDivision || params.codec == CodecId::kDivisionDct) {
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
  if (params.codec == CodecId::kBitpack && !name_and_options.second.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("actpack: codec spec '", spec, "': bitpack takes no options"));
  }
  if (!name_and_options.second.empty()) {
    int bounds = 0;
    for (absl::string_view option : absl::StrSplit(name_and_options.second, ',')) {
      std::pair<absl::string_view, absl::string_view> kv =
          absl::StrSplit(option, absl::MaxSplits('=', 1));
      const absl::string_view key = absl::StripAsciiWhitespace(kv.first);
      absl::Status set = SetOption(spec, key, absl::StripAsciiWhitespace(kv.second), &params);
      if (!set.ok()) return set;
      if (params.codec == CodecId::kEb && (key == "rel" || key == "abs") && ++bounds > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "actpack: codec spec '", spec, "': eb takes one bound, rel=... or abs=..."));
      }
    }
  }
  // Validate the numbers now, against a tensor of a dtype the codec takes (float32; int64 for
  // bitpack, which packs integers only), so a bad spec fails where it is given.
  const DType probe = params.codec == CodecId::kBitpack ? DType::kInt64 : DType::kFloat32;
  absl::Status encodable = (*codec)->CheckEncodable(TensorSpec{probe, {}}, params);
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
  if (params.codec == CodecId::kDivision || params.codec == CodecId::kDivisionDct) {
    const bool dct = params.codec == CodecId::kDivisionDct;
    const int lfc = dct ? params.keep : params.block;
    const int default_lfc = dct ? kDivisionDefaultKeep : kDivisionDefaultBlock;
    if (lfc == default_lfc && params.bits == 2 && params.group_size == kDivisionDefaultGroup) {
      return name;
    }
    std::string spec = absl::StrCat(name, dct ? ":keep=" : ":block=", lfc, ",bits=", params.bits);
    if (params.group_size != kDivisionDefaultGroup) {
      absl::StrAppend(&spec, ",group=", params.group_size);
    }
    return spec;
  }
  if (params.codec == CodecId::kEb) {
    return absl::StrCat(name, params.eb_mode == EbMode::kAbsolute ? ":abs=" : ":rel=",
                        ShortestNumber(params.error_bound));
  }
  if (params.codec == CodecId::kCast) {
    return absl::StrCat(name, params.cast_to == DType::kBFloat16 ? ":bf16" : ":fp16");
  }
  return name;
}

}  // namespace actpack::codecs
