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

#include "codecs/internal/division_math.h"
#include "codecs/internal/eb_math.h"

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

// Consecutive groups of the quantizer `quant` and `division` share: values x[0 .. n) of element
// kind `kind` (elements::Kind: float32, float16 or bfloat16, widened to float32) minus
// approx[0 .. n) when approx is not null (division's residuals), cut into groups of `length`
// values (the last may be shorter), quantized to `bits` bits with the draws of flat elements
// first .. first + n under `seed`. Writes group i's parameter word at
// words[first_param_word + i] and its codes from words[first_code_word + i * length * bits /
// 32]: `length` codes a group, `padded_last` (a multiple of 32 / bits, at least the last
// group's values) for the last, codes past the values 0; adds the words' checksum terms to
// *totals. The scalar reference is quant.cc's EncodeGroups (division.cc's EncodeGroup).
void QuantizeGroups(int kind, const void* x, const float* approx, uint64_t n, uint32_t length,
                    uint32_t padded_last, uint32_t bits, uint64_t seed, uint64_t first,
                    uint32_t* words, uint64_t first_param_word, uint64_t first_code_word,
                    QuantTotals* totals);

// The inverse: out[i] = approx[i] + Dequantize(code i) (no addition when approx is null),
// rounded to element kind `kind`, i < n, from the group's parameter word and its code words.
void DequantizeGroup(int kind, const uint32_t* code_words, uint32_t param_word, uint32_t n,
                     uint32_t bits, const float* approx, void* out);

// ---- cast ----

struct CastTotals {
  uint64_t checksum = 0;
  uint64_t overflow = 0;  // finite inputs that became infinite
};

// Payload words [begin, end) of `cast` from a float32 tensor of `numel` elements (cast.cc's loop
// over cast_math::EncodeWord), with their checksum terms.
void CastEncodeWords(const float* input, uint64_t numel, bool to_bf16, uint64_t begin,
                     uint64_t end, uint32_t* words, CastTotals* totals);

// Elements [begin, end) of a cast payload as float32 (cast_math::DecodeElement).
void CastDecodeElements(const uint16_t* halves, bool from_bf16, uint64_t begin, uint64_t end,
                        float* out);

// ---- mask, 4-byte elements ----

struct MaskTotals {
  uint64_t checksum = 0;
  uint32_t max_bits = 0;            // largest nonzero element bits
  uint32_t min_bits = 0xffffffffu;  // smallest nonzero element bits
};

// Payload words [begin, end) of `mask` for a tensor of `numel` elements of `width` bytes (1, 2
// or 4; mask.cc's EncodeWords<width>).
void MaskEncodeWords(int width, const void* input, uint64_t numel, uint64_t begin, uint64_t end,
                     uint32_t* words, MaskTotals* totals);

// Elements [32 * begin_word, min(numel, 32 * end_word)) of a mask payload: `value` where the
// bit is set, else 0 (mask.cc's DecodeElements<width>).
void MaskDecodeWords(int width, const uint32_t* words, uint64_t numel, uint32_t value,
                     uint64_t begin_word, uint64_t end_word, void* out);

// ---- pool: rows of whole windows of 2, 3 or 4 values ----

struct PoolTotals {
  uint64_t checksum = 0;
  uint64_t nonfinite = 0;  // means that are not finite
};

// Words [begin, end) of a `pool` payload of `means` means whose windows tile the flattened
// tensor of element kind `kind`: mean m is that of elements [m * window, (m + 1) * window),
// one float32 a word or two 16-bit means a word (pool_math::EncodeWord<K>).
void PoolEncodeWords(int kind, const void* input, uint64_t means, uint32_t window, uint64_t begin,
                     uint64_t end, uint32_t* words, PoolTotals* totals);

// The inverse, a copy of `width`-byte (2 or 4) means: out[m * window + j] = means[m] for m in
// [begin, end), j < window.
void PoolDecodeMeans(int width, const void* means, uint32_t window, uint64_t begin, uint64_t end,
                     void* out);

// Whether the pool kernels take windows of this size.
inline bool PoolWindowVectorized(uint32_t window) { return window >= 2 && window <= 4; }

// ---- eb (simd_eb.cc) ----

// Encodes blocks [first, last) of an eb tensor of element kind `kind` as eb.cc's EncodeBlock
// does: writes block b's header word to headers[b - first], the blocks' data words one after
// the other from `data` (room for (last - first) * kBlockValues words), and each outlier's slot
// (b * kBlockValues + its position in the block) and raw bits to slots and raw (room for
// (last - first) * kBlockValues each). Returns the data words; *outliers gets the outliers.
uint64_t EbEncodeBlocks(int kind, const void* input, const eb_math::Layout& l,
                        const eb_math::Quantizer& qz, uint64_t first, uint64_t last,
                        uint32_t* headers, uint32_t* data, uint64_t* slots, uint32_t* raw,
                        uint64_t* outliers);

// Decodes blocks [first, last), whose headers (validated) are headers[0 .. last - first) and
// whose data words start at `data`, as eb.cc's DecodeBlock does (outliers are not written).
void EbDecodeBlocks(int kind, const uint32_t* headers, const uint32_t* data,
                    const eb_math::Layout& l, float half_bin, uint64_t first, uint64_t last,
                    void* output);

struct EbRangeTotals {
  float lo = __builtin_inff();
  float hi = -__builtin_inff();
  uint64_t finite = 0;
};

// Folds the finite values of elements [begin, end) into *totals (eb.cc's RangeOf).
void EbRange(int kind, const void* input, uint64_t begin, uint64_t end, EbRangeTotals* totals);

// ---- division's pooled LFC (simd_division.cc) ----

// Band `band` of the window means (division.cc's PoolBands for one band: plane band / blocks_h,
// window row band % blocks_h) of a tensor of element kind `kind`: writes its blocks_w * inner
// bfloat16 means to means[band * blocks_w * inner ...] and adds those that are not finite to
// *nonfinite. `scratch` holds blocks_w * inner + width + 16 floats.
void DivisionPoolBand(int kind, const void* input, const division_math::Layout& l, uint64_t band,
                      float* scratch, uint16_t* means, uint64_t* nonfinite);

// division.cc's PoolApproximations: the upsampled LFC of values [j0, j0 + n) of plane p. Writes
// up to 8 floats past approx[n - 1].
void DivisionApproximations(const uint16_t* means, const division_math::Layout& l, uint64_t p,
                            uint64_t j0, uint64_t n, float* approx);

}  // namespace actpack::codecs::simd

#endif  // ACTPACK_CODECS_INTERNAL_SIMD_H_
