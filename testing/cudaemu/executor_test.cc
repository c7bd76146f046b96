// The executor: barriers, warp collectives, divergence detection, shared memory, atomics,
// schedules (blocks at once under the concurrent one), built-in variables, launch checks and
// fiber stacks under AddressSanitizer.
#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "cudaemu/control.h"
#include "gtest/gtest.h"

#define LAUNCH(kernel, grid, block) ::cudaemu::Launch(kernel, #kernel, grid, block, 0, nullptr)

namespace {

const char* const kSchedules[] = {"forward", "reverse", "random:1", "random:2", "random:3"};

// Device buffers of T, read back with a synchronising copy.
template <class T>
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : size(n) {
    EXPECT_EQ(cudaMalloc(&data, n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(data, 0, n * sizeof(T)), cudaSuccess);
  }
  ~DeviceBuffer() { EXPECT_EQ(cudaFree(data), cudaSuccess); }
  std::vector<T> Read() const {
    std::vector<T> host(size);
    EXPECT_EQ(cudaMemcpy(host.data(), data, size * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }
  T* data = nullptr;
  size_t size;
};

class ScheduleGuard {
 public:
  explicit ScheduleGuard(const char* schedule) : saved_(cudaemu::ScheduleName()) {
    cudaemu::SetSchedule(schedule);
  }
  ~ScheduleGuard() { cudaemu::SetSchedule(saved_); }

 private:
  std::string saved_;
};

// ---- barriers ----

// Inclusive scan of 1..n over shared memory (Hillis-Steele); `synchronised` = false drops the
// barrier between the read and the write of each step.
__global__ void ScanKernel(unsigned long long* out, int synchronised) {
  __shared__ unsigned long long s[1024];
  const unsigned t = threadIdx.x;
  s[t] = t + 1;
  __syncthreads();
  for (unsigned offset = 1; offset < blockDim.x; offset *= 2) {
    const unsigned long long v = t >= offset ? s[t - offset] : 0;
    if (synchronised) __syncthreads();
    s[t] += v;
    __syncthreads();
  }
  out[t] = s[t];
}

TEST(BarrierTest, ScanIsExactInEveryScheduleAndBlockSize) {
  for (const char* schedule : kSchedules) {
    ScheduleGuard guard(schedule);
    for (unsigned threads : {32u, 64u, 256u, 1024u}) {
      DeviceBuffer<unsigned long long> out(threads);
      LAUNCH(ScanKernel, 1, threads)(out.data, 1);
      const std::vector<unsigned long long> got = out.Read();
      for (unsigned t = 0; t < threads; ++t) {
        ASSERT_EQ(got[t], (t + 1ull) * (t + 2) / 2) << schedule << " threads " << threads;
      }
    }
  }
}

TEST(BarrierTest, AMissingBarrierChangesTheResultInSomeSchedule) {
  // Forward order happens to work for this bug (each thread reads before later threads
  // write); the reverse order does not. Schedules exist to expose exactly this.
  bool wrong_somewhere = false;
  for (const char* schedule : kSchedules) {
    ScheduleGuard guard(schedule);
    DeviceBuffer<unsigned long long> out(256);
    LAUNCH(ScanKernel, 1, 256)(out.data, 0);
    const std::vector<unsigned long long> got = out.Read();
    for (unsigned t = 0; t < 256; ++t) wrong_somewhere |= got[t] != (t + 1ull) * (t + 2) / 2;
  }
  EXPECT_TRUE(wrong_somewhere);
}

__global__ void DivergentBarrierKernel(int* out) {
  if (threadIdx.x < 16) __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void TwoBarriersKernel(int* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

TEST(BarrierDeathTest, ABarrierSomeThreadsSkipStopsTheProgram) {
  DeviceBuffer<int> out(64);
  EXPECT_DEATH(
      {
        LAUNCH(DivergentBarrierKernel, 1, 64)(out.data);
        cudaDeviceSynchronize();
      },
      "__syncthreads is not reached by every thread of the block.*DivergentBarrierKernel");
  EXPECT_DEATH(
      {
        LAUNCH(TwoBarriersKernel, 1, 64)(out.data);
        cudaDeviceSynchronize();
      },
      "threads of a block wait at different __syncthreads");
}

// ---- warp collectives ----

__global__ void ShuffleKernel(int* out) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x / 32;
  int* row = out + threadIdx.x * 10;
  // Butterfly sum: every lane gets the sum of the warp's lanes.
  int sum = lane;
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  row[0] = sum;
  // Inclusive scan with __shfl_up_sync.
  int scan = lane + 1;
  for (int offset = 1; offset < 32; offset *= 2) {
    const int v = __shfl_up_sync(0xffffffffu, scan, offset);
    if (lane >= offset) scan += v;
  }
  row[1] = scan;
  row[2] = __shfl_down_sync(0xffffffffu, lane * 10, 3);
  row[3] = __shfl_sync(0xffffffffu, lane * 100 + warp, 5);
  row[4] = __shfl_sync(0xffffffffu, lane, 3, 8);  // lane 3 of each group of 8
  row[5] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 3 == 0));
  row[6] = __any_sync(0xffffffffu, lane == 31 && warp == 1);
  row[7] = __all_sync(0xffffffffu, lane < 32);
  // Disjoint masks: each half warp votes on its own.
  const unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
  row[8] = static_cast<int>(__ballot_sync(half, lane % 2 == 0));
  row[9] = __shfl_xor_sync(0xffffffffu, 7.5f, 1) == 7.5f;  // floats move bit-exactly
}

TEST(WarpTest, EveryCollectiveMatchesItsDefinition) {
  for (const char* schedule : kSchedules) {
    ScheduleGuard guard(schedule);
    DeviceBuffer<int> out(64 * 10);
    LAUNCH(ShuffleKernel, 1, 64)(out.data);
    const std::vector<int> got = out.Read();
    for (int t = 0; t < 64; ++t) {
      const int lane = t % 32, warp = t / 32;
      const int* row = &got[t * 10];
      SCOPED_TRACE(std::string(schedule) + " thread " + std::to_string(t));
      EXPECT_EQ(row[0], 31 * 32 / 2);
      EXPECT_EQ(row[1], (lane + 1) * (lane + 2) / 2);
      EXPECT_EQ(row[2], (lane + 3 < 32 ? lane + 3 : lane) * 10);
      EXPECT_EQ(row[3], 5 * 100 + warp);
      EXPECT_EQ(row[4], (lane & ~7) + 3);
      unsigned thirds = 0;
      for (int l = 0; l < 32; l += 3) thirds |= 1u << l;
      EXPECT_EQ(static_cast<unsigned>(row[5]), thirds);
      EXPECT_EQ(row[6], warp == 1 ? 1 : 0);
      EXPECT_EQ(row[7], 1);
      EXPECT_EQ(static_cast<unsigned>(row[8]), lane < 16 ? 0x00005555u : 0x55550000u);
      EXPECT_EQ(row[9], 1);
    }
  }
}

__global__ void BallotInBranchKernel(int* out) {
  const int lane = threadIdx.x & 31;
  if (lane < 16) out[lane] = static_cast<int>(__ballot_sync(0xffffffffu, 1));
}

__global__ void TwoCallSitesKernel(int* out) {
  const int lane = threadIdx.x & 31;
  int v = lane;
  if (lane < 16) {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  }
  out[lane] = v;
}

__global__ void MaskMismatchKernel(int* out) {
  const int lane = threadIdx.x & 31;
  out[lane] = __any_sync(lane == 0 ? 0x3u : 0xffffffffu, 1);
}

__global__ void ReadOutsideMaskKernel(int* out) {
  const int lane = threadIdx.x & 31;
  if (lane < 16) out[lane] = __shfl_sync(0x0000ffffu, lane, 20);
}

__global__ void CallerNotInMaskKernel(int* out) {
  const int lane = threadIdx.x & 31;
  if (lane == 0) out[0] = __any_sync(0x2u, 1);
}

__global__ void CollectiveVersusBarrierKernel(int* out) {
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
    __syncthreads();
  } else {
    out[lane] = __any_sync(0xfffffffeu, 1);
    __syncwarp(0xfffffffeu);
    __syncthreads();
  }
  out[0] = __any_sync(0xffffffffu, 1);
}

TEST(WarpDeathTest, DivergentCollectivesStopTheProgram) {
  DeviceBuffer<int> out(64);
  EXPECT_DEATH(
      {
        LAUNCH(BallotInBranchKernel, 1, 32)(out.data);
        cudaDeviceSynchronize();
      },
      "__ballot_sync with mask ffffffff in warp 0: lane 16 has exited");
  EXPECT_DEATH(
      {
        LAUNCH(TwoCallSitesKernel, 1, 32)(out.data);
        cudaDeviceSynchronize();
      },
      "divergent warp collective in warp 0.*TwoCallSitesKernel");
  EXPECT_DEATH(
      {
        LAUNCH(MaskMismatchKernel, 1, 32)(out.data);
        cudaDeviceSynchronize();
      },
      "divergent warp collective");
  EXPECT_DEATH(
      {
        LAUNCH(ReadOutsideMaskKernel, 1, 32)(out.data);
        cudaDeviceSynchronize();
      },
      "reads lane 20, which is not in the mask");
  EXPECT_DEATH(
      {
        LAUNCH(CallerNotInMaskKernel, 1, 32)(out.data);
        cudaDeviceSynchronize();
      },
      "the calling lane is not in its mask");
  EXPECT_DEATH(
      {
        LAUNCH(CollectiveVersusBarrierKernel, 1, 32)(out.data);
        cudaDeviceSynchronize();
      },
      "waits at __syncthreads|different __syncthreads|lane 0 has exited");
}

TEST(WarpDeathTest, CollectivesOutsideKernelsStopTheProgram) {
  EXPECT_DEATH(__syncwarp(), "__syncwarp called outside a kernel");
  EXPECT_DEATH(__syncthreads(), "__syncthreads called outside a kernel");
}

// ---- shared memory and atomics ----

__global__ void ReverseBlockKernel(const int* in, int* out) {
  __shared__ int s[256];
  const unsigned base = blockIdx.x * blockDim.x;
  s[threadIdx.x] = in[base + threadIdx.x];
  __syncthreads();
  out[base + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

TEST(SharedMemoryTest, EachBlockReversesItsOwnSlice) {
  for (const char* schedule : kSchedules) {
    ScheduleGuard guard(schedule);
    std::vector<int> host(4 * 256);
    std::iota(host.begin(), host.end(), 0);
    DeviceBuffer<int> in(host.size()), out(host.size());
    ASSERT_EQ(cudaMemcpy(in.data, host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice),
              cudaSuccess);
    LAUNCH(ReverseBlockKernel, 4, 256)(in.data, out.data);
    const std::vector<int> got = out.Read();
    for (int b = 0; b < 4; ++b) {
      for (int t = 0; t < 256; ++t) ASSERT_EQ(got[b * 256 + t], b * 256 + 255 - t) << schedule;
    }
  }
}

__global__ void AtomicsKernel(unsigned long long* counters) {
  const unsigned long long id = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(&counters[0], 1ull);
  atomicMax(&counters[1], id);
  atomicOr(&counters[2], 1ull << (id % 64));
  atomicAdd(&counters[3], id);
  unsigned long long expected = atomicCAS(&counters[4], 0ull, id + 1);
  (void)expected;
}

TEST(AtomicsTest, EveryThreadCountsOnce) {
  DeviceBuffer<unsigned long long> counters(5);
  LAUNCH(AtomicsKernel, 37, 96)(counters.data);
  const std::vector<unsigned long long> got = counters.Read();
  const unsigned long long n = 37 * 96;
  EXPECT_EQ(got[0], n);
  EXPECT_EQ(got[1], n - 1);
  EXPECT_EQ(got[2], ~0ull);
  EXPECT_EQ(got[3], n * (n - 1) / 2);
  EXPECT_GE(got[4], 1u);  // exactly one thread won the compare-and-swap
  EXPECT_LE(got[4], n);
}

// ---- schedules and built-ins ----

__global__ void OrderKernel(unsigned long long* counter, unsigned* order) {
  const unsigned long long slot = atomicAdd(counter, 1ull);
  order[slot] = blockIdx.x * blockDim.x + threadIdx.x;
}

std::vector<unsigned> RunOrder(const char* schedule) {
  ScheduleGuard guard(schedule);
  DeviceBuffer<unsigned long long> counter(1);
  DeviceBuffer<unsigned> order(4 * 64);
  LAUNCH(OrderKernel, 4, 64)(counter.data, order.data);
  return order.Read();
}

TEST(ScheduleTest, SchedulesOrderThreadsAndBlocksDifferentlyAndReproducibly) {
  const std::vector<unsigned> forward = RunOrder("forward");
  const std::vector<unsigned> reverse = RunOrder("reverse");
  const std::vector<unsigned> random1 = RunOrder("random:1");
  const std::vector<unsigned> random2 = RunOrder("random:2");
  std::vector<unsigned> ids(4 * 64);
  std::iota(ids.begin(), ids.end(), 0u);
  EXPECT_EQ(forward, ids);
  EXPECT_EQ(reverse, std::vector<unsigned>(ids.rbegin(), ids.rend()));
  EXPECT_TRUE(std::is_permutation(random1.begin(), random1.end(), ids.begin()));
  EXPECT_NE(random1, forward);
  EXPECT_NE(random1, reverse);
  EXPECT_NE(random1, random2);
  EXPECT_EQ(RunOrder("random:1"), random1);
}

// Every block waits until all of the grid's blocks have arrived, so it finishes only where
// they run at once; each keeps a slice of shared memory of its own meanwhile.
__global__ void AllAtOnceKernel(unsigned* arrived, unsigned* out) {
  __shared__ unsigned s[64];
  s[threadIdx.x] = blockIdx.x * 1000 + threadIdx.x;
  __syncthreads();
  if (threadIdx.x == 0) {
    atomicAdd(arrived, 1u);
    while (atomicAdd(arrived, 0u) < gridDim.x) {
    }
  }
  __syncthreads();
  out[blockIdx.x * 64 + threadIdx.x] = s[threadIdx.x] + (blockIdx.x << 20);
}

TEST(ScheduleTest, TheConcurrentScheduleRunsBlocksAtOnceEachWithItsOwnSharedMemory) {
  if (!cudaemu::ConcurrentScheduleAvailable()) {
    GTEST_SKIP() << "the concurrent schedule runs on the plain emulated build";
  }
  ScheduleGuard guard("concurrent:4");
  EXPECT_EQ(cudaemu::ScheduleName(), "concurrent:4");
  DeviceBuffer<unsigned> arrived(1);
  DeviceBuffer<unsigned> out(4 * 64);
  LAUNCH(AllAtOnceKernel, 4, 64)(arrived.data, out.data);
  const std::vector<unsigned> got = out.Read();
  for (unsigned b = 0; b < 4; ++b) {
    for (unsigned t = 0; t < 64; ++t) EXPECT_EQ(got[b * 64 + t], b * 1000 + t + (b << 20));
  }
  EXPECT_EQ(arrived.Read()[0], 4u);
}

// Lane 0 of block 0 reads `flag` once, before block 1 may set it (block 1 waits for that read);
// the other lanes wait until it is set. So the lanes saw different values of one word, and part
// ways: what a GPU's lanes can do when each reads a word another block is writing.
__global__ void LanesSeeAWordChangeKernel(unsigned* flag, unsigned* reads) {
  if (blockIdx.x == 1) {
    if (threadIdx.x == 0) {
      while (atomicAdd(reads, 0u) == 0) {
      }
      atomicExch(flag, 1u);
    }
    return;
  }
  unsigned seen = 0;
  if (threadIdx.x == 0) {
    seen = atomicAdd(flag, 0u);
    atomicAdd(reads, 1u);
  } else {
    while ((seen = atomicAdd(flag, 0u)) == 0) {
    }
  }
  if (seen != 0) {
    __syncwarp();
  } else {
    __syncwarp();
  }
}

TEST(ScheduleDeathTest, LanesThatSawAnotherBlocksWriteDifferentlyStopTheProgram) {
  if (!cudaemu::ConcurrentScheduleAvailable()) {
    GTEST_SKIP() << "the concurrent schedule runs on the plain emulated build";
  }
  EXPECT_DEATH(
      {
        ScheduleGuard guard("concurrent:2");
        DeviceBuffer<unsigned> flag(1);
        DeviceBuffer<unsigned> reads(1);
        LAUNCH(LanesSeeAWordChangeKernel, 2, 32)(flag.data, reads.data);
        cudaDeviceSynchronize();
      },
      "divergent warp collective");
  EXPECT_DEATH(cudaemu::SetSchedule("concurrent:1"),
               "expected forward, reverse, random:SEED or concurrent:BLOCKS");
}

__global__ void BuiltinsKernel(unsigned* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  unsigned* slot = out + 8 * (block * threads + thread);
  slot[0] = threadIdx.x;
  slot[1] = threadIdx.y;
  slot[2] = threadIdx.z;
  slot[3] = blockIdx.x;
  slot[4] = blockIdx.y;
  slot[5] = blockIdx.z;
  slot[6] = gridDim.x * gridDim.y * gridDim.z;
  slot[7] = threads + warpSize;
}

TEST(BuiltinsTest, ThreeDimensionalIndicesAreCudas) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  DeviceBuffer<unsigned> out(12 * 24 * 8);
  LAUNCH(BuiltinsKernel, grid, block)(out.data);
  const std::vector<unsigned> got = out.Read();
  for (unsigned b = 0; b < 12; ++b) {
    for (unsigned t = 0; t < 24; ++t) {
      const unsigned* slot = &got[8 * (b * 24 + t)];
      EXPECT_EQ(slot[0], t % 4);
      EXPECT_EQ(slot[1], t / 4 % 3);
      EXPECT_EQ(slot[2], t / 12);
      EXPECT_EQ(slot[3], b % 3);
      EXPECT_EQ(slot[4], b / 3 % 2);
      EXPECT_EQ(slot[5], b / 6);
      EXPECT_EQ(slot[6], 12u);
      EXPECT_EQ(slot[7], 24u + 32u);
    }
  }
}

// ---- launches ----

__global__ void CountKernel(unsigned long long* counter) { atomicAdd(counter, 1ull); }

TEST(LaunchTest, BadConfigurationsAreCudaErrorsAndRunNothing) {
  DeviceBuffer<unsigned long long> counter(1);
  (void)cudaGetLastError();
  const uint64_t launched = cudaemu::KernelsLaunched();
  LAUNCH(CountKernel, 1, 1025)(counter.data);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  LAUNCH(CountKernel, 0, 32)(counter.data);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  LAUNCH(CountKernel, dim3(1, 1, 1), dim3(1, 1, 65))(counter.data);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaemu::KernelsLaunched(), launched);
  LAUNCH(CountKernel, dim3(2, 3), dim3(8, 8))(counter.data);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(counter.Read()[0], 2u * 3 * 64);
}

TEST(LaunchDeathTest, HostPointersAreRefused) {
  unsigned long long host = 0;
  EXPECT_DEATH(LAUNCH(CountKernel, 1, 1)(&host),
               "kernel CountKernel argument 0 is 0x[0-9a-f]+, which is not device memory");
}

// ---- vector types ----

// Copies 16-byte vectors from `in` + `offset` bytes to `out` + `offset` bytes, a vector a thread.
// Kept from UBSan's alignment check, which would stop a misaligned one first: the point is the
// emulator's own fault.
__attribute__((no_sanitize("alignment"))) __global__ void VectorCopyKernel(
    const unsigned char* in, unsigned char* out, int in_offset, int out_offset) {
  const float4* from = reinterpret_cast<const float4*>(in + in_offset);
  float4* to = reinterpret_cast<float4*>(out + out_offset);
  const float4 v = from[threadIdx.x];
  to[threadIdx.x] = make_float4(v.w, v.z, v.y, v.x);
}

__attribute__((no_sanitize("alignment"))) __global__ void Vector8CopyKernel(
    const unsigned char* in, unsigned char* out, int in_offset) {
  const uint2* from = reinterpret_cast<const uint2*>(in + in_offset);
  reinterpret_cast<uint2*>(out)[threadIdx.x] = from[threadIdx.x];
}

TEST(VectorTest, SixteenByteTypesHaveCudasLayoutAndCopyWhole) {
  static_assert(sizeof(float4) == 16 && alignof(float4) == 16);
  static_assert(sizeof(int4) == 16 && alignof(int4) == 16);
  static_assert(sizeof(uint4) == 16 && alignof(uint4) == 16);
  static_assert(sizeof(float2) == 8 && alignof(float2) == 8);
  static_assert(sizeof(uint2) == 8 && alignof(uint2) == 8);
  const int4 i = make_int4(1, -2, 3, -4);
  const uint4 u = make_uint4(5, 6, 7, 8);
  EXPECT_EQ(i.y, -2);
  EXPECT_EQ(u.w, 8u);
  DeviceBuffer<float> in(64 + 4), out(64 + 4);
  std::vector<float> host(64 + 4);
  std::iota(host.begin(), host.end(), 0.0f);
  ASSERT_EQ(cudaMemcpy(in.data, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  LAUNCH(VectorCopyKernel, 1, 16)(reinterpret_cast<const unsigned char*>(in.data),
                                  reinterpret_cast<unsigned char*>(out.data), 16, 0);
  const std::vector<float> got = out.Read();
  for (int v = 0; v < 16; ++v) {
    for (int k = 0; k < 4; ++k) EXPECT_EQ(got[4 * v + k], 4 + 4 * v + (3 - k));
  }
}

// The PTX ISA's cvt.rmi.s32.f32: toward minus infinity, saturated, NaN to 0.
TEST(BuiltinsTest, FloatToIntRoundingDownIsPtxs) {
  EXPECT_EQ(__float2int_rd(2.99f), 2);
  EXPECT_EQ(__float2int_rd(3.0f), 3);
  EXPECT_EQ(__float2int_rd(-0.5f), -1);
  EXPECT_EQ(__float2int_rd(-0.0f), 0);
  EXPECT_EQ(__float2int_rd(0x1.fffffep-1f), 0);
  EXPECT_EQ(__float2int_rd(3e9f), 2147483647);
  EXPECT_EQ(__float2int_rd(-3e9f), -2147483647 - 1);
  EXPECT_EQ(__float2int_rd(-2147483648.0f), -2147483647 - 1);
  EXPECT_EQ(__float2int_rd(__int_as_float(0x7f800000)), 2147483647);
  EXPECT_EQ(__float2int_rd(__int_as_float(0x7fc00000)), 0);
}

TEST(VectorDeathTest, AMisalignedSixteenByteReadOrWriteStopsTheProgram) {
  DeviceBuffer<float> in(64 + 4), out(64 + 4);
  const unsigned char* from = reinterpret_cast<const unsigned char*>(in.data);
  unsigned char* to = reinterpret_cast<unsigned char*>(out.data);
  // 8-byte aligned is not enough for a 16-byte vector. Which thread faults first depends on
  // the schedule (CUDAEMU_SCHEDULE): the reverse one runs thread 15 first.
  EXPECT_DEATH(
      {
        LAUNCH(VectorCopyKernel, 1, 16)(from, to, 8, 0);
        cudaDeviceSynchronize();
      },
      "a misaligned 16-byte vector read at 0x[0-9a-f]+ .*in kernel VectorCopyKernel, block "
      "\\(0,0,0\\), thread \\([0-9]+,0,0\\)");
  EXPECT_DEATH(
      {
        LAUNCH(VectorCopyKernel, 1, 16)(from, to, 0, 4);
        cudaDeviceSynchronize();
      },
      "a misaligned 16-byte vector write .*in kernel VectorCopyKernel");
  EXPECT_DEATH(
      {
        LAUNCH(Vector8CopyKernel, 1, 16)(from, to, 4);
        cudaDeviceSynchronize();
      },
      "a misaligned 8-byte vector read .*in kernel Vector8CopyKernel");
}

// ---- fiber stacks ----

// Not checked by UBSan (which would stop a bad index first): the point is ASan on fibers.
__attribute__((no_sanitize("undefined"))) __global__ void DeepStackKernel(int* out, int index) {
  volatile int local[512];
  for (int i = 0; i < 512; ++i) local[i] = i * static_cast<int>(threadIdx.x);
  out[threadIdx.x] = local[index];
}

TEST(FiberTest, EveryThreadHasItsOwnStack) {
  DeviceBuffer<int> out(128);
  LAUNCH(DeepStackKernel, 1, 128)(out.data, 7);
  const std::vector<int> got = out.Read();
  for (int t = 0; t < 128; ++t) EXPECT_EQ(got[t], 7 * t);
}

#if defined(__SANITIZE_ADDRESS__)
__global__ void OverflowKernel(int* out, int n) { out[n] = 1; }

TEST(AddressSanitizerDeathTest, AWriteOnePastADeviceBufferIsCaught) {
  int* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 10 * sizeof(int)), cudaSuccess);
  EXPECT_DEATH(
      {
        LAUNCH(OverflowKernel, 1, 1)(buffer, 10);
        cudaDeviceSynchronize();
      },
      "heap-buffer-overflow");
  cudaFree(buffer);
}

TEST(AddressSanitizerDeathTest, AFiberStackOverflowOfALocalArrayIsCaught) {
  DeviceBuffer<int> out(32);
  // ASan knows the fiber's stack (the switch annotations): the bad index is a
  // stack-buffer-overflow in the fiber, not a crash in the scheduler.
  EXPECT_DEATH(
      {
        LAUNCH(DeepStackKernel, 1, 32)(out.data, 600);
        cudaDeviceSynchronize();
      },
      "stack-buffer-(overflow|underflow)");
}
#endif

}  // namespace
