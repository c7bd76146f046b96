// Per-group stochastic quantization (ActNN/GACT), the arithmetic shared by the CPU reference
// (quant.cc) and the CUDA kernel (cuda/quant_kernels.cu).
//
// A group stores its minimum rounded down to bfloat16 and its step (range / levels) rounded up
// to bfloat16, so every finite value of the group maps into [0, levels]. A value's code is
// floor((x - min) / step + u) with u uniform in [0, 1): E[code * step + min] = x, so gradients
// computed from decoded activations stay unbiased.
#ifndef ACTPACK_CODECS_INTERNAL_QUANT_MATH_H_
#define ACTPACK_CODECS_INTERNAL_QUANT_MATH_H_

#include <cstdint>

#include "codecs/internal/portable.h"

namespace actpack::codecs::quant_math {

// Where everything of a quant payload lies, in 32-bit words: one parameter word per group
// (GroupParams::packed), then each group's codes, `words_per_group` words a group (the last
// group padded). The CPU reference and the CUDA kernels both index through this.
struct Layout {
  uint64_t numel;
  uint32_t group_size;  // values per group, a multiple of 32
  uint32_t bits;        // 1, 2, 4 or 8
  uint64_t seed;
  uint64_t groups;
  uint64_t words_per_group;
  ACTPACK_HD_METHOD uint64_t payload_words() const { return groups * (1 + words_per_group); }
  // The word holding codes [32 / bits * w, ...) of group g.
  ACTPACK_HD_METHOD uint64_t CodeWord(uint64_t g, uint64_t w) const {
    return groups + g * words_per_group + w;
  }
};

ACTPACK_HD Layout MakeLayout(uint64_t numel, uint32_t group_size, uint32_t bits, uint64_t seed) {
  Layout l{numel, group_size, bits, seed, 0, 0};
  l.groups = (numel + group_size - 1) / group_size;
  l.words_per_group = uint64_t{group_size} * bits / 32;
  return l;
}

struct GroupParams {
  uint32_t packed;   // min bf16 in the low half, step bf16 in the high half: the stored word
  float min;         // the stored minimum as a float
  float step;        // the stored step as a float
  float inv_step;    // 1 / step, 0 when step is 0 (a constant group)
  bool ok;           // false when the range overflows float
};

// Parameters of a group whose finite values lie in [lo, hi]. An empty group has lo > hi.
ACTPACK_HD GroupParams MakeGroupParams(float lo, float hi, int bits) {
  GroupParams p;
  if (lo > hi) {  // no finite value in the group
    lo = 0.0f;
    hi = 0.0f;
  }
  // -0 and +0 compare equal, so which one a min/max reduction returns depends on its order;
  // adding +0 turns -0 into +0 and makes the stored minimum independent of that order.
  lo = portable::Add(lo, 0.0f);
  const uint16_t min_bf16 = portable::FloatToBf16Down(lo);
  p.min = portable::Bf16ToFloat(min_bf16);
  const float range = portable::Sub(hi, p.min);
  const float levels = static_cast<float>((1 << bits) - 1);
  // A step below the smallest normal bfloat16 (0x0080) would make 1/step infinite and flush to
  // zero under denormals-are-zero on the CPU: raise it to that value.
  uint16_t step_bf16 =
      range > 0.0f ? portable::FloatToBf16Up(portable::Div(range, levels)) : uint16_t{0};
  if (step_bf16 != 0 && step_bf16 < 0x0080) step_bf16 = 0x0080;
  p.step = portable::Bf16ToFloat(step_bf16);
  p.ok = portable::IsFinite(range) && portable::IsFinite(p.step);
  p.inv_step = p.step > 0.0f ? portable::Div(1.0f, p.step) : 0.0f;
  p.packed = static_cast<uint32_t>(min_bf16) | (static_cast<uint32_t>(step_bf16) << 16);
  return p;
}

ACTPACK_HD GroupParams UnpackGroupParams(uint32_t packed) {
  GroupParams p;
  p.packed = packed;
  p.min = portable::Bf16ToFloat(static_cast<uint16_t>(packed & 0xffffu));
  p.step = portable::Bf16ToFloat(static_cast<uint16_t>(packed >> 16));
  p.inv_step = 0.0f;
  p.ok = true;
  return p;
}

// The code of value x (finite) with uniform draw u. x >= p.min, so `scaled` lies in
// [0, levels] once clamped, or is NaN (0 * inf where the group's range overflowed); both paths
// give floor(scaled) there, and 0 for NaN.
ACTPACK_HD uint32_t Quantize(float x, const GroupParams& p, float u, uint32_t levels) {
  const float scaled = portable::Add(portable::Mul(portable::Sub(x, p.min), p.inv_step), u);
  const float clamped = portable::Min(scaled, static_cast<float>(levels));
#if defined(__CUDA_ARCH__)
  // One instruction (F2I.FLOOR) for the floor and the conversion, which turns NaN into 0;
  // portable::Floor's branch-free form is four.
  const int32_t code = __float2int_rd(clamped);
  return static_cast<uint32_t>(code < 0 ? 0 : code);
#else
  return static_cast<uint32_t>(static_cast<int32_t>(portable::Max(portable::Floor(clamped), 0.0f)));
#endif
}

ACTPACK_HD float Dequantize(uint32_t code, const GroupParams& p) {
  return portable::Add(portable::Mul(static_cast<float>(code), p.step), p.min);
}

}  // namespace actpack::codecs::quant_math

#endif  // ACTPACK_CODECS_INTERNAL_QUANT_MATH_H_
