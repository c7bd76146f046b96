#include "codecs/internal/simd.h"

#include <algorithm>
#include <atomic>
#include <cstring>

// Highway compiles this file once per target (AVX2, AVX-512 and its static scalar target) by
// including it again from foreach_target.h; HWY_ONCE marks what is compiled only once. The SSE
// targets would only serve CPUs older than AVX2, which run the scalar reference.
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "codecs/internal/simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include "codecs/internal/portable.h"
#include "codecs/internal/quant_math.h"

HWY_BEFORE_NAMESPACE();
namespace actpack::codecs::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D64 = hn::ScalableTag<uint64_t>;
using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;

// Codes a quantizer block handles at a time: they sit in a byte buffer between computing and
// packing (or unpacking and dequantizing).
constexpr uint32_t kBlockCodes = 1024;
// Room past a block for whole vectors of u64 lanes (8 codes a lane).
constexpr size_t kCodePadding = 8 * HWY_MAX_BYTES;

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

uint64_t ChecksumWordsVector(const uint32_t* words, uint64_t count, uint64_t first_index) {
  return first_index + count <= (uint64_t{1} << 31)
             ? SumChecksumTerms<false>(words, count, first_index)
             : SumChecksumTerms<true>(words, count, first_index);
}

// ---- the quantizer ----

HWY_INLINE hn::Mask<DF> IsFiniteLanes(DF df, hn::Vec<DF> v) {
  const DU du;
  const hn::Vec<DU> exponent = hn::Set(du, 0x7f800000u);
  return hn::RebindMask(df, hn::Ne(hn::And(hn::BitCast(du, v), exponent), exponent));
}

// portable::Hash32 per lane.
HWY_INLINE hn::Vec<DU> Hash32(hn::Vec<DU> x) {
  const DU du;
  x = hn::Xor(x, hn::ShiftRight<16>(x));
  x = hn::Mul(x, hn::Set(du, 0x7feb352du));
  x = hn::Xor(x, hn::ShiftRight<15>(x));
  x = hn::Mul(x, hn::Set(du, 0x846ca68bu));
  return hn::Xor(x, hn::ShiftRight<16>(x));
}

// The draws portable::UniformFloat(seed, index) of the lanes' elements, given their indices'
// low 32 bits and the hashed key (portable::Hash32(portable::UniformKey(...))) of their stream.
HWY_INLINE hn::Vec<DF> Draws(hn::Vec<DU> low_index, hn::Vec<DU> key) {
  const DF df;
  const DI di;
  const hn::Vec<DU> r = hn::ShiftRight<8>(Hash32(hn::Xor(low_index, key)));
  return hn::Mul(hn::ConvertTo(df, hn::BitCast(di, r)), hn::Set(df, 1.0f / 16777216.0f));
}

// The hashed keys of lanes of a group whose draws cross into the next stream of 2^32 where the
// low index bits wrap (only in tensors of more than 2^32 elements): below the group's first
// element's low bits, `key1`.
HWY_INLINE hn::Vec<DU> WrappedKeys(hn::Vec<DU> low_index, hn::Vec<DU> first_low, hn::Vec<DU> key0,
                                   hn::Vec<DU> key1) {
  const DI di;
  const DU du;
  const hn::Vec<DU> sign = hn::Set(du, 0x80000000u);
  // Unsigned low_index < first_low, as a signed comparison of both with the sign bit flipped.
  const hn::Mask<DI> wrapped = hn::Lt(hn::BitCast(di, hn::Xor(low_index, sign)),
                                      hn::BitCast(di, hn::Xor(first_low, sign)));
  return hn::IfThenElse(hn::RebindMask(du, wrapped), key1, key0);
}

// x[i] (or x[i] - approx[i]) for the lanes of the vector at i: all of them when kWhole, else
// those in `valid` (0 elsewhere).
template <bool kWhole>
HWY_INLINE hn::Vec<DF> LoadLanes(const float* p, hn::Mask<DF> valid, size_t i) {
  const DF df;
  return kWhole ? hn::LoadU(df, p + i) : hn::MaskedLoad(valid, df, p + i);
}

// The zero bytes PackCodes reads past `count` codes: up to a whole vector of u64 lanes.
HWY_INLINE size_t PaddingOf(uint32_t count) {
  const size_t vector_codes = 8 * hn::Lanes(D64());
  return (count + vector_codes - 1) / vector_codes * vector_codes - count;
}

// Packs codes[0 .. count) (bytes, each < 2^bits; zero up to a whole vector of u64 lanes past
// count) into count * bits / 32 words, code j at bits (j mod 32/bits) * bits of word j / (32 /
// bits), as the format lays them out. Each u64 lane gathers its 8 codes into 8 * bits bits.
void PackCodes(const uint8_t* codes, uint32_t count, uint32_t bits, uint32_t* out) {
  const D64 d;
  const size_t n = hn::Lanes(d);
  const uint32_t lanes = (count + 7) / 8;
  alignas(HWY_MAX_BYTES) uint8_t packed[kBlockCodes + kCodePadding];
  if (bits == 8) {
    std::memcpy(out, codes, count);
    return;
  }
  for (uint32_t k = 0; k < lanes; k += n) {
    hn::Vec<D64> x = hn::LoadU(d, reinterpret_cast<const uint64_t*>(codes) + k);
    uint8_t* dst = packed + k * bits;
    if (bits == 4) {
      x = hn::And(hn::Or(x, hn::ShiftRight<4>(x)), hn::Set(d, 0x00ff00ff00ff00ffull));
      x = hn::And(hn::Or(x, hn::ShiftRight<8>(x)), hn::Set(d, 0x0000ffff0000ffffull));
      x = hn::And(hn::Or(x, hn::ShiftRight<16>(x)), hn::Set(d, 0xffffffffull));
      const hn::Rebind<uint32_t, D64> d32;
      hn::StoreU(hn::TruncateTo(d32, x), d32, reinterpret_cast<uint32_t*>(dst));
    } else if (bits == 2) {
      x = hn::And(hn::Or(x, hn::ShiftRight<6>(x)), hn::Set(d, 0x000f000f000f000full));
      x = hn::And(hn::Or(x, hn::ShiftRight<12>(x)), hn::Set(d, 0x000000ff000000ffull));
      x = hn::And(hn::Or(x, hn::ShiftRight<24>(x)), hn::Set(d, 0xffffull));
      const hn::Rebind<uint16_t, D64> d16;
      hn::StoreU(hn::TruncateTo(d16, x), d16, reinterpret_cast<uint16_t*>(dst));
    } else {
      x = hn::And(hn::Or(x, hn::ShiftRight<7>(x)), hn::Set(d, 0x0003000300030003ull));
      x = hn::And(hn::Or(x, hn::ShiftRight<14>(x)), hn::Set(d, 0x0000000f0000000full));
      x = hn::And(hn::Or(x, hn::ShiftRight<28>(x)), hn::Set(d, 0xffull));
      const hn::Rebind<uint8_t, D64> d8;
      hn::StoreU(hn::TruncateTo(d8, x), d8, dst);
    }
  }
  std::memcpy(out, packed, count * bits / 8);
}

// The inverse of PackCodes: codes[0 .. count) (count a multiple of 8) from `words`, which must
// hold whole vectors past count * bits / 32 words.
void UnpackCodes(const uint32_t* words, uint32_t count, uint32_t bits, uint8_t* codes) {
  const D64 d;
  const size_t n = hn::Lanes(d);
  const hn::Rebind<uint32_t, D64> d32;
  const uint8_t* src = reinterpret_cast<const uint8_t*>(words);
  if (bits == 8) {
    std::memcpy(codes, src, count);
    return;
  }
  for (uint32_t k = 0; k < count / 8; k += n) {
    const uint8_t* lane_bits = src + k * bits;
    hn::Vec<D64> x;
    if (bits == 4) {
      x = hn::PromoteTo(d, hn::LoadU(d32, reinterpret_cast<const uint32_t*>(lane_bits)));
      x = hn::And(hn::Or(x, hn::ShiftLeft<16>(x)), hn::Set(d, 0x0000ffff0000ffffull));
      x = hn::And(hn::Or(x, hn::ShiftLeft<8>(x)), hn::Set(d, 0x00ff00ff00ff00ffull));
      x = hn::And(hn::Or(x, hn::ShiftLeft<4>(x)), hn::Set(d, 0x0f0f0f0f0f0f0f0full));
    } else if (bits == 2) {
      const hn::Rebind<uint16_t, D64> d16;
      x = hn::PromoteTo(d, hn::PromoteTo(d32, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(
                                                            lane_bits))));
      x = hn::And(hn::Or(x, hn::ShiftLeft<24>(x)), hn::Set(d, 0x000000ff000000ffull));
      x = hn::And(hn::Or(x, hn::ShiftLeft<12>(x)), hn::Set(d, 0x000f000f000f000full));
      x = hn::And(hn::Or(x, hn::ShiftLeft<6>(x)), hn::Set(d, 0x0303030303030303ull));
    } else {
      const hn::Rebind<uint8_t, D64> d8;
      x = hn::PromoteTo(d, hn::PromoteTo(d32, hn::LoadU(d8, lane_bits)));
      x = hn::And(hn::Or(x, hn::ShiftLeft<28>(x)), hn::Set(d, 0x0000000f0000000full));
      x = hn::And(hn::Or(x, hn::ShiftLeft<14>(x)), hn::Set(d, 0x0003000300030003ull));
      x = hn::And(hn::Or(x, hn::ShiftLeft<7>(x)), hn::Set(d, 0x0101010101010101ull));
    }
    hn::StoreU(x, d, reinterpret_cast<uint64_t*>(codes) + k);
  }
}

// Copies the `word_count` words holding `count` codes (a multiple of 8) of `bits` bits to `dst`
// and zeroes what UnpackCodes reads past them: only the words are read from the payload, whose
// end may be near.
HWY_INLINE void CopyCodeWords(const uint32_t* src, uint32_t word_count, uint32_t count,
                              uint32_t bits, uint32_t* dst) {
  std::memcpy(dst, src, 4 * word_count);
  const size_t extent = (count + PaddingOf(count)) / 8 * bits;
  if (extent > 4 * word_count) {
    std::memset(reinterpret_cast<uint8_t*>(dst) + 4 * word_count, 0, extent - 4 * word_count);
  }
}

void QuantizeGroupF32Vector(const float* x, const float* approx, uint32_t n, uint32_t padded,
                            uint32_t bits, uint64_t seed, uint64_t first, uint32_t* words,
                            uint64_t param_word, uint64_t first_code_word, QuantTotals* totals) {
  const DF df;
  const DI di;
  const DU du;
  const uint32_t lanes = static_cast<uint32_t>(hn::Lanes(df));
  // The group's range, as quant.cc's EncodeGroups: over the finite residuals; counts of
  // non-finite inputs and of finite inputs whose residual is not finite.
  hn::Vec<DF> lo = hn::Set(df, portable::BitsToFloat(0x7f800000u));
  hn::Vec<DF> hi = hn::Neg(lo);
  hn::Vec<DI> nonfinite = hn::Zero(di), overflow = hn::Zero(di);
  const hn::Vec<DI> one = hn::Set(di, 1);
  const auto range = [&]<bool kWhole>(uint32_t i, hn::Mask<DF> valid) {
    const hn::Vec<DF> v = LoadLanes<kWhole>(x, valid, i);
    const hn::Vec<DF> r = approx == nullptr ? v : hn::Sub(v, LoadLanes<kWhole>(approx, valid, i));
    const hn::Mask<DF> x_finite = IsFiniteLanes(df, v);  // true past n (0 was loaded)
    const hn::Mask<DF> r_finite = IsFiniteLanes(df, r);
    nonfinite = hn::Add(nonfinite, hn::IfThenZeroElse(hn::RebindMask(di, x_finite), one));
    overflow = hn::Add(overflow, hn::IfThenZeroElse(hn::RebindMask(di, hn::Or(r_finite, hn::Not(x_finite))), one));
    const hn::Mask<DF> counted = kWhole ? r_finite : hn::And(valid, r_finite);
    lo = hn::IfThenElse(counted, hn::Min(lo, r), lo);
    hi = hn::IfThenElse(counted, hn::Max(hi, r), hi);
  };
  uint32_t i = 0;
  for (; i + lanes <= n; i += lanes) range.template operator()<true>(i, hn::FirstN(df, lanes));
  if (i < n) range.template operator()<false>(i, hn::FirstN(df, n - i));
  const quant_math::GroupParams p = quant_math::MakeGroupParams(
      hn::GetLane(hn::MinOfLanes(df, lo)), hn::GetLane(hn::MaxOfLanes(df, hi)),
      static_cast<int>(bits));
  totals->nonfinite += hn::GetLane(hn::SumOfLanes(di, nonfinite));
  if (!p.ok || hn::GetLane(hn::SumOfLanes(di, overflow)) > 0) ++totals->overflow_groups;
  words[param_word] = p.packed;
  totals->checksum += portable::ChecksumTerm(p.packed, param_word);

  // Codes: quant_math::Quantize per lane, with its comparisons spelled out so that NaN and
  // rounding go exactly as there. floor(min(scaled, levels)) clamped at 0 is, for every float
  // (NaN included), the truncation of scaled when 0 < min(scaled, levels), else 0.
  const hn::Vec<DF> min = hn::Set(df, p.min);
  const hn::Vec<DF> inv_step = hn::Set(df, p.inv_step);
  const hn::Vec<DF> levels = hn::Set(df, static_cast<float>((1u << bits) - 1));
  const uint64_t last = first + (n > 0 ? n - 1 : 0);
  const bool wraps = (first >> 32) != (last >> 32);
  const uint32_t hashed_key = portable::Hash32(portable::UniformKey(seed, first));
  const hn::Vec<DU> key0 = hn::Set(du, hashed_key);
  const hn::Vec<DU> key1 =
      hn::Set(du, wraps ? portable::Hash32(portable::UniformKey(seed, last)) : hashed_key);
  const hn::Vec<DU> first_low = hn::Set(du, static_cast<uint32_t>(first));
  const hn::Vec<DU> iota = hn::Iota(du, 0);
  const hn::Rebind<uint8_t, DU> d8;
  alignas(HWY_MAX_BYTES) uint8_t codes[kBlockCodes + kCodePadding];
  const auto quantize = [&]<bool kWhole, bool kWraps>(uint32_t i, hn::Mask<DF> valid,
                                                      uint8_t* out) {
    const hn::Vec<DF> v = LoadLanes<kWhole>(x, valid, i);
    const hn::Vec<DF> r = approx == nullptr ? v : hn::Sub(v, LoadLanes<kWhole>(approx, valid, i));
    const hn::Mask<DF> finite = IsFiniteLanes(df, r);
    const hn::Vec<DF> safe = hn::IfThenElse(finite, r, min);
    const hn::Vec<DU> low_index = hn::Add(iota, hn::Set(du, static_cast<uint32_t>(first + i)));
    const hn::Vec<DU> key = kWraps ? WrappedKeys(low_index, first_low, key0, key1) : key0;
    const hn::Vec<DF> scaled =
        hn::Add(hn::Mul(hn::Sub(safe, min), inv_step), Draws(low_index, key));
    const hn::Vec<DF> clamped = hn::IfThenElse(hn::Lt(levels, scaled), levels, scaled);
    const hn::Vec<DF> positive = hn::IfThenElseZero(hn::Gt(clamped, hn::Zero(df)), clamped);
    const hn::Mask<DF> coded = kWhole ? finite : hn::And(valid, finite);
    const hn::Vec<DI> code =
        hn::IfThenElseZero(hn::RebindMask(di, coded), hn::ConvertTo(di, positive));
    hn::StoreU(hn::TruncateTo(d8, hn::BitCast(du, code)), d8, out);
  };
  for (uint32_t block = 0; block < padded; block += kBlockCodes) {
    const uint32_t count = std::min(kBlockCodes, padded - block);
    const uint32_t whole = n > block ? std::min(count, n - block) / lanes * lanes : 0;
    uint32_t j = 0;
    if (wraps) {
      for (; j < whole; j += lanes) {
        quantize.template operator()<true, true>(block + j, hn::FirstN(df, lanes), codes + j);
      }
    } else {
      for (; j < whole; j += lanes) {
        quantize.template operator()<true, false>(block + j, hn::FirstN(df, lanes), codes + j);
      }
    }
    for (; j < count; j += lanes) {
      const uint32_t at = block + j;
      quantize.template operator()<false, true>(at, hn::FirstN(df, at < n ? n - at : 0),
                                                codes + j);
    }
    std::memset(codes + count, 0, PaddingOf(count));
    uint32_t* out = words + first_code_word + block * bits / 32;
    PackCodes(codes, count, bits, out);
    totals->checksum += ChecksumWordsVector(out, count * bits / 32,
                                            first_code_word + block * bits / 32);
  }
}

void DequantizeGroupF32Vector(const uint32_t* code_words, uint32_t param_word, uint32_t n,
                              uint32_t bits, const float* approx, float* out) {
  const DF df;
  const DI di;
  const size_t lanes = hn::Lanes(df);
  const quant_math::GroupParams p = quant_math::UnpackGroupParams(param_word);
  const hn::Vec<DF> step = hn::Set(df, p.step);
  const hn::Vec<DF> min = hn::Set(df, p.min);
  const hn::Rebind<uint8_t, DI> d8;
  alignas(HWY_MAX_BYTES) uint32_t words[kBlockCodes + kCodePadding / 4];
  alignas(HWY_MAX_BYTES) uint8_t codes[kBlockCodes + kCodePadding];
  for (uint32_t block = 0; block < n; block += kBlockCodes) {
    const uint32_t count = std::min(kBlockCodes, n - block);
    const uint32_t word_count = (count * bits + 31) / 32;
    CopyCodeWords(code_words + block * bits / 32, word_count, (count + 7) / 8 * 8, bits, words);
    UnpackCodes(words, (count + 7) / 8 * 8, bits, codes);
    for (uint32_t j = 0; j < count; j += lanes) {
      const uint32_t i = block + j;
      const hn::Vec<DF> code = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, codes + j)));
      hn::Vec<DF> v = hn::Add(hn::Mul(code, step), min);
      const hn::Mask<DF> valid = hn::FirstN(df, n - i);
      if (approx != nullptr) v = hn::Add(hn::MaskedLoad(valid, df, approx + i), v);
      hn::BlendedStore(v, valid, df, out + i);
    }
  }
}


// ---- cast ----

// Elements a cast, mask or pool block converts before it checksums the words it wrote (they
// are still in the L1 cache).
constexpr uint64_t kBlockElements = 2048;

// portable::FloatToBf16 per lane (the result in the low 16 bits).
HWY_INLINE hn::Vec<DU> FloatToBf16(hn::Vec<DU> u) {
  const DU du;
  const DI di;
  const hn::Vec<DU> abs = hn::And(u, hn::Set(du, 0x7fffffffu));
  const hn::Mask<DU> nan = hn::RebindMask(
      du, hn::Gt(hn::BitCast(di, abs), hn::Set(di, 0x7f800000)));
  const hn::Vec<DU> rounded = hn::ShiftRight<16>(hn::Add(
      u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u)))));
  return hn::IfThenElse(nan, hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u)), rounded);
}

// portable::FloatToHalf per lane (the result in the low 16 bits), its branches as selects.
HWY_INLINE hn::Vec<DU> FloatToHalf(hn::Vec<DU> u) {
  const DU du;
  const DI di;
  const hn::Vec<DU> sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u));
  const hn::Vec<DU> abs = hn::And(u, hn::Set(du, 0x7fffffffu));
  const hn::Vec<DI> abs_i = hn::BitCast(di, abs);  // abs < 2^31: signed comparisons hold
  // Normal results: round the mantissa to 10 bits, to nearest even.
  const hn::Vec<DU> rounded =
      hn::Add(abs, hn::Add(hn::Set(du, 0xfffu), hn::And(hn::ShiftRight<13>(abs), hn::Set(du, 1u))));
  hn::Vec<DU> h = hn::ShiftRight<13>(hn::Sub(rounded, hn::Set(du, 112u << 23)));
  // Subnormal results: the full mantissa shifted by 126 - exponent (14..24), rounded to even.
  const hn::Vec<DU> exponent = hn::ShiftRight<23>(abs);
  const hn::Vec<DU> shift = hn::Min(hn::Sub(hn::Set(du, 126u), hn::Min(exponent, hn::Set(du, 112u))),
                                    hn::Set(du, 24u));
  const hn::Vec<DU> mantissa = hn::Or(hn::And(abs, hn::Set(du, 0x7fffffu)), hn::Set(du, 0x800000u));
  const hn::Vec<DU> result = hn::Shr(mantissa, shift);
  const hn::Vec<DU> remainder = hn::And(mantissa, hn::Sub(hn::Shl(hn::Set(du, 1u), shift), hn::Set(du, 1u)));
  const hn::Vec<DU> halfway = hn::Shl(hn::Set(du, 1u), hn::Sub(shift, hn::Set(du, 1u)));
  const hn::Vec<DI> rem_i = hn::BitCast(di, remainder), half_i = hn::BitCast(di, halfway);
  const hn::Mask<DI> up = hn::Or(
      hn::Gt(rem_i, half_i),
      hn::And(hn::Eq(rem_i, half_i), hn::Eq(hn::And(hn::BitCast(di, result), hn::Set(di, 1)),
                                            hn::Set(di, 1))));
  const hn::Vec<DU> subnormal =
      hn::Add(result, hn::BitCast(du, hn::IfThenElseZero(up, hn::Set(di, 1))));
  h = hn::IfThenElse(hn::RebindMask(du, hn::Lt(abs_i, hn::Set(di, 0x38800000))), subnormal, h);
  h = hn::IfThenElse(hn::RebindMask(du, hn::Lt(abs_i, hn::Set(di, 0x33000000))), hn::Zero(du), h);
  h = hn::IfThenElse(hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, 0x477ff000 - 1))),
                     hn::Set(du, 0x7c00u), h);
  h = hn::IfThenElse(hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, 0x7f800000))),
                     hn::Set(du, 0x7e00u), h);
  return hn::Or(sign, h);
}

// portable::HalfToFloat per lane (the half in the low 16 bits). A subnormal half m * 2^-24
// converts exactly through float arithmetic.
HWY_INLINE hn::Vec<DF> HalfToFloat(hn::Vec<DU> h) {
  const DF df;
  const DI di;
  const DU du;
  const hn::Vec<DU> sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const hn::Vec<DU> exponent = hn::And(hn::ShiftRight<10>(h), hn::Set(du, 0x1fu));
  const hn::Vec<DU> mantissa = hn::And(h, hn::Set(du, 0x3ffu));
  const hn::Vec<DU> normal =
      hn::Or(hn::ShiftLeft<23>(hn::Add(exponent, hn::Set(du, 112u))), hn::ShiftLeft<13>(mantissa));
  const hn::Vec<DU> special = hn::Or(hn::Set(du, 0x7f800000u), hn::ShiftLeft<13>(mantissa));
  const hn::Vec<DU> subnormal = hn::BitCast(
      du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, mantissa)), hn::Set(df, 1.0f / 16777216.0f)));
  const hn::Vec<DU> bits = hn::IfThenElse(
      hn::Eq(exponent, hn::Zero(du)), subnormal,
      hn::IfThenElse(hn::Eq(exponent, hn::Set(du, 0x1fu)), special, normal));
  return hn::BitCast(df, hn::Or(sign, bits));
}

void CastEncodeWordsVector(const float* input, uint64_t numel, bool to_bf16, uint64_t begin,
                           uint64_t end, uint32_t* words, CastTotals* totals) {
  const DF df;
  const DU du;
  const hn::Rebind<uint16_t, DU> d16;
  const size_t lanes = hn::Lanes(df);
  const uint16_t exponent = to_bf16 ? 0x7f80u : 0x7c00u;
  const hn::Vec<DU> exponent_mask = hn::Set(du, exponent);
  uint16_t* halves = reinterpret_cast<uint16_t*>(words);
  alignas(HWY_MAX_BYTES) uint16_t tail[(HWY_MAX_BYTES / 4)];
  uint64_t overflow = 0;
  for (uint64_t block = begin; block < end; block += kBlockElements / 2) {
    const uint64_t block_end = std::min(end, block + kBlockElements / 2);
    const uint64_t last = std::min(numel, 2 * block_end);  // elements [2 * block, last)
    for (uint64_t i = 2 * block; i < 2 * block_end; i += lanes) {
      const hn::Mask<DF> valid = hn::FirstN(df, i < last ? last - i : 0);
      const hn::Vec<DF> v = hn::MaskedLoad(valid, df, input + i);
      const hn::Vec<DU> u = hn::BitCast(du, v);
      const hn::Vec<DU> h = to_bf16 ? FloatToBf16(u) : FloatToHalf(u);
      overflow += hn::CountTrue(
          df, hn::And(IsFiniteLanes(df, v),
                      hn::RebindMask(df, hn::Eq(hn::And(h, exponent_mask), exponent_mask))));
      // Elements past `last` are 0 and give 0: the zero high half the format asks for.
      if (i + lanes <= 2 * block_end) {
        hn::StoreU(hn::TruncateTo(d16, h), d16, halves + i);
      } else {
        hn::StoreU(hn::TruncateTo(d16, h), d16, tail);
        std::memcpy(halves + i, tail, 2 * (2 * block_end - i));
      }
    }
    totals->checksum += ChecksumWordsVector(words + block, block_end - block, block);
  }
  totals->overflow += overflow;
}

void CastDecodeElementsVector(const uint16_t* halves, bool from_bf16, uint64_t begin,
                              uint64_t end, float* out) {
  const DF df;
  const DU du;
  const hn::Rebind<uint16_t, DU> d16;
  const size_t lanes = hn::Lanes(df);
  alignas(HWY_MAX_BYTES) uint16_t tail[(HWY_MAX_BYTES / 4)] = {};
  for (uint64_t i = begin; i < end; i += lanes) {
    const bool whole = i + lanes <= end;
    if (!whole) std::memcpy(tail, halves + i, 2 * (end - i));
    const hn::Vec<DU> h = hn::PromoteTo(du, hn::LoadU(d16, whole ? halves + i : tail));
    const hn::Vec<DF> v = from_bf16 ? hn::BitCast(df, hn::ShiftLeft<16>(h)) : HalfToFloat(h);
    hn::BlendedStore(v, hn::FirstN(df, end - i), df, out + i);
  }
}

// ---- mask ----

void MaskEncodeWordsVector(const uint32_t* input, uint64_t numel, uint64_t begin, uint64_t end,
                           uint32_t* words, MaskTotals* totals) {
  const DU du;
  const hn::Rebind<uint8_t, DU> d8;
  const size_t lanes = hn::Lanes(du);
  hn::Vec<DU> max = hn::Zero(du);
  hn::Vec<DU> min = hn::Set(du, 0xffffffffu);
  alignas(HWY_MAX_BYTES) uint8_t bits[kBlockElements + kCodePadding];
  for (uint64_t block = begin; block < end; block += kBlockElements / 32) {
    const uint64_t block_end = std::min(end, block + kBlockElements / 32);
    const uint64_t last = std::min(numel, 32 * block_end);
    for (uint64_t i = 32 * block; i < 32 * block_end; i += lanes) {
      const hn::Mask<DU> valid = hn::FirstN(du, i < last ? last - i : 0);
      const hn::Vec<DU> v = hn::MaskedLoad(valid, du, input + i);
      const hn::Mask<DU> set = hn::Ne(v, hn::Zero(du));
      max = hn::Max(max, v);
      min = hn::Min(min, hn::IfThenElse(set, v, hn::Set(du, 0xffffffffu)));
      hn::StoreU(hn::TruncateTo(d8, hn::IfThenElseZero(set, hn::Set(du, 1u))), d8,
                 bits + (i - 32 * block));
    }
    const uint32_t count = static_cast<uint32_t>(32 * (block_end - block));
    std::memset(bits + count, 0, PaddingOf(count));
    PackCodes(bits, count, 1, words + block);
    totals->checksum += ChecksumWordsVector(words + block, block_end - block, block);
  }
  totals->max_bits = std::max(totals->max_bits, hn::GetLane(hn::MaxOfLanes(du, max)));
  totals->min_bits = std::min(totals->min_bits, hn::GetLane(hn::MinOfLanes(du, min)));
}

void MaskDecodeWordsVector(const uint32_t* words, uint64_t numel, uint32_t value,
                           uint64_t begin_word, uint64_t end_word, uint32_t* out) {
  const DU du;
  const hn::Rebind<uint8_t, DU> d8;
  const size_t lanes = hn::Lanes(du);
  const hn::Vec<DU> v = hn::Set(du, value);
  alignas(HWY_MAX_BYTES) uint32_t block_words[kBlockElements / 32 + kCodePadding / 4];
  alignas(HWY_MAX_BYTES) uint8_t bits[kBlockElements + kCodePadding];
  for (uint64_t block = begin_word; block < end_word; block += kBlockElements / 32) {
    const uint64_t block_end = std::min(end_word, block + kBlockElements / 32);
    const uint32_t count = static_cast<uint32_t>(32 * (block_end - block));
    CopyCodeWords(words + block, static_cast<uint32_t>(block_end - block), count, 1, block_words);
    UnpackCodes(block_words, count, 1, bits);
    const uint64_t last = std::min(numel, 32 * block_end);
    for (uint64_t i = 32 * block; i < last; i += lanes) {
      const hn::Vec<DU> set = hn::PromoteTo(du, hn::LoadU(d8, bits + (i - 32 * block)));
      hn::BlendedStore(hn::IfThenElseZero(hn::Ne(set, hn::Zero(du)), v), hn::FirstN(du, last - i),
                       du, out + i);
    }
  }
}

// ---- pool ----

// The window means of `lanes` consecutive windows at x, summed left to right from +0 and
// divided by the window, as pool_math::WindowMean.
HWY_INLINE hn::Vec<DF> WindowMeans(const float* x, uint32_t window) {
  const DF df;
  hn::Vec<DF> v0, v1, v2, v3;
  hn::Vec<DF> sum = hn::Zero(df);
  if (window == 2) {
    hn::LoadInterleaved2(df, x, v0, v1);
    sum = hn::Add(hn::Add(sum, v0), v1);
  } else if (window == 3) {
    hn::LoadInterleaved3(df, x, v0, v1, v2);
    sum = hn::Add(hn::Add(hn::Add(sum, v0), v1), v2);
  } else {
    hn::LoadInterleaved4(df, x, v0, v1, v2, v3);
    sum = hn::Add(hn::Add(hn::Add(hn::Add(sum, v0), v1), v2), v3);
  }
  return hn::Div(sum, hn::Set(df, static_cast<float>(window)));
}

void PoolEncodeWordsVector(const float* input, uint32_t window, uint64_t begin, uint64_t end,
                           uint32_t* words, PoolTotals* totals) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  alignas(HWY_MAX_BYTES) float tail[4 * (HWY_MAX_BYTES / 4)] = {};
  alignas(HWY_MAX_BYTES) float means[(HWY_MAX_BYTES / 4)];
  uint64_t nonfinite = 0;
  for (uint64_t block = begin; block < end; block += kBlockElements) {
    const uint64_t block_end = std::min(end, block + kBlockElements);
    for (uint64_t m = block; m < block_end; m += lanes) {
      float* dst = reinterpret_cast<float*>(words + m);
      if (m + lanes <= block_end) {
        const hn::Vec<DF> mean = WindowMeans(input + m * window, window);
        nonfinite += hn::CountTrue(df, hn::Not(IsFiniteLanes(df, mean)));
        hn::StoreU(mean, df, dst);
        continue;
      }
      const size_t rest = block_end - m;
      std::memcpy(tail, input + m * window, sizeof(float) * rest * window);
      const hn::Vec<DF> mean = WindowMeans(tail, window);
      nonfinite += hn::CountTrue(df, hn::AndNot(IsFiniteLanes(df, mean), hn::FirstN(df, rest)));
      hn::StoreU(mean, df, means);
      std::memcpy(dst, means, sizeof(float) * rest);
    }
    totals->checksum += ChecksumWordsVector(words + block, block_end - block, block);
  }
  totals->nonfinite += nonfinite;
}

void PoolDecodeMeansVector(const float* means, uint32_t window, uint64_t begin, uint64_t end,
                           float* out) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  alignas(HWY_MAX_BYTES) float tail[4 * (HWY_MAX_BYTES / 4)];
  for (uint64_t m = begin; m < end; m += lanes) {
    const bool whole = m + lanes <= end;
    const hn::Vec<DF> v = hn::MaskedLoad(hn::FirstN(df, end - m), df, means + m);
    float* dst = whole ? out + m * window : tail;
    if (window == 2) {
      hn::StoreInterleaved2(v, v, df, dst);
    } else if (window == 3) {
      hn::StoreInterleaved3(v, v, v, df, dst);
    } else {
      hn::StoreInterleaved4(v, v, v, v, df, dst);
    }
    if (!whole) std::memcpy(out + m * window, tail, sizeof(float) * (end - m) * window);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace actpack::codecs::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace actpack::codecs::simd {
namespace {

// What the CPU supports. hwy::SupportedTargets() runs CPUID unless a test restriction is set,
// which costs microseconds in a virtual machine: read it once, before any restriction.
int64_t CpuTargets() {
  static const int64_t targets = hwy::SupportedTargets();
  return targets;
}

Target BestTarget() {
  static const Target best = (CpuTargets() & HWY_AVX3)   ? Target::kAvx512
                             : (CpuTargets() & HWY_AVX2) ? Target::kAvx2
                                                         : Target::kScalar;
  return best;
}

// The target SetTargetForTest chose, or -1.
std::atomic<int> forced_target{-1};

}  // namespace

const char* TargetName(Target target) {
  switch (target) {
    case Target::kAvx2: return "AVX2";
    case Target::kAvx512: return "AVX-512";
    default: return "scalar";
  }
}

std::vector<Target> SupportedTargets() {
  std::vector<Target> targets{Target::kScalar};
  if (CpuTargets() & HWY_AVX2) targets.push_back(Target::kAvx2);
  if (CpuTargets() & HWY_AVX3) targets.push_back(Target::kAvx512);
  return targets;
}

void SetTargetForTest(std::optional<Target> target) {
  BestTarget();
  forced_target = target.has_value() ? static_cast<int>(*target) : -1;
  int64_t mask = 0;  // no restriction
  if (target == Target::kAvx2) mask = HWY_AVX2;
  if (target == Target::kAvx512) mask = HWY_AVX3;
  hwy::SetSupportedTargetsForTest(mask);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

Target ActiveTarget() {
  const int forced = forced_target.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<Target>(forced) : BestTarget();
}

bool Vectorized() { return ActiveTarget() != Target::kScalar; }

HWY_EXPORT(ChecksumWordsVector);
HWY_EXPORT(QuantizeGroupF32Vector);
HWY_EXPORT(DequantizeGroupF32Vector);
HWY_EXPORT(CastEncodeWordsVector);
HWY_EXPORT(CastDecodeElementsVector);
HWY_EXPORT(MaskEncodeWordsVector);
HWY_EXPORT(MaskDecodeWordsVector);
HWY_EXPORT(PoolEncodeWordsVector);
HWY_EXPORT(PoolDecodeMeansVector);

uint64_t ChecksumWords(const uint32_t* words, uint64_t count, uint64_t first_index) {
  if (Vectorized()) return HWY_DYNAMIC_DISPATCH(ChecksumWordsVector)(words, count, first_index);
  uint64_t sum = 0;
  for (uint64_t i = 0; i < count; ++i) sum += portable::ChecksumTerm(words[i], first_index + i);
  return sum;
}

void QuantizeGroupF32(const float* x, const float* approx, uint32_t n, uint32_t padded,
                      uint32_t bits, uint64_t seed, uint64_t first, uint32_t* words,
                      uint64_t param_word, uint64_t first_code_word, QuantTotals* totals) {
  HWY_DYNAMIC_DISPATCH(QuantizeGroupF32Vector)(x, approx, n, padded, bits, seed, first, words,
                                               param_word, first_code_word, totals);
}

void DequantizeGroupF32(const uint32_t* code_words, uint32_t param_word, uint32_t n,
                        uint32_t bits, const float* approx, float* out) {
  HWY_DYNAMIC_DISPATCH(DequantizeGroupF32Vector)(code_words, param_word, n, bits, approx, out);
}

void CastEncodeWords(const float* input, uint64_t numel, bool to_bf16, uint64_t begin,
                     uint64_t end, uint32_t* words, CastTotals* totals) {
  HWY_DYNAMIC_DISPATCH(CastEncodeWordsVector)(input, numel, to_bf16, begin, end, words, totals);
}

void CastDecodeElements(const uint16_t* halves, bool from_bf16, uint64_t begin, uint64_t end,
                        float* out) {
  HWY_DYNAMIC_DISPATCH(CastDecodeElementsVector)(halves, from_bf16, begin, end, out);
}

void MaskEncodeWords(const uint32_t* input, uint64_t numel, uint64_t begin, uint64_t end,
                     uint32_t* words, MaskTotals* totals) {
  HWY_DYNAMIC_DISPATCH(MaskEncodeWordsVector)(input, numel, begin, end, words, totals);
}

void MaskDecodeWords(const uint32_t* words, uint64_t numel, uint32_t value, uint64_t begin_word,
                     uint64_t end_word, uint32_t* out) {
  HWY_DYNAMIC_DISPATCH(MaskDecodeWordsVector)(words, numel, value, begin_word, end_word, out);
}

void PoolEncodeWords(const float* input, uint32_t window, uint64_t begin, uint64_t end,
                     uint32_t* words, PoolTotals* totals) {
  HWY_DYNAMIC_DISPATCH(PoolEncodeWordsVector)(input, window, begin, end, words, totals);
}

void PoolDecodeMeans(const float* means, uint32_t window, uint64_t begin, uint64_t end,
                     float* out) {
  HWY_DYNAMIC_DISPATCH(PoolDecodeMeansVector)(means, window, begin, end, out);
}

}  // namespace actpack::codecs::simd
#endif  // HWY_ONCE
