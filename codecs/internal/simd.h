// The CPU codecs' vector kernels and the runtime choice between them and the scalar reference.
//
// The scalar reference is each codec's loop over the per-element functions of
// internal/*_math.h, the arithmetic the CUDA kernels run. The kernels declared here compute the
// same bytes with Highway vectors, compiled for AVX2 and AVX-512 and chosen at run time for the
// CPU (hwy's dynamic dispatch); a CPU with neither runs the reference. Every vector operation
// rounds as its scalar counterpart (no fused multiply-add, no reassociation, no approximate
// reciprocal): simd_test runs each target against the reference, byte for byte.
#ifndef ACTPACK_CODECS_INTERNAL_SIMD_H_
#define ACTPACK_CODECS_INTERNAL_SIMD_H_

#include <cstdint>
#include <optional>
#include <vector>


namespace actpack::codecs::simd {

enum class Target { kScalar, kAvx2, kAvx512 };

const char* TargetName(Target target);

// The targets this CPU can run, the scalar reference first.
std::vector<Target> SupportedTargets();

// Restricts the codecs to `target` (one SupportedTargets() gives), or lifts the restriction.
// For tests and benchmarks; not thread-safe against concurrent codec calls.
void SetTargetForTest(std::optional<Target> target);

// The target the codecs run now.
Target ActiveTarget();

// Whether the codecs take the vector kernels (ActiveTarget() is not kScalar).
bool Vectorized();

// ---- kernels ----

// The checksum terms (portable::ChecksumTerm) of words[0 .. count) at indices first_index + i,
// summed. Runs the active target itself (the reference when not vectorized).
uint64_t ChecksumWords(const uint32_t* words, uint64_t count, uint64_t first_index);

// What an encoder's parallel chunk found besides its bytes.
struct QuantTotals {
  uint64_t checksum = 0;
  uint64_t nonfinite = 0;        // non-finite inputs
  uint64_t overflow_groups = 0;  // groups whose value (or residual) range overflows float
};

// One group of the quantizer `quant` and `division` share, in float32: values x[0 .. n) minus
// approx[0 .. n) when approx is not null (division's residuals), quantized to `bits` bits with
// the draws of flat elements first .. first + n under `seed`. Writes the group's parameter
// word at words[param_word] and `padded` codes (a multiple of 32 / bits, >= n; codes past n
// are 0) from words[first_code_word], and adds their checksum terms to *totals. The scalar
// reference is quant.cc's EncodeGroups (division.cc's EncodeGroup).
void QuantizeGroupF32(const float* x, const float* approx, uint32_t n, uint32_t padded,
                      uint32_t bits, uint64_t seed, uint64_t first, uint32_t* words,
                      uint64_t param_word, uint64_t first_code_word, QuantTotals* totals);

// The inverse: out[i] = approx[i] + Dequantize(code i) (no addition when approx is null),
// i < n, from the group's parameter word and its code words.
void DequantizeGroupF32(const uint32_t* code_words, uint32_t param_word, uint32_t n,
                        uint32_t bits, const float* approx, float* out);

}  // namespace actpack::codecs::simd

#endif  // ACTPACK_CODECS_INTERNAL_SIMD_H_
