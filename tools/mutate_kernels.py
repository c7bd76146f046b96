#!/usr/bin/env python3
"""Mutation tests of the CUDA kernels: every bug below must make the emulated suite fail.

Each mutant is a bug of a kind GPU code has (a lane-dependent loop around a warp collective, an
off-by-one write, a missing barrier, a reduction that skips a step, a dropped tail element, a
wrong shift in bit packing), written into one kernel file at a time. The script builds the
emulated codec tests with the race checker (bazel --config=cudaemu_race), runs the cases of the
kernel's codec, and requires a failure: a byte that differs from the CPU reference, a race or
out-of-bounds access the race checker reports, or a divergent collective the executor stops.
The file is restored after every mutant, whatever happens.

Usage (from the repository root): python3 tools/mutate_kernels.py [--smoke] [--only ID ...]
(--smoke: the first mutant of each kernel file, what the test command runs by default)
Exit status 1 when a mutant survives or no longer applies (the kernel changed: update it here).
"""
import argparse
import atexit
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "testing", "cudaemu"))
from race_config import CONFIG, execution_root, gcov_test_env  # noqa: E402

TARGET = "//codecs:cuda_identity_test"
DEFERRED = "//codecs:deferred_test"


@dataclass
class Mutant:
    id: str
    kind: str
    path: str
    old: str
    new: str
    cases: str  # gtest filter over the test
    target: str = TARGET
    # The build it runs in: the race checker's, or the plain emulated one for a bug only blocks
    # running at once show (the concurrent schedule runs blocks on several host threads, which
    # the race checker cannot watch).
    config: str = CONFIG


def deferred(case):
    """Cases of the deferred calls' test (codecs/deferred_test.cc)."""
    return f"*.{case}"


def identity(spec):
    """The identity test's cases of one spec (its name as the test names it)."""
    name = re.sub(r"[^A-Za-z0-9]", "_", spec)
    return f"AllSpecs/CudaIdentityTest.*/{name}_*"


# division_dct's cases of the identity test.
DCT_CASES = (identity("division_dct") + ":CudaIdentityDivisionDctTest.*")

MUTANTS = [
    # Shared reductions and the checksum.
    Mutant("ops-sum-step", "a reduction that skips a step", "codecs/cuda/device_ops.cuh",
           "  for (int offset = 16; offset > 0; offset /= 2) {\n    value += __shfl_xor_sync",
           "  for (int offset = 16; offset > 1; offset /= 2) {\n    value += __shfl_xor_sync",
           identity("identity")),
    Mutant("ops-max-lane", "a lane-dependent loop around a warp collective",
           "codecs/cuda/device_ops.cuh",
           "  for (int offset = 16; offset > 0; offset /= 2) {\n    const uint64_t other",
           "  for (int offset = 16; offset > (threadIdx.x & 1); offset /= 2) {\n    const uint64_t other",
           identity("mask")),
    Mutant("checksum-tail", "a dropped tail element", "codecs/cuda/device_ops.cu",
           "w < full_words; w += stride) {\n    local += portable::ChecksumTerm",
           "w + 1 < full_words; w += stride) {\n    local += portable::ChecksumTerm",
           identity("identity")),
    # quant
    # quant's vector kernels (16-byte aligned tensors: the identity test's) ...
    Mutant("quant-minmax-lane", "a lane-dependent loop around a warp collective",
           "codecs/cuda/quant_kernels.cu",
           "    for (int offset = 16; offset > 0; offset /= 2) {\n      lo = fminf(",
           "    for (int offset = 16; offset > (lane & 1); offset /= 2) {\n      lo = fminf(",
           identity("quant2")),
    Mutant("quant-code-round", "a floor rounded to nearest", "codecs/internal/quant_math.h",
           "const int32_t code = __float2int_rd(clamped);",
           "const int32_t code = static_cast<int32_t>(clamped + 0.5f);", identity("quant2")),
    Mutant("quant-vector-finite", "a check removed", "codecs/cuda/quant_kernels.cu",
           "if (range.magnitude < 0x7f800000u) {", "if (range.magnitude <= 0x7f800000u) {",
           identity("quant2")),
    Mutant("quant-vector-partial", "a dropped tail element", "codecs/cuda/quant_kernels.cu",
           "? static_cast<uint32_t>(last - at)", "? static_cast<uint32_t>(last - at - 1)",
           identity("quant8")),
    # The code words of a warp's group (device_ops.cuh's GroupCodeWords, quant's and division's
    # vector encodes): the words lanes share, their checksum terms a lane a word, and the
    # parameter word's.
    Mutant("group-words-shift", "a wrong shift in bit packing", "codecs/cuda/device_ops.cuh",
           "uint32_t word = static_cast<uint32_t>(codes) << ((j & (lanes_per_word_ - 1)) * vector_bits_);",
           "uint32_t word = static_cast<uint32_t>(codes) << (((j + 1) & (lanes_per_word_ - 1)) * vector_bits_);",
           identity("quant2") + ":" + identity("division")),
    Mutant("group-words-own", "a dropped tail element", "codecs/cuda/device_ops.cuh",
           "if (32 * q < vector_bits_) {", "if (32 * q + 32 < vector_bits_) {",
           deferred("EveryOffsetAndTailGivesTheCpusBytesAndOutput/quant8_float16"), DEFERRED),
    Mutant("group-words-own-division", "a dropped tail element", "codecs/cuda/device_ops.cuh",
           "if (32 * q < vector_bits_) {", "if (32 * q + 32 < vector_bits_) {",
           identity("division:block=16,bits=8")),
    Mutant("group-words-shared-source", "a shuffle from the wrong lane",
           "codecs/cuda/device_ops.cuh",
           "__shfl_sync(0xffffffffu, row_word_[t], first_lane_ | (from & (kLanes - 1)));",
           "__shfl_sync(0xffffffffu, row_word_[t], first_lane_ | ((from + lanes_per_word_) & (kLanes - 1)));",
           identity("quant2")),
    Mutant("group-words-spare-lane", "a dropped tail element", "codecs/cuda/device_ops.cuh",
           "if (vectors_ > 0 && lane_ <= words_) {", "if (vectors_ > 0 && lane_ < words_) {",
           identity("quant2") + ":" + identity("division")),
    Mutant("group-words-empty", "a check removed (lanes with no group sum a term)",
           "codecs/cuda/device_ops.cuh",
           "if (vectors_ > 0 && lane_ <= words_) {", "if (lane_ <= words_) {",
           "CudaIdentityDivisionTest.*"),
    Mutant("group-words-full-warp", "a check removed", "codecs/cuda/device_ops.cuh",
           "if (vectors_ > 0 && words_ == kLanes && lane_ == 0) {",
           "if (vectors_ > 0 && words_ == kLanes + 1 && lane_ == 0) {",
           identity("quant4")),
    Mutant("quant-vector-stride", "a grid-stride loop that skips work (only a wrap shows it)",
           "codecs/cuda/quant_kernels.cu",
           "       g += warp_stride) {\n    const uint64_t first = g * layout.group_size;\n"
           "    const uint64_t end = first + layout.group_size;\n"
           "    const uint64_t last = end < layout.numel ? end : layout.numel;\n"
           "    const uint4* group",
           "       g += warp_stride + 1) {\n    const uint64_t first = g * layout.group_size;\n"
           "    const uint64_t end = first + layout.group_size;\n"
           "    const uint64_t last = end < layout.numel ? end : layout.numel;\n"
           "    const uint4* group", identity("quant2")),
    Mutant("quant-vector-decode-write", "an off-by-one write", "codecs/cuda/quant_kernels.cu",
           "if (j * kPer + kPer <= n) {", "if (j * kPer + kPer <= n + 1) {", identity("quant2")),
    Mutant("quant-vector-draw-key", "a random stream keyed per group, not per 2^32 elements",
           "codecs/cuda/quant_kernels.cu",
           "kWholeOneKey ? portable::UniformFromHashedKey(draws.hashed_key, at + e)",
           "kWholeOneKey ? portable::UniformFromHashedKey(draws.hashed_key, at + e + 1)",
           identity("quant2")),
    Mutant("quant-vector-terms", "a dropped tail element", "codecs/cuda/quant_kernels.cu",
           "if ((bit & 31) == 0) checksum += portable::ChecksumTerm(word, first_word + (bit >> 5));",
           "if ((bit & 31) == 0 && j + 1 < vectors) "
           "checksum += portable::ChecksumTerm(word, first_word + (bit >> 5));",
           identity("quant8")),
    # ... and its scalar kernels (other alignments, larger groups: the alignment test's)
    Mutant("quant-minmax-step", "a reduction that skips a step", "codecs/cuda/quant_kernels.cu",
           "      hi = portable::Max(hi, v);\n    }\n    for (int offset = 16; offset > 0;",
           "      hi = portable::Max(hi, v);\n    }\n    for (int offset = 8; offset > 0;",
           deferred("EveryOffsetAndTailGivesTheCpusBytesAndOutput/quant4*"), DEFERRED),
    Mutant("quant-tail", "a dropped tail element", "codecs/cuda/quant_kernels.cu",
           "      if (i < last) {", "      if (i + 1 < last) {",
           deferred("EveryOffsetAndTailGivesTheCpusBytesAndOutput/quant8*"), DEFERRED),
    Mutant("quant-shift", "a wrong shift in bit packing", "codecs/cuda/quant_kernels.cu",
           "uint32_t word = code << (slot * layout.bits);",
           "uint32_t word = code << ((slot ^ 1) * layout.bits);",
           deferred("EveryOffsetAndTailGivesTheCpusBytesAndOutput/quant2*"), DEFERRED),
    Mutant("quant-group-terms", "a dropped tail element", "codecs/cuda/quant_kernels.cu",
           "for (uint64_t w = lane; w < layout.words_per_group; w += 32) {",
           "for (uint64_t w = lane; w + 1 < layout.words_per_group; w += 32) {",
           deferred("EveryOffsetAndTailGivesTheCpusBytesAndOutput/quant2*"), DEFERRED),
    Mutant("quant-decode-write", "an off-by-one write", "codecs/cuda/quant_kernels.cu",
           "for (uint32_t k = lane; k < n; k += 32) {",
           "for (uint32_t k = lane; k <= n; k += 32) {",
           deferred("EveryOffsetAndTailGivesTheCpusBytesAndOutput/quant2*"), DEFERRED),
    Mutant("quant-draw-key", "a random stream keyed per group, not per 2^32 elements",
           "codecs/cuda/quant_kernels.cu",
           "if (portable::IsFinite(v)) code = quant_math::Quantize(v, p, draws(i), levels);",
           "if (portable::IsFinite(v)) code = quant_math::Quantize(v, p, draws(i ^ g), levels);",
           deferred("EveryOffsetAndTailGivesTheCpusBytesAndOutput/quant2*"), DEFERRED),
    # identity's one launch: vectors, the words and bytes past them, the checksum
    Mutant("identity-vector-tail", "a dropped tail element", "codecs/cuda/device_ops.cu",
           "    for (; i < vectors; i += stride) {", "    for (; i + 1 < vectors; i += stride) {",
           deferred("EveryOffsetAndTailGivesTheCpusBytesAndOutput/identity*"), DEFERRED),
    Mutant("identity-unroll-index", "an off-by-one write", "codecs/cuda/device_ops.cu",
           "        dst[i + k * stride] = v[k];", "        dst[i + k * stride + 1] = v[k];",
           identity("identity")),
    Mutant("identity-word-tail", "a dropped tail element", "codecs/cuda/device_ops.cu",
           "for (uint64_t w = word + first; w < words; w += stride) {",
           "for (uint64_t w = word + first; w + 1 < words; w += stride) {",
           deferred("EveryOffsetAndTailGivesTheCpusBytesAndOutput/identity*"), DEFERRED),
    Mutant("identity-byte-word", "a wrong shift in bit packing", "codecs/cuda/device_ops.cu",
           "        value |= static_cast<uint32_t>(byte) << (8 * b);",
           "        value |= static_cast<uint32_t>(byte) << (8 * (b ^ 1));",
           deferred("EveryOffsetAndTailGivesTheCpusBytesAndOutput/identity_bool"), DEFERRED),
    Mutant("identity-byte-tail", "a dropped tail element", "codecs/cuda/device_ops.cu",
           "  if (first == 0 && bytes % 4 != 0) {", "  if (first == 0 && bytes % 4 > 1) {",
           deferred("EveryOffsetAndTailGivesTheCpusBytesAndOutput/identity*"), DEFERRED),
    # cast: 16-byte vectors where aligned (the identity test's), words past them and elsewhere
    Mutant("cast-tail", "a dropped tail element", "codecs/cuda/cast_kernels.cu",
           "w < words; w += stride) {\n    const uint32_t value = cast_math::EncodeWord",
           "w + 1 < words; w += stride) {\n    const uint32_t value = cast_math::EncodeWord",
           identity("cast:fp16")),
    Mutant("cast-pair-half", "a wrong shift in bit packing", "codecs/internal/cast_math.h",
           "  return lo | hi << 16;", "  return lo | hi << 15;", identity("cast:fp16")),
    Mutant("cast-decode-write", "an off-by-one write", "codecs/cuda/cast_kernels.cu",
           "if (2 * w + 1 < numel) output[2 * w + 1]", "if (2 * w + 1 <= numel) output[2 * w + 1]",
           identity("cast:bf16")),
    Mutant("cast-vector-terms", "a wrong index", "codecs/cuda/cast_kernels.cu",
           "portable::ChecksumTerm(out.y, 2 * at + 1);", "portable::ChecksumTerm(out.y, 2 * at);",
           identity("cast:fp16")),
    Mutant("cast-decode-vector-tail", "a dropped tail element", "codecs/cuda/cast_kernels.cu",
           "      StoreDecoded(w, from_bf16, dst + 2 * i);",
           "      if (i + 1 < vectors) StoreDecoded(w, from_bf16, dst + 2 * i);",
           identity("cast:bf16")),
    # mask: a thread per 16-byte vector, words ORed across lanes
    Mutant("mask-or-lane", "a lane-dependent loop around a warp collective",
           "codecs/cuda/mask_kernels.cu",
           "for (uint32_t offset = 1; offset < kLanesPerWord; offset *= 2) {",
           "for (uint32_t offset = 1; offset < kLanesPerWord + (lane & 1); offset *= 2) {",
           identity("mask")),
    Mutant("mask-check-value", "a check removed", "codecs/cuda/mask_kernels.cu",
           "  bool ok = ValidValue(dtype, header[kParamsWord]);", "  bool ok = true;",
           deferred("MaskParametersNoEncodeWritesAreRefusedOnTheDevice"), DEFERRED),
    Mutant("mask-check-words", "a check removed", "codecs/cuda/mask_kernels.cu",
           "  for (int j = 1; j < 6; ++j) ok = ok && header[kParamsWord + j] == 0;\n", "",
           deferred("MaskParametersNoEncodeWritesAreRefusedOnTheDevice"), DEFERRED),
    Mutant("mask-shift", "a wrong shift in bit packing", "codecs/cuda/mask_kernels.cu",
           "ExpandBits<Width>(word >> (at % 32), value)",
           "ExpandBits<Width>(word >> ((at + 1) % 32), value)", identity("mask")),
    Mutant("mask-unroll-index", "an off-by-one write", "codecs/cuda/mask_kernels.cu",
           "static_cast<uint4*>(output)[v + k * stride] =",
           "static_cast<uint4*>(output)[v + k * stride + 1] =", identity("mask")),
    Mutant("mask-tail-shift", "a wrong shift in bit packing", "codecs/cuda/mask_kernels.cu",
           "(word >> (i % 32)) & 1u ? value : 0u", "(word >> ((i + 1) % 32)) & 1u ? value : 0u",
           deferred("EveryOffsetAndTailGivesTheCpusBytesAndOutput/mask*"), DEFERRED),
    Mutant("mask-word-bound", "an off-by-one write", "codecs/cuda/mask_kernels.cu",
           "if (lane % kLanesPerWord == 0 && w < words) {",
           "if (lane % kLanesPerWord == 0 && w <= words) {", identity("mask")),
    # bitpack
    Mutant("bitpack-range-lane", "a lane-dependent branch around a warp collective",
           "codecs/cuda/bitpack_kernels.cu",
           "  WarpMaxToGlobal(max_key, &status->work[kMaxKeyWord]);",
           "  if ((threadIdx.x & 31) != 3) WarpMaxToGlobal(max_key, &status->work[kMaxKeyWord]);",
           identity("bitpack")),
    Mutant("bitpack-range-tail", "a dropped tail element", "codecs/cuda/bitpack_kernels.cu",
           "i < numel; i += stride) {\n    const uint64_t key",
           "i + 1 < numel; i += stride) {\n    const uint64_t key", identity("bitpack")),
    Mutant("bitpack-min-complement", "a reduction that skips a step",
           "codecs/cuda/bitpack_kernels.cu",
           "max_complement = ~key > max_complement ? ~key : max_complement;",
           "max_complement = key > max_complement ? ~key : max_complement;",
           identity("bitpack")),
    Mutant("bitpack-encode-tail", "a dropped tail element", "codecs/cuda/bitpack_kernels.cu",
           "offsets[k] = i < numel ?", "offsets[k] = i + 1 < numel ?", identity("bitpack")),
    Mutant("bitpack-encode-shift", "a wrong shift in bit packing",
           "codecs/cuda/bitpack_kernels.cu", "const uint64_t high = d >> (32 - shift);",
           "const uint64_t high = d >> (31 - shift);", identity("bitpack")),
    Mutant("bitpack-encode-wide", "a dropped word of a wide element",
           "codecs/cuda/bitpack_kernels.cu",
           "        if ((high >> 32) != 0) atomicOr(&group[2], static_cast<uint32_t>(high >> 32));\n",
           "", identity("bitpack")),
    Mutant("bitpack-encode-syncwarp", "a missing barrier", "codecs/cuda/bitpack_kernels.cu",
           "      }\n    }\n    __syncwarp();\n", "      }\n    }\n", identity("bitpack")),
    Mutant("bitpack-encode-store", "an off-by-one write", "codecs/cuda/bitpack_kernels.cu",
           "for (uint32_t t = lane; t < pass_words; t += 32) {",
           "for (uint32_t t = lane; t <= pass_words; t += 32) {", identity("bitpack")),
    Mutant("bitpack-decode-shift", "a wrong shift in bit packing",
           "codecs/cuda/bitpack_kernels.cu", "static_cast<uint32_t>(i % bm::kGroup), bits);",
           "static_cast<uint32_t>((i + 1) % bm::kGroup), bits);", identity("bitpack")),
    Mutant("bitpack-decode-write", "an off-by-one write", "codecs/cuda/bitpack_kernels.cu",
           "i < numel; i += stride) {\n    const uint64_t offset",
           "i <= numel; i += stride) {\n    const uint64_t offset", identity("bitpack")),
    # pool: 16-byte vectors where the windows tile the tensor, value by value elsewhere
    Mutant("pool-tail", "a dropped tail element", "codecs/cuda/pool_kernels.cu",
           "w < words; w += stride) {\n    const uint32_t word =\n        w < tiled_words",
           "w + 1 < words; w += stride) {\n    const uint32_t word =\n        w < tiled_words",
           identity("pool:k=3")),
    Mutant("pool-decode-write", "an off-by-one write", "codecs/cuda/pool_kernels.cu",
           "i < numel; i += stride) {\n    const uint64_t row",
           "i <= numel; i += stride) {\n    const uint64_t row", identity("pool4")),
    Mutant("pool-tiled-second-mean", "a wrong index", "codecs/cuda/pool_kernels.cu",
           "if (K != elements::kF32 && v * kPer + e >= window) {",
           "if (K != elements::kF32 && v * kPer + e > window) {",
           deferred("EveryOffsetAndTailGivesTheCpusBytesAndOutput/pool*"), DEFERRED),
    Mutant("pool-unroll-index", "an off-by-one write", "codecs/cuda/pool_kernels.cu",
           "        payload[w + k * stride] = word;", "        payload[w + k * stride + 1] = word;",
           identity("pool4")),
    Mutant("pool-decode-terms", "a dropped tail element", "codecs/cuda/pool_kernels.cu",
           "if (e % shape.window == 0) checksum += MeanTerm<Width>(payload, m);",
           "if (e % shape.window == 0 && i + 1 < vectors) checksum += MeanTerm<Width>(payload, m);",
           identity("pool4")),
    # division
    # division's vector residual kernel (aligned planes of whole vectors, one window a vector)
    Mutant("division-vector-stride", "a grid-stride loop that skips work (only a wrap shows it)",
           "codecs/cuda/division_kernels.cu",
           "       w += warp_stride) {\n    const uint64_t g = 2 * w + half;",
           "       w += warp_stride + 1) {\n    const uint64_t g = 2 * w + half;",
           identity("division")),
    # (<= would be equivalent: a non-finite value's window mean is not finite either, so its
    # residual is NaN, above infinity's bits.)
    Mutant("division-vector-finite", "a check removed", "codecs/cuda/division_kernels.cu",
           "if (range.magnitude < 0x7f800000u) {", "if (range.magnitude < 0x80000000u) {",
           identity("division")),
    Mutant("division-vector-pair", "a check removed (a half-warp with no group writes)",
           "codecs/cuda/division_kernels.cu",
           "const bool in = g < l.groups;", "const bool in = true;", "CudaIdentityDivisionTest.*"),
    Mutant("division-vector-half-overflow", "a reduction across the wrong lanes",
           "codecs/cuda/division_kernels.cu",
           "(__ballot_sync(kFullMask, overflow) & half_mask) != 0",
           "__ballot_sync(kFullMask, overflow) != 0", "CudaIdentityDivisionTest.*"),
    Mutant("division-vector-half-range", "a reduction across the wrong lanes",
           "codecs/cuda/division_kernels.cu",
           "for (uint32_t offset = kGroupLanes / 2; offset > 0; offset /= 2) {",
           "for (uint32_t offset = kGroupLanes; offset > 0; offset /= 2) {", identity("division")),
    Mutant("division-lfc-overflow", "a count never raised", "codecs/cuda/division_kernels.cu",
           "  WarpSumToGlobal(lfc_nonfinite, &status->work[kLfcOverflowWord]);",
           "  WarpSumToGlobal(0, &status->work[kLfcOverflowWord]);", "*ivision*"),
    Mutant("division-lfc-high-mean", "a half of a word never tested",
           "codecs/internal/division_math.h",
           "return ((word & 0x7f80u) == 0x7f80u) + ((word >> 16 & 0x7f80u) == 0x7f80u);",
           "return ((word & 0x7f80u) == 0x7f80u);", "*ivision*"),
    Mutant("division-lfc-zeroes", "a status left as the caller gave it",
           "codecs/cuda/division_kernels.cu",
           "  if (blockIdx.x == 0 && threadIdx.x < sizeof(DeviceStatus) / 8) {",
           "  if (blockIdx.x == 0 && threadIdx.x < sizeof(DeviceStatus) / 8 - 1) {",
           deferred("AnEncodeAndADecodeQueueAtMostTwoOperationsEach/division*"), DEFERRED),
    Mutant("division-lfc-vector-two", "a window row's second vector left out of its mean",
           "codecs/cuda/division_kernels.cu",
           "        if (two) {\n          ACTPACK_UNROLL",
           "        if (false) {\n          ACTPACK_UNROLL", identity("division")),
    Mutant("division-lfc-vector-rows", "a window's rows read one vector apart, not a row",
           "codecs/cuda/division_kernels.cu",
           "        const uint4 a = first[h * row_vectors];",
           "        const uint4 a = first[h];", identity("division")),
    Mutant("division-lfc-terms", "payload words left out of the checksum",
           "codecs/cuda/division_kernels.cu",
           "    checksum += portable::ChecksumTerm(word, w);\n    lfc_nonfinite",
           "    checksum += 0;\n    lfc_nonfinite", identity("division")),
    Mutant("division-lfc-share", "a thread's share of the words skipped after the first",
           "codecs/cuda/division_kernels.cu",
           "  for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < l.lfc_words;\n"
           "       w += stride) {",
           "  for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < l.lfc_words;\n"
           "       w += 2 * stride) {", identity("division")),
    Mutant("division-vector-window", "a check removed", "codecs/cuda/division_kernels.cu",
           "return reinterpret_cast<uintptr_t>(input) % 16 == 0 && l.plane % per == 0 &&\n"
           "         VectorsShareApproximation(l, per) &&",
           "return reinterpret_cast<uintptr_t>(input) % 16 == 0 && l.plane % per == 0 &&\n"
           "         true &&", identity("division:block=2,bits=1")),
    Mutant("division-vector-minmax-step", "a reduction that skips a step",
           "codecs/cuda/division_kernels.cu",
           "for (uint32_t offset = kGroupLanes / 2; offset > 0; offset /= 2) {",
           "for (uint32_t offset = kGroupLanes / 2; offset > 1; offset /= 2) {", identity("division")),
    Mutant("division-vector-tail", "a dropped tail element", "codecs/cuda/division_kernels.cu",
           "    if (j < vectors) {\n      lv.v[t] = group[j];",
           "    if (j + 1 < vectors) {\n      lv.v[t] = group[j];", identity("division")),
    Mutant("division-one-window", "a check removed", "codecs/cuda/division_kernels.cu",
           "return l.inner == 1 && l.width % per == 0 && l.block_w % per == 0;",
           "return l.inner == 1 && l.width % per == 0;", identity("division:block=2,bits=1")),
    Mutant("division-one-window-term", "a check removed", "codecs/cuda/division_kernels.cu",
           "const uint64_t m = MeanIndex(l, d, p, j, &starts);\n    if (starts && m % 2 == 0)",
           "const uint64_t m = MeanIndex(l, d, p, j, &starts);\n    if (m % 2 == 0)",
           identity("division")),
    Mutant("division-minmax-step", "a reduction that skips a step",
           "codecs/cuda/division_kernels.cu",
           "    for (int offset = 16; offset > 0; offset /= 2) {\n      lo = portable::Min",
           "    for (int offset = 16; offset > 2; offset /= 2) {\n      lo = portable::Min",
           identity("division")),
    Mutant("division-pack-lane", "a lane-dependent loop around a warp collective",
           "codecs/cuda/division_kernels.cu",
           "for (uint32_t offset = 1; offset < per_word; offset *= 2) {",
           "for (uint32_t offset = 1; offset < per_word + (lane & 1); offset *= 2) {",
           identity("division:block=4,bits=4")),
    Mutant("division-code-write", "an off-by-one write", "codecs/cuda/division_kernels.cu",
           "if ((lane & (per_word - 1)) == 0 && index < n_words) {",
           "if ((lane & (per_word - 1)) == 0 && index <= n_words) {", identity("division")),
    Mutant("division-decode-write", "an off-by-one write", "codecs/cuda/division_kernels.cu",
           "i < numel; i += stride) {\n    const uint64_t p = PlaneOf(l, d, i);",
           "i <= numel; i += stride) {\n    const uint64_t p = PlaneOf(l, d, i);",
           identity("division")),
    Mutant("division-plane-of", "a wrong index", "codecs/cuda/division_kernels.cu",
           "return d.narrow ? portable::Divide(static_cast<uint32_t>(i), d.plane)",
           "return d.narrow ? portable::Divide(static_cast<uint32_t>(i + 1), d.plane)",
           identity("division")),
    Mutant("division-place-of-group", "a wrong index", "codecs/cuda/division_kernels.cu",
           "? portable::Divide(static_cast<uint32_t>(g), d.groups_per_plane)",
           "? portable::Divide(static_cast<uint32_t>(g + 1), d.groups_per_plane)",
           identity("division")),
    Mutant("division-group-of", "a wrong index", "codecs/cuda/division_kernels.cu",
           "return d.narrow ? portable::Divide(static_cast<uint32_t>(j), d.group_length)",
           "return d.narrow ? portable::Divide(static_cast<uint32_t>(j + 1), d.group_length)",
           identity("division")),
    # division_dct (its own cases: every spec, and the chunks, tiles and long axes)
    Mutant("dct-forward-barrier", "a missing barrier", "codecs/cuda/division_kernels.cu",
           "      }\n      __syncthreads();\n      const uint64_t tile",
           "      }\n      const uint64_t tile", DCT_CASES),
    Mutant("dct-forward-row", "a dropped tail element", "codecs/cuda/division_kernels.cu",
           "          for (uint64_t h = 0; h < H; ++h) {\n            g = portable::Add(",
           "          for (uint64_t h = 0; h + 1 < H; ++h) {\n            g = portable::Add(",
           DCT_CASES),
    Mutant("dct-forward-tile", "a tile read past its columns", "codecs/cuda/division_kernels.cu",
           "const uint64_t tile = division_math::MinU(t.columns, W - w0);",
           "const uint64_t tile = t.columns;", DCT_CASES),
    Mutant("dct-forward-planes", "a block item one plane too many",
           "codecs/cuda/division_kernels.cu",
           "const uint64_t planes = division_math::MinU(t.planes, l.planes - first_plane);",
           "const uint64_t planes = t.planes;", DCT_CASES),
    Mutant("dct-forward-pad", "a padding half left as the buffer held it",
           "codecs/cuda/division_kernels.cu",
           "    lfc[2 * l.lfc_words - 1] = 0;", "    lfc[2 * l.lfc_words - 1] = lfc[0];", DCT_CASES),
    Mutant("dct-cosine-table", "a wrong index", "codecs/cuda/division_kernels.cu",
           "table[i] = dct_math::Basis(i % n, 1 + i / n, n);",
           "table[i] = dct_math::Basis(i % n, i / n, n);", DCT_CASES),
    Mutant("dct-mean-channel", "a wrong index", "codecs/cuda/division_kernels.cu",
           "CoefficientIndex(l, p, 0, 0, c)]);\n      return portable::Add(0.0f",
           "CoefficientIndex(l, p, 0, 0, 0)]);\n      return portable::Add(0.0f", DCT_CASES),
    Mutant("dct-other-words", "a thread's share of the words skipped after the first",
           "codecs/cuda/division_kernels.cu",
           "    for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < l.lfc_words;\n"
           "         w += stride) {",
           "    for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < l.lfc_words;\n"
           "         w += 2 * stride) {", DCT_CASES),
    Mutant("dct-shared-approximation", "a check removed", "codecs/cuda/division_kernels.cu",
           "if (l.kept_rows > 0) return OneFrequency(l) && l.inner == 1;",
           "if (l.kept_rows > 0) return OneFrequency(l);", DCT_CASES),
    # eb
    Mutant("eb-encode-barrier", "a missing barrier", "codecs/cuda/eb_kernels.cu",
           "        listed[bi] = choice.outliers;\n      }\n    }\n    __syncthreads();\n",
           "        listed[bi] = choice.outliers;\n      }\n    }\n", identity("eb:rel=1e-2")),
    Mutant("eb-decode-syncwarp", "a missing barrier", "codecs/cuda/eb_kernels.cu",
           "          for (uint32_t r = 1; r < l.tile_rows; ++r) k[r * tc] += k[(r - 1) * tc];\n"
           "        }\n        __syncwarp();\n",
           "          for (uint32_t r = 1; r < l.tile_rows; ++r) k[r * tc] += k[(r - 1) * tc];\n"
           "        }\n",
           identity("eb:rel=1e-4")),
    Mutant("eb-min-step", "a reduction that skips a step", "codecs/cuda/eb_kernels.cu",
           "for (int offset = 16; offset > 0; offset /= 2) v = min(",
           "for (int offset = 16; offset > 1; offset /= 2) v = min(", identity("eb:abs=1e-3")),
    Mutant("eb-plan-lane", "a lane-dependent branch around a warp collective",
           "codecs/cuda/eb_kernels.cu",
           "  lo = WarpMin(lo);\n  hi = WarpMax(hi);\n  const int32_t mid = eb_math::MidCode(lo, hi);\n"
           "  const int32_t first = k[0];",
           "  if (lane != 3) lo = WarpMin(lo);\n  hi = WarpMax(hi);\n"
           "  const int32_t mid = eb_math::MidCode(lo, hi);\n  const int32_t first = k[0];",
           identity("eb:rel=1e-2")),
    Mutant("eb-run-lane", "a lane-dependent branch around a warp collective",
           "codecs/cuda/eb_kernels.cu",
           "  const int32_t before = __shfl_up_sync(kFullMask, code[kSlotsPerLane - 1], 1);",
           "  const int32_t before = lane == 5 ? 0 : __shfl_up_sync(kFullMask, code[kSlotsPerLane - 1], 1);",
           identity("eb:rel=1e-2")),
    Mutant("eb-pack-shift", "a wrong shift in bit packing", "codecs/cuda/eb_kernels.cu",
           "atomicOr(&words[bit / 32 + 1], value >> (32 - shift));",
           "atomicOr(&words[bit / 32 + 1], value >> (31 - shift));", identity("eb:abs=0.5")),
    Mutant("eb-range-tail", "a dropped tail element", "codecs/cuda/eb_kernels.cu",
           "v[u] = at < numel ? elements::Load<K>(input, at)",
           "v[u] = at + 1 < numel ? elements::Load<K>(input, at)", identity("eb:rel=1e-2")),
    Mutant("eb-lookback-prefix", "a reduction that skips a step", "codecs/cuda/eb_kernels.cu",
           "const int take = first_prefix < first_missing ? first_prefix + 1 : first_missing;",
           "const int take = first_prefix < first_missing ? first_prefix : first_missing;",
           "CudaIdentityEbTest.*"),
    Mutant("eb-lookback-lane-wait", "a lane-dependent loop around a warp collective",
           "codecs/cuda/eb_kernels.cu",
           "    if (lane == 0) {\n"
           "      for (int spin = 0; spin < kLookBackSpins && flag_m == 0; ++spin) {\n"
           "        words = LoadState(&state[2 * m]);\n"
           "        outliers = LoadState(&state[2 * m + 1]);\n"
           "        flag_m = FlagOf(words, outliers);\n"
           "      }\n"
           "    }\n"
           "    words = __shfl_sync(kFullMask, words, 0);\n"
           "    outliers = __shfl_sync(kFullMask, outliers, 0);\n"
           "    flag_m = FlagOf(words, outliers);\n",
           "    for (int spin = 0; spin < kLookBackSpins && flag_m == 0; ++spin) {\n"
           "      words = LoadState(&state[2 * m]);\n"
           "      outliers = LoadState(&state[2 * m + 1]);\n"
           "      flag_m = FlagOf(words, outliers);\n"
           "    }\n",
           "CudaIdentityEbTest.EveryBlockOrder*", config="cudaemu"),
    Mutant("eb-lookback-fallback", "a look-back that skips a chunk with no state",
           "codecs/cuda/eb_kernels.cu", "      words = sums.words << 2 | kAggregate;",
           "      words = kAggregate;", "CudaIdentityEbTest.*"),
    Mutant("eb-lookback-spin", "a look-back that skips a chunk with no state",
           "codecs/cuda/eb_kernels.cu", "    before.words += words >> 2;\n    before.outliers",
           "    before.words += flag_m == kAggregate ? 0 : words >> 2;\n    before.outliers",
           "CudaIdentityEbTest.*"),
    Mutant("eb-outlier-first", "an off-by-one write", "codecs/cuda/eb_kernels.cu",
           "uint64_t outlier = c > 0 ? state[2 * c - 1] >> 2 : 0;",
           "uint64_t outlier = c > 0 ? state[2 * c - 1] >> 2 : 1;", "CudaIdentityEbTest.*"),
    Mutant("eb-totals", "a status never raised", "codecs/cuda/eb_kernels.cu",
           "if (c + 1 == l.chunks) {  // the totals", "if (c + 2 == l.chunks) {  // the totals",
           identity("eb:rel=1e-2")),
    Mutant("eb-run-scan", "a reduction that skips a step", "codecs/cuda/eb_kernels.cu",
           "    for (uint32_t j = 1; j < kSlotsPerLane; ++j) v[j] += v[j - 1];",
           "    for (uint32_t j = 2; j < kSlotsPerLane; ++j) v[j] += v[j - 1];",
           "CudaIdentityEbTest.*"),
    Mutant("eb-store-tail", "an off-by-one write", "codecs/cuda/eb_kernels.cu",
           "for (uint32_t j = 0; j < n && j < 4; ++j) elements::Store<K>(output, i + j, y[j]);",
           "for (uint32_t j = 0; j <= n && j < 4; ++j) elements::Store<K>(output, i + j, y[j]);",
           identity("eb:rel=1e-2")),
    # The device's own checks of an eb or bitpack buffer, each removed in turn: the status an
    # unresolved decode reads, the blocks, the chunk index and the outliers, bitpack's
    # parameters.
    Mutant("eb-status-half-bin", "a check removed", "codecs/cuda/eb_kernels.cu",
           "  if (!(half_bin >= eb_math::kMinNormal && half_bin <= eb_math::kMaxHalfBin) ||\n"
           "      !(bound >= 0.0f",
           "  if (!(bound >= 0.0f",
           deferred("AnUnresolvedEbDecodeChecksWhatTheStatusSays/half_bin*"), DEFERRED),
    Mutant("eb-status-bound", "a check removed", "codecs/cuda/eb_kernels.cu",
           "      !(bound >= 0.0f && portable::IsFinite(bound)) || params[0] != 0",
           "      params[0] != 0",
           deferred("AnUnresolvedEbDecodeChecksWhatTheStatusSays/bound*"), DEFERRED),
    Mutant("eb-status-unused", "a check removed", "codecs/cuda/eb_kernels.cu",
           "|| params[0] != 0 || params[3] != 0) {", ") {",
           deferred("AnUnresolvedEbDecodeChecksWhatTheStatusSays/unused*"), DEFERRED),
    Mutant("eb-status-whole-words", "a check removed", "codecs/cuda/eb_kernels.cu",
           "if (bytes % 4 != 0 || bytes > p.max_bytes || bytes / 4 < fixed)",
           "if (bytes > p.max_bytes || bytes / 4 < fixed)",
           deferred("AnUnresolvedEbDecodeChecksWhatTheStatusSays/payload*"), DEFERRED),
    Mutant("eb-status-fixed", "a check removed", "codecs/cuda/eb_kernels.cu",
           "if (bytes % 4 != 0 || bytes > p.max_bytes || bytes / 4 < fixed)",
           "if (bytes % 4 != 0 || bytes > p.max_bytes)",
           deferred("AnUnresolvedEbDecodeChecksWhatTheStatusSays/payload*"), DEFERRED),
    Mutant("eb-block-header", "a check removed", "codecs/cuda/eb_kernels.cu",
           "      if (eb_math::ValidHeader(h)) {", "      if (true) {",
           "CudaIdentityEbTest.Forged*"),
    Mutant("eb-chunk-index", "a check removed", "codecs/cuda/eb_kernels.cu",
           "      if ((c == 0 && start != 0) || start + chunk_size != next) bad |= kFailEbChunkIndex;\n",
           "", "CudaIdentityEbTest.Forged*"),
    Mutant("eb-outlier-order", "a check removed", "codecs/cuda/eb_kernels.cu",
           "    bool ok = j + 1 >= outliers || ReadU64(slots, j + 1) > slot;",
           "    bool ok = true;", "CudaIdentityEbTest.Forged*"),
    Mutant("eb-outlier-block", "a check removed", "codecs/cuda/eb_kernels.cu",
           "    ok = ok && b < l.blocks && slot % eb_math::kBlockValues < eb_math::TileOf(l, b).count &&",
           "    ok = ok && slot % eb_math::kBlockValues < eb_math::TileOf(l, b).count &&",
           "CudaIdentityEbTest.Forged*"),
    Mutant("eb-outlier-raw", "a check removed", "codecs/cuda/eb_kernels.cu",
           "    ok = ok && (element_bytes == 4 || raw[j] <= 0xffffu);\n", "",
           "CudaIdentityEbTest.Forged*"),
    Mutant("bitpack-check-params", "a check removed", "codecs/cuda/bitpack_kernels.cu",
           "bool ok = bits <= 64 && bm::ValidParams(BaseOf(params), bits, kind, element_bytes) &&",
           "bool ok = bits <= 64 &&", "DeferredParamsTest.*", DEFERRED),
    Mutant("bitpack-check-unused", "a check removed", "codecs/cuda/bitpack_kernels.cu",
           "            params[3] == 0 && params[4] == 0 && params[5] == 0;",
           "            true;", "DeferredParamsTest.*", DEFERRED),
    Mutant("bitpack-check-size", "a check removed", "codecs/cuda/bitpack_kernels.cu",
           "  ok = ok && size == 4 * bm::PayloadWords(numel, bits);\n", "",
           "DeferredParamsTest.*", DEFERRED),
    # The deferred calls' own kernels: the header written on the device, the decode's check of
    # a buffer, the overwrite of a decode that failed it.
    Mutant("poison-tail", "a dropped tail element", "codecs/cuda/device_ops.cu",
           "i < numel; i += stride) {\n    if constexpr (Bytes == 8) {",
           "i + 1 < numel; i += stride) {\n    if constexpr (Bytes == 8) {",
           deferred("ACorruptedPayloadDecodesAsNaN/*"), DEFERRED),
    Mutant("finalize-flag", "a status never raised", "codecs/cuda/device_ops.cuh",
           "  if (read(&status->nonfinite) != 0 || read(&status->unrepresentable) != 0) {",
           "  if (read(&status->nonfinite) != 0 && read(&status->unrepresentable) != 0) {",
           deferred("TheFlagIsSetAndTheDecodeIsNaN/*"), DEFERRED),
    # A launch's last block: counted, and the header or the check it leaves.
    Mutant("last-block-count", "an off-by-one bound", "codecs/cuda/device_ops.cuh",
           "    last = (before >> 32) == blocks - 1;", "    last = (before >> 32) == blocks - 2;",
           identity("quant2")),
    Mutant("closing-sum-reset", "a status never raised", "codecs/cuda/device_ops.cuh",
           "    atomicExch(&status->decode_sum, 0ull);  // the next decode", "    // the next decode",
           deferred("ASecondDecodeWithTheSameStatusPassesToo/*"), DEFERRED),
    # Each device-side check of a decode's buffer (BufferFailures) removed in turn: the header
    # words, the flags, the payload's size against the capacity, the checksum.
    Mutant("check-flags", "a check removed", "codecs/cuda/device_ops.cuh",
           "  if ((flags & ~kFlagUnrepresentable) != 0) failures |= kFailHeader;\n", "",
           deferred("AnUnknownHeaderFlagIsRefused/*"), DEFERRED),
    Mutant("check-unrepresentable", "a check removed", "codecs/cuda/device_ops.cuh",
           "  if ((flags & kFlagUnrepresentable) != 0) failures |= kFailUnrepresentable;\n", "",
           deferred("TheFlagIsSetAndTheDecodeIsNaN/*"), DEFERRED),
    Mutant("check-capacity", "a check removed", "codecs/cuda/device_ops.cuh",
           "  if (Words64(w + kPayloadSizeWord) > capacity - kHeaderWords * 4) failures |= kFailHeader;\n",
           "", deferred("APayloadPastTheBuffersEndIsRefused/*"), DEFERRED),
    Mutant("check-checksum", "a check removed", "codecs/cuda/device_ops.cuh",
           "  if (checksum != Words64(w + kChecksumWord)) failures |= kFailChecksum;\n", "",
           deferred("ACorruptedPayloadDecodesAsNaN/*"), DEFERRED),
    Mutant("check-header-words", "a status never raised", "codecs/cuda/device_ops.cuh",
           "  for (int j = 0; j < kChecksumWord; ++j) {\n    // The flags",
           "  for (int j = 0; j < 4; ++j) {\n    // The flags",
           deferred("ABufferOfAnotherTensorIsRefused/*"), DEFERRED),
    Mutant("check-size-words", "a status never raised", "codecs/cuda/device_ops.cu",
           "  const bool size_known = (known >> kPayloadSizeWord & 3u) == 3u;",
           "  const bool size_known = true;",
           deferred("Unresolved*"), DEFERRED),
    # The checks of what an unresolved eb decode reads from the status, and the placement of
    # an encoding whose size the device decided (PlaceDeferred, GatherDeferred).
    Mutant("eb-status-outliers", "a bound never checked", "codecs/cuda/eb_kernels.cu",
           "  if (outliers > p.max_outliers) failures |= kFailEbOutlier;\n",
           "", deferred("AnUnresolvedEbDecodeChecksWhatTheStatusSays/outliers*"), DEFERRED),
    Mutant("eb-status-size", "a bound never checked", "codecs/cuda/eb_kernels.cu",
           "if (bytes % 4 != 0 || bytes > p.max_bytes || bytes / 4 < fixed)",
           "if (bytes % 4 != 0 || bytes / 4 < fixed)",
           deferred("AnUnresolvedEbDecodeChecksWhatTheStatusSays/payload*"), DEFERRED),
    Mutant("eb-status-header", "a status never raised", "codecs/cuda/eb_kernels.cu",
           "    if (bad == 0 && !StatusIsTheHeaders(words - kHeaderWords, status)) bad = kFailHeader;\n",
           "", deferred("AnUnresolvedEbDecodeChecksWhatTheStatusSays/half_bin*"), DEFERRED),
    Mutant("place-arena-bound", "a bound never checked", "codecs/cuda/device_ops.cu",
           "if (room <= arena_capacity && offset <= arena_capacity - room) {",
           "if (room <= arena_capacity) {", deferred("AnEncodingThatFitsNowhere*"), DEFERRED),
    Mutant("place-target-fit", "an off-by-one bound", "codecs/cuda/device_ops.cu",
           "  if (bytes <= target_capacity) {", "  if (bytes < target_capacity) {",
           deferred("AnEncodingThatFitsItsTarget*"), DEFERRED),
    Mutant("place-arena-align", "a misaligned allocation", "codecs/cuda/device_ops.cu",
           "const uint64_t room = (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;",
           "const uint64_t room = (bytes + 3) / 4 * 4;",
           deferred("PlacementsFromSeveralStreams*"), DEFERRED),
    Mutant("move-tail", "a dropped tail element", "codecs/cuda/device_ops.cu",
           "for (uint64_t b = units * sizeof(Unit); b < bytes; ++b)",
           "for (uint64_t b = units * sizeof(Unit); b + 4 < bytes; ++b)",
           deferred("AnEncodingThatFitsItsTarget*"), DEFERRED),
    Mutant("lost-unflagged", "a status never raised", "codecs/cuda/device_ops.cuh",
           "  if (PlacedNowhere(status)) failures = kFailLost;",
           "", deferred("AnEncodingThatFitsNowhere*"), DEFERRED),
    Mutant("mask-value-smallest", "a reduction that skips a step", "codecs/cuda/mask_kernels.cu",
           "  if (smallest != value || !ValidValue(dtype, value)) status->unrepresentable = 1;",
           "  if (!ValidValue(dtype, value)) status->unrepresentable = 1;",
           deferred("TheFlagIsSetAndTheDecodeIsNaN/mask*"), DEFERRED),
]


def run_bazel(args):
    return subprocess.run(["bazel", *args], text=True, capture_output=True)


def why_failed(bazel_output, testlogs):
    """What stopped the test: the emulator's message, or the first failed expectation."""
    texts = [bazel_output]
    for root, _, files in os.walk(testlogs):
        for name in files:
            if name == "test.log":
                with open(os.path.join(root, name), errors="replace") as f:
                    texts.append(f.read())
    text = "\n".join(texts)
    for pattern in (r"cudaemu: race checker: ([^\n]{0,110})", r"cudaemu: ([^\n]{0,110})",
                    r"ERROR: AddressSanitizer: ([^\n]{0,80})", r"(first differing [^\n]{0,60})",
                    r"Failure\n([^\n]{0,100})"):
        m = re.search(pattern, text)
        if m:
            return m.group(1).strip()
    return "failed"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="mutant ids to run")
    parser.add_argument("--smoke", action="store_true",
                        help="the first mutant of each kernel file (the test command's run; all "
                             "of them with ACTPACK_FULL=1)")
    args = parser.parse_args()
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    mutants = [m for m in MUTANTS if not args.only or m.id in args.only]
    if args.smoke:
        # The first mutant of each kernel file: that the suite still sees a bug in each (each
        # mutant rebuilds the emulated kernels: the full list is the full run's).
        picked = {}
        for m in mutants:
            picked.setdefault(m.path, m)
        mutants = list(picked.values())  # in the list's order: each is its file's first

    originals = {}

    def restore():
        for path, text in originals.items():
            with open(path, "w") as f:
                f.write(text)

    atexit.register(restore)

    # The unmutated suite must pass first, or a "killed" mutant would mean nothing. With the
    # coverage run's test environment (testing/cudaemu/race_config.py): after tools/cudaemu_coverage.py (the test command runs it
    # first) this is its cached pass.
    base = run_bazel(["test", f"--config={CONFIG}", *gcov_test_env(execution_root()), TARGET, DEFERRED])
    if base.returncode != 0:
        print(base.stdout[-3000:] + base.stderr[-3000:])
        print("mutate_kernels: the unmutated emulated suite fails; fix that first")
        return 1
    testlogs = {}  # config: its bazel-testlogs

    def testlogs_root(config):
        if config not in testlogs:
            testlogs[config] = run_bazel(["info", f"--config={config}",
                                          "bazel-testlogs"]).stdout.strip()
        return testlogs[config]

    survived, stale = [], []
    print(f"{'mutant':22} {'kind':48} result")
    for m in mutants:
        with open(m.path) as f:
            text = f.read()
        originals.setdefault(m.path, text)
        if text.count(m.old) != 1:
            stale.append(m.id)
            print(f"{m.id:22} {m.kind:48} NO LONGER APPLIES ({text.count(m.old)} matches)")
            continue
        start = time.time()
        with open(m.path, "w") as f:
            f.write(text.replace(m.old, m.new))
        try:
            result = run_bazel(["test", f"--config={m.config}", m.target,
                                f"--test_filter={m.cases}", "--test_output=errors"])
        finally:
            with open(m.path, "w") as f:
                f.write(text)
        seconds = time.time() - start
        # bazel: 3 = tests failed (killed), 0 = passed (survived), anything else = no verdict.
        if result.returncode == 3:
            print(f"{m.id:22} {m.kind:48} killed ({seconds:.0f} s): "
                  f"{why_failed(result.stdout + result.stderr, os.path.join(testlogs_root(m.config), *m.target[2:].split(':')))}")
        elif result.returncode == 0:
            survived.append(m.id)
            print(f"{m.id:22} {m.kind:48} SURVIVED ({seconds:.0f} s)")
        else:
            stale.append(m.id)
            print(f"{m.id:22} {m.kind:48} DID NOT BUILD (exit {result.returncode})")
            print(result.stderr[-2000:])
    restore()
    killed = len(mutants) - len(survived) - len(stale)
    print(f"mutate_kernels: {killed} of {len(mutants)} mutants killed"
          + (f"; survived: {' '.join(survived)}" if survived else "")
          + (f"; not applied: {' '.join(stale)}" if stale else ""))
    return 0 if not survived and not stale else 1


if __name__ == "__main__":
    sys.exit(main())
