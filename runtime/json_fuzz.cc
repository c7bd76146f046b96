// Fuzz target for runtime/json: any input must parse or fail cleanly, and whatever parses must
// survive Serialize -> Parse unchanged (compact and indented), with Serialize a fixed point.
// A mismatch aborts, so the fuzzer reports it as a crash.
//
// One file, three builds:
//  - libFuzzer (clang), the real fuzzing run, from the repository root:
//      clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -I.
//        runtime/json.cc runtime/json_fuzz.cc
//        -labsl_statusor -labsl_status -labsl_str_format_internal -labsl_strings
//        -labsl_raw_hash_set -labsl_hash -labsl_throw_delegate -o /tmp/json_fuzz
//      mkdir -p /tmp/json_corpus
//      /tmp/json_fuzz -max_total_time=30 /tmp/json_corpus runtime/testdata/json_corpus
//    (one command line each; no trailing backslashes here, as they would splice comments).
//    Debian's absl .so files pull in their own dependencies, so only the libraries json uses
//    directly are named; clang 14 takes its fuzzer and sanitizer runtimes from
//    libclang-rt-14-dev. New inputs go to the first directory, so the checked-in seeds stay.
//  - `bazel test //runtime:json_fuzz_replay_test` (gcc, -DACTPACK_JSON_FUZZ_REPLAY): a gtest
//    that runs the entry over runtime/testdata/json_corpus and 20k deterministic mutations.
//  - `bazel run //runtime:json_fuzz -- FILE...` (gcc, -DACTPACK_JSON_FUZZ_MAIN): replays the
//    given files, e.g. a crash-* file that libFuzzer wrote, under a debugger.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "runtime/json.h"

namespace {

[[noreturn]] void Mismatch(const char* what, absl::string_view input, const std::string& a,
                           const std::string& b) {
  std::fprintf(stderr, "json_fuzz: %s\n  input:  %.*s\n  first:  %s\n  second: %s\n", what,
               static_cast<int>(input.size()), input.data(), a.c_str(), b.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace json = actpack::json;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<json::Value> parsed = json::Parse(input);
  if (!parsed.ok()) {
    if (parsed.status().code() != absl::StatusCode::kInvalidArgument &&
        parsed.status().code() != absl::StatusCode::kDataLoss) {
      Mismatch("unexpected status code", input, parsed.status().ToString(), "");
    }
    return 0;
  }
  for (int indent : {0, 2}) {
    const std::string written = json::Serialize(*parsed, indent);
    const absl::StatusOr<json::Value> reparsed = json::Parse(written);
    if (!reparsed.ok()) {
      Mismatch("serialized text does not parse", input, written, reparsed.status().ToString());
    }
    if (*reparsed != *parsed) Mismatch("value changed across a round trip", input, written, "");
    const std::string rewritten = json::Serialize(*reparsed, indent);
    if (rewritten != written) Mismatch("Serialize is not a fixed point", input, written, rewritten);
  }
  return 0;
}

#if defined(ACTPACK_JSON_FUZZ_REPLAY)

#include <vector>

#include "gtest/gtest.h"
#include "tests/fuzz_replay.h"

namespace {

int RunOne(const std::string& input) {
  return LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

TEST(JsonFuzzReplayTest, SeedCorpus) {
  const std::vector<std::string> corpus = actpack::fuzz::ReadCorpus("runtime/testdata/json_corpus");
  ASSERT_GE(corpus.size(), 5u);
  int parsed = 0;
  for (const std::string& input : corpus) {
    EXPECT_EQ(RunOne(input), 0);
    parsed += actpack::json::Parse(input).ok() ? 1 : 0;
  }
  // The corpus holds both kinds; if either vanished the seeds lost their point.
  EXPECT_GT(parsed, 0);
  EXPECT_LT(parsed, static_cast<int>(corpus.size()));
}

// Byte edits, JSON tokens, splices of two seeds, truncation (tests/fuzz_replay.h). Fixed
// seed, so a failure reproduces.
TEST(JsonFuzzReplayTest, DeterministicMutations) {
  const std::vector<std::string> corpus = actpack::fuzz::ReadCorpus("runtime/testdata/json_corpus");
  ASSERT_FALSE(corpus.empty());
  actpack::fuzz::Mutator mutator(
      0x6a736f6e,  // "json"
      corpus,
      {"[",     "]",      "{",      "}",      ",",       ":",     "\"",      "\\",
       "\\u",   "\\ud83d", "\\ude00", "null",  "true",    "false", "-",       "0",
       "1e308", "1e400",  "-0.0",   "1.5",    "9223372036854775808", "\xC3\xA9", "\xFF",
       "\xED\xA0\x80", " ",     "\n",     "{\"a\":", "[[[[",   "]]]]",    "\x01",  "\"k\":1,", "e-"});
  int parsed = 0;
  constexpr int kInputs = 20000;
  for (int i = 0; i < kInputs; ++i) {
    const std::string s = mutator.Next();
    ASSERT_EQ(RunOne(s), 0);
    parsed += actpack::json::Parse(s).ok() ? 1 : 0;
  }
  // Mutations should reach both the error paths and the round-trip check.
  EXPECT_GT(parsed, kInputs / 50);
  EXPECT_LT(parsed, kInputs - kInputs / 50);
}

}  // namespace

#elif defined(ACTPACK_JSON_FUZZ_MAIN)

#include <fstream>
#include <sstream>

// Replays inputs without libFuzzer (the same job as libFuzzer's StandaloneFuzzTargetMain).
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "json_fuzz: cannot read %s\n", argv[i]);
      return 1;
    }
    std::stringstream text;
    text << in.rdbuf();
    const std::string input = text.str();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    std::printf("json_fuzz: %s ok\n", argv[i]);
  }
  return 0;
}

#endif
