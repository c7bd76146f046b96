// Helpers shared by the codec tests: encode into an exactly sized vector, decode floats, and
// draw Gaussian test data.
#ifndef ACTPACK_CODECS_TESTING_TEST_UTIL_H_
#define ACTPACK_CODECS_TESTING_TEST_UTIL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "codecs/codec.h"

namespace actpack::codecs::testing {

// Encodes a CPU tensor; the vector holds exactly the bytes used.
absl::StatusOr<std::vector<uint8_t>> EncodeToVector(const void* data, DType dtype,
                                                    std::vector<int64_t> shape,
                                                    const CodecParams& params);

absl::StatusOr<std::vector<uint8_t>> EncodeFloats(const std::vector<float>& values,
                                                  std::vector<int64_t> shape,
                                                  const CodecParams& params);

// Decodes a float32 buffer (a gtest failure when it does not decode). The output is poisoned
// with NaN first, so an element the decoder did not write shows.
std::vector<float> DecodeFloats(const std::vector<uint8_t>& buffer, std::vector<int64_t> shape);

std::vector<float> Gaussian(size_t n, uint32_t seed, float mean = 0.0f, float stddev = 1.0f);

// The bytes of a `dtype` tensor holding `values` rounded to it (round to nearest even).
std::vector<uint8_t> ToBytes(const std::vector<float>& values, DType dtype);

// The values of a `dtype` tensor's bytes, widened to float.
std::vector<float> ToFloats(const std::vector<uint8_t>& bytes, DType dtype);

}  // namespace actpack::codecs::testing

#endif  // ACTPACK_CODECS_TESTING_TEST_UTIL_H_
