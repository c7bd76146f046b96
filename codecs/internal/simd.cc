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
// Must follow highway.h: it is compiled per target too.
#include "codecs/internal/simd-inl.h"

#include "codecs/internal/portable.h"
#include "codecs/internal/quant_math.h"

HWY_BEFORE_NAMESPACE();
namespace actpack::codecs::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Codes a quantizer block handles at a time: they sit in a byte buffer between computing and
// packing (or unpacking and dequantizing).
constexpr uint32_t kBlockCodes = 1024;
// Room past a block for whole vectors of u64 lanes (8 codes a lane).
constexpr size_t kCodePadding = 8 * HWY_MAX_BYTES;

// ---- the quantizer ----

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

// Elements [i, i + count) of x as floats (count <= Lanes; 0 in the lanes past it): all lanes
// when kWhole.
template <int K, bool kWhole>
HWY_INLINE hn::Vec<DF> LoadLanes(const void* x, size_t i, size_t count) {
  const DF df;
  return kWhole ? LoadElements<K>(df, x, i) : LoadElementsN<K>(df, x, i, count);
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

// The range of one group's residuals and what quant.cc's EncodeGroups counts: the first pass
// takes min and max of every lane and notes whether any input or residual is not finite; only
// such a group (which the codec refuses, or whose residual range overflows) is gone over again
// lane by lane as the reference does.
struct GroupRange {
  float lo, hi;
  uint32_t nonfinite = 0;  // non-finite inputs
  uint32_t overflow = 0;   // finite inputs whose residual is not finite
  bool clean = true;       // every input and residual finite
};

template <int K>
GroupRange RangeOfGroup(const void* x, const float* approx, uint32_t n) {
  const DF df;
  const DI di;
  const uint32_t lanes = static_cast<uint32_t>(hn::Lanes(df));
  GroupRange g;
  hn::Vec<DF> lo = hn::Set(df, portable::BitsToFloat(0x7f800000u));
  hn::Vec<DF> hi = hn::Neg(lo);
  hn::Mask<DF> bad = hn::FirstN(df, 0);
  const auto fast = [&]<bool kWhole>(uint32_t i) {
    const uint32_t count = kWhole ? lanes : n - i;
    const hn::Vec<DF> v = LoadLanes<K, kWhole>(x, i, count);
    const hn::Vec<DF> r =
        approx == nullptr ? v : hn::Sub(v, LoadLanes<elements::kF32, kWhole>(approx, i, count));
    // Lanes past n hold 0, which is finite; min and max count only lanes in the group.
    bad = hn::Or(bad, hn::Not(hn::And(IsFiniteLanes(df, v), IsFiniteLanes(df, r))));
    if (kWhole) {
      lo = hn::Min(lo, r);
      hi = hn::Max(hi, r);
    } else {
      const hn::Mask<DF> valid = hn::FirstN(df, count);
      lo = hn::IfThenElse(valid, hn::Min(lo, r), lo);
      hi = hn::IfThenElse(valid, hn::Max(hi, r), hi);
    }
  };
  uint32_t i = 0;
  for (; i + lanes <= n; i += lanes) fast.template operator()<true>(i);
  if (i < n) fast.template operator()<false>(i);
  if (HWY_UNLIKELY(!hn::AllFalse(df, bad))) {
    // As the reference: the range over the finite residuals, and the counts.
    g.clean = false;
    lo = hn::Set(df, portable::BitsToFloat(0x7f800000u));
    hi = hn::Neg(lo);
    hn::Vec<DI> nonfinite = hn::Zero(di), overflow = hn::Zero(di);
    const hn::Vec<DI> one = hn::Set(di, 1);
    for (i = 0; i < n; i += lanes) {
      const uint32_t count = std::min(lanes, n - i);
      const hn::Vec<DF> v = LoadLanes<K, false>(x, i, count);
      const hn::Vec<DF> r =
          approx == nullptr ? v : hn::Sub(v, LoadLanes<elements::kF32, false>(approx, i, count));
      const hn::Mask<DF> x_finite = IsFiniteLanes(df, v);  // true past n (0 was loaded)
      const hn::Mask<DF> r_finite = IsFiniteLanes(df, r);
      nonfinite = hn::Add(nonfinite, hn::IfThenZeroElse(hn::RebindMask(di, x_finite), one));
      overflow = hn::Add(overflow, hn::IfThenZeroElse(
                                       hn::RebindMask(di, hn::Or(r_finite, hn::Not(x_finite))), one));
      const hn::Mask<DF> counted = hn::And(hn::FirstN(df, count), r_finite);
      lo = hn::IfThenElse(counted, hn::Min(lo, r), lo);
      hi = hn::IfThenElse(counted, hn::Max(hi, r), hi);
    }
    g.nonfinite = static_cast<uint32_t>(hn::GetLane(hn::SumOfLanes(di, nonfinite)));
    g.overflow = static_cast<uint32_t>(hn::GetLane(hn::SumOfLanes(di, overflow)));
  }
  g.lo = hn::GetLane(hn::MinOfLanes(df, lo));
  g.hi = hn::GetLane(hn::MaxOfLanes(df, hi));
  return g;
}

// Float to int32 by truncation for lanes known to be in range (Highway's ConvertTo also fixes
// up lanes out of range, which costs four more instructions on x86).
HWY_INLINE hn::Vec<DI> TruncateInRange(hn::Vec<DF> v) {
#if HWY_TARGET == HWY_AVX2
  return hn::Vec256<int32_t>{_mm256_cvttps_epi32(v.raw)};
#elif HWY_ARCH_X86 && HWY_TARGET < HWY_AVX2  // the AVX-512 targets: 512-bit vectors
  return hn::Vec512<int32_t>{_mm512_cvttps_epi32(v.raw)};
#else
  return hn::ConvertTo(DI(), v);
#endif
}

// Codes [0, padded) of one group (quant_math::Quantize per lane, with its comparisons spelled
// out so that NaN and rounding go exactly as there), packed to `bits` bits from `out`.
// floor(min(scaled, levels)) clamped at 0 is, for every float (NaN included), the truncation of
// scaled when 0 < min(scaled, levels), else 0. A clean group (every residual finite) skips the
// non-finite lanes' handling.
template <int K>
void QuantizeGroupCodes(const void* x, const float* approx, uint32_t n, uint32_t padded,
                        uint32_t bits, uint64_t seed, uint64_t first,
                        const quant_math::GroupParams& p, bool clean, uint32_t* out) {
  const DF df;
  const DI di;
  const DU du;
  const uint32_t lanes = static_cast<uint32_t>(hn::Lanes(df));
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
  // kClean: every lane is a finite residual of the group (a whole vector of a clean group).
  const auto quantize = [&]<bool kWhole, bool kWraps, bool kClean>(uint32_t i, uint8_t* dst) {
    const uint32_t count = kWhole ? lanes : (i < n ? n - i : 0);
    const hn::Vec<DF> v = LoadLanes<K, kWhole>(x, i, count);
    const hn::Vec<DF> r =
        approx == nullptr ? v : hn::Sub(v, LoadLanes<elements::kF32, kWhole>(approx, i, count));
    const hn::Mask<DF> finite = kClean ? hn::FirstN(df, lanes) : IsFiniteLanes(df, r);
    const hn::Vec<DF> safe = kClean ? r : hn::IfThenElse(finite, r, min);
    const hn::Vec<DU> low_index = hn::Add(iota, hn::Set(du, static_cast<uint32_t>(first + i)));
    const hn::Vec<DU> key = kWraps ? WrappedKeys(low_index, first_low, key0, key1) : key0;
    const hn::Vec<DF> scaled =
        hn::Add(hn::Mul(hn::Sub(safe, min), inv_step), Draws(low_index, key));
    const hn::Vec<DF> clamped = hn::IfThenElse(hn::Lt(levels, scaled), levels, scaled);
    hn::Vec<DI> code;
    if (kClean) {
      // A finite residual of a group whose range is finite scales to a finite value >= +0.
      code = TruncateInRange(clamped);
    } else {
      const hn::Vec<DF> positive = hn::IfThenElseZero(hn::Gt(clamped, hn::Zero(df)), clamped);
      const hn::Mask<DF> coded = kWhole ? finite : hn::And(hn::FirstN(df, count), finite);
      code = hn::IfThenElseZero(hn::RebindMask(di, coded), hn::ConvertTo(di, positive));
    }
    hn::StoreU(hn::TruncateTo(d8, hn::BitCast(du, code)), d8, dst);
  };
  for (uint32_t block = 0; block < padded; block += kBlockCodes) {
    const uint32_t count = std::min(kBlockCodes, padded - block);
    const uint32_t whole = n > block ? std::min(count, n - block) / lanes * lanes : 0;
    uint32_t j = 0;
    if (clean && !wraps) {
      for (; j < whole; j += lanes) {
        quantize.template operator()<true, false, true>(block + j, codes + j);
      }
    } else if (wraps) {
      for (; j < whole; j += lanes) {
        quantize.template operator()<true, true, false>(block + j, codes + j);
      }
    } else {
      for (; j < whole; j += lanes) {
        quantize.template operator()<true, false, false>(block + j, codes + j);
      }
    }
    for (; j < count; j += lanes) {
      quantize.template operator()<false, true, false>(block + j, codes + j);
    }
    std::memset(codes + count, 0, PaddingOf(count));
    PackCodes(codes, count, bits, out + block * bits / 32);
  }
}

// Groups in a batch: their ranges and parameters first, then their codes, so that the
// parameters' divisions of one group overlap the work of the others.
constexpr uint32_t kGroupBatch = 8;

template <int K>
void QuantizeGroupsKind(const void* x, const float* approx, uint64_t n, uint32_t length,
                        uint32_t padded_last, uint32_t bits, uint64_t seed, uint64_t first,
                        uint32_t* words, uint64_t first_param_word, uint64_t first_code_word,
                        QuantTotals* totals) {
  const uint64_t groups = (n + length - 1) / length;
  const uint32_t group_words = length * bits / 32;
  constexpr size_t kBytes = K == elements::kF32 ? 4 : 2;
  const uint8_t* bytes = static_cast<const uint8_t*>(x);
  for (uint64_t g0 = 0; g0 < groups; g0 += kGroupBatch) {
    const uint64_t g1 = std::min<uint64_t>(groups, g0 + kGroupBatch);
    quant_math::GroupParams params[kGroupBatch];
    bool clean[kGroupBatch];
    for (uint64_t g = g0; g < g1; ++g) {
      const uint64_t at = g * length;
      const uint32_t count = static_cast<uint32_t>(std::min<uint64_t>(length, n - at));
      const GroupRange range = RangeOfGroup<K>(bytes + kBytes * at,
                                               approx == nullptr ? nullptr : approx + at, count);
      const quant_math::GroupParams p =
          quant_math::MakeGroupParams(range.lo, range.hi, static_cast<int>(bits));
      totals->nonfinite += range.nonfinite;
      if (!p.ok || range.overflow > 0) ++totals->overflow_groups;
      words[first_param_word + g] = p.packed;
      params[g - g0] = p;
      clean[g - g0] = range.clean && p.ok;
    }
    for (uint64_t g = g0; g < g1; ++g) {
      const uint64_t at = g * length;
      const uint32_t count = static_cast<uint32_t>(std::min<uint64_t>(length, n - at));
      QuantizeGroupCodes<K>(bytes + kBytes * at, approx == nullptr ? nullptr : approx + at, count,
                            g + 1 == groups ? padded_last : length, bits, seed, first + at,
                            params[g - g0], clean[g - g0], words + first_code_word + g * group_words);
    }
  }
  // The checksum terms of the run's words, while they are still in the cache.
  totals->checksum += ChecksumWordsVector(words + first_param_word, groups, first_param_word);
  const uint64_t code_words = (groups - 1) * group_words + padded_last * bits / 32;
  totals->checksum += ChecksumWordsVector(words + first_code_word, code_words, first_code_word);
}

void QuantizeGroupsVector(int kind, const void* x, const float* approx, uint64_t n,
                          uint32_t length, uint32_t padded_last, uint32_t bits, uint64_t seed,
                          uint64_t first, uint32_t* words, uint64_t first_param_word,
                          uint64_t first_code_word, QuantTotals* totals) {
  if (n == 0) return;
  return WithKind(kind, [&](auto k) {
    QuantizeGroupsKind<decltype(k)::value>(x, approx, n, length, padded_last, bits, seed, first,
                                           words, first_param_word, first_code_word, totals);
  });
}

template <int K>
void DequantizeGroupKind(const uint32_t* code_words, uint32_t param_word, uint32_t n,
                         uint32_t bits, const float* approx, void* out) {
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
      if (j + lanes <= count) {
        if (approx != nullptr) v = hn::Add(hn::LoadU(df, approx + i), v);
        StoreElements<K>(df, v, out, i);
      } else {
        if (approx != nullptr) v = hn::Add(LoadElementsN<elements::kF32>(df, approx, i, count - j), v);
        StoreElementsN<K>(df, v, out, i, count - j);
      }
    }
  }
}

void DequantizeGroupVector(int kind, const uint32_t* code_words, uint32_t param_word, uint32_t n,
                           uint32_t bits, const float* approx, void* out) {
  return WithKind(kind, [&](auto k) {
    DequantizeGroupKind<decltype(k)::value>(code_words, param_word, n, bits, approx, out);
  });
}

// ---- cast ----

// Elements a cast, mask or pool block converts before it checksums the words it wrote (they
// are still in the L1 cache).
constexpr uint64_t kBlockElements = 2048;

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
      const hn::Vec<DU> h = to_bf16 ? FloatToBf16(du, u) : FloatToHalf(du, u);
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
    const hn::Vec<DF> v = from_bf16 ? hn::BitCast(df, hn::ShiftLeft<16>(h)) : HalfToFloat(du, h);
    if (whole) {
      hn::StoreU(v, df, out + i);
    } else {
      hn::BlendedStore(v, hn::FirstN(df, end - i), df, out + i);
    }
  }
}

// ---- mask ----

// Elements [i, i + count) of `input` (count <= Lanes(d); 0 past it) without reading past them.
template <class D>
HWY_INLINE hn::Vec<D> LoadFirst(D d, const hn::TFromD<D>* input, size_t count) {
  if (count == hn::Lanes(d)) return hn::LoadU(d, input);
  alignas(HWY_MAX_BYTES) hn::TFromD<D> part[HWY_MAX_BYTES / sizeof(hn::TFromD<D>)] = {};
  std::memcpy(part, input, count * sizeof(hn::TFromD<D>));
  return hn::Load(d, part);
}

// Stores the first count <= Lanes(d) lanes of v (a masked store is slow on some CPUs).
template <class D>
HWY_INLINE void StoreFirst(D d, hn::Vec<D> v, hn::TFromD<D>* out, size_t count) {
  if (count == hn::Lanes(d)) return hn::StoreU(v, d, out);
  alignas(HWY_MAX_BYTES) hn::TFromD<D> part[HWY_MAX_BYTES / sizeof(hn::TFromD<D>)];
  hn::Store(v, d, part);
  std::memcpy(out, part, count * sizeof(hn::TFromD<D>));
}

// mask.cc's EncodeWords<sizeof(T)>: lanes of the element width.
template <typename T>
void MaskEncodeWordsKind(const T* input, uint64_t numel, uint64_t begin, uint64_t end,
                         uint32_t* words, MaskTotals* totals) {
  const hn::ScalableTag<T> d;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const size_t lanes = hn::Lanes(d);
  const T all_ones = static_cast<T>(~T{0});
  auto max = hn::Zero(d);
  auto min = hn::Set(d, all_ones);
  alignas(HWY_MAX_BYTES) uint8_t bits[kBlockElements + kCodePadding];
  for (uint64_t block = begin; block < end; block += kBlockElements / 32) {
    const uint64_t block_end = std::min(end, block + kBlockElements / 32);
    const uint64_t last = std::min(numel, 32 * block_end);
    for (uint64_t i = 32 * block; i < 32 * block_end; i += lanes) {
      const auto v = LoadFirst(d, input + i, i < last ? std::min<uint64_t>(lanes, last - i) : 0);
      const auto set = hn::Ne(v, hn::Zero(d));
      max = hn::Max(max, v);
      min = hn::Min(min, hn::IfThenElse(set, v, hn::Set(d, all_ones)));
      const auto one = hn::IfThenElseZero(set, hn::Set(d, T{1}));
      if constexpr (sizeof(T) == 1) {
        hn::StoreU(one, d8, bits + (i - 32 * block));
      } else {
        hn::StoreU(hn::TruncateTo(d8, one), d8, bits + (i - 32 * block));
      }
    }
    const uint32_t count = static_cast<uint32_t>(32 * (block_end - block));
    std::memset(bits + count, 0, PaddingOf(count));
    PackCodes(bits, count, 1, words + block);
    totals->checksum += ChecksumWordsVector(words + block, block_end - block, block);
  }
  // Zero-extended (mask.cc compares element bits as uint32).
  // Lane by lane: this Highway has no 8-bit MinOfLanes / MaxOfLanes.
  alignas(HWY_MAX_BYTES) T lane_max[HWY_MAX_BYTES / sizeof(T)];
  alignas(HWY_MAX_BYTES) T lane_min[HWY_MAX_BYTES / sizeof(T)];
  hn::Store(max, d, lane_max);
  hn::Store(min, d, lane_min);
  uint32_t max_bits = 0;
  T min_lane = all_ones;
  for (size_t j = 0; j < lanes; ++j) {
    max_bits = std::max<uint32_t>(max_bits, lane_max[j]);
    min_lane = std::min(min_lane, lane_min[j]);
  }
  const uint32_t min_bits = min_lane == all_ones && max_bits != all_ones ? 0xffffffffu : min_lane;
  totals->max_bits = std::max(totals->max_bits, max_bits);
  totals->min_bits = std::min(totals->min_bits, min_bits);
}

void MaskEncodeWordsVector(int width, const void* input, uint64_t numel, uint64_t begin,
                           uint64_t end, uint32_t* words, MaskTotals* totals) {
  switch (width) {
    case 1:
      return MaskEncodeWordsKind(static_cast<const uint8_t*>(input), numel, begin, end, words,
                                 totals);
    case 2:
      return MaskEncodeWordsKind(static_cast<const uint16_t*>(input), numel, begin, end, words,
                                 totals);
    default:
      return MaskEncodeWordsKind(static_cast<const uint32_t*>(input), numel, begin, end, words,
                                 totals);
  }
}

template <typename T>
void MaskDecodeWordsKind(const uint32_t* words, uint64_t numel, uint32_t value,
                         uint64_t begin_word, uint64_t end_word, T* out) {
  const hn::ScalableTag<T> d;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const size_t lanes = hn::Lanes(d);
  const auto v = hn::Set(d, static_cast<T>(value));
  alignas(HWY_MAX_BYTES) uint32_t block_words[kBlockElements / 32 + kCodePadding / 4];
  alignas(HWY_MAX_BYTES) uint8_t bits[kBlockElements + kCodePadding];
  for (uint64_t block = begin_word; block < end_word; block += kBlockElements / 32) {
    const uint64_t block_end = std::min(end_word, block + kBlockElements / 32);
    const uint32_t count = static_cast<uint32_t>(32 * (block_end - block));
    CopyCodeWords(words + block, static_cast<uint32_t>(block_end - block), count, 1, block_words);
    UnpackCodes(block_words, count, 1, bits);
    const uint64_t last = std::min(numel, 32 * block_end);
    for (uint64_t i = 32 * block; i < last; i += lanes) {
      hn::Vec<decltype(d)> set;
      if constexpr (sizeof(T) == 1) {
        set = hn::LoadU(d8, bits + (i - 32 * block));
      } else {
        set = hn::PromoteTo(d, hn::LoadU(d8, bits + (i - 32 * block)));
      }
      StoreFirst(d, hn::IfThenElseZero(hn::Ne(set, hn::Zero(d)), v), out + i,
                 std::min<uint64_t>(lanes, last - i));
    }
  }
}

void MaskDecodeWordsVector(int width, const uint32_t* words, uint64_t numel, uint32_t value,
                           uint64_t begin_word, uint64_t end_word, void* out) {
  switch (width) {
    case 1:
      return MaskDecodeWordsKind(words, numel, value, begin_word, end_word,
                                 static_cast<uint8_t*>(out));
    case 2:
      return MaskDecodeWordsKind(words, numel, value, begin_word, end_word,
                                 static_cast<uint16_t*>(out));
    default:
      return MaskDecodeWordsKind(words, numel, value, begin_word, end_word,
                                 static_cast<uint32_t*>(out));
  }
}

// ---- pool ----

// The `window` (2, 3 or 4) interleaved vectors at x (elements of kind K) as float lanes.
template <int K, size_t kWindow>
HWY_INLINE void LoadWindows(const void* x, hn::Vec<DF>* v) {
  const DF df;
  if constexpr (K == elements::kF32) {
    const float* f = static_cast<const float*>(x);
    if constexpr (kWindow == 2) hn::LoadInterleaved2(df, f, v[0], v[1]);
    if constexpr (kWindow == 3) hn::LoadInterleaved3(df, f, v[0], v[1], v[2]);
    if constexpr (kWindow == 4) hn::LoadInterleaved4(df, f, v[0], v[1], v[2], v[3]);
  } else {
    const DU du;
    const hn::Rebind<uint16_t, DF> d16;
    const uint16_t* h = static_cast<const uint16_t*>(x);
    hn::Vec<decltype(d16)> u[4];
    if constexpr (kWindow == 2) hn::LoadInterleaved2(d16, h, u[0], u[1]);
    if constexpr (kWindow == 3) hn::LoadInterleaved3(d16, h, u[0], u[1], u[2]);
    if constexpr (kWindow == 4) hn::LoadInterleaved4(d16, h, u[0], u[1], u[2], u[3]);
    for (size_t j = 0; j < kWindow; ++j) v[j] = FromHalfBits<K>(du, hn::PromoteTo(du, u[j]));
  }
}

// The window means of `lanes` consecutive windows at x (elements of kind K), summed left to
// right from +0 and divided by the window, as pool_math::WindowMean.
template <int K, size_t kWindow>
HWY_INLINE hn::Vec<DF> WindowMeans(const void* x) {
  const DF df;
  hn::Vec<DF> v[kWindow];
  LoadWindows<K, kWindow>(x, v);
  hn::Vec<DF> sum = hn::Zero(df);
  for (size_t j = 0; j < kWindow; ++j) sum = hn::Add(sum, v[j]);
  return hn::Div(sum, hn::Set(df, static_cast<float>(kWindow)));
}

template <int K>
HWY_INLINE hn::Vec<DF> WindowMeans(const void* x, uint32_t window) {
  if (window == 2) return WindowMeans<K, 2>(x);
  if (window == 3) return WindowMeans<K, 3>(x);
  return WindowMeans<K, 4>(x);
}

// pool_math::EncodeWord<K> for words [begin, end) of a payload whose windows tile the tensor:
// one float32 mean a word, or two 16-bit means (low half first; a missing last one is 0).
template <int K>
void PoolEncodeWordsKind(const void* input, uint64_t means, uint32_t window, uint64_t begin,
                         uint64_t end, uint32_t* words, PoolTotals* totals) {
  constexpr uint64_t kPerWord = K == elements::kF32 ? 1 : 2;
  constexpr size_t kBytes = K == elements::kF32 ? 4 : 2;
  const DF df;
  const DU du;
  const size_t lanes = hn::Lanes(df);
  const uint8_t* in = static_cast<const uint8_t*>(input);
  uint8_t* out = reinterpret_cast<uint8_t*>(words);
  alignas(HWY_MAX_BYTES) uint8_t tail[4 * HWY_MAX_BYTES] = {};
  alignas(HWY_MAX_BYTES) uint8_t tail_means[HWY_MAX_BYTES];
  uint64_t nonfinite = 0;
  const hn::Vec<DU> exponent = hn::Set(du, K == elements::kF16 ? 0x7c00u : 0x7f80u);
  for (uint64_t block = begin; block < end; block += kBlockElements) {
    const uint64_t block_end = std::min(end, block + kBlockElements);
    const uint64_t last = std::min(means, kPerWord * block_end);  // means [kPerWord * block, last)
    for (uint64_t m = kPerWord * block; m < kPerWord * block_end; m += lanes) {
      const size_t rest = m < last ? std::min<uint64_t>(lanes, last - m) : 0;
      const void* x = in + kBytes * m * window;
      if (rest < lanes) {
        std::memcpy(tail, x, kBytes * rest * window);
        std::memset(tail + kBytes * rest * window, 0, sizeof(tail) - kBytes * rest * window);
        x = tail;
      }
      const hn::Vec<DF> mean = WindowMeans<K>(x, window);
      const hn::Mask<DF> valid = hn::FirstN(df, rest);
      uint8_t* dst = rest < lanes ? tail_means : out + kBytes * m;
      if constexpr (K == elements::kF32) {
        nonfinite += hn::CountTrue(df, hn::AndNot(IsFiniteLanes(df, mean), valid));
        hn::StoreU(mean, df, reinterpret_cast<float*>(dst));
      } else {
        const hn::Rebind<uint16_t, DF> d16;
        const hn::Vec<DU> h = ToHalfBits<K>(df, mean);
        nonfinite += hn::CountTrue(
            df, hn::And(valid, hn::RebindMask(df, hn::Eq(hn::And(h, exponent), exponent))));
        // Means past `last` are 0 and give 0: the zero high half the format asks for.
        hn::StoreU(hn::TruncateTo(d16, h), d16, reinterpret_cast<uint16_t*>(dst));
      }
      if (rest < lanes) {
        const uint64_t stop = std::min<uint64_t>(m + lanes, kPerWord * block_end);
        std::memcpy(out + kBytes * m, tail_means, kBytes * (stop - m));
      }
    }
    totals->checksum += ChecksumWordsVector(words + block, block_end - block, block);
  }
  totals->nonfinite += nonfinite;
}

void PoolEncodeWordsVector(int kind, const void* input, uint64_t means, uint32_t window,
                           uint64_t begin, uint64_t end, uint32_t* words, PoolTotals* totals) {
  return WithKind(kind, [&](auto k) {
    PoolEncodeWordsKind<decltype(k)::value>(input, means, window, begin, end, words, totals);
  });
}

// The inverse, a bit copy: out[m * window + j] = means[m] for m in [begin, end), j < window.
template <typename T>
void PoolDecodeMeansKind(const T* means, uint32_t window, uint64_t begin, uint64_t end, T* out) {
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  alignas(HWY_MAX_BYTES) T tail[4 * HWY_MAX_BYTES / sizeof(T)];
  for (uint64_t m = begin; m < end; m += lanes) {
    const bool whole = m + lanes <= end;
    const auto v = LoadFirst(d, means + m, whole ? lanes : end - m);
    T* dst = whole ? out + m * window : tail;
    if (window == 2) {
      hn::StoreInterleaved2(v, v, d, dst);
    } else if (window == 3) {
      hn::StoreInterleaved3(v, v, v, d, dst);
    } else {
      hn::StoreInterleaved4(v, v, v, v, d, dst);
    }
    if (!whole) std::memcpy(out + m * window, tail, sizeof(T) * (end - m) * window);
  }
}

void PoolDecodeMeansVector(int width, const void* means, uint32_t window, uint64_t begin,
                           uint64_t end, void* out) {
  if (width == 2) {
    PoolDecodeMeansKind(static_cast<const uint16_t*>(means), window, begin, end,
                        static_cast<uint16_t*>(out));
  } else {
    PoolDecodeMeansKind(static_cast<const uint32_t*>(means), window, begin, end,
                        static_cast<uint32_t*>(out));
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
HWY_EXPORT(QuantizeGroupsVector);
HWY_EXPORT(DequantizeGroupVector);
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

void QuantizeGroups(int kind, const void* x, const float* approx, uint64_t n, uint32_t length,
                    uint32_t padded_last, uint32_t bits, uint64_t seed, uint64_t first,
                    uint32_t* words, uint64_t first_param_word, uint64_t first_code_word,
                    QuantTotals* totals) {
  HWY_DYNAMIC_DISPATCH(QuantizeGroupsVector)(kind, x, approx, n, length, padded_last, bits, seed,
                                             first, words, first_param_word, first_code_word,
                                             totals);
}

void DequantizeGroup(int kind, const uint32_t* code_words, uint32_t param_word, uint32_t n,
                     uint32_t bits, const float* approx, void* out) {
  HWY_DYNAMIC_DISPATCH(DequantizeGroupVector)(kind, code_words, param_word, n, bits, approx, out);
}

void CastEncodeWords(const float* input, uint64_t numel, bool to_bf16, uint64_t begin,
                     uint64_t end, uint32_t* words, CastTotals* totals) {
  HWY_DYNAMIC_DISPATCH(CastEncodeWordsVector)(input, numel, to_bf16, begin, end, words, totals);
}

void CastDecodeElements(const uint16_t* halves, bool from_bf16, uint64_t begin, uint64_t end,
                        float* out) {
  HWY_DYNAMIC_DISPATCH(CastDecodeElementsVector)(halves, from_bf16, begin, end, out);
}

void MaskEncodeWords(int width, const void* input, uint64_t numel, uint64_t begin, uint64_t end,
                     uint32_t* words, MaskTotals* totals) {
  HWY_DYNAMIC_DISPATCH(MaskEncodeWordsVector)(width, input, numel, begin, end, words, totals);
}

void MaskDecodeWords(int width, const uint32_t* words, uint64_t numel, uint32_t value,
                     uint64_t begin_word, uint64_t end_word, void* out) {
  HWY_DYNAMIC_DISPATCH(MaskDecodeWordsVector)(width, words, numel, value, begin_word, end_word,
                                              out);
}

void PoolEncodeWords(int kind, const void* input, uint64_t means, uint32_t window, uint64_t begin,
                     uint64_t end, uint32_t* words, PoolTotals* totals) {
  HWY_DYNAMIC_DISPATCH(PoolEncodeWordsVector)(kind, input, means, window, begin, end, words,
                                              totals);
}

void PoolDecodeMeans(int width, const void* means, uint32_t window, uint64_t begin, uint64_t end,
                     void* out) {
  HWY_DYNAMIC_DISPATCH(PoolDecodeMeansVector)(width, means, window, begin, end, out);
}

}  // namespace actpack::codecs::simd
#endif  // HWY_ONCE
