#include "runtime/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/charconv.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace actpack::json {
namespace {

// The byte length of the valid UTF-8 sequence (RFC 3629: no overlong forms, no surrogates,
// nothing above U+10FFFF) that starts s[pos], or 0 when there is none. `*truncated` says the
// bytes that are there form a valid prefix cut short by the end of `s`.
size_t Utf8SequenceLength(absl::string_view s, size_t pos, bool* truncated) {
  *truncated = false;
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(pos);
  if (lead < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    len = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    len = 3;
    if (lead == 0xE0) lo = 0xA0;  // overlong
    if (lead == 0xED) hi = 0x9F;  // UTF-16 surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    len = 4;
    if (lead == 0xF0) lo = 0x90;  // overlong
    if (lead == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  for (size_t i = 1; i < len; ++i) {
    if (pos + i >= s.size()) {
      *truncated = true;
      return 0;
    }
    const unsigned char c = byte(pos + i);
    if (i == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return 0;
  }
  return len;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Exact comparison of an int64 and a double (no rounding of either side).
bool IntEqualsDouble(int64_t i, double d) {
  // 2^63 is exactly representable; int64 covers [-2^63, 2^63).
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return false;
  if (d != std::trunc(d)) return false;
  return static_cast<int64_t>(d) == i;
}

// Typed accessors on the wrong type are programming errors: say which, then abort.
[[noreturn]] void Fatal(const std::string& message) {
  std::fprintf(stderr, "json::Value::%s\n", message.c_str());
  std::abort();
}

[[noreturn]] void TypeMismatch(absl::string_view accessor, const Value& v) {
  static constexpr const char* kNames[] = {"null",     "a bool",   "a number",
                                           "a string", "an array", "an object"};
  const char* name = kNames[static_cast<int>(v.type())];
  if (v.is_number()) name = v.is_int() ? "an int64 number" : "a double number";
  Fatal(absl::StrCat(accessor, " called on ", name));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Parser: recursive descent over the text, depth-bounded by kMaxDepth. A friend of Value so
// that object members go in without Set's linear search (duplicates are checked here).

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Value> ParseDocument() {
    Value value;
    SkipWhitespace();
    if (absl::Status s = ParseValue(0, &value); !s.ok()) return s;
    SkipWhitespace();
    if (pos_ < text_.size()) return Expected(pos_, "end of input after the JSON value");
    return value;
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }

  void SkipWhitespace() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  // "line L, column C" of byte offset `at`; computed only on error, so the happy path does no
  // line bookkeeping.
  std::string LineColumn(size_t at) const {
    int line = 1, column = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(text_[i]);
      if (c == '\n') {
        ++line;
        column = 1;
      } else if ((c & 0xC0) != 0x80) {  // count characters, not continuation bytes
        ++column;
      }
    }
    return absl::StrFormat("line %d, column %d", line, column);
  }

  std::string Where(size_t at) const { return absl::StrCat("json: ", LineColumn(at), ": "); }

  static std::string Describe(char ch) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '\'') return "\"'\"";
    if (c >= 0x20 && c < 0x7F) return absl::StrFormat("'%c'", ch);
    return absl::StrFormat("byte 0x%02X", c);
  }

  absl::Status Invalid(size_t at, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(Where(at), what));
  }

  // Truncated input is kDataLoss (the document was cut short, e.g. a partly written report);
  // anything else that is not what the grammar wants is kInvalidArgument.
  absl::Status Expected(size_t at, absl::string_view what) const {
    if (at >= text_.size()) {
      return absl::DataLossError(
          absl::StrCat(Where(at), "unexpected end of input; expected ", what));
    }
    return Invalid(at, absl::StrCat("expected ", what, ", found ", Describe(text_[at])));
  }

  absl::Status ParseValue(int depth, Value* out) {
    if (AtEnd()) return Expected(pos_, "a JSON value");
    switch (Peek()) {
      case '{':
        return ParseObject(depth, out);
      case '[':
        return ParseArray(depth, out);
      case '"': {
        std::string s;
        if (absl::Status st = ParseString(&s); !st.ok()) return st;
        *out = Value(std::move(s));
        return absl::OkStatus();
      }
      case 't':
        return ParseLiteral("true", Value(true), out);
      case 'f':
        return ParseLiteral("false", Value(false), out);
      case 'n':
        return ParseLiteral("null", Value(), out);
      case '/':
        return Invalid(pos_, "expected a JSON value, found '/' (JSON has no comments)");
      default:
        if (Peek() == '-' || IsDigit(Peek())) return ParseNumber(out);
        return Expected(pos_, "a JSON value");
    }
  }

  absl::Status ParseLiteral(absl::string_view word, Value value, Value* out) {
    for (size_t i = 0; i < word.size(); ++i) {
      if (pos_ + i >= text_.size() || text_[pos_ + i] != word[i]) {
        return Expected(pos_ + i, absl::StrCat("'", word, "'"));
      }
    }
    pos_ += word.size();
    *out = std::move(value);
    return absl::OkStatus();
  }

  absl::Status ParseNumber(Value* out) {
    const size_t start = pos_;
    if (Peek() == '-') ++pos_;
    if (AtEnd() || !IsDigit(Peek())) return Expected(pos_, "a digit after '-'");
    if (Peek() == '0') {
      ++pos_;
      if (!AtEnd() && IsDigit(Peek())) {
        return Invalid(pos_ - 1, "leading zeros are not allowed in numbers");
      }
    } else {
      while (!AtEnd() && IsDigit(Peek())) ++pos_;
    }
    const size_t int_end = pos_;
    bool is_integer = true;
    if (!AtEnd() && Peek() == '.') {
      is_integer = false;
      ++pos_;
      if (AtEnd() || !IsDigit(Peek())) return Expected(pos_, "a digit after '.' in number");
      while (!AtEnd() && IsDigit(Peek())) ++pos_;
    }
    if (!AtEnd() && (Peek() == 'e' || Peek() == 'E')) {
      is_integer = false;
      ++pos_;
      if (!AtEnd() && (Peek() == '+' || Peek() == '-')) ++pos_;
      if (AtEnd() || !IsDigit(Peek())) return Expected(pos_, "a digit in exponent");
      while (!AtEnd() && IsDigit(Peek())) ++pos_;
    }
    const absl::string_view number = text_.substr(start, pos_ - start);
    if (is_integer) {
      int64_t i;
      if (absl::SimpleAtoi(number, &i)) {
        *out = Value(i);
        return absl::OkStatus();
      }
      // Too large for int64: it is still a valid JSON number; keep it as a double.
    }
    double d = 0;
    const absl::from_chars_result r =
        absl::from_chars(number.data(), number.data() + number.size(), d);
    if (r.ec == std::errc::result_out_of_range) {
      // Either too large (refuse: JSON cannot write infinity back) or too small (it is 0).
      if (DecimalExponent(number, int_end - start) > 0) {
        return Invalid(start, absl::StrCat("number ", number.substr(0, 40),
                                           number.size() > 40 ? "..." : "",
                                           " is out of range for a double"));
      }
      d = number[0] == '-' ? -0.0 : 0.0;
    } else if (r.ec != std::errc() || r.ptr != number.data() + number.size()) {
      return Invalid(start, "malformed number");  // not reached: the grammar was checked above
    }
    *out = Value(d);
    return absl::OkStatus();
  }

  // The power of ten of the leading nonzero digit of a grammar-checked number, saturated; only
  // its sign is used, to tell overflow from underflow.
  static int64_t DecimalExponent(absl::string_view number, size_t int_len) {
    size_t i = number[0] == '-' ? 1 : 0;
    int64_t exponent;
    while (i < int_len && number[i] == '0') ++i;
    if (i < int_len) {
      exponent = static_cast<int64_t>(int_len - i) - 1;
    } else {
      i = int_len + 1;  // past '.'
      exponent = -1;
      while (i < number.size() && number[i] == '0') {
        ++i;
        --exponent;
      }
    }
    const size_t e = number.find_first_of("eE");
    if (e != absl::string_view::npos) {
      size_t j = e + 1;
      const bool negative = number[j] == '-';
      if (number[j] == '+' || number[j] == '-') ++j;
      int64_t value = 0;
      for (; j < number.size(); ++j) {
        value = std::min<int64_t>(value * 10 + (number[j] - '0'), int64_t{1} << 40);
      }
      exponent += negative ? -value : value;
    }
    return exponent;
  }

  static int HexValue(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Reads the 4 hex digits after "\u" at pos_.
  absl::Status ParseHex4(uint32_t* out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = AtEnd() ? -1 : HexValue(Peek());
      if (h < 0) return Expected(pos_, "4 hex digits after \\u");
      v = v * 16 + static_cast<uint32_t>(h);
      ++pos_;
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    const size_t open = pos_;
    ++pos_;  // '"'
    while (true) {
      // Copy runs of plain ASCII in one go.
      const size_t run = pos_;
      while (pos_ < text_.size()) {
        const unsigned char c = static_cast<unsigned char>(text_[pos_]);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
        ++pos_;
      }
      out->append(text_.data() + run, pos_ - run);
      if (AtEnd()) {
        return absl::DataLossError(absl::StrCat(
            Where(pos_), "unexpected end of input; expected '\"' to close the string that starts at ",
            LineColumn(open)));
      }
      const unsigned char c = static_cast<unsigned char>(Peek());
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c < 0x20) {
        return Invalid(pos_, absl::StrCat("control character ", Describe(Peek()),
                                          " in string must be escaped"));
      }
      if (c >= 0x80) {
        bool truncated;
        const size_t len = Utf8SequenceLength(text_, pos_, &truncated);
        if (truncated) return Expected(text_.size(), "the rest of a UTF-8 sequence");
        if (len == 0) {
          return Invalid(pos_, absl::StrFormat("invalid UTF-8 byte 0x%02X in string", c));
        }
        out->append(text_.data() + pos_, len);
        pos_ += len;
        continue;
      }
      // Backslash.
      const size_t escape = pos_;
      ++pos_;
      if (AtEnd()) return Expected(pos_, "an escape character after '\\'");
      const char e = Peek();
      ++pos_;
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          if (absl::Status s = ParseHex4(&cp); !s.ok()) return s;
          if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Invalid(escape, absl::StrFormat(
                "unpaired low surrogate \\u%04X in string", cp));
          }
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate must be followed by an escaped low one: together one code point.
            if (absl::StartsWith("\\u", text_.substr(pos_))) {  // input ends here or after '\\'
              return Expected(text_.size(), "a low surrogate \\uDC00-\\uDFFF");
            }
            if (text_.substr(pos_, 2) != "\\u") {
              return Invalid(escape, absl::StrFormat(
                  "high surrogate \\u%04X must be followed by a low surrogate \\uDC00-\\uDFFF",
                  cp));
            }
            const size_t low_at = pos_;
            pos_ += 2;
            uint32_t low = 0;
            if (absl::Status s = ParseHex4(&low); !s.ok()) return s;
            if (low < 0xDC00 || low > 0xDFFF) {
              return Invalid(low_at, absl::StrFormat(
                  "expected a low surrogate \\uDC00-\\uDFFF after \\u%04X, found \\u%04X", cp,
                  low));
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return Invalid(escape, absl::StrCat("invalid escape '\\", absl::string_view(&e, 1),
                                              "' in string"));
      }
    }
  }

  absl::Status EnterContainer(int depth) const {
    if (depth >= kMaxDepth) {
      return Invalid(pos_, absl::StrCat("arrays and objects nested deeper than ", kMaxDepth));
    }
    return absl::OkStatus();
  }

  absl::Status ParseArray(int depth, Value* out) {
    if (absl::Status s = EnterContainer(depth); !s.ok()) return s;
    ++pos_;  // '['
    *out = Value::Array();
    SkipWhitespace();
    if (!AtEnd() && Peek() == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      Value element;
      if (absl::Status s = ParseValue(depth + 1, &element); !s.ok()) return s;
      out->Append(std::move(element));
      SkipWhitespace();
      if (AtEnd()) return Expected(pos_, "',' or ']' after array element");
      if (Peek() == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      if (Peek() != ',') return Expected(pos_, "',' or ']' after array element");
      ++pos_;
      SkipWhitespace();
      if (!AtEnd() && Peek() == ']') return Invalid(pos_, "trailing comma before ']'");
    }
  }

  absl::Status ParseObject(int depth, Value* out) {
    if (absl::Status s = EnterContainer(depth); !s.ok()) return s;
    ++pos_;  // '{'
    *out = Value::Object();
    SkipWhitespace();
    if (!AtEnd() && Peek() == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    // Duplicate keys are found with a scan while the object is small and with a set after,
    // so that a hostile object with many keys stays linear.
    constexpr size_t kScanLimit = 16;
    absl::flat_hash_set<std::string> seen;
    bool first = true;
    while (true) {
      if (AtEnd() || Peek() != '"') {
        return Expected(pos_, first ? "a string key or '}'" : "a string key after ','");
      }
      first = false;
      const size_t key_at = pos_;
      std::string key;
      if (absl::Status s = ParseString(&key); !s.ok()) return s;
      bool duplicate;
      if (out->size() < kScanLimit) {
        duplicate = out->Find(key) != nullptr;
      } else {
        if (seen.empty()) {
          for (const Value::Member& m : out->members()) seen.insert(m.first);
        }
        duplicate = !seen.insert(key).second;
      }
      if (duplicate) {
        std::string shown = key.size() > 40 ? key.substr(0, 40) + "..." : key;
        return Invalid(key_at,
                       absl::StrCat("duplicate key ", Serialize(Value(shown), 0), " in object"));
      }
      SkipWhitespace();
      if (AtEnd() || Peek() != ':') return Expected(pos_, "':' after object key");
      ++pos_;
      SkipWhitespace();
      Value value;
      if (absl::Status s = ParseValue(depth + 1, &value); !s.ok()) return s;
      std::get<Value::ObjectData>(out->data_).emplace_back(std::move(key), std::move(value));
      SkipWhitespace();
      if (AtEnd()) return Expected(pos_, "',' or '}' after object member");
      if (Peek() == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      if (Peek() != ',') return Expected(pos_, "',' or '}' after object member");
      ++pos_;
      SkipWhitespace();
      if (!AtEnd() && Peek() == '}') return Invalid(pos_, "trailing comma before '}'");
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

namespace {

// ---------------------------------------------------------------------------------------------
// Serializer.

void WriteString(absl::string_view s, std::string* out) {
  out->push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      bool truncated;
      const size_t len = Utf8SequenceLength(s, i, &truncated);
      if (len == 0) {
        out->append("\xEF\xBF\xBD");  // U+FFFD: keep the output valid UTF-8
        ++i;
      } else {
        out->append(s.data() + i, len);
        i += len;
      }
      continue;
    }
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(out, "\\u%04X", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  out->push_back('"');
}

void WriteDouble(double d, std::string* out) {
  if (!std::isfinite(d)) {
    out->append("null");
    return;
  }
  char buf[64];
  // Shortest text that reads back as the same double.
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), d);
  const absl::string_view text(buf, static_cast<size_t>(r.ptr - buf));
  out->append(text.data(), text.size());
  // "1" would read back as an integer; "1.0" keeps the number a double across a round trip.
  if (text.find_first_of(".e") == absl::string_view::npos) out->append(".0");
}

void Newline(int indent, int level, std::string* out) {
  if (indent <= 0) return;
  out->push_back('\n');
  out->append(static_cast<size_t>(indent) * static_cast<size_t>(level), ' ');
}

void Write(const Value& v, int indent, int level, std::string* out) {
  switch (v.type()) {
    case Type::kNull:
      out->append("null");
      return;
    case Type::kBool:
      out->append(v.as_bool() ? "true" : "false");
      return;
    case Type::kNumber:
      if (v.is_int()) {
        absl::StrAppend(out, v.as_int());
      } else {
        WriteDouble(v.as_double(), out);
      }
      return;
    case Type::kString:
      WriteString(v.as_string(), out);
      return;
    case Type::kArray: {
      if (v.size() == 0) {
        out->append("[]");
        return;
      }
      out->push_back('[');
      bool first = true;
      for (const Value& e : v.elements()) {
        if (!first) out->push_back(',');
        first = false;
        Newline(indent, level + 1, out);
        Write(e, indent, level + 1, out);
      }
      Newline(indent, level, out);
      out->push_back(']');
      return;
    }
    case Type::kObject: {
      if (v.size() == 0) {
        out->append("{}");
        return;
      }
      out->push_back('{');
      bool first = true;
      for (const Value::Member& m : v.members()) {
        if (!first) out->push_back(',');
        first = false;
        Newline(indent, level + 1, out);
        WriteString(m.first, out);
        out->append(indent > 0 ? ": " : ":");
        Write(m.second, indent, level + 1, out);
      }
      Newline(indent, level, out);
      out->push_back('}');
      return;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Value.

Value Value::Array() {
  Value v;
  v.data_ = ArrayData();
  return v;
}

Value Value::Object() {
  Value v;
  v.data_ = ObjectData();
  return v;
}

Type Value::type() const {
  switch (data_.index()) {
    case 0: return Type::kNull;
    case 1: return Type::kBool;
    case 2:
    case 3: return Type::kNumber;
    case 4: return Type::kString;
    case 5: return Type::kArray;
    default: return Type::kObject;
  }
}

bool Value::as_bool() const {
  if (const bool* b = std::get_if<bool>(&data_)) return *b;
  TypeMismatch("as_bool", *this);
}

int64_t Value::as_int() const {
  if (const int64_t* i = std::get_if<int64_t>(&data_)) return *i;
  TypeMismatch("as_int", *this);
}

double Value::as_double() const {
  if (const double* d = std::get_if<double>(&data_)) return *d;
  if (const int64_t* i = std::get_if<int64_t>(&data_)) return static_cast<double>(*i);
  TypeMismatch("as_double", *this);
}

const std::string& Value::as_string() const {
  if (const std::string* s = std::get_if<std::string>(&data_)) return *s;
  TypeMismatch("as_string", *this);
}

size_t Value::size() const {
  if (const ArrayData* a = std::get_if<ArrayData>(&data_)) return a->size();
  if (const ObjectData* o = std::get_if<ObjectData>(&data_)) return o->size();
  return 0;
}

const Value& Value::operator[](size_t i) const {
  const ArrayData* a = std::get_if<ArrayData>(&data_);
  if (a == nullptr) TypeMismatch("operator[]", *this);
  if (i >= a->size()) {
    Fatal(absl::StrFormat("operator[]: index %d out of range (size %d)", i, a->size()));
  }
  return (*a)[i];
}

Value& Value::operator[](size_t i) {
  return const_cast<Value&>(static_cast<const Value&>(*this)[i]);
}

Value& Value::Append(Value v) {
  ArrayData* a = std::get_if<ArrayData>(&data_);
  if (a == nullptr) TypeMismatch("Append", *this);
  a->push_back(std::move(v));
  return a->back();
}

absl::Span<const Value> Value::elements() const {
  if (const ArrayData* a = std::get_if<ArrayData>(&data_)) return *a;
  return {};
}

absl::Span<Value> Value::elements() {
  if (ArrayData* a = std::get_if<ArrayData>(&data_)) return absl::MakeSpan(*a);
  return {};
}

const Value* Value::Find(absl::string_view key) const {
  const ObjectData* o = std::get_if<ObjectData>(&data_);
  if (o == nullptr) return nullptr;
  for (const Member& m : *o) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

Value* Value::Find(absl::string_view key) {
  return const_cast<Value*>(static_cast<const Value&>(*this).Find(key));
}

Value& Value::Set(std::string key, Value v) {
  ObjectData* o = std::get_if<ObjectData>(&data_);
  if (o == nullptr) TypeMismatch("Set", *this);
  if (Value* existing = Find(key)) {
    *existing = std::move(v);
    return *existing;
  }
  o->emplace_back(std::move(key), std::move(v));
  return o->back().second;
}

absl::Span<const Value::Member> Value::members() const {
  if (const ObjectData* o = std::get_if<ObjectData>(&data_)) return *o;
  return {};
}

bool operator==(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
    if (a.is_int()) return IntEqualsDouble(a.as_int(), b.as_double());
    if (b.is_int()) return IntEqualsDouble(b.as_int(), a.as_double());
    return a.as_double() == b.as_double();
  }
  // Same alternative: the variant's own == compares vectors, pairs and strings element-wise.
  return a.data_ == b.data_;
}

// ---------------------------------------------------------------------------------------------

absl::StatusOr<Value> Parse(absl::string_view text) { return Parser(text).ParseDocument(); }

std::string Serialize(const Value& value, int indent) {
  std::string out;
  Write(value, indent, 0, &out);
  return out;
}

}  // namespace actpack::json
