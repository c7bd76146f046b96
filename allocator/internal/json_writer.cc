#include "allocator/internal/json_writer.h"

#include "absl/strings/str_cat.h"

namespace actpack::allocator::internal {

void AppendJsonString(absl::string_view text, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out.push_back(kHex[(c >> 4) & 0xF]);
          out.push_back(kHex[c & 0xF]);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!has_element_.empty()) {
    if (has_element_.back()) out_.push_back(',');
    has_element_.back() = true;
  }
}

void JsonWriter::Open(char bracket) {
  BeforeValue();
  out_.push_back(bracket);
  has_element_.push_back(false);
}

void JsonWriter::Close(char bracket) {
  out_.push_back(bracket);
  has_element_.pop_back();
}

void JsonWriter::Key(absl::string_view key) {
  BeforeValue();
  AppendJsonString(key, out_);
  out_.push_back(':');
  after_key_ = true;
}

void JsonWriter::String(absl::string_view value) {
  BeforeValue();
  AppendJsonString(value, out_);
}

void JsonWriter::Int(int64_t value) {
  BeforeValue();
  absl::StrAppend(&out_, value);
}

void JsonWriter::UInt(uint64_t value) {
  BeforeValue();
  absl::StrAppend(&out_, value);
}

void JsonWriter::Bool(bool value) {
  BeforeValue();
  out_ += value ? "true" : "false";
}

}  // namespace actpack::allocator::internal
