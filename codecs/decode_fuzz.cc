// Fuzz target for decoding: any bytes must decode or fail with kDataLoss / kInvalidArgument,
// never crash or read outside the buffer. Each input is decoded twice: as given (the checksum
// rejects most mutations) and with its checksum repaired, so that mutations reach every
// codec's own validation of its parameters and payload.
//
// One file, two builds:
//  - libFuzzer (clang, ASan + UBSan), the real fuzzing run: `bash tools/fuzz.sh [seconds]`
//    builds it from codecs/*.cc and runs it over codecs/testdata/decode_corpus (tools/test.sh
//    runs it for a bounded time).
//  - `bazel test //codecs:decode_fuzz_replay_test` (gcc, -DACTPACK_DECODE_FUZZ_REPLAY): the
//    seed corpus and 20k deterministic mutations (tests/fuzz_replay.h).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "codecs/codec.h"
#include "codecs/format.h"

namespace {

using actpack::codecs::Header;

// Outputs larger than this are skipped: the fuzzer looks for parsing bugs, not allocations.
constexpr uint64_t kMaxOutputBytes = 64 << 20;

// Decodes `bytes` (an exactly sized heap copy, so ASan sees any overread); returns whether it
// decoded. Aborts on a status a corrupt buffer must never produce.
bool DecodeOnce(const std::vector<uint8_t>& bytes) {
  const actpack::codecs::ExecContext cpu;
  const absl::StatusOr<Header> header = actpack::codecs::ReadHeader(bytes.data(), bytes.size(), cpu);
  if (!header.ok()) return false;
  const uint64_t output_bytes = header->numel * actpack::codecs::ElementSize(header->dtype);
  if (output_bytes > kMaxOutputBytes) return false;
  std::vector<uint8_t> output(output_bytes);
  const actpack::codecs::MutableTensorView view{output.data(), header->dtype, header->Shape(),
                                                actpack::codecs::Device::kCpu};
  const absl::Status status = actpack::codecs::Decode(bytes.data(), bytes.size(), view, cpu);
  if (!status.ok() && status.code() != absl::StatusCode::kDataLoss) {
    std::fprintf(stderr, "decode_fuzz: unexpected status %s\n", status.ToString().c_str());
    std::abort();
  }
  return status.ok();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  DecodeOnce(bytes);
  absl::StatusOr<Header> header = actpack::codecs::ParseHeader(bytes.data(), bytes.size());
  if (header.ok()) {
    const uint8_t* payload = bytes.data() + actpack::codecs::kHeaderSize;
    header->checksum = actpack::codecs::CombineChecksum(
        actpack::codecs::HeaderChecksum(*header),
        actpack::codecs::PayloadChecksum(payload, header->payload_size));
    actpack::codecs::WriteHeader(*header, bytes.data());
    DecodeOnce(bytes);
  }
  return 0;
}

#if defined(ACTPACK_DECODE_FUZZ_REPLAY)

#include <string>

#include "gtest/gtest.h"
#include "tests/fuzz_replay.h"

namespace {

bool Decodes(const std::string& input) {
  return DecodeOnce(std::vector<uint8_t>(input.begin(), input.end()));
}

void RunOne(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

TEST(DecodeFuzzReplayTest, SeedCorpusDecodes) {
  const std::vector<std::string> corpus =
      actpack::fuzz::ReadCorpus("codecs/testdata/decode_corpus");
  ASSERT_GE(corpus.size(), 10u);
  for (const std::string& input : corpus) {
    EXPECT_TRUE(Decodes(input));
    RunOne(input);
  }
}

TEST(DecodeFuzzReplayTest, DeterministicMutations) {
  const std::vector<std::string> corpus =
      actpack::fuzz::ReadCorpus("codecs/testdata/decode_corpus");
  // Tokens: the magic, extreme sizes and dims, codec ids, bit widths.
  actpack::fuzz::Mutator mutator(0x61637470, corpus,
                                 {std::string("APK1"), std::string(8, '\xff'),
                                  std::string(8, '\0'), std::string("\x7f\xff\xff\xff", 4),
                                  std::string("\x01\x00", 2), std::string("\x02\x00", 2),
                                  std::string("\x05\x00", 2), std::string("\x06\x00", 2),
                                  std::string("\x07\x00", 2), std::string("\x08\x00", 2),
                                  std::string("\x03", 1),
                                  std::string("\x40\x00\x00\x00", 4)});
  for (int i = 0; i < 20000; ++i) RunOne(mutator.Next());
}

}  // namespace

#endif
