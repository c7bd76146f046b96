// Arithmetic shared by the CPU reference and the CUDA kernels.
//
// Every codec computes its encoded bytes with the functions here, on both devices, so that a
// buffer encoded on the CPU is byte-identical to one encoded on the GPU for the same input and
// seed. That rules out anything whose rounding may differ between compilers: no fused
// multiply-add (the CPU build uses -ffp-contract=off, nvcc --fmad=false, and the device path
// below uses the explicitly rounded intrinsics anyway), no library transcendental functions,
// and half/bfloat16 conversions done here in integer arithmetic.
//
// This header is included by nvcc: it must not include Abseil or anything nvcc cannot parse.
#ifndef ACTPACK_CODECS_INTERNAL_PORTABLE_H_
#define ACTPACK_CODECS_INTERNAL_PORTABLE_H_

#include <cstdint>
#include <cstring>

// ACTPACK_HD marks a function both devices run; ACTPACK_HD_METHOD a member function.
// Under the CUDA emulator (testing/cudaemu) a kernel source is host C++ compiled with
// __CUDA_ARCH__ defined, so its copies of these functions take the device branches below while
// the CPU reference's take the host ones. They must not be merged at link time (the one
// definition rule would let the linker keep either copy for both, and the CPU-vs-CUDA identity
// tests would compare a path with itself): there they get internal linkage.
#if defined(__CUDACC__)
#define ACTPACK_HD __host__ __device__ __forceinline__
#define ACTPACK_HD_METHOD __host__ __device__ __forceinline__
#elif defined(__CUDA_ARCH__)
#define ACTPACK_HD static inline
#define ACTPACK_HD_METHOD inline
#else
#define ACTPACK_HD inline
#define ACTPACK_HD_METHOD inline
#endif

// Unrolls the loop that follows 4 times under nvcc, whose own choice for a loop of a few trips
// varies with the code around it; nothing elsewhere.
#if defined(__CUDACC__)
#define ACTPACK_UNROLL_4 _Pragma("unroll 4")
#else
#define ACTPACK_UNROLL_4
#endif

namespace actpack::codecs::portable {

ACTPACK_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

ACTPACK_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

ACTPACK_HD bool IsFinite(float f) { return (FloatBits(f) & 0x7f800000u) != 0x7f800000u; }

// IEEE single-precision operations with round-to-nearest-even, never contracted.
ACTPACK_HD float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ACTPACK_HD float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
ACTPACK_HD float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ACTPACK_HD float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// floor() for floats in the code range; exact for |x| < 2^23, which every caller guarantees.
// Branch-free so that CPU loops using it vectorize.
ACTPACK_HD float Floor(float x) {
  const float t = static_cast<float>(static_cast<int32_t>(x));
  return t - static_cast<float>(t > x);
}

ACTPACK_HD float Min(float a, float b) { return b < a ? b : a; }
ACTPACK_HD float Max(float a, float b) { return a < b ? b : a; }

// ---- bfloat16 (the top 16 bits of a float) ----

ACTPACK_HD float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays NaN (quiet).
ACTPACK_HD uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

// Largest bfloat16 <= f (f finite). Used for a group's minimum so no value falls below it.
ACTPACK_HD uint16_t FloatToBf16Down(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t truncated = static_cast<uint16_t>(u >> 16);  // rounds toward zero
  const bool inexact = (u & 0xffffu) != 0;
  const bool negative = (u >> 31) != 0;
  return (inexact && negative) ? static_cast<uint16_t>(truncated + 1) : truncated;
}

// Smallest bfloat16 >= f (f finite, f >= 0). Used for a group's step so the top code covers
// the group's maximum.
ACTPACK_HD uint16_t FloatToBf16Up(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t truncated = static_cast<uint16_t>(u >> 16);
  const bool inexact = (u & 0xffffu) != 0;
  return inexact ? static_cast<uint16_t>(truncated + 1) : truncated;
}

// The leading zero bits of x, which is not 0.
ACTPACK_HD uint32_t LeadingZeros(uint32_t x) {
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__clz(x));
#else
  return static_cast<uint32_t>(__builtin_clz(x));
#endif
}

// ---- IEEE half ----

ACTPACK_HD float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return BitsToFloat(sign);
    // Subnormal half: normalised into a float by the shift that brings its leading one to bit
    // 10 (the implicit bit), in one step rather than a loop (a loop in an unrolled kernel
    // loop costs registers).
    const uint32_t shift = LeadingZeros(mantissa) - 21;
    return BitsToFloat(sign | ((113 - shift) << 23) | ((mantissa << shift) & 0x3ffu) << 13);
  }
  return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// Round to nearest even, overflow to infinity, NaN stays NaN.
ACTPACK_HD uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs_bits = u & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (abs_bits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs_bits < 0x38800000u) {
    // Result is subnormal (or zero) in half: shift the full mantissa and round to even.
    if (abs_bits < 0x33000000u) return sign;  // below half the smallest subnormal
    const uint32_t exponent = abs_bits >> 23;
    const uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24
    const uint32_t result = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    const uint32_t rounded =
        result + ((remainder > halfway || (remainder == halfway && (result & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | rounded);
  }
  const uint32_t rounded = abs_bits + 0xfffu + ((abs_bits >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

// ---- counter-based randomness ----

ACTPACK_HD uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A 32-bit integer hash with low bias (Wellons' "lowbias32"): cheap enough to run per element
// and vectorizable (32-bit multiplies only).
ACTPACK_HD uint32_t Hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The per-stream key of the draws of elements [k * 2^32, (k + 1) * 2^32) under `seed`.
ACTPACK_HD uint32_t UniformKey(uint64_t seed, uint64_t index) {
  return static_cast<uint32_t>(SplitMix64(seed ^ ((index >> 32) * 0xd1b54a32d192ed03ull)));
}

// A uniform draw in [0, 1) for element `index` under its stream's key, hashed (Hash32), with
// 24 random bits so that the result is exact in float. Counter-based: any thread can draw any
// element's number, and the CPU and the GPU draw the same one.
ACTPACK_HD float UniformFromHashedKey(uint32_t hashed_key, uint64_t index) {
  const uint32_t r = Hash32(static_cast<uint32_t>(index) ^ hashed_key);
  return static_cast<float>(r >> 8) * (1.0f / 16777216.0f);
}

ACTPACK_HD float UniformFloat(uint64_t seed, uint64_t index) {
  return UniformFromHashedKey(Hash32(UniformKey(seed, index)), index);
}

// The draws UniformFloat(seed, i) of elements i in [first, last), with the stream's key hashed
// once when they all share it (the usual case): per element, two 32-bit hashes instead of a
// 64-bit SplitMix64 and three, which is most of a GPU encode's arithmetic.
struct UniformDraws {
  ACTPACK_HD_METHOD UniformDraws(uint64_t seed, uint64_t first, uint64_t last)
      : UniformDraws(seed, first, last, Hash32(UniformKey(seed, first))) {}
  // With `hashed_key` = Hash32(UniformKey(seed, first)), made already.
  ACTPACK_HD_METHOD UniformDraws(uint64_t seed, uint64_t first, uint64_t last, uint32_t hashed_key)
      : seed(seed),
        one_key(last <= first || (first >> 32) == ((last - 1) >> 32)),
        hashed_key(hashed_key) {}
  ACTPACK_HD_METHOD float operator()(uint64_t index) const {
    return one_key ? UniformFromHashedKey(hashed_key, index) : UniformFloat(seed, index);
  }
  uint64_t seed;
  bool one_key;
  uint32_t hashed_key;
};

// The UniformDraws of a kernel's groups in turn: a 2^32-element stream's key is hashed once for
// the groups in it (a tensor below 2^32 elements has one stream), not once a group.
class GroupDraws {
 public:
  ACTPACK_HD_METHOD explicit GroupDraws(uint64_t seed)
      : seed_(seed), stream_(0), hashed_(Hash32(UniformKey(seed, 0))) {}
  // The draws of elements [first, last).
  ACTPACK_HD_METHOD UniformDraws Of(uint64_t first, uint64_t last) {
    if ((first >> 32) != stream_) {
      stream_ = first >> 32;  hashed_ = Hash32(UniformKey(seed_, first));  // a further stream
    }
    return UniformDraws(seed_, first, last, hashed_);
  }

 private:
  uint64_t seed_;
  uint64_t stream_;  // first >> 32 of the stream hashed_ is of
  uint32_t hashed_;
};

// ---- division by a divisor fixed for many values ----
//
// Unsigned 32-bit division as a multiplication and two shifts (Granlund and Montgomery,
// "Division by invariant integers using multiplication", PLDI 1994, figure 4.1): exact for
// every n and every divisor d >= 1. A GPU expands n / d into about 15 instructions through the
// conversion unit, a quarter of the integer units' rate; this is 5 integer instructions.
struct Divisor32 {
  uint32_t multiplier;  // floor(2^32 (2^l - d) / d) + 1, l = ceil(log2 d)
  uint32_t shift1;      // min(l, 1)
  uint32_t shift2;      // max(l - 1, 0)
};

ACTPACK_HD Divisor32 MakeDivisor32(uint32_t d) {
  uint32_t l = 0;
  while (l < 32 && (uint64_t{1} << l) < d) ++l;
  // 2^l - d < d, so the multiplier fits 32 bits; (2^l - d) << 32 fits 64.
  const uint64_t m = (((uint64_t{1} << l) - d) << 32) / d + 1;
  return Divisor32{static_cast<uint32_t>(m), l < 1 ? l : 1u, l > 1 ? l - 1 : 0u};
}

ACTPACK_HD uint32_t Divide(uint32_t n, const Divisor32& d) {
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
  const uint32_t t = __umulhi(d.multiplier, n);
#else
  const uint32_t t = static_cast<uint32_t>((uint64_t{d.multiplier} * n) >> 32);
#endif
  return (t + ((n - t) >> d.shift1)) >> d.shift2;
}

// ---- checksum ----
//
// The checksum of a buffer is a sum (mod 2^64) of a bijective mix of every 32-bit word with its
// index. A sum is order-free, so a GPU computes it with one atomic add per thread block while it
// writes the payload; a changed, swapped or truncated word changes it.
//
// The header's words are mixed at indices 2^31 + j (HeaderChecksumTerm). A payload word's index
// goes into the top 32 bits; from index 2^31 on (payloads of 8 GiB and more) its high bits are
// mixed in as well, so that no payload word shares a term with a header word or with the word
// 2^32 positions away. Below 2^31, which is every buffer of earlier releases, the term is
// unchanged.
ACTPACK_HD uint64_t ChecksumTerm(uint32_t word, uint64_t word_index) {
  const uint64_t high = word_index >> 31;  // 0 below 8 GiB of payload
  return SplitMix64((word_index << 32) ^ word ^ 0x5851f42d4c957f2dull ^
                    (high * 0x9e3779b97f4a7c15ull));
}

ACTPACK_HD uint64_t HeaderChecksumTerm(uint32_t word, uint32_t header_word) {
  return SplitMix64((((uint64_t{1} << 31) + header_word) << 32) ^ word ^ 0x5851f42d4c957f2dull);
}

}  // namespace actpack::codecs::portable

#endif  // ACTPACK_CODECS_INTERNAL_PORTABLE_H_
