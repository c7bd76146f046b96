// The device side of cudaemu: what lets an unchanged .cu file compile as host C++ and run.
//
// Each CUDA thread runs as a fiber (testing/cudaemu/executor.cc). A fiber runs until it reaches
// a barrier or a warp collective and then waits until every thread that must take part has
// arrived, so __syncthreads, __syncwarp and the *_sync intrinsics have their CUDA meaning, and a
// collective that would be undefined on a GPU (lanes at different call sites, different ops or
// masks, a lane of the mask that exited) stops the program with the block and thread.
//
// __shared__ variables are function statics, one per host thread: a block runs on one host
// thread (several at once under the concurrent schedule, each with its own shared memory), and a
// GPU gives a block uninitialised shared memory, so nothing may depend on their content at block
// start (the race checker reports a read of shared memory the block has not written).
//
// Kernels are launched with ACTPACK_LAUNCH (codecs/cuda/launch.cuh), which expands to
// `kernel<<<grid, block, 0, stream>>>` under nvcc and to cudaemu::Launch(...) here.
#ifndef CUDAEMU_DEVICE_H_
#define CUDAEMU_DEVICE_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
// The race checker (kernels built with -fsanitize=thread) watches one host thread and finds
// shared memory among the object file's writable statics, and AddressSanitizer misreads fiber
// stacks on worker threads: in their builds it stays a plain static (cheaper too), and the
// concurrent schedule is refused.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define __shared__ static
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define __shared__ static
#endif
#endif
#ifndef __shared__
#define __shared__ static thread_local
#endif
#define __constant__ static const

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

namespace cudaemu {
// Stops the program: a vector access (`bytes` wide, a read or a write) at an address that is not
// a multiple of its width, which a GPU faults on ("misaligned address"). Names the kernel, block
// and thread.
[[noreturn]] void MisalignedVectorAccess(const void* address, size_t bytes, bool write);
}  // namespace cudaemu

// CUDA's vector types (vector_types.h) with the alignment CUDA gives them: a copy of one to or
// from memory is one access of its full width (a 16-byte LDG.E.128 on a GPU), checked here for
// that alignment. Copies go through the check, so here they are not aggregates nor trivially
// copyable: build one with make_float4(...) and the like, or member by member.
#define CUDAEMU_VECTOR_TYPE(name, T, align, ...)                                              \
  struct alignas(align) name {                                                                \
    T __VA_ARGS__;                                                                            \
    name() = default;                                                                         \
    name(const name& o) { CopyFrom(o); }                                                      \
    name& operator=(const name& o) {                                                          \
      if (reinterpret_cast<uintptr_t>(this) % align != 0) {                                   \
        ::cudaemu::MisalignedVectorAccess(this, align, true);                                 \
      }                                                                                       \
      CopyFrom(o);                                                                            \
      return *this;                                                                           \
    }                                                                                         \
                                                                                              \
   private:                                                                                   \
    void CopyFrom(const name& o) {                                                            \
      if (reinterpret_cast<uintptr_t>(&o) % align != 0) {                                     \
        ::cudaemu::MisalignedVectorAccess(&o, align, false);                                  \
      }                                                                                       \
      __builtin_memcpy(static_cast<void*>(this), &o, align);                                  \
    }                                                                                         \
  };
CUDAEMU_VECTOR_TYPE(float2, float, 8, x, y)
CUDAEMU_VECTOR_TYPE(float4, float, 16, x, y, z, w)
CUDAEMU_VECTOR_TYPE(int2, int, 8, x, y)
CUDAEMU_VECTOR_TYPE(int4, int, 16, x, y, z, w)
CUDAEMU_VECTOR_TYPE(uint2, unsigned int, 8, x, y)
CUDAEMU_VECTOR_TYPE(uint4, unsigned int, 16, x, y, z, w)
#undef CUDAEMU_VECTOR_TYPE
static_assert(sizeof(float4) == 16 && alignof(float4) == 16 && sizeof(uint2) == 8);

#define CUDAEMU_MAKE2(name, T) \
  inline name make_##name(T x, T y) {  \
    name v;                             \
    v.x = x;                            \
    v.y = y;                            \
    return v;                           \
  }
#define CUDAEMU_MAKE4(name, T)                     \
  inline name make_##name(T x, T y, T z, T w) {  \
    name v;                                        \
    v.x = x;                                       \
    v.y = y;                                       \
    v.z = z;                                       \
    v.w = w;                                       \
    return v;                                      \
  }
CUDAEMU_MAKE2(float2, float)
CUDAEMU_MAKE4(float4, float)
CUDAEMU_MAKE2(int2, int)
CUDAEMU_MAKE4(int4, int)
CUDAEMU_MAKE2(uint2, unsigned int)
CUDAEMU_MAKE4(uint4, unsigned int)
#undef CUDAEMU_MAKE2
#undef CUDAEMU_MAKE4

// The built-in variables: the executor sets them before it resumes a thread's fiber. One set
// per host thread: under the concurrent schedule several blocks run at once, each on its own.
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace cudaemu {

// The warp collectives, as the executor tells them apart.
enum CollectiveOp : int { kSyncWarp, kShflXor, kShflUp, kShflDown, kShfl, kBallot, kAny, kAll };

// Where in the kernel's source a barrier or collective is: lanes at different sites diverge.
// A source location, not a return address: a compiler may duplicate or merge call
// instructions, but not lines.
using Site = std::source_location;

// Deposits `bits` for the collective `op` and waits until every lane of `mask` has arrived at
// the same site with the same op and mask; returns this lane's result.
uint64_t Collective(CollectiveOp op, unsigned mask, uint64_t bits, int arg, int width,
                    const Site& site);

// Waits until every thread of the block has arrived at this __syncthreads.
void SyncThreads(const Site& site);

// Runs one CUDA thread of a launch: the kernel with its own copy of the arguments.
using ThreadBody = void (*)(const void* closure);

// Queues a kernel on `stream`: `body(closure.get())` runs once per CUDA thread of the grid
// when the stream gets to it. Configuration errors are reported like CUDA's (cudaGetLastError).
void EnqueueKernel(const char* name, dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, ThreadBody body, std::shared_ptr<const void> closure);

// Stops the program: a kernel argument that is neither null nor device (or pinned host) memory.
void CheckKernelPointer(const char* kernel, int argument, const void* pointer);

template <class T>
uint64_t ToBits(T value) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "a 1..8-byte value");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return bits;
}
template <class T>
T FromBits(uint64_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

// What `kernel<<<grid, block, shared, stream>>>` evaluates to: called with the arguments, it
// converts them to the kernel's parameter types (as CUDA does), checks pointer arguments and
// queues the kernel. Each CUDA thread gets its own copy of the parameters, as registers.
template <class... Params>
struct Launcher {
  void (*kernel)(Params...);
  const char* name;
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;

  struct Closure {
    void (*kernel)(Params...);
    std::tuple<std::decay_t<Params>...> params;
  };

  template <class... Args>
  void operator()(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(Params), "kernel called with the wrong arity");
    auto closure = std::make_shared<Closure>(
        Closure{kernel, std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)});
    CheckPointers(closure->params, std::index_sequence_for<Params...>{});
    EnqueueKernel(name, grid, block, shared_bytes, stream, &RunThread, std::move(closure));
  }

 private:
  // Not instrumented by the race checker: copying the arguments out of the launch's closure
  // is the launch's doing, not the kernel's.
  __attribute__((no_sanitize("thread"))) static void RunThread(const void* closure) {
    const Closure* c = static_cast<const Closure*>(closure);
    // Both copied onto the thread's stack: std::apply may not be inlined here (with coverage
    // instrumentation it is not), and its reads must not reach into the launch's closure.
    void (*kernel)(Params...) = c->kernel;
    std::tuple<std::decay_t<Params>...> registers = c->params;
    std::apply(kernel, registers);
  }

  template <class Tuple, size_t... I>
  void CheckPointers(const Tuple& params, std::index_sequence<I...>) const {
    (CheckOne(static_cast<int>(I), std::get<I>(params)), ...);
  }
  template <class T>
  void CheckOne(int index, const T& value) const {
    if constexpr (std::is_pointer_v<T>) {
      CheckKernelPointer(name, index, reinterpret_cast<const void*>(value));
    }
  }
};

template <class... Params>
Launcher<Params...> Launch(void (*kernel)(Params...), const char* name, dim3 grid, dim3 block,
                           size_t shared_bytes, cudaStream_t stream) {
  return {kernel, name, grid, block, shared_bytes, stream};
}

}  // namespace cudaemu

// ---- barriers and warp collectives ----
// Each takes its call site as a defaulted source location.
#define CUDAEMU_SITE_PARAM const cudaemu::Site& site = cudaemu::Site::current()

inline void __syncthreads(CUDAEMU_SITE_PARAM) { cudaemu::SyncThreads(site); }
inline void __syncwarp(unsigned mask = 0xffffffffu, CUDAEMU_SITE_PARAM) {
  cudaemu::Collective(cudaemu::kSyncWarp, mask, 0, 0, 32, site);
}
template <class T>
T __shfl_sync(unsigned mask, T value, int source, int width = 32, CUDAEMU_SITE_PARAM) {
  return cudaemu::FromBits<T>(cudaemu::Collective(cudaemu::kShfl, mask, cudaemu::ToBits(value),
                                                  source, width, site));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32, CUDAEMU_SITE_PARAM) {
  return cudaemu::FromBits<T>(cudaemu::Collective(cudaemu::kShflXor, mask,
                                                  cudaemu::ToBits(value), lane_mask, width, site));
}
template <class T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32, CUDAEMU_SITE_PARAM) {
  return cudaemu::FromBits<T>(cudaemu::Collective(cudaemu::kShflUp, mask, cudaemu::ToBits(value),
                                                  static_cast<int>(delta), width, site));
}
template <class T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32, CUDAEMU_SITE_PARAM) {
  return cudaemu::FromBits<T>(cudaemu::Collective(cudaemu::kShflDown, mask,
                                                  cudaemu::ToBits(value),
                                                  static_cast<int>(delta), width, site));
}
inline unsigned __ballot_sync(unsigned mask, int predicate, CUDAEMU_SITE_PARAM) {
  return static_cast<unsigned>(
      cudaemu::Collective(cudaemu::kBallot, mask, predicate != 0, 0, 32, site));
}
inline int __any_sync(unsigned mask, int predicate, CUDAEMU_SITE_PARAM) {
  return static_cast<int>(cudaemu::Collective(cudaemu::kAny, mask, predicate != 0, 0, 32, site));
}
inline int __all_sync(unsigned mask, int predicate, CUDAEMU_SITE_PARAM) {
  return static_cast<int>(cudaemu::Collective(cudaemu::kAll, mask, predicate != 0, 0, 32, site));
}
#undef CUDAEMU_SITE_PARAM

// ---- intrinsics with exact host equivalents ----
inline unsigned int __float_as_uint(float f) { return cudaemu::FromBits<unsigned int>(cudaemu::ToBits(f)); }
inline int __float_as_int(float f) { return cudaemu::FromBits<int>(cudaemu::ToBits(f)); }
inline float __uint_as_float(unsigned int u) { return cudaemu::FromBits<float>(u); }
inline float __int_as_float(int i) { return cudaemu::FromBits<float>(static_cast<unsigned int>(i)); }
inline int __popc(unsigned int v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz(static_cast<unsigned int>(v)); }
inline int __clzll(long long v) {
  return v == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(v));
}
inline int __ffs(int v) { return __builtin_ffs(v); }
inline unsigned int __brev(unsigned int v) {
  v = ((v >> 1) & 0x55555555u) | ((v & 0x55555555u) << 1);
  v = ((v >> 2) & 0x33333333u) | ((v & 0x33333333u) << 2);
  v = ((v >> 4) & 0x0f0f0f0fu) | ((v & 0x0f0f0f0fu) << 4);
  v = ((v >> 8) & 0x00ff00ffu) | ((v & 0x00ff00ffu) << 8);
  return (v >> 16) | (v << 16);
}
// Round-to-nearest-even single-precision arithmetic: the host's, built with -ffp-contract=off.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
// cvt.rmi.s32.f32: floor, saturated to int's range, NaN to 0 (the PTX ISA's conversion rules).
inline int __float2int_rd(float x) {
  if (x != x) return 0;
  const float f = std::floor(x);
  if (f >= 2147483648.0f) return 2147483647;
  if (f < -2147483648.0f) return -2147483647 - 1;
  return static_cast<int>(f);
}

// CUDA's integer min/max overloads (one type; mixed types do not compile, as with nvcc's
// ambiguous overloads, so a kernel cannot pass here and fail there).
inline int min(int a, int b) { return b < a ? b : a; }
inline unsigned int min(unsigned int a, unsigned int b) { return b < a ? b : a; }
inline long long min(long long a, long long b) { return b < a ? b : a; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return b < a ? b : a; }
inline int max(int a, int b) { return a < b ? b : a; }
inline unsigned int max(unsigned int a, unsigned int b) { return a < b ? b : a; }
inline long long max(long long a, long long b) { return a < b ? b : a; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a < b ? b : a; }

// ---- atomics (device scope; relaxed, as CUDA's atomicXxx) ----
// Built on the __atomic builtins so that the race checker sees them as atomic accesses. Each
// first gives the other lanes of the block a turn under the concurrent schedule, so that a warp's
// lanes read a word other blocks are writing at different moments, as a GPU's lanes can, and
// the other blocks a turn of the host's processor.
namespace cudaemu {
void AtomicTurn();
}  // namespace cudaemu
template <class T>
inline T atomicAdd(T* address, T value) {
  cudaemu::AtomicTurn();
  static_assert(std::is_integral_v<T>, "integer atomicAdd");
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
inline float atomicAdd(float* address, float value) {
  cudaemu::AtomicTurn();
  unsigned int* word = reinterpret_cast<unsigned int*>(address);
  unsigned int old = __atomic_load_n(word, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(word, &old, __float_as_uint(__uint_as_float(old) + value),
                                      false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return __uint_as_float(old);
}
template <class T>
inline T atomicSub(T* address, T value) {
  cudaemu::AtomicTurn();
  return __atomic_fetch_sub(address, value, __ATOMIC_RELAXED);
}
template <class T>
inline T atomicOr(T* address, T value) {
  cudaemu::AtomicTurn();
  return __atomic_fetch_or(address, value, __ATOMIC_RELAXED);
}
template <class T>
inline T atomicAnd(T* address, T value) {
  cudaemu::AtomicTurn();
  return __atomic_fetch_and(address, value, __ATOMIC_RELAXED);
}
template <class T>
inline T atomicXor(T* address, T value) {
  cudaemu::AtomicTurn();
  return __atomic_fetch_xor(address, value, __ATOMIC_RELAXED);
}
template <class T>
inline T atomicExch(T* address, T value) {
  cudaemu::AtomicTurn();
  return __atomic_exchange_n(address, value, __ATOMIC_RELAXED);
}
template <class T>
inline T atomicMax(T* address, T value) {
  cudaemu::AtomicTurn();
  T old = __atomic_load_n(address, __ATOMIC_RELAXED);
  while (old < value && !__atomic_compare_exchange_n(address, &old, value, false,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <class T>
inline T atomicMin(T* address, T value) {
  cudaemu::AtomicTurn();
  T old = __atomic_load_n(address, __ATOMIC_RELAXED);
  while (value < old && !__atomic_compare_exchange_n(address, &old, value, false,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <class T>
inline T atomicCAS(T* address, T compare, T value) {
  cudaemu::AtomicTurn();
  __atomic_compare_exchange_n(address, &compare, value, false, __ATOMIC_RELAXED,
                              __ATOMIC_RELAXED);
  return compare;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#endif  // CUDAEMU_DEVICE_H_
