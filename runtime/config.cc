#include "runtime/config.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "allocator/units.h"

namespace actpack::runtime {
namespace {

struct Unit {
  const char* name;
  double multiplier;
};

constexpr Unit kUnits[] = {
    {"", 1.0},           {"b", 1.0},
    {"k", 1024.0},       {"kib", 1024.0},      {"kb", 1e3},
    {"m", 1048576.0},    {"mib", 1048576.0},   {"mb", 1e6},
    {"g", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
    {"t", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12},
};

absl::Status BadSize(absl::string_view what, absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "actpack: invalid ", what, " '", text, "': ", why,
      "; expected a positive number with a unit, e.g. '6GiB', '512MiB', '1.5GB' or '80%'"));
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text, absl::string_view what) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  const auto digit_at = [&](size_t i) { return i < trimmed.size() && absl::ascii_isdigit(trimmed[i]); };
  size_t split = 0;
  while (split < trimmed.size() &&
         (absl::ascii_isdigit(trimmed[split]) || trimmed[split] == '.' || trimmed[split] == '-' ||
          trimmed[split] == '+')) {
    ++split;
  }
  // A number may carry an exponent ("1e9", "1.5E-3"): an 'e' followed by a digit, or by a
  // sign and a digit, belongs to the number, not to the unit.
  const size_t mantissa_end = split;
  if (split > 0 && split < trimmed.size() && (trimmed[split] == 'e' || trimmed[split] == 'E')) {
    size_t end = split + 1;
    if (end < trimmed.size() && (trimmed[end] == '+' || trimmed[end] == '-')) ++end;
    if (digit_at(end)) {
      while (digit_at(end)) ++end;
      split = end;
    }
  }
  const absl::string_view number_text = trimmed.substr(0, split);
  const std::string unit_text =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(trimmed.substr(split)));
  double number = 0;
  if (number_text.empty() || !absl::SimpleAtod(number_text, &number) || std::isnan(number)) {
    return BadSize(what, text, "no number");
  }
  const auto out_of_range = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "actpack: invalid ", what, " '", text, "': out of range; expected 1 byte to 9.2e18 bytes (",
        allocator::FormatBytes(kMaxSizeBytes), ")"));
  };
  // A non-zero mantissa whose exponent took it to 0 or to infinity ("1e-400", "1e400").
  const bool nonzero_mantissa =
      trimmed.substr(0, mantissa_end).find_first_of("123456789") != absl::string_view::npos;
  if (std::isinf(number) || (number == 0 && nonzero_mantissa)) return out_of_range();
  if (number <= 0) return BadSize(what, text, "the size must be positive");
  for (const Unit& unit : kUnits) {
    if (unit_text == unit.name) {
      const double bytes = number * unit.multiplier;
      if (bytes < 1 || bytes > static_cast<double>(kMaxSizeBytes)) return out_of_range();
      return static_cast<uint64_t>(std::llround(bytes));
    }
  }
  return BadSize(what, text, absl::StrCat("unknown unit '", unit_text, "'"));
}

uint64_t MemoryLimit::Resolve(uint64_t device_total) const {
  if (bytes != 0) return bytes;
  return allocator::ShareOf(fraction, device_total);
}

std::string MemoryLimit::ToString() const {
  if (bytes != 0) return allocator::FormatBytes(bytes);
  return absl::StrFormat("%g%% of the device", fraction * 100.0);
}

absl::StatusOr<MemoryLimit> ParseMemoryLimit(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  MemoryLimit budget;
  if (!trimmed.empty() && trimmed.back() == '%') {
    double percent = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(trimmed.substr(0, trimmed.size() - 1)),
                          &percent) ||
        !(percent > 0 && percent <= 100)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "actpack: invalid budget '", text, "': a share of the device must be in (0%, 100%]"));
    }
    budget.fraction = percent / 100.0;
    return budget;
  }
  absl::StatusOr<uint64_t> bytes = ParseByteSize(trimmed);
  if (!bytes.ok()) return bytes.status();
  budget.bytes = *bytes;
  return budget;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseKeyValues(
    absl::string_view text, const std::vector<std::string>& allowed, absl::string_view source) {
  std::vector<std::pair<std::string, std::string>> pairs;
  const std::string known = absl::StrJoin(allowed, ", ");
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    const size_t equals = item.find('=');
    if (equals == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("actpack: ", source, ": '", item,
                                                     "' is not key=value; known keys: ", known));
    }
    const std::string key(absl::StripAsciiWhitespace(item.substr(0, equals)));
    const std::string value(absl::StripAsciiWhitespace(item.substr(equals + 1)));
    bool is_allowed = false;
    for (const std::string& name : allowed) is_allowed = is_allowed || name == key;
    if (!is_allowed) {
      return absl::InvalidArgumentError(absl::StrCat("actpack: ", source, ": unknown key '", key,
                                                     "'; known keys: ", known));
    }
    for (const auto& [seen, unused] : pairs) {
      if (seen == key) {
        return absl::InvalidArgumentError(
            absl::StrCat("actpack: ", source, ": key '", key, "' is given twice"));
      }
    }
    if (value.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("actpack: ", source, ": key '", key, "' has no value"));
    }
    pairs.emplace_back(key, value);
  }
  return pairs;
}

}  // namespace actpack::runtime
