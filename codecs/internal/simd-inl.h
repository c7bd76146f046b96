// Vector helpers the kernel files (simd.cc, simd_eb.cc) share, compiled once per Highway target
// by each of them: the checksum, float16/bfloat16 conversions, and loads and stores of a
// tensor's elements as float32 lanes. Each is the per-lane form of a function of portable.h and
// rounds exactly as it does.
//
// Highway's per-target header pattern: this file is included again for every target, so its
// include guard toggles with HWY_TARGET_TOGGLE instead of stopping the second inclusion.
#if defined(ACTPACK_CODECS_INTERNAL_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ACTPACK_CODECS_INTERNAL_SIMD_INL_H_
#undef ACTPACK_CODECS_INTERNAL_SIMD_INL_H_
#else
#define ACTPACK_CODECS_INTERNAL_SIMD_INL_H_
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace actpack::codecs::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D64 = hn::ScalableTag<uint64_t>;
using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;

// Calls fn(std::integral_constant<int, K>()) for the element kind `kind` (elements::Kind) and
// returns what it returns.
template <typename Fn>
HWY_INLINE auto WithKind(int kind, Fn&& fn) {
  switch (kind) {
    case elements::kF16: return fn(std::integral_constant<int, elements::kF16>());
    case elements::kBF16: return fn(std::integral_constant<int, elements::kBF16>());
    default: return fn(std::integral_constant<int, elements::kF32>());
  }
}

// ---- the checksum ----

// portable::SplitMix64 per u64 lane.
HWY_INLINE hn::Vec<D64> SplitMix64(D64 d, hn::Vec<D64> x) {
  x = hn::Add(x, hn::Set(d, 0x9e3779b97f4a7c15ull));
  x = hn::Mul(hn::Xor(x, hn::ShiftRight<30>(x)), hn::Set(d, 0xbf58476d1ce4e5b9ull));
  x = hn::Mul(hn::Xor(x, hn::ShiftRight<27>(x)), hn::Set(d, 0x94d049bb133111ebull));
  return hn::Xor(x, hn::ShiftRight<31>(x));
}

// portable::ChecksumTerm per lane; kHigh when an index may be 2^31 or more.
template <bool kHigh>
HWY_INLINE hn::Vec<D64> ChecksumTerms(D64 d, hn::Vec<D64> words, hn::Vec<D64> index) {
  hn::Vec<D64> x = hn::Xor(hn::Xor(hn::ShiftLeft<32>(index), words),
                           hn::Set(d, 0x5851f42d4c957f2dull));
  if (kHigh) {
    x = hn::Xor(x, hn::Mul(hn::ShiftRight<31>(index), hn::Set(d, 0x9e3779b97f4a7c15ull)));
  }
  return SplitMix64(d, x);
}

template <bool kHigh>
uint64_t SumChecksumTerms(const uint32_t* words, uint64_t count, uint64_t first_index) {
  const D64 d;
  const hn::Rebind<uint32_t, D64> d32;
  const size_t n = hn::Lanes(d);
  hn::Vec<D64> index = hn::Iota(d, first_index);
  const hn::Vec<D64> step = hn::Set(d, n);
  hn::Vec<D64> sum0 = hn::Zero(d), sum1 = hn::Zero(d);
  uint64_t i = 0;
  for (; i + 2 * n <= count; i += 2 * n) {
    const hn::Vec<D64> next = hn::Add(index, step);
    sum0 = hn::Add(sum0, ChecksumTerms<kHigh>(d, hn::PromoteTo(d, hn::LoadU(d32, words + i)),
                                              index));
    sum1 = hn::Add(sum1, ChecksumTerms<kHigh>(
                             d, hn::PromoteTo(d, hn::LoadU(d32, words + i + n)), next));
    index = hn::Add(next, step);
  }
  // Lane by lane in uint64_t: GCC's AVX-512 horizontal sum adds as signed 64-bit integers,
  // whose overflow is undefined (UBSan reports it).
  alignas(HWY_MAX_BYTES) uint64_t lane_sums[HWY_MAX_BYTES / 8];
  hn::Store(hn::Add(sum0, sum1), d, lane_sums);
  uint64_t sum = 0;
  for (size_t k = 0; k < n; ++k) sum += lane_sums[k];
  for (; i < count; ++i) sum += portable::ChecksumTerm(words[i], first_index + i);
  return sum;
}

// The checksum terms of words[0 .. count) at indices first_index + i, summed.
inline uint64_t ChecksumWordsVector(const uint32_t* words, uint64_t count, uint64_t first_index) {
  return first_index + count <= (uint64_t{1} << 31)
             ? SumChecksumTerms<false>(words, count, first_index)
             : SumChecksumTerms<true>(words, count, first_index);
}

// ---- float lanes ----

template <class D>
HWY_INLINE hn::Mask<D> IsFiniteLanes(D df, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du;
  const hn::Vec<decltype(du)> exponent = hn::Set(du, 0x7f800000u);
  return hn::RebindMask(df, hn::Ne(hn::And(hn::BitCast(du, v), exponent), exponent));
}

// portable::FloatToBf16 per lane (the result in the low 16 bits).
template <class DU32>
HWY_INLINE hn::Vec<DU32> FloatToBf16(DU32 du, hn::Vec<DU32> u) {
  const hn::RebindToSigned<DU32> di;
  const hn::Vec<DU32> abs = hn::And(u, hn::Set(du, 0x7fffffffu));
  const hn::Mask<DU32> nan = hn::RebindMask(
      du, hn::Gt(hn::BitCast(di, abs), hn::Set(di, 0x7f800000)));
  const hn::Vec<DU32> rounded = hn::ShiftRight<16>(hn::Add(
      u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u)))));
  return hn::IfThenElse(nan, hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u)), rounded);
}

// portable::FloatToHalf per lane in integer arithmetic, its branches as selects.
template <class DU32>
HWY_INLINE hn::Vec<DU32> FloatToHalfBits(DU32 du, hn::Vec<DU32> u) {
  const hn::RebindToSigned<DU32> di;
  using VI = hn::Vec<decltype(di)>;
  using VU = hn::Vec<DU32>;
  const VU sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u));
  const VU abs = hn::And(u, hn::Set(du, 0x7fffffffu));
  const VI abs_i = hn::BitCast(di, abs);  // abs < 2^31: signed comparisons hold
  // Normal results: round the mantissa to 10 bits, to nearest even.
  const VU rounded =
      hn::Add(abs, hn::Add(hn::Set(du, 0xfffu), hn::And(hn::ShiftRight<13>(abs), hn::Set(du, 1u))));
  VU h = hn::ShiftRight<13>(hn::Sub(rounded, hn::Set(du, 112u << 23)));
  // Subnormal results: the full mantissa shifted by 126 - exponent (14..24), rounded to even.
  const VU exponent = hn::ShiftRight<23>(abs);
  const VU shift = hn::Min(hn::Sub(hn::Set(du, 126u), hn::Min(exponent, hn::Set(du, 112u))),
                           hn::Set(du, 24u));
  const VU mantissa = hn::Or(hn::And(abs, hn::Set(du, 0x7fffffu)), hn::Set(du, 0x800000u));
  const VU result = hn::Shr(mantissa, shift);
  const VU remainder = hn::And(mantissa, hn::Sub(hn::Shl(hn::Set(du, 1u), shift), hn::Set(du, 1u)));
  const VU halfway = hn::Shl(hn::Set(du, 1u), hn::Sub(shift, hn::Set(du, 1u)));
  const VI rem_i = hn::BitCast(di, remainder), half_i = hn::BitCast(di, halfway);
  const hn::Mask<decltype(di)> up = hn::Or(
      hn::Gt(rem_i, half_i),
      hn::And(hn::Eq(rem_i, half_i), hn::Eq(hn::And(hn::BitCast(di, result), hn::Set(di, 1)),
                                            hn::Set(di, 1))));
  const VU subnormal = hn::Add(result, hn::BitCast(du, hn::IfThenElseZero(up, hn::Set(di, 1))));
  h = hn::IfThenElse(hn::RebindMask(du, hn::Lt(abs_i, hn::Set(di, 0x38800000))), subnormal, h);
  h = hn::IfThenElse(hn::RebindMask(du, hn::Lt(abs_i, hn::Set(di, 0x33000000))), hn::Zero(du), h);
  h = hn::IfThenElse(hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, 0x477ff000 - 1))),
                     hn::Set(du, 0x7c00u), h);
  h = hn::IfThenElse(hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, 0x7f800000))),
                     hn::Set(du, 0x7e00u), h);
  return hn::Or(sign, h);
}

// portable::FloatToHalf per lane (the result in the low 16 bits). x86's F16C conversion
// (vcvtps2ph, round to nearest even from its immediate, not MXCSR) rounds every non-NaN value
// as portable::FloatToHalf does, overflow to infinity and half subnormals included; it keeps a
// NaN's top payload bits where the format stores the one quiet NaN 0x7e00, so NaN lanes are
// replaced.
template <class DU32>
HWY_INLINE hn::Vec<DU32> FloatToHalf(DU32 du, hn::Vec<DU32> u) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  const hn::RebindToFloat<DU32> df;
  const hn::RebindToSigned<DU32> di;
  const hn::Rebind<hwy::float16_t, DU32> dh;
  const hn::Rebind<uint16_t, DU32> d16;
  const hn::Vec<DU32> converted =
      hn::PromoteTo(du, hn::BitCast(d16, hn::DemoteTo(dh, hn::BitCast(df, u))));
  const hn::Mask<DU32> nan = hn::RebindMask(
      du, hn::Gt(hn::BitCast(di, hn::And(u, hn::Set(du, 0x7fffffffu))), hn::Set(di, 0x7f800000)));
  const hn::Vec<DU32> quiet_nan =
      hn::Or(hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u)), hn::Set(du, 0x7e00u));
  return hn::IfThenElse(nan, quiet_nan, converted);
#else
  return FloatToHalfBits(du, u);
#endif
}

// portable::HalfToFloat per lane (the half in the low 16 bits). A subnormal half m * 2^-24
// converts exactly through float arithmetic.
template <class DU32>
HWY_INLINE hn::Vec<hn::RebindToFloat<DU32>> HalfToFloat(DU32 du, hn::Vec<DU32> h) {
  const hn::RebindToFloat<DU32> df;
  const hn::RebindToSigned<DU32> di;
  using VU = hn::Vec<DU32>;
  const VU sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const VU exponent = hn::And(hn::ShiftRight<10>(h), hn::Set(du, 0x1fu));
  const VU mantissa = hn::And(h, hn::Set(du, 0x3ffu));
  const VU normal =
      hn::Or(hn::ShiftLeft<23>(hn::Add(exponent, hn::Set(du, 112u))), hn::ShiftLeft<13>(mantissa));
  const VU special = hn::Or(hn::Set(du, 0x7f800000u), hn::ShiftLeft<13>(mantissa));
  const VU subnormal = hn::BitCast(
      du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, mantissa)), hn::Set(df, 1.0f / 16777216.0f)));
  const VU bits = hn::IfThenElse(
      hn::Eq(exponent, hn::Zero(du)), subnormal,
      hn::IfThenElse(hn::Eq(exponent, hn::Set(du, 0x1fu)), special, normal));
  return hn::BitCast(df, hn::Or(sign, bits));
}

// The 16-bit element bits (low half of each lane) of float lanes: elements::Store's rounding.
template <int K, class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> ToHalfBits(D df, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du;
  if constexpr (K == elements::kF16) {
    return FloatToHalf(du, hn::BitCast(du, v));
  } else {
    return FloatToBf16(du, hn::BitCast(du, v));
  }
}

// Float lanes from 16-bit element bits in the low half of each lane: elements::Load's widening.
template <int K, class DU32>
HWY_INLINE hn::Vec<hn::RebindToFloat<DU32>> FromHalfBits(DU32 du, hn::Vec<DU32> h) {
  const hn::RebindToFloat<DU32> df;
  if constexpr (K == elements::kF16) {
    return HalfToFloat(du, h);
  } else {
    return hn::BitCast(df, hn::ShiftLeft<16>(h));
  }
}

// `v` as the element type K holds it, back in float (eb_math::RoundTo).
template <int K, class D>
HWY_INLINE hn::Vec<D> RoundToElement(D df, hn::Vec<D> v) {
  if constexpr (K == elements::kF32) {
    return v;
  } else {
    return FromHalfBits<K>(hn::RebindToUnsigned<D>(), ToHalfBits<K>(df, v));
  }
}

// ---- elements of a tensor as float lanes ----

// Elements [i, i + Lanes(d)) of a tensor of element kind K as floats.
template <int K, class D>
HWY_INLINE hn::Vec<D> LoadElements(D d, const void* base, size_t i) {
  if constexpr (K == elements::kF32) {
    return hn::LoadU(d, static_cast<const float*>(base) + i);
  } else {
    const hn::RebindToUnsigned<D> du;
    const hn::Rebind<uint16_t, D> d16;
    return FromHalfBits<K>(
        du, hn::PromoteTo(du, hn::LoadU(d16, static_cast<const uint16_t*>(base) + i)));
  }
}

// The first n < Lanes(d) of them (0 in the other lanes); reads only those n elements.
template <int K, class D>
HWY_INLINE hn::Vec<D> LoadElementsN(D d, const void* base, size_t i, size_t n) {
  if constexpr (K == elements::kF32) {
    return hn::MaskedLoad(hn::FirstN(d, n), d, static_cast<const float*>(base) + i);
  } else {
    alignas(HWY_MAX_BYTES) uint16_t part[HWY_MAX_BYTES / 4] = {};
    std::memcpy(part, static_cast<const uint16_t*>(base) + i, 2 * n);
    return LoadElements<K>(d, part, 0);
  }
}

// Stores float lanes as elements [i, i + Lanes(d)), rounded to K (elements::Store).
template <int K, class D>
HWY_INLINE void StoreElements(D d, hn::Vec<D> v, void* base, size_t i) {
  if constexpr (K == elements::kF32) {
    hn::StoreU(v, d, static_cast<float*>(base) + i);
  } else {
    const hn::Rebind<uint16_t, D> d16;
    hn::StoreU(hn::TruncateTo(d16, ToHalfBits<K>(d, v)), d16, static_cast<uint16_t*>(base) + i);
  }
}

// The first n < Lanes(d) lanes of them; writes only those n elements. (A masked store is slow on
// some CPUs: whole vectors take StoreElements.)
template <int K, class D>
HWY_INLINE void StoreElementsN(D d, hn::Vec<D> v, void* base, size_t i, size_t n) {
  if constexpr (K == elements::kF32) {
    hn::BlendedStore(v, hn::FirstN(d, n), d, static_cast<float*>(base) + i);
  } else {
    alignas(HWY_MAX_BYTES) uint16_t part[HWY_MAX_BYTES / 4];
    StoreElements<K>(d, v, part, 0);
    std::memcpy(static_cast<uint16_t*>(base) + i, part, 2 * n);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace actpack::codecs::simd
HWY_AFTER_NAMESPACE();

#endif  // ACTPACK_CODECS_INTERNAL_SIMD_INL_H_
