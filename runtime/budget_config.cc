#include "runtime/budget_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codecs/registry.h"
#include "runtime/codec_choice.h"

namespace actpack::runtime {
namespace {

constexpr char kWhere[] = "actpack.budget: ";
constexpr char kHeadroomExpected[] = "a share of the budget in [0, 0.5)";

// Whether a codec choice may change what backward reads: "auto" and the lossy codecs' specs,
// not "none" nor a lossless codec's (Codec::lossless).
bool IsLossy(absl::string_view spec) {
  if (spec.substr(0, spec.find(':')) == kNotPacked) return false;
  const absl::StatusOr<codecs::CodecParams> params = codecs::ParseCodecSpec(spec);
  if (!params.ok()) return true;  // "auto"
  const codecs::Codec* codec = codecs::FindCodec(params->codec);
  return codec == nullptr || !codec->lossless();
}

// Python's repr of a printable str without quotes in it (what the Python front end passes);
// other text stays on one line: backslashes, quotes and control bytes escaped as repr does.
std::string Quoted(absl::string_view text) {
  std::string out = "'";
  for (const char c : text) {
    const unsigned char byte = static_cast<unsigned char>(c);
    if (c == '\\' || c == '\'') {
      absl::StrAppend(&out, "\\", absl::string_view(&c, 1));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(byte, absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  return out + "'";
}

absl::Status BadConfValue(absl::string_view key, absl::string_view value,
                          absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat("actpack: ACTPACK_CONF: key '", key, "' is ",
                                                 Quoted(value), "; expected ", expected));
}

}  // namespace

std::string ShowNumber(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // The shortest digits that read back, laid out as Python's repr lays them: positional for
  // decimal exponents in [-4, 16), else d.ddde+XX.
  char text[64];
  const std::to_chars_result end =
      std::to_chars(text, text + sizeof(text), value, std::chars_format::scientific);
  std::string scientific(text, end.ptr);
  std::string sign;
  if (scientific[0] == '-') {
    sign = "-";
    scientific.erase(0, 1);
  }
  const size_t e = scientific.find('e');
  const int exponent = std::stoi(scientific.substr(e + 1));
  std::string digits;
  for (const char c : scientific.substr(0, e)) {
    if (c != '.') digits += c;
  }
  if (exponent < -4 || exponent >= 16) {
    std::string shown = digits.substr(0, 1);
    if (digits.size() > 1) absl::StrAppend(&shown, ".", digits.substr(1));
    const int magnitude = exponent < 0 ? -exponent : exponent;
    return absl::StrCat(sign, shown, "e", exponent < 0 ? "-" : "+", magnitude < 10 ? "0" : "",
                        magnitude);
  }
  if (exponent < 0) {
    return absl::StrCat(sign, "0.", std::string(static_cast<size_t>(-exponent - 1), '0'), digits);
  }
  const size_t whole = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= whole) {
    return absl::StrCat(sign, digits, std::string(whole - digits.size(), '0'), ".0");
  }
  return absl::StrCat(sign, digits.substr(0, whole), ".", digits.substr(whole));
}

std::string BudgetConfig::DefaultMinBytesText() { return absl::StrCat(kDefaultMinBytes); }

absl::Status BudgetConfig::Validate() const {
  if (limit.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWhere, "the limit is empty; give a budget such as \"6GiB\" or \"80%\""));
  }
  if (absl::StatusOr<MemoryLimit> parsed = ParseMemoryLimit(limit); !parsed.ok()) {
    return parsed.status();
  }
  if (min_bytes != "0") {
    if (absl::StatusOr<uint64_t> bytes = ParseByteSize(min_bytes, "min_bytes"); !bytes.ok()) {
      return bytes.status();
    }
  }
  if (!std::isfinite(headroom)) {
    return absl::InvalidArgumentError(absl::StrCat(kWhere, "headroom=", ShowNumber(headroom),
                                                   " is not finite; expected ",
                                                   kHeadroomExpected));
  }
  if (!(headroom >= 0 && headroom < kMaxHeadroom)) {
    return absl::InvalidArgumentError(absl::StrCat(kWhere, "headroom=", ShowNumber(headroom),
                                                   " is out of range; expected ",
                                                   kHeadroomExpected));
  }
  if (profile_every < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWhere, "profile_every=", profile_every,
        " is out of range; expected an int from 1 to 2**63-1 (steps between profiles)"));
  }
  if (!std::isfinite(max_rel_rms) || max_rel_rms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "actpack: max_rel_rms is the relative RMS error a saved tensor may carry, a number >= 0 "
        "(0 or None: no floor), got ",
        ShowNumber(max_rel_rms)));
  }
  if (recompute != "false" && recompute != "true" && recompute != "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        kWhere, "recompute must be True, False or \"auto\", got ", Quoted(recompute)));
  }
  std::vector<std::string> specs = {codec};
  for (const auto& [pattern, spec] : rules) specs.push_back(spec);
  for (const std::string& spec : specs) {
    if (absl::StatusOr<CodecChoice> choice = ParseCodecChoice(spec); !choice.ok()) {
      return choice.status();
    }
  }
  if (allowed_loss_increase.has_value()) {
    const double bound = *allowed_loss_increase;
    if (!(bound > 0 && bound < 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          kWhere, "allowed_loss_increase is the fraction the loss may rise over an exact step, "
          "in (0, 1) (e.g. 0.01), got ", ShowNumber(bound)));
    }
    for (const std::string& spec : specs) {
      if (spec != "auto" && spec != "eb") {
        return absl::InvalidArgumentError(absl::StrCat(
            kWhere, "allowed_loss_increase sets the error bounds of 'eb' and the caps of "
            "'auto'; it does not apply to codec '", spec,
            "' (use 'eb' or 'auto', or leave allowed_loss_increase out)"));
      }
    }
  }
  return absl::OkStatus();
}

MemoryLimit BudgetConfig::ParsedLimit() const {
  absl::StatusOr<MemoryLimit> parsed = ParseMemoryLimit(limit);
  return parsed.ok() ? *parsed : MemoryLimit{};
}

uint64_t BudgetConfig::MinBytes() const {
  if (min_bytes == "0") return 0;
  absl::StatusOr<uint64_t> bytes = ParseByteSize(min_bytes, "min_bytes");
  return bytes.ok() ? *bytes : kDefaultMinBytes;
}

RecomputeMode BudgetConfig::Recompute() const {
  if (recompute == "true") return RecomputeMode::kOn;
  if (recompute == "auto") return RecomputeMode::kAuto;
  return RecomputeMode::kOff;
}

bool BudgetConfig::Packs() const { return enabled && codec != kNotPacked; }

bool BudgetConfig::Chooses() const {
  // With rules, the mapping decides (a catch-all rule "*" to a fixed codec leaves auto
  // nothing to choose), as actpack.budget's dict form states it.
  if (rules.empty()) return codec == "auto";
  for (const auto& [pattern, spec] : rules) {
    if (spec == "auto") return true;
  }
  return false;
}

bool BudgetConfig::Automatic() const { return Packs() && (codec == "auto" || !rules.empty()); }

bool BudgetConfig::GuardsGradients() const {
  if (!gradient_guard || !Packs()) return false;
  if (IsLossy(codec)) return true;
  for (const auto& [pattern, spec] : rules) {
    if (IsLossy(spec)) return true;
  }
  return false;
}

std::string BudgetConfig::CodecText() const {
  if (rules.empty()) return Quoted(codec);
  std::vector<std::string> items;
  for (const auto& [pattern, spec] : rules) {
    items.push_back(absl::StrCat(Quoted(pattern), ": ", Quoted(spec)));
  }
  if (codec != "auto") items.push_back(absl::StrCat("'*': ", Quoted(codec)));
  return absl::StrCat("{", absl::StrJoin(items, ", "), "}");
}

std::string BudgetConfig::Packing() const {
  return Packs() ? absl::StrCat("codec ", CodecText()) : "plain training (enabled=False)";
}

absl::StatusOr<SessionOptions> BudgetConfig::SessionOptionsFor(
    uint64_t budget_bytes, uint64_t outside_allowance_bytes) const {
  SessionOptions options;
  absl::StatusOr<CodecChoice> choice = ParseCodecChoice(codec);
  if (!choice.ok()) return choice.status();
  options.codec = *choice;
  for (const auto& [pattern, spec] : rules) {
    absl::StatusOr<CodecChoice> rule = ParseCodecChoice(spec);
    if (!rule.ok()) return rule.status();
    options.rules.push_back({pattern, *rule});
  }
  options.min_bytes = MinBytes();
  options.seed = seed;
  options.enabled = Packs();
  options.budget_bytes = budget_bytes;
  options.headroom = headroom;
  options.outside_allowance_bytes = outside_allowance_bytes;
  options.profile_every = static_cast<int>(std::min<int64_t>(profile_every, int64_t{1} << 30));
  options.allowed_loss_increase = allowed_loss_increase.value_or(0.0);
  options.max_rel_rms = max_rel_rms;
  return options;
}

const std::vector<std::string>& BudgetConfKeys() {
  static const std::vector<std::string> keys = {
      "budget",   "codec",     "report",      "min_bytes", "seed",  "enabled", "allocator",
      "allowed_loss_increase", "recompute",   "max_rel_rms", "device"};
  return keys;
}

absl::StatusOr<BudgetConf> ParseBudgetConf(absl::string_view text) {
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> pairs =
      ParseKeyValues(text, BudgetConfKeys(), "ACTPACK_CONF");
  if (!pairs.ok()) return pairs.status();
  BudgetConf conf;
  BudgetConfig& config = conf.config;
  bool has_budget = false;
  for (const auto& [key, value] : *pairs) {
    conf.given.push_back(key);
    if (key == "budget") {
      has_budget = true;
      config.limit = value;
    } else if (key == "codec") {
      config.codec = value;
    } else if (key == "report") {
      config.report = value;
    } else if (key == "min_bytes") {
      config.min_bytes = value;
    } else if (key == "seed") {
      if (!absl::SimpleAtoi(value, &config.seed)) {
        return BadConfValue(key, value, "an integer");
      }
    } else if (key == "enabled") {
      if (value != "0" && value != "1" && value != "true" && value != "false") {
        return BadConfValue(key, value, "true or false");
      }
      config.enabled = value == "1" || value == "true";
    } else if (key == "allocator") {
      if (value != "auto" && value != "cpu" && value != "cuda" && value != "none") {
        return BadConfValue(key, value, "one of auto, cpu, cuda, none");
      }
      conf.allocator = value;
    } else if (key == "allowed_loss_increase") {
      double bound = 0;
      if (!absl::SimpleAtod(value, &bound)) {
        return BadConfValue(key, value, "a fraction such as 0.01");
      }
      config.allowed_loss_increase = bound;
    } else if (key == "recompute") {
      if (value == "true" || value == "1") {
        config.recompute = "true";
      } else if (value == "false" || value == "0") {
        config.recompute = "false";
      } else if (value == "auto") {
        config.recompute = "auto";
      } else {
        return BadConfValue(key, value, "true, false or auto");
      }
    } else if (key == "max_rel_rms") {
      double floor = 0;
      if (value == "none") {
        config.max_rel_rms = 0;
      } else if (absl::SimpleAtod(value, &floor)) {
        config.max_rel_rms = floor;
      } else {
        return BadConfValue(key, value, "a number such as 0.2, or none");
      }
    } else if (key == "device") {
      conf.device = value;
    }
  }
  if (!has_budget) {
    return absl::InvalidArgumentError(
        "actpack: ACTPACK_CONF: key 'budget' is required, e.g. "
        "ACTPACK_CONF=\"budget=6GiB,codec=quant2\"");
  }
  if (absl::Status valid = config.Validate(); !valid.ok()) return valid;
  return conf;
}

}  // namespace actpack::runtime
