// The layout and arithmetic of `bitpack` (codecs/bitpack.h), shared by the CPU reference and the
// CUDA kernels so that both write the same words.
//
// Elements are read as signed 64-bit values (uint8 as its value) and stored as their offset
// d = v - base, an unsigned b-bit number, at bit i * b of the payload's little-endian 32-bit
// words, least significant bit first. A group of 32 elements fills exactly b words, so group g
// starts at word g * b; the last, partial group ends at the word holding its last bit, whose
// unused high bits are zero.
//
// This header is included by nvcc: it must not include Abseil or anything nvcc cannot parse.
#ifndef ACTPACK_CODECS_INTERNAL_BITPACK_MATH_H_
#define ACTPACK_CODECS_INTERNAL_BITPACK_MATH_H_

#include <cstdint>

#include "codecs/internal/portable.h"

namespace actpack::codecs::bitpack_math {

// The integer element types, as the kernels' template argument (bitpack.cc maps a DType to one).
enum Kind : int { kU8 = 1, kI8 = 2, kI16 = 3, kI32 = 4, kI64 = 5 };

inline constexpr uint32_t kGroup = 32;  // elements per group: a group fills `b` words

// Element `i` as a signed 64-bit value.
template <int K>
ACTPACK_HD int64_t Load(const void* base, uint64_t i) {
  if constexpr (K == kU8) {
    return static_cast<const uint8_t*>(base)[i];
  } else if constexpr (K == kI8) {
    return static_cast<const int8_t*>(base)[i];
  } else if constexpr (K == kI16) {
    return static_cast<const int16_t*>(base)[i];
  } else if constexpr (K == kI32) {
    return static_cast<const int32_t*>(base)[i];
  } else {
    return static_cast<const int64_t*>(base)[i];
  }
}

// Stores `v`, which the decoder's checks keep within the element type.
template <int K>
ACTPACK_HD void Store(void* base, uint64_t i, int64_t v) {
  if constexpr (K == kU8) {
    static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
  } else if constexpr (K == kI8) {
    static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v);
  } else if constexpr (K == kI16) {
    static_cast<int16_t*>(base)[i] = static_cast<int16_t>(v);
  } else if constexpr (K == kI32) {
    static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
  } else {
    static_cast<int64_t*>(base)[i] = v;
  }
}

// The kind's smallest and largest value.
ACTPACK_HD int64_t Lowest(int kind) {
  switch (kind) {
    case kU8: return 0;
    case kI8: return -128;
    case kI16: return -32768;
    case kI32: return -2147483647 - 1;
    default: return static_cast<int64_t>(uint64_t{1} << 63);
  }
}
ACTPACK_HD int64_t Highest(int kind) {
  switch (kind) {
    case kU8: return 255;
    case kI8: return 127;
    case kI16: return 32767;
    case kI32: return 2147483647;
    default: return static_cast<int64_t>(~(uint64_t{1} << 63));
  }
}

// The bits of `range` (max - min as an unsigned 64-bit number): 0 for 0, else 1..64.
ACTPACK_HD uint32_t Width(uint64_t range) {
  uint32_t b = 0;
  while (range != 0) {
    ++b;
    range >>= 1;
  }
  return b;
}

// 2^b - 1: the largest offset b bits hold.
ACTPACK_HD uint64_t Span(uint32_t b) { return b >= 64 ? ~uint64_t{0} : (uint64_t{1} << b) - 1; }

// The header's parameters: b and base for the values in [lo, hi] of `kind` (an empty tensor:
// lo = hi = 0).
struct Params {
  int64_t base;
  uint32_t bits;
};
ACTPACK_HD Params MakeParams(int64_t lo, int64_t hi, int kind) {
  Params p;
  p.bits = Width(static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo));
  // Lowered where lo + 2^b - 1 would pass the kind's largest value. b is no wider than the
  // kind, so the difference is a value of it.
  const int64_t top = static_cast<int64_t>(static_cast<uint64_t>(Highest(kind)) - Span(p.bits));
  p.base = lo < top ? lo : top;
  return p;
}

// Whether a decoder may use base and b for `kind`: b no wider than the kind, and every offset b
// bits hold, added to base, a value of it.
ACTPACK_HD bool ValidParams(int64_t base, uint32_t bits, int kind, uint32_t element_bytes) {
  if (bits > 8 * element_bytes) return false;
  const int64_t lowest = Lowest(kind), highest = Highest(kind);
  return base >= lowest && base <= highest &&
         static_cast<uint64_t>(highest) - static_cast<uint64_t>(base) >= Span(bits);
}

// Words of the payload: b per whole group, the partial group's bits rounded up to a word.
// Without overflow for any numel <= 2^62 and b <= 64.
ACTPACK_HD uint64_t PayloadWords(uint64_t numel, uint32_t b) {
  return numel / kGroup * b + ((numel % kGroup) * b + 31) / 32;
}

// Packs group `g` (elements [32g, min(32g + 32, numel))) at offsets from `base` into its words
// payload[g * b ...]; returns the sum of their checksum terms (portable::ChecksumTerm). Every
// element must lie in [base, base + 2^b - 1]. A 64-bit accumulator holds fewer than 32 pending
// bits between elements; an offset wider than 32 bits goes in as two pieces.
template <int K>
ACTPACK_HD uint64_t PackGroup(const void* input, uint64_t numel, uint64_t g, int64_t base,
                              uint32_t b, uint32_t* payload) {
  const uint64_t first = g * kGroup;
  const uint32_t count =
      numel - first < kGroup ? static_cast<uint32_t>(numel - first) : kGroup;
  uint64_t word_index = g * b;
  uint64_t checksum = 0;
  uint64_t pending = 0;  // bits not yet written, from bit 0
  uint32_t filled = 0;   // how many (< 32 between pieces)
  const auto put = [&](uint64_t piece, uint32_t bits) {  // bits <= 32, piece < 2^bits
    pending |= piece << filled;
    filled += bits;
    if (filled >= 32) {
      const uint32_t word = static_cast<uint32_t>(pending);
      payload[word_index] = word;
      checksum += portable::ChecksumTerm(word, word_index);
      ++word_index;
      pending >>= 32;
      filled -= 32;
    }
  };
  if (b <= 32) {
    for (uint32_t j = 0; j < count; ++j) {
      put(static_cast<uint64_t>(Load<K>(input, first + j)) - static_cast<uint64_t>(base), b);
    }
  } else {
    for (uint32_t j = 0; j < count; ++j) {
      const uint64_t d =
          static_cast<uint64_t>(Load<K>(input, first + j)) - static_cast<uint64_t>(base);
      put(d & 0xffffffffu, 32);
      put(d >> 32, b - 32);
    }
  }
  if (filled > 0) {  // the partial group's last word
    const uint32_t word = static_cast<uint32_t>(pending);
    payload[word_index] = word;
    checksum += portable::ChecksumTerm(word, word_index);
  }
  return checksum;
}

// The offset of element j (0..31) of a group whose words start at `group`; reads only the
// words that hold its bits (none for b = 0).
ACTPACK_HD uint64_t Extract(const uint32_t* group, uint32_t j, uint32_t b) {
  if (b == 0) return 0;
  const uint32_t bit = j * b;
  const uint32_t k = bit / 32, shift = bit % 32;
  uint64_t v = group[k] >> shift;
  uint32_t got = 32 - shift;  // bits of v read so far
  if (got < b) {
    v |= static_cast<uint64_t>(group[k + 1]) << got;
    got += 32;
    if (got < b) v |= static_cast<uint64_t>(group[k + 2]) << got;
  }
  return v & Span(b);
}

}  // namespace actpack::codecs::bitpack_math

#endif  // ACTPACK_CODECS_INTERNAL_BITPACK_MATH_H_
