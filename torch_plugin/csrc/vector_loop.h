// ACTPACK_VECTOR_LOOP: a hot loop over floats compiled twice, for AVX2 and for the baseline,
// the CPU's choice made once when the module loads (GCC and Clang function multi-versioning).
// The module is built for any x86-64, where the compiler vectorizes with SSE2 only: the lean
// backward's and the sign masks' loops ran 2-3x slower than ATen's own kernels, which ATen
// builds per CPU the same way. The loops are element-wise or sum per channel in a fixed order,
// and fp-contract is off, so both versions compute the same bits.
#ifndef ACTPACK_TORCH_PLUGIN_CSRC_VECTOR_LOOP_H_
#define ACTPACK_TORCH_PLUGIN_CSRC_VECTOR_LOOP_H_

#include <cstddef>  // defines __GLIBC__ where glibc is the C library

// The choice at load is an ELF ifunc, which glibc's loader resolves (musl's and macOS's do not).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__ELF__) && \
    defined(__GLIBC__)
#define ACTPACK_VECTOR_LOOP __attribute__((target_clones("avx2", "default")))
#else
#define ACTPACK_VECTOR_LOOP
#endif

#endif  // ACTPACK_TORCH_PLUGIN_CSRC_VECTOR_LOOP_H_
