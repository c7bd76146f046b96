#include "report/snapshot.h"

#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/strings/string_view.h"

namespace actpack::report {
namespace {

// Python pickle, protocol 2 (the opcodes of CPython's Lib/pickle.py). No memo: the unpickler
// needs one only for shared or recursive objects, and a JSON tree has neither.

constexpr char kPickleProto = '\x80';
constexpr char kPickleStop = '.';
constexpr char kPickleNone = 'N';
constexpr char kPickleTrue = '\x88';
constexpr char kPickleFalse = '\x89';
constexpr char kPickleBinInt1 = 'K';  // 1-byte unsigned
constexpr char kPickleBinInt2 = 'M';  // 2-byte unsigned, little-endian
constexpr char kPickleBinInt = 'J';   // 4-byte signed, little-endian
constexpr char kPickleLong1 = '\x8a';  // n bytes of two's complement, little-endian
constexpr char kPickleBinFloat = 'G';  // 8-byte IEEE 754, big-endian
constexpr char kPickleBinUnicode = 'X';  // 4-byte little-endian length, UTF-8
constexpr char kPickleEmptyList = ']';
constexpr char kPickleEmptyDict = '}';
constexpr char kPickleMark = '(';
constexpr char kPickleAppends = 'e';
constexpr char kPickleSetItems = 'u';

void AppendLittleEndian(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

void AppendPickleInt(int64_t n, std::string* out) {
  if (n >= 0 && n < 256) {
    out->push_back(kPickleBinInt1);
    AppendLittleEndian(static_cast<uint64_t>(n), 1, out);
  } else if (n >= 0 && n < 65536) {
    out->push_back(kPickleBinInt2);
    AppendLittleEndian(static_cast<uint64_t>(n), 2, out);
  } else if (n >= std::numeric_limits<int32_t>::min() && n <= std::numeric_limits<int32_t>::max()) {
    out->push_back(kPickleBinInt);
    AppendLittleEndian(static_cast<uint32_t>(static_cast<int32_t>(n)), 4, out);
  } else {
    // The shortest two's complement: drop high bytes that only repeat the sign.
    std::string bytes;
    AppendLittleEndian(static_cast<uint64_t>(n), 8, &bytes);
    while (bytes.size() > 1) {
      const unsigned char last = bytes.back();
      const bool next_negative = (static_cast<unsigned char>(bytes[bytes.size() - 2]) & 0x80) != 0;
      if ((last == 0x00 && !next_negative) || (last == 0xFF && next_negative)) {
        bytes.pop_back();
      } else {
        break;
      }
    }
    out->push_back(kPickleLong1);
    out->push_back(static_cast<char>(bytes.size()));
    out->append(bytes);
  }
}

void AppendPickleFloat(double d, std::string* out) {
  uint64_t bits = 0;
  static_assert(sizeof(bits) == sizeof(d));
  std::memcpy(&bits, &d, sizeof(d));
  out->push_back(kPickleBinFloat);
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}

void AppendPickleString(absl::string_view text, std::string* out) {
  // A run report is read whole into memory; no string in it comes near 4 GiB.
  out->push_back(kPickleBinUnicode);
  AppendLittleEndian(text.size(), 4, out);
  out->append(text.data(), text.size());
}

// Recursion is bounded by the JSON parser's nesting limit (json::kMaxDepth).
void AppendPickle(const json::Value& value, std::string* out) {
  switch (value.type()) {
    case json::Value::value_t::null:
    case json::Value::value_t::binary:     // never in parsed text
    case json::Value::value_t::discarded:  // never in parsed text
      out->push_back(kPickleNone);
      return;
    case json::Value::value_t::boolean:
      out->push_back(value.get<bool>() ? kPickleTrue : kPickleFalse);
      return;
    case json::Value::value_t::number_integer:
    case json::Value::value_t::number_unsigned:
    case json::Value::value_t::number_float:
      if (json::IsInt(value)) {
        AppendPickleInt(value.get<int64_t>(), out);
      } else {
        AppendPickleFloat(value.get<double>(), out);
      }
      return;
    case json::Value::value_t::string:
      AppendPickleString(value.get_ref<const std::string&>(), out);
      return;
    case json::Value::value_t::array:
      out->push_back(kPickleEmptyList);
      if (value.size() == 0) return;
      out->push_back(kPickleMark);
      for (const json::Value& element : value) AppendPickle(element, out);
      out->push_back(kPickleAppends);
      return;
    case json::Value::value_t::object:
      out->push_back(kPickleEmptyDict);
      if (value.size() == 0) return;
      out->push_back(kPickleMark);
      for (const auto& member : value.items()) {
        AppendPickleString(member.key(), out);
        AppendPickle(member.value(), out);
      }
      out->push_back(kPickleSetItems);
      return;
  }
}

}  // namespace

std::string PickleJson(const json::Value& value) {
  std::string pickle = {kPickleProto, '\x02'};
  AppendPickle(value, &pickle);
  pickle.push_back(kPickleStop);
  return pickle;
}

}  // namespace actpack::report
