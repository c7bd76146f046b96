// The race checker on kernels with and without the synchronisation they need, in the block
// sizes actpack's kernels launch (up to 1024 threads; TSan itself tracks about 255).
#include <cuda_runtime.h>

#include <vector>

#include "cudaemu/control.h"
#include "gtest/gtest.h"

#define LAUNCH(kernel, grid, block) ::cudaemu::Launch(kernel, #kernel, grid, block, 0, nullptr)

namespace {

#ifdef CUDAEMU_RACE_CHECKER_UNAVAILABLE

TEST(RaceCheckerTest, NotInThisBuild) {
  GTEST_SKIP() << "AddressSanitizer builds cannot carry the race checker's instrumentation; "
                  "bazel test --config=cudaemu_race runs it";
}

#else

template <class T>
T* DeviceArray(size_t n) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemset(p, 0, n * sizeof(T)), cudaSuccess);
  return p;
}

// Block-wide neighbour sum through shared memory; `synchronised` = 0 drops the barrier
// between the writes and the reads.
__global__ void NeighbourKernel(int* out, int synchronised) {
  __shared__ int s[1024];
  s[threadIdx.x] = 0;
  __syncthreads();
  s[threadIdx.x] = static_cast<int>(threadIdx.x);
  if (synchronised) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

TEST(RaceCheckerTest, IsActiveInThisBinary) { EXPECT_TRUE(cudaemu::RaceCheckerActive()); }

TEST(RaceCheckerTest, SynchronisedKernelsPassInEveryBlockSize) {
  for (unsigned threads : {32u, 256u, 1024u}) {
    int* out = DeviceArray<int>(2 * threads);
    LAUNCH(NeighbourKernel, 2, threads)(out, 1);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<int> host(2 * threads);
    ASSERT_EQ(cudaMemcpy(host.data(), out, host.size() * sizeof(int), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(host[threads - 1], 0);
    EXPECT_EQ(host[threads + 5], 6);
    cudaFree(out);
  }
}

TEST(RaceCheckerDeathTest, AMissingBarrierIsARaceIn256And1024ThreadBlocks) {
  for (unsigned threads : {256u, 1024u}) {
    int* out = DeviceArray<int>(threads);
    EXPECT_DEATH(
        {
          LAUNCH(NeighbourKernel, 1, threads)(out, 0);
          cudaDeviceSynchronize();
        },
        "race checker: a data race with an earlier (read|write).*NeighbourKernel");
    cudaFree(out);
  }
}

// Each block writes the same global word: blocks of a launch are never ordered.
__global__ void BlocksCollideKernel(int* out) {
  if (threadIdx.x == 0) out[0] = static_cast<int>(blockIdx.x);
}

__global__ void AtomicCounterKernel(unsigned long long* counter) { atomicAdd(counter, 1ull); }

__global__ void AtomicThenPlainReadKernel(unsigned long long* counter, unsigned long long* out) {
  if (blockIdx.x == 0) {
    atomicAdd(counter, 1ull);
  } else {
    out[threadIdx.x] = *counter;
  }
}

TEST(RaceCheckerTest, AtomicsFromEveryBlockAreNotRaces) {
  auto* counter = DeviceArray<unsigned long long>(1);
  LAUNCH(AtomicCounterKernel, 8, 256)(counter);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  unsigned long long host = 0;
  ASSERT_EQ(cudaMemcpy(&host, counter, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, 8u * 256);
  cudaFree(counter);
}

TEST(RaceCheckerDeathTest, GlobalMemoryRacesBetweenBlocksAreFound) {
  int* out = DeviceArray<int>(1);
  EXPECT_DEATH(
      {
        LAUNCH(BlocksCollideKernel, 4, 32)(out);
        cudaDeviceSynchronize();
      },
      "another block of the same launch");
  auto* counter = DeviceArray<unsigned long long>(1);
  auto* values = DeviceArray<unsigned long long>(32);
  EXPECT_DEATH(
      {
        LAUNCH(AtomicThenPlainReadKernel, 2, 32)(counter, values);
        cudaDeviceSynchronize();
      },
      "another block of the same launch");
  cudaFree(out);
  cudaFree(counter);
  cudaFree(values);
}

__global__ void UninitialisedSharedKernel(int* out) {
  __shared__ int s[64];
  if (threadIdx.x < 32) s[threadIdx.x] = 1;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];  // threads 32..63 read what nobody wrote
}

TEST(RaceCheckerDeathTest, ReadingUnwrittenSharedMemoryIsFound) {
  int* out = DeviceArray<int>(64);
  EXPECT_DEATH(
      {
        LAUNCH(UninitialisedSharedKernel, 1, 64)(out);
        cudaDeviceSynchronize();
      },
      "a read of shared memory this block has not written");
  cudaFree(out);
}

// Lanes exchange through shared memory; `sync` picks __syncwarp, a shuffle, or nothing.
__global__ void WarpExchangeKernel(int* out, int sync) {
  __shared__ int s[64];
  const unsigned lane = threadIdx.x & 31;
  s[threadIdx.x] = 0;
  __syncthreads();
  s[threadIdx.x] = static_cast<int>(lane);
  if (sync == 1) __syncwarp();
  if (sync == 2) (void)__shfl_xor_sync(0xffffffffu, 0, 1);
  out[threadIdx.x] = s[(threadIdx.x & ~31u) | ((lane + 1) & 31)];
}

TEST(RaceCheckerTest, SyncwarpOrdersItsLanes) {
  int* out = DeviceArray<int>(64);
  LAUNCH(WarpExchangeKernel, 1, 64)(out, 1);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(out);
}

TEST(RaceCheckerDeathTest, WithoutSyncwarpOrOnlyAShuffleLanesRace) {
  int* out = DeviceArray<int>(64);
  EXPECT_DEATH(
      {
        LAUNCH(WarpExchangeKernel, 1, 64)(out, 0);
        cudaDeviceSynchronize();
      },
      "a data race with an earlier (read|write)");
  EXPECT_DEATH(
      {
        LAUNCH(WarpExchangeKernel, 1, 64)(out, 2);
        cudaDeviceSynchronize();
      },
      "a data race with an earlier (read|write)");
  cudaFree(out);
}

__global__ void ReadPastEndKernel(const int* in, int* out, int n) {
  out[threadIdx.x] = in[threadIdx.x + n];
}

TEST(RaceCheckerDeathTest, OutOfBoundsAccessesAreFound) {
  int* in = DeviceArray<int>(1000);
  int* out = DeviceArray<int>(32);
  EXPECT_DEATH(
      {
        LAUNCH(ReadPastEndKernel, 1, 32)(in, out, 1000 - 31);  // the last thread reads in[1000]
        cudaDeviceSynchronize();
      },
      "an out-of-bounds read.*nearest allocation below is .* 0 bytes before");
  cudaFree(in);
  cudaFree(out);
}

#endif  // CUDAEMU_RACE_CHECKER_UNAVAILABLE

}  // namespace
