#include "runtime/json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace actpack::json {
namespace {

// Parses text that must be valid.
Value MustParse(absl::string_view text) {
  absl::StatusOr<Value> v = Parse(text);
  EXPECT_TRUE(v.ok()) << v.status() << "\n  in: " << text;
  return v.ok() ? *std::move(v) : Value();
}

TEST(JsonValueTest, ScalarsKeepTheirTypes) {
  EXPECT_TRUE(Value().is_null());
  EXPECT_TRUE(Value(nullptr).is_null());
  EXPECT_TRUE(Value(true).as_bool());
  EXPECT_TRUE(Value(3).is_int());
  EXPECT_EQ(Value(int64_t{-7}).as_int(), -7);
  EXPECT_EQ(Value(std::numeric_limits<int64_t>::max()).as_int(),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(Value(uint32_t{4000000000u}).as_int(), 4000000000);
  // Above INT64_MAX there is no exact int64; it becomes a double.
  const Value big(std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(big.is_number());
  EXPECT_FALSE(big.is_int());
  EXPECT_DOUBLE_EQ(big.as_double(), 18446744073709551615.0);
  EXPECT_FALSE(Value(1.5).is_int());
  EXPECT_EQ(Value(1.5).as_double(), 1.5);
  EXPECT_EQ(Value(2).as_double(), 2.0);
  EXPECT_EQ(Value("c string").as_string(), "c string");
  EXPECT_EQ(Value(std::string("std")).as_string(), "std");
  EXPECT_EQ(Value(absl::string_view("view")).as_string(), "view");
  EXPECT_EQ(Value(1.5).type(), Type::kNumber);
  EXPECT_EQ(Value("s").type(), Type::kString);
}

TEST(JsonValueTest, ObjectKeepsInsertionOrderAndSetReplacesInPlace) {
  Value o = Value::Object();
  o.Set("zeta", 1);
  o.Set("alpha", 2);
  o.Set("mid", 3);
  o.Set("alpha", "replaced");
  ASSERT_EQ(o.size(), 3u);
  EXPECT_EQ(o.members()[0].first, "zeta");
  EXPECT_EQ(o.members()[1].first, "alpha");
  EXPECT_EQ(o.members()[1].second.as_string(), "replaced");
  EXPECT_EQ(o.members()[2].first, "mid");
  EXPECT_EQ(Serialize(o, 0), R"({"zeta":1,"alpha":"replaced","mid":3})");

  // Parsing keeps the text's order, not a sorted one.
  const Value parsed = MustParse(R"({"b": 1, "a": 2, "c": 3})");
  std::string keys;
  for (const Value::Member& m : parsed.members()) keys += m.first;
  EXPECT_EQ(keys, "bac");
}

TEST(JsonValueTest, FindAndQueriesAnswerNothingOnTheWrongType) {
  Value o = Value::Object();
  o.Set("n", 5);
  ASSERT_NE(o.Find("n"), nullptr);
  EXPECT_EQ(o.Find("n")->as_int(), 5);
  EXPECT_EQ(o.Find("missing"), nullptr);
  *o.Find("n") = Value(6);
  EXPECT_EQ(o.Find("n")->as_int(), 6);

  const Value scalar(1);
  EXPECT_EQ(scalar.Find("n"), nullptr);
  EXPECT_EQ(scalar.size(), 0u);
  EXPECT_TRUE(scalar.elements().empty());
  EXPECT_TRUE(scalar.members().empty());
}

TEST(JsonValueTest, ArraysAppendIndexAndIterate) {
  Value a = Value::Array();
  a.Append(1);
  a.Append("two");
  Value& nested = a.Append(Value::Array());
  nested.Append(3.5);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[1].as_string(), "two");
  EXPECT_EQ(a[2][0].as_double(), 3.5);
  a[0] = Value(false);
  int count = 0;
  for (const Value& e : a.elements()) count += e.is_bool() ? 1 : 0;
  EXPECT_EQ(count, 1);
}

TEST(JsonValueTest, EqualityIsDeepAndNumeric) {
  EXPECT_EQ(Value(1), Value(1.0));
  EXPECT_NE(Value(1), Value(1.5));
  EXPECT_NE(Value(1), Value("1"));
  EXPECT_NE(Value(), Value(false));
  // 2^63 as a double is not INT64_MAX: compared exactly, not after rounding.
  EXPECT_NE(Value(std::numeric_limits<int64_t>::max()), Value(9223372036854775808.0));
  EXPECT_EQ(Value(std::numeric_limits<int64_t>::min()), Value(-9223372036854775808.0));
  EXPECT_EQ(MustParse(R"({"a":[1,{"b":null}]})"), MustParse(R"({ "a" : [ 1.0 , {"b":null} ] })"));
  EXPECT_NE(MustParse(R"({"a":1,"b":2})"), MustParse(R"({"b":2,"a":1})"));  // order matters
}

TEST(JsonValueDeathTest, TypedAccessorOnWrongTypeAborts) {
  EXPECT_DEATH(Value("s").as_int(), "as_int called on a string");
  EXPECT_DEATH(Value(1.5).as_int(), "as_int called on a double number");
  EXPECT_DEATH(Value(1).Append(2), "Append called on an int64 number");
  EXPECT_DEATH(Value::Array()[0], "index 0 out of range");
}

TEST(JsonSerializeTest, PrettyAndCompact) {
  Value doc = Value::Object();
  doc.Set("schema", 1);
  Value& layers = doc.Set("layers", Value::Array());
  layers.Append("conv1");
  layers.Append(Value::Object());
  doc.Set("empty", Value::Array());
  doc.Set("ok", true);
  doc.Set("none", nullptr);
  EXPECT_EQ(Serialize(doc),
            "{\n"
            "  \"schema\": 1,\n"
            "  \"layers\": [\n"
            "    \"conv1\",\n"
            "    {}\n"
            "  ],\n"
            "  \"empty\": [],\n"
            "  \"ok\": true,\n"
            "  \"none\": null\n"
            "}");
  EXPECT_EQ(Serialize(doc, 0),
            R"({"schema":1,"layers":["conv1",{}],"empty":[],"ok":true,"none":null})");
  EXPECT_EQ(Serialize(doc, 4).substr(0, 17), "{\n    \"schema\": 1");
  EXPECT_EQ(Serialize(Value(7)), "7");
}

TEST(JsonSerializeTest, DoublesAreShortestRoundTripAndStayDoubles) {
  EXPECT_EQ(Serialize(Value(0.1)), "0.1");
  EXPECT_EQ(Serialize(Value(1.0)), "1.0");
  EXPECT_EQ(Serialize(Value(-0.0)), "-0.0");
  EXPECT_EQ(Serialize(Value(1e300)), "1e+300");
  EXPECT_EQ(Serialize(Value(123456.789)), "123456.789");
  EXPECT_EQ(Serialize(Value(5e-324)), "5e-324");
  EXPECT_EQ(Serialize(Value(std::numeric_limits<double>::max())), "1.7976931348623157e+308");
  EXPECT_EQ(Serialize(Value(1.0 / 3)), "0.3333333333333333");
  for (double d : {0.1, 1.0, -0.0, 1e300, 5e-324, 1.0 / 3, 2.5e-8, 9007199254740993.0}) {
    const Value back = MustParse(Serialize(Value(d)));
    EXPECT_FALSE(back.is_int()) << d;
    EXPECT_EQ(back.as_double(), d);
    EXPECT_EQ(std::signbit(back.as_double()), std::signbit(d));
  }
}

TEST(JsonSerializeTest, NanAndInfinityBecomeNull) {
  Value a = Value::Array();
  a.Append(std::nan(""));
  a.Append(std::numeric_limits<double>::infinity());
  a.Append(-std::numeric_limits<double>::infinity());
  EXPECT_EQ(Serialize(a, 0), "[null,null,null]");
}

TEST(JsonSerializeTest, StringsAreEscaped) {
  EXPECT_EQ(Serialize(Value("q\" b\\ / \n\t\r\b\f \x01 \x1f \x7f")),
            R"("q\" b\\ / \n\t\r\b\f \u0001 \u001F )"
            "\x7f\"");
  EXPECT_EQ(Serialize(Value(std::string("nul\0here", 8))), R"("nul\u0000here")");
  EXPECT_EQ(Serialize(Value("caf\xC3\xA9 \xF0\x9F\x98\x80")), "\"caf\xC3\xA9 \xF0\x9F\x98\x80\"");
  // Invalid UTF-8 cannot be written as JSON: each bad byte becomes U+FFFD.
  EXPECT_EQ(Serialize(Value("a\xFF" "b\xC3")), "\"a\xEF\xBF\xBD" "b\xEF\xBF\xBD\"");
}

TEST(JsonParseTest, RoundTripsADocument) {
  const std::string text = R"({
  "schema": 1,
  "budget": "6GiB",
  "peak_bytes": 6442450944,
  "ratio": 0.253,
  "layers": [
    {"name": "conv1", "codec": "quant", "bits": 2, "error": 1.5e-3, "packed": true},
    {"name": "fc", "codec": null, "bits": -1, "error": 0, "packed": false}
  ],
  "notes": "line\nbreak \u00e9 \ud83d\ude00",
  "empty": {},
  "none": []
})";
  const Value doc = MustParse(text);
  EXPECT_EQ(doc.Find("peak_bytes")->as_int(), 6442450944);
  EXPECT_EQ(doc.Find("layers")->size(), 2u);
  EXPECT_EQ((*doc.Find("layers"))[0].Find("error")->as_double(), 1.5e-3);
  for (int indent : {0, 1, 2, 4}) {
    const std::string written = Serialize(doc, indent);
    const Value back = MustParse(written);
    EXPECT_EQ(back, doc) << written;
    EXPECT_EQ(Serialize(back, indent), written);  // a fixed point
  }
}

TEST(JsonParseTest, ScalarsAndWhitespace) {
  EXPECT_TRUE(MustParse(" \t\r\n null \n").is_null());
  EXPECT_TRUE(MustParse("true").as_bool());
  EXPECT_FALSE(MustParse("false").as_bool());
  EXPECT_EQ(MustParse("\"\"").as_string(), "");
  EXPECT_EQ(MustParse("-0").as_int(), 0);
  EXPECT_EQ(MustParse("-12.5e-1").as_double(), -1.25);
  EXPECT_EQ(MustParse("1E+2").as_double(), 100.0);
  EXPECT_FALSE(MustParse("1E+2").is_int());
  EXPECT_EQ(MustParse("0.000001").as_double(), 1e-6);
}

TEST(JsonParseTest, LargeIntegersStayExactOrBecomeDoubles) {
  const Value max = MustParse("9223372036854775807");
  ASSERT_TRUE(max.is_int());
  EXPECT_EQ(max.as_int(), std::numeric_limits<int64_t>::max());
  const Value min = MustParse("-9223372036854775808");
  ASSERT_TRUE(min.is_int());
  EXPECT_EQ(min.as_int(), std::numeric_limits<int64_t>::min());
  // One past the range: still a number, as the nearest double.
  const Value over = MustParse("9223372036854775808");
  EXPECT_FALSE(over.is_int());
  EXPECT_EQ(over.as_double(), 9223372036854775808.0);
  EXPECT_EQ(MustParse("-123456789012345678901234567890").as_double(), -1.2345678901234568e29);
  EXPECT_EQ(Serialize(MustParse("[9007199254740993]"), 0), "[9007199254740993]");
}

TEST(JsonParseTest, TinyNumbersUnderflowToZeroHugeOnesAreRefused) {
  EXPECT_EQ(MustParse("1e-400").as_double(), 0.0);
  EXPECT_TRUE(std::signbit(MustParse("-1e-400").as_double()));
  EXPECT_EQ(MustParse("0.0000e99999999999999999999").as_double(), 0.0);
  EXPECT_EQ(MustParse("4.9e-324").as_double(), 5e-324);
  const absl::StatusOr<Value> huge = Parse("[1e400]");
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(huge.status().message(),
            "json: line 1, column 2: number 1e400 is out of range for a double");
  EXPECT_FALSE(Parse("-0.001e99999999999999999999").ok());
}

TEST(JsonParseTest, UnicodeEscapesBecomeUtf8) {
  EXPECT_EQ(MustParse(R"("\u0041\u00e9\u20AC")").as_string(), "A\xC3\xA9\xE2\x82\xAC");
  EXPECT_EQ(MustParse(R"("\ud83d\ude00")").as_string(), "\xF0\x9F\x98\x80");  // U+1F600
  EXPECT_EQ(MustParse(R"("\uDBFF\uDFFF")").as_string(), "\xF4\x8F\xBF\xBF");  // U+10FFFF
  EXPECT_EQ(MustParse(R"("\u0000")").as_string(), std::string(1, '\0'));
  EXPECT_EQ(MustParse(R"("\"\\\/\b\f\n\r\t")").as_string(), "\"\\/\b\f\n\r\t");
  // Raw UTF-8 passes through unchanged, up to 4-byte sequences.
  EXPECT_EQ(MustParse("\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\"").as_string(),
            "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
}

struct ErrorCase {
  std::string text;
  absl::StatusCode code;
  std::string message;
};

class JsonParseErrorTest : public testing::TestWithParam<ErrorCase> {};

TEST_P(JsonParseErrorTest, NamesPlaceAndExpectation) {
  const absl::StatusOr<Value> v = Parse(GetParam().text);
  ASSERT_FALSE(v.ok()) << "parsed: " << GetParam().text;
  EXPECT_EQ(v.status().code(), GetParam().code) << v.status();
  EXPECT_EQ(v.status().message(), GetParam().message);
}

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kTruncated = absl::StatusCode::kDataLoss;

INSTANTIATE_TEST_SUITE_P(
    Grammar, JsonParseErrorTest,
    testing::Values(
        // Structure.
        ErrorCase{"{\n  \"a\": 1,\n  \"b\": 2     x\n}", kInvalid,
                  "json: line 3, column 14: expected ',' or '}' after object member, found 'x'"},
        ErrorCase{"[1 2]", kInvalid,
                  "json: line 1, column 4: expected ',' or ']' after array element, found '2'"},
        ErrorCase{"[1,]", kInvalid, "json: line 1, column 4: trailing comma before ']'"},
        ErrorCase{"{\"a\":1,}", kInvalid, "json: line 1, column 8: trailing comma before '}'"},
        ErrorCase{"{1:2}", kInvalid,
                  "json: line 1, column 2: expected a string key or '}', found '1'"},
        ErrorCase{"{\"a\":1,2}", kInvalid,
                  "json: line 1, column 8: expected a string key after ',', found '2'"},
        ErrorCase{"{\"a\" 1}", kInvalid,
                  "json: line 1, column 6: expected ':' after object key, found '1'"},
        ErrorCase{"{\"a\":1,\"a\":2}", kInvalid,
                  "json: line 1, column 8: duplicate key \"a\" in object"},
        ErrorCase{"1 2", kInvalid,
                  "json: line 1, column 3: expected end of input after the JSON value, found '2'"},
        ErrorCase{"[,1]", kInvalid, "json: line 1, column 2: expected a JSON value, found ','"},
        ErrorCase{"NaN", kInvalid, "json: line 1, column 1: expected a JSON value, found 'N'"},
        ErrorCase{"'a'", kInvalid,
                  "json: line 1, column 1: expected a JSON value, found \"'\""},
        ErrorCase{"\xEF\xBB\xBF{}", kInvalid,
                  "json: line 1, column 1: expected a JSON value, found byte 0xEF"},
        ErrorCase{"// note\n1", kInvalid,
                  "json: line 1, column 1: expected a JSON value, found '/' (JSON has no "
                  "comments)"},
        ErrorCase{"[1] /* c */", kInvalid,
                  "json: line 1, column 5: expected end of input after the JSON value, found "
                  "'/'"},
        // Literals.
        ErrorCase{"trUe", kInvalid, "json: line 1, column 3: expected 'true', found 'U'"},
        ErrorCase{"nul", kTruncated,
                  "json: line 1, column 4: unexpected end of input; expected 'null'"},
        // Numbers.
        ErrorCase{"[01]", kInvalid,
                  "json: line 1, column 2: leading zeros are not allowed in numbers"},
        ErrorCase{"-x", kInvalid, "json: line 1, column 2: expected a digit after '-', found 'x'"},
        ErrorCase{"+1", kInvalid, "json: line 1, column 1: expected a JSON value, found '+'"},
        ErrorCase{".5", kInvalid, "json: line 1, column 1: expected a JSON value, found '.'"},
        ErrorCase{"1.x", kInvalid,
                  "json: line 1, column 3: expected a digit after '.' in number, found 'x'"},
        ErrorCase{"1e+]", kInvalid,
                  "json: line 1, column 4: expected a digit in exponent, found ']'"},
        ErrorCase{"1.", kTruncated,
                  "json: line 1, column 3: unexpected end of input; expected a digit after '.' "
                  "in number"},
        ErrorCase{"-", kTruncated,
                  "json: line 1, column 2: unexpected end of input; expected a digit after '-'"},
        // Strings.
        ErrorCase{"\"a\\qb\"", kInvalid, "json: line 1, column 3: invalid escape '\\q' in string"},
        ErrorCase{"\"a\x01\"", kInvalid,
                  "json: line 1, column 3: control character byte 0x01 in string must be "
                  "escaped"},
        ErrorCase{"\"tab\there\"", kInvalid,
                  "json: line 1, column 5: control character byte 0x09 in string must be "
                  "escaped"},
        ErrorCase{"\"\\u12g4\"", kInvalid,
                  "json: line 1, column 6: expected 4 hex digits after \\u, found 'g'"},
        ErrorCase{"\"\\ud800\"", kInvalid,
                  "json: line 1, column 2: high surrogate \\uD800 must be followed by a low "
                  "surrogate \\uDC00-\\uDFFF"},
        ErrorCase{"\"\\ud800\\u0041\"", kInvalid,
                  "json: line 1, column 8: expected a low surrogate \\uDC00-\\uDFFF after "
                  "\\uD800, found \\u0041"},
        ErrorCase{"\"\\udc00\"", kInvalid,
                  "json: line 1, column 2: unpaired low surrogate \\uDC00 in string"},
        ErrorCase{"\"\xFF\"", kInvalid, "json: line 1, column 2: invalid UTF-8 byte 0xFF in string"},
        ErrorCase{"\"\xC0\xAF\"", kInvalid,  // overlong '/'
                  "json: line 1, column 2: invalid UTF-8 byte 0xC0 in string"},
        ErrorCase{"\"\xED\xA0\x80\"", kInvalid,  // an encoded surrogate
                  "json: line 1, column 2: invalid UTF-8 byte 0xED in string"},
        ErrorCase{"\"\xF4\x90\x80\x80\"", kInvalid,  // above U+10FFFF
                  "json: line 1, column 2: invalid UTF-8 byte 0xF4 in string"},
        // Truncation anywhere is kDataLoss.
        ErrorCase{"", kTruncated,
                  "json: line 1, column 1: unexpected end of input; expected a JSON value"},
        ErrorCase{"  \n ", kTruncated,
                  "json: line 2, column 2: unexpected end of input; expected a JSON value"},
        ErrorCase{"[1,2", kTruncated,
                  "json: line 1, column 5: unexpected end of input; expected ',' or ']' after "
                  "array element"},
        ErrorCase{"{\"a\":", kTruncated,
                  "json: line 1, column 6: unexpected end of input; expected a JSON value"},
        ErrorCase{"{\"a\"", kTruncated,
                  "json: line 1, column 5: unexpected end of input; expected ':' after object "
                  "key"},
        ErrorCase{"{", kTruncated,
                  "json: line 1, column 2: unexpected end of input; expected a string key or "
                  "'}'"},
        ErrorCase{"[\"abc", kTruncated,
                  "json: line 1, column 6: unexpected end of input; expected '\"' to close the "
                  "string that starts at line 1, column 2"},
        ErrorCase{"\"ab\\", kTruncated,
                  "json: line 1, column 5: unexpected end of input; expected an escape character "
                  "after '\\'"},
        ErrorCase{"\"\\u00", kTruncated,
                  "json: line 1, column 6: unexpected end of input; expected 4 hex digits after "
                  "\\u"},
        ErrorCase{"\"\\ud83d", kTruncated,
                  "json: line 1, column 8: unexpected end of input; expected a low surrogate "
                  "\\uDC00-\\uDFFF"},
        ErrorCase{"\"\\ud83d\\", kTruncated,
                  "json: line 1, column 9: unexpected end of input; expected a low surrogate "
                  "\\uDC00-\\uDFFF"},
        ErrorCase{"\"\xF0\x9F\x98", kTruncated,
                  "json: line 1, column 3: unexpected end of input; expected the rest of a "
                  "UTF-8 sequence"},
        // Columns count characters, not bytes.
        ErrorCase{"[\n\t\"\xC3\xA9\xE2\x82\xAC\" x", kInvalid,
                  "json: line 2, column 7: expected ',' or ']' after array element, found 'x'"}));

std::string Nested(int depth, absl::string_view open, absl::string_view inner,
                   absl::string_view close) {
  std::string s;
  for (int i = 0; i < depth; ++i) s.append(open.data(), open.size());
  s.append(inner.data(), inner.size());
  for (int i = 0; i < depth; ++i) s.append(close.data(), close.size());
  return s;
}

TEST(JsonParseTest, NestingUpToTheLimitParses) {
  const Value arrays = MustParse(Nested(kMaxDepth, "[", "1", "]"));
  const Value* v = &arrays;
  int depth = 0;
  while (v->is_array()) {
    v = &(*v)[0];
    ++depth;
  }
  EXPECT_EQ(depth, kMaxDepth);
  EXPECT_EQ(MustParse(Serialize(arrays)), arrays);
  EXPECT_TRUE(MustParse(Nested(kMaxDepth, "{\"k\":", "1", "}")).is_object());
}

TEST(JsonParseTest, NestingBeyondTheLimitIsRefused) {
  const absl::StatusOr<Value> arrays = Parse(Nested(kMaxDepth + 1, "[", "", "]"));
  EXPECT_EQ(arrays.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arrays.status().message(),
            "json: line 1, column 257: arrays and objects nested deeper than 256");
  const absl::StatusOr<Value> mixed = Parse(Nested(200, "[{\"k\":", "0", "}]"));
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
  // A hostile depth fails fast instead of exhausting the stack.
  EXPECT_EQ(Parse(std::string(1000000, '[')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(JsonParseTest, DuplicateKeysInLargeObjectsAreFound) {
  std::string text = "{";
  for (int i = 0; i < 1000; ++i) text += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  const std::string ok = text.substr(0, text.size() - 1) + "}";
  const Value v = MustParse(ok);
  EXPECT_EQ(v.size(), 1000u);
  EXPECT_EQ(v.Find("k999")->as_int(), 999);
  const absl::StatusOr<Value> dup = Parse(text + "\"k500\":1}");
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("duplicate key \"k500\" in object"), std::string::npos)
      << dup.status();
}

}  // namespace
}  // namespace actpack::json
