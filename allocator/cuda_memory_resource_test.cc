#include "allocator/cuda_memory_resource.h"

#include <vector>

#include "allocator/caching_pool.h"
#include "allocator/statistics_adaptor.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>

#include "common/cuda_check.h"
#endif

namespace actpack::allocator {
namespace {

using namespace literals;

#if !ACTPACK_WITH_CUDA

TEST(CudaMemoryResourceTest, SaysCudaIsNotCompiledIn) {
  EXPECT_FALSE(CudaSupportCompiledIn());
  CudaMemoryResource device(0);
  absl::StatusOr<void*> p = device.Allocate(1_MiB);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(p.status().message(), "actpack: CUDA support not compiled in");
  EXPECT_EQ(CudaDeviceCount().status().code(), absl::StatusCode::kUnimplemented);
  CudaStreamEvents events(0);
  EXPECT_EQ(events.Record(nullptr).status().code(), absl::StatusCode::kUnimplemented);
}

#else  // ACTPACK_WITH_CUDA

bool HaveDevice() {
  absl::StatusOr<int> count = CudaDeviceCount();
  return count.ok() && *count > 0;
}

TEST(CudaCheckTest, ReportsErrorCallAndLocation) {
  const absl::Status status = ACTPACK_CUDA_STATUS(cudaErrorMemoryAllocation);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("cudaErrorMemoryAllocation"), absl::string_view::npos);
  EXPECT_NE(status.message().find("cuda_memory_resource_test.cc:"), absl::string_view::npos);
  EXPECT_EQ(ACTPACK_CUDA_STATUS(cudaErrorInvalidValue).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(ACTPACK_CUDA_STATUS(cudaSuccess).ok());
}

TEST(CudaMemoryResourceTest, AllocatesAlignedDeviceMemory) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device visible";
  CudaMemoryResource device(0);
  absl::StatusOr<void*> p = device.Allocate(1_MiB + 1);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % kAllocationAlignment, 0u);
  EXPECT_EQ(device.GetUsage().reserved_bytes, 1_MiB + 256);
  ASSERT_TRUE(ACTPACK_CUDA_STATUS(cudaMemset(*p, 0x7, 1_MiB + 1)).ok());
  device.Deallocate(*p, 1_MiB + 1);
  EXPECT_EQ(device.GetUsage().reserved_bytes, 0u);
}

TEST(CudaMemoryResourceTest, ImpossibleAllocationIsResourceExhausted) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device visible";
  CudaMemoryResource device(0);
  absl::StatusOr<void*> p = device.Allocate(size_t{1} << 50);  // 1 PiB
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(device.GetUsage().reserved_bytes, 0u);
  // The failure must not poison later calls.
  absl::StatusOr<void*> q = device.Allocate(4_KiB);
  ASSERT_TRUE(q.ok()) << q.status();
  device.Deallocate(*q, 4_KiB);
}

TEST(CudaStreamEventsTest, PoolWaitsForARecordedStream) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device visible";
  CudaMemoryResource device(0);
  CudaStreamEvents events(0);
  CachingPool pool(&device, &events);
  StatisticsAdaptor stats(&pool);
  cudaStream_t a = nullptr, b = nullptr;
  ASSERT_TRUE(ACTPACK_CUDA_STATUS(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking)).ok());
  ASSERT_TRUE(ACTPACK_CUDA_STATUS(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking)).ok());
  void* p = *stats.Allocate(8_MiB, a);
  ASSERT_TRUE(ACTPACK_CUDA_STATUS(cudaMemsetAsync(p, 1, 8_MiB, b)).ok());
  ASSERT_TRUE(pool.RecordStream(p, b).ok());
  stats.Deallocate(p, 8_MiB, a);
  ASSERT_TRUE(ACTPACK_CUDA_STATUS(cudaStreamSynchronize(b)).ok());
  // b has finished: the next allocation on a sees the completed event and reuses the block.
  void* q = *stats.Allocate(8_MiB, a);
  EXPECT_EQ(q, p);
  EXPECT_EQ(stats.GetStats().active_bytes.current, static_cast<int64_t>(8_MiB));
  stats.Deallocate(q, 8_MiB, a);
  EXPECT_EQ(pool.EmptyCache(), 20_MiB);
  EXPECT_TRUE(pool.CheckInvariants().ok());
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

#endif  // ACTPACK_WITH_CUDA

}  // namespace
}  // namespace actpack::allocator
