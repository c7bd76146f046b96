#include "codecs/internal/simd.h"

#include <algorithm>
#include <atomic>
#include <cstring>

// Highway compiles this file once per target (AVX2, AVX-512 and its static scalar target) by
// including it again from foreach_target.h; HWY_ONCE marks what is compiled only once.
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
  uint64_t sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1)));
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
// low 32 bits. Elements of one group lie in at most two streams of 2^32 (the second from where
// the low bits wrap below those of the group's first element): `key0` and `key1` are the
// hashed keys (portable::Hash32(portable::UniformKey(...))) of the first and the last element.
HWY_INLINE hn::Vec<DF> Draws(hn::Vec<DU> low_index, hn::Vec<DU> first_low, hn::Vec<DU> key0,
                             hn::Vec<DU> key1) {
  const DF df;
  const DI di;
  const DU du;
  const hn::Vec<DU> sign = hn::Set(du, 0x80000000u);
  // Unsigned low_index < first_low, as a signed comparison of both with the sign bit flipped.
  const hn::Mask<DI> wrapped = hn::Lt(hn::BitCast(di, hn::Xor(low_index, sign)),
                                      hn::BitCast(di, hn::Xor(first_low, sign)));
  const hn::Vec<DU> key = hn::IfThenElse(hn::RebindMask(du, wrapped), key1, key0);
  const hn::Vec<DU> r = hn::ShiftRight<8>(Hash32(hn::Xor(low_index, key)));
  return hn::Mul(hn::ConvertTo(df, hn::BitCast(di, r)), hn::Set(df, 1.0f / 16777216.0f));
}

// x[i] (or x[i] - approx[i]) for the lanes i < n of the vector at i; 0 past n.
HWY_INLINE hn::Vec<DF> LoadResiduals(const float* x, const float* approx, hn::Mask<DF> valid,
                                     size_t i) {
  const DF df;
  const hn::Vec<DF> v = hn::MaskedLoad(valid, df, x + i);
  if (approx == nullptr) return v;
  return hn::Sub(v, hn::MaskedLoad(valid, df, approx + i));
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

void QuantizeGroupF32Vector(const float* x, const float* approx, uint32_t n, uint32_t padded,
                            uint32_t bits, uint64_t seed, uint64_t first, uint32_t* words,
                            uint64_t param_word, uint64_t first_code_word, QuantTotals* totals) {
  const DF df;
  const DI di;
  const DU du;
  const size_t lanes = hn::Lanes(df);
  // The group's range, as quant.cc's EncodeGroups: over the finite residuals; counts of
  // non-finite inputs and of finite inputs whose residual is not finite.
  hn::Vec<DF> lo = hn::Set(df, portable::BitsToFloat(0x7f800000u));
  hn::Vec<DF> hi = hn::Neg(lo);
  uint64_t nonfinite = 0, overflow = 0;
  for (uint32_t i = 0; i < n; i += lanes) {
    const hn::Mask<DF> valid = hn::FirstN(df, n - i);
    const hn::Mask<DF> x_finite = IsFiniteLanes(df, hn::MaskedLoad(valid, df, x + i));
    const hn::Vec<DF> r = LoadResiduals(x, approx, valid, i);
    const hn::Mask<DF> r_finite = hn::And(valid, IsFiniteLanes(df, r));
    nonfinite += hn::CountTrue(df, hn::AndNot(x_finite, valid));
    overflow += hn::CountTrue(df, hn::AndNot(r_finite, hn::And(valid, x_finite)));
    lo = hn::IfThenElse(r_finite, hn::Min(lo, r), lo);
    hi = hn::IfThenElse(r_finite, hn::Max(hi, r), hi);
  }
  const quant_math::GroupParams p = quant_math::MakeGroupParams(
      hn::GetLane(hn::MinOfLanes(df, lo)), hn::GetLane(hn::MaxOfLanes(df, hi)),
      static_cast<int>(bits));
  totals->nonfinite += nonfinite;
  if (!p.ok || overflow > 0) ++totals->overflow_groups;
  words[param_word] = p.packed;
  totals->checksum += portable::ChecksumTerm(p.packed, param_word);

  // Codes: quant_math::Quantize per lane, with its comparisons spelled out so that NaN and
  // rounding go exactly as there. floor(min(scaled, levels)) clamped at 0 is, for every float
  // (NaN included), the truncation of scaled when 0 < min(scaled, levels), else 0.
  const hn::Vec<DF> min = hn::Set(df, p.min);
  const hn::Vec<DF> inv_step = hn::Set(df, p.inv_step);
  const hn::Vec<DF> levels = hn::Set(df, static_cast<float>((1u << bits) - 1));
  const hn::Vec<DU> key0 = hn::Set(du, portable::Hash32(portable::UniformKey(seed, first)));
  const hn::Vec<DU> key1 =
      hn::Set(du, portable::Hash32(portable::UniformKey(seed, first + (n > 0 ? n - 1 : 0))));
  const hn::Vec<DU> first_low = hn::Set(du, static_cast<uint32_t>(first));
  const hn::Rebind<uint8_t, DI> d8;
  alignas(HWY_MAX_BYTES) uint8_t codes[kBlockCodes + kCodePadding];
  for (uint32_t block = 0; block < padded; block += kBlockCodes) {
    const uint32_t count = std::min(kBlockCodes, padded - block);
    for (uint32_t j = 0; j < count; j += lanes) {
      const uint32_t i = block + j;
      const hn::Mask<DF> valid = hn::FirstN(df, i < n ? n - i : 0);
      const hn::Vec<DF> r = LoadResiduals(x, approx, valid, i);
      const hn::Mask<DF> finite = IsFiniteLanes(df, r);
      const hn::Vec<DF> safe = hn::IfThenElse(finite, r, min);
      const hn::Vec<DU> low_index = hn::Add(hn::Iota(du, 0), hn::Set(du, static_cast<uint32_t>(
                                                                           first + i)));
      const hn::Vec<DF> scaled =
          hn::Add(hn::Mul(hn::Sub(safe, min), inv_step), Draws(low_index, first_low, key0, key1));
      const hn::Vec<DF> clamped = hn::IfThenElse(hn::Lt(levels, scaled), levels, scaled);
      const hn::Vec<DF> positive = hn::IfThenElseZero(hn::Gt(clamped, hn::Zero(df)), clamped);
      const hn::Vec<DI> code = hn::IfThenElseZero(hn::RebindMask(di, hn::And(valid, finite)),
                                                  hn::ConvertTo(di, positive));
      hn::StoreU(hn::DemoteTo(d8, code), d8, codes + j);
    }
    std::memset(codes + count, 0, kCodePadding);
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
    // The group's words only (a whole vector past them could be past the payload).
    std::memcpy(words, code_words + block * bits / 32, 4 * word_count);
    std::memset(words + word_count, 0, kCodePadding);
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

}  // namespace HWY_NAMESPACE
}  // namespace actpack::codecs::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace actpack::codecs::simd {
namespace {

constexpr int64_t kVectorTargets = HWY_AVX2 | HWY_AVX3;

// Set by SetTargetForTest: the scalar reference although vectors are available.
std::atomic<bool> scalar_forced{false};

// What the CPU supports, read before any test restricts it.
int64_t CpuTargets() {
  static const int64_t targets = hwy::SupportedTargets();
  return targets;
}

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
  CpuTargets();
  scalar_forced = target == Target::kScalar;
  int64_t mask = 0;  // no restriction
  if (target == Target::kAvx2) mask = HWY_AVX2;
  if (target == Target::kAvx512) mask = HWY_AVX3;
  hwy::SetSupportedTargetsForTest(mask);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

Target ActiveTarget() {
  const int64_t cpu = hwy::SupportedTargets();
  if (scalar_forced || (cpu & kVectorTargets) == 0) return Target::kScalar;
  return (cpu & HWY_AVX3) ? Target::kAvx512 : Target::kAvx2;
}

bool Vectorized() { return ActiveTarget() != Target::kScalar; }

HWY_EXPORT(ChecksumWordsVector);
HWY_EXPORT(QuantizeGroupF32Vector);
HWY_EXPORT(DequantizeGroupF32Vector);

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

}  // namespace actpack::codecs::simd
#endif  // HWY_ONCE
