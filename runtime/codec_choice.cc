#include "runtime/codec_choice.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "codecs/registry.h"

namespace actpack::runtime {

std::string CodecChoice::Name() const {
  if (keep) return std::string(kNotPacked);
  return automatic ? std::string("auto") : codecs::FormatCodecSpec(params);
}

absl::StatusOr<CodecChoice> ParseCodecChoice(absl::string_view text) {
  CodecChoice choice;
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  if (trimmed == "auto") {
    choice.automatic = true;
    return choice;
  }
  if (trimmed == kNotPacked) {
    choice.keep = true;
    return choice;
  }
  absl::StatusOr<codecs::CodecParams> params = codecs::ParseCodecSpec(text);
  if (!params.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(params.status().message(),
                     " (or 'auto': the policy chooses per tensor; 'none': not packed)"));
  }
  if (params->codec == codecs::CodecId::kBitpack) {
    // It takes integers only: as a session's codec every float tensor would fail to pack.
    return absl::InvalidArgumentError(absl::StrCat(
        "actpack: codec '", text, "': bitpack packs integer tensors only, and a session packs "
        "every integer tensor with it already; choose a codec for the floating-point tensors "
        "(or 'auto': the policy chooses per tensor)"));
  }
  choice.params = *params;
  return choice;
}

const CodecChoice& ChoiceFor(const std::vector<CodecRule>& rules, const CodecChoice& fallback,
                             absl::string_view module) {
  for (const CodecRule& rule : rules) {
    if (GlobMatch(rule.pattern, module)) return rule.choice;
  }
  return fallback;
}

bool GlobMatch(absl::string_view pattern, absl::string_view text) {
  // Iterative wildcard matching with one backtrack point (the last '*').
  size_t p = 0, t = 0, star = absl::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace actpack::runtime
