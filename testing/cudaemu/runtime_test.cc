// The emulated CUDA runtime: devices, the memory cap and cudaMemGetInfo, deferred streams and
// events, the legacy default stream, copy semantics, errors.
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cudaemu/control.h"
#include "gtest/gtest.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;

__global__ void FillKernel(int* out, int n, int value) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

__global__ void CopyKernel(const int* in, int* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

// Tests of deferral pin the forward schedule: the random one also runs queued work at random
// moments, which is its point and would make "still queued" checks flaky.
class Deferred : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = cudaemu::ScheduleName();
    cudaemu::SetSchedule("forward");
  }
  void TearDown() override { cudaemu::SetSchedule(saved_); }

 private:
  std::string saved_;
};
using StreamTest = Deferred;
using DeferredCopyTest = Deferred;
using DeferredMemoryTest = Deferred;

void Fill(int* out, int n, int value, cudaStream_t stream) {
  ::cudaemu::Launch(FillKernel, "FillKernel", (n + 127) / 128, 128, 0, stream)(out, n, value);
}

TEST(ErrorTest, NamesAndStringsAreCudas) {
  EXPECT_STREQ(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorNotReady), "cudaErrorNotReady");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorNotReady), "device not ready");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidDevice), "invalid device ordinal");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument");
  EXPECT_STREQ(cudaGetErrorString(cudaSuccess), "no error");
  EXPECT_EQ(static_cast<int>(cudaErrorNotReady), 600);
  EXPECT_EQ(static_cast<int>(cudaErrorMemoryAllocation), 2);
}

TEST(DeviceTest, SeveralDevicesWithTheirOwnMemory) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  ASSERT_GE(count, 2);
  EXPECT_EQ(cudaSetDevice(count), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);

  const size_t before0 = cudaemu::DeviceAllocatedBytes(0);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 3 * kMiB), cudaSuccess);
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(0), before0);
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(1), 4 * kMiB);  // whole 2 MiB pages
  cudaPointerAttributes attributes;
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, p), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 1);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(1), 0u);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST(DeviceDeathTest, AKernelMayNotUseAnotherDevicesMemory) {
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  int* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_DEATH(Fill(p, 16, 1, nullptr), "points into memory of device 1, launched on device 0");
  ASSERT_EQ(cudaFree(p), cudaSuccess);
}

TEST(MemoryTest, MallocFailsPastTheCapAndMemGetInfoAgrees) {
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaemu::SetDeviceMemory(1, 64 * kMiB);
  cudaemu::SetContextMemory(1, 8 * kMiB);
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  EXPECT_EQ(total, 64 * kMiB);
  EXPECT_EQ(free_bytes, 56 * kMiB);

  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 40 * kMiB), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  EXPECT_EQ(free_bytes, 16 * kMiB);
  EXPECT_EQ(cudaMalloc(&b, 16 * kMiB + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(b, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);  // remembered, then cleared
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 16 * kMiB), cudaSuccess);  // exactly what is left
  ASSERT_EQ(cudaFree(a), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&a, 30 * kMiB), cudaSuccess);  // freed memory can be had again
  ASSERT_EQ(cudaFree(a), cudaSuccess);
  ASSERT_EQ(cudaFree(b), cudaSuccess);
  EXPECT_EQ(cudaFree(b), cudaErrorInvalidValue);  // not an allocation any more
  (void)cudaGetLastError();
  cudaemu::SetContextMemory(1, 0);
  cudaemu::SetDeviceMemory(1, size_t{8} << 30);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST(MemoryTest, NewAllocationsHoldGarbageNotZeros) {
  unsigned char* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
  std::vector<unsigned char> host(4096);
  ASSERT_EQ(cudaMemcpy(host.data(), p, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  int zeros = 0;
  for (unsigned char c : host) zeros += c == 0;
  EXPECT_LT(zeros, 64);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
}

TEST(CopyTest, RangesAndDirectionsAreChecked) {
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 16 * sizeof(int)), cudaSuccess);
  std::vector<int> host(32, 7);
  EXPECT_EQ(cudaMemcpy(d, host.data(), 17 * sizeof(int), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);  // one element past the allocation
  EXPECT_EQ(cudaMemcpy(host.data(), d, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(host.data(), 0, 4), cudaErrorInvalidValue);  // not device memory
  EXPECT_EQ(cudaMemcpy(d, host.data(), 16 * sizeof(int), cudaMemcpyHostToDevice), cudaSuccess);
  (void)cudaGetLastError();
  ASSERT_EQ(cudaFree(d), cudaSuccess);
}

TEST_F(StreamTest, WorkWaitsUntilSomethingWaitsForIt) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 256 * sizeof(int)), cudaSuccess);
  const uint64_t executed = cudaemu::KernelsExecuted();
  Fill(d, 256, 5, s);
  Fill(d, 256, 6, s);
  EXPECT_EQ(cudaemu::PendingOperations(s), 2u);
  EXPECT_EQ(cudaemu::KernelsExecuted(), executed);
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
  // A query answers "not ready" and moves the stream one operation on: polling finishes.
  int queries = 0;
  cudaError_t status;
  while ((status = cudaEventQuery(e)) == cudaErrorNotReady) ++queries;
  EXPECT_EQ(status, cudaSuccess);
  EXPECT_EQ(queries, 2);
  EXPECT_EQ(cudaemu::KernelsExecuted(), executed + 2);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
  ASSERT_EQ(cudaFree(d), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
}

TEST_F(StreamTest, AStreamThatDoesNotWaitSeesOldData) {
  // The bug stream ordering guards against: B reads what A writes, without an event.
  cudaStream_t a, b;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  int *src = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaMalloc(&src, 64 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, 64 * sizeof(int)), cudaSuccess);
  Fill(src, 64, 1, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  Fill(src, 64, 2, a);
  ::cudaemu::Launch(CopyKernel, "CopyKernel", 1, 64, 0, b)(src, dst, 64);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  std::vector<int> host(64);
  ASSERT_EQ(cudaMemcpy(host.data(), dst, 64 * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host[0], 1);  // B ran before A: the stale value

  // With an event, B waits for A.
  Fill(src, 64, 3, a);
  cudaEvent_t done;
  ASSERT_EQ(cudaEventCreate(&done), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, a), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, done, 0), cudaSuccess);
  ::cudaemu::Launch(CopyKernel, "CopyKernel", 1, 64, 0, b)(src, dst, 64);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), dst, 64 * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host[0], 3);
  ASSERT_EQ(cudaEventDestroy(done), cudaSuccess);
  ASSERT_EQ(cudaFree(src), cudaSuccess);
  ASSERT_EQ(cudaFree(dst), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(a), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(b), cudaSuccess);
}

TEST_F(StreamTest, TheLegacyStreamWaitsForBlockingStreamsOnly) {
  cudaStream_t blocking, nonblocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking), cudaSuccess);
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 2 * sizeof(int)), cudaSuccess);
  Fill(d, 1, 1, blocking);
  Fill(d + 1, 1, 1, nonblocking);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);  // empty legacy stream: nothing runs
  EXPECT_EQ(cudaemu::PendingOperations(blocking), 1u);
  Fill(d, 1, 2, nullptr);  // queued behind the blocking stream's work
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(cudaemu::PendingOperations(blocking), 0u);
  EXPECT_EQ(cudaemu::PendingOperations(nonblocking), 1u);
  std::vector<int> host(2);
  ASSERT_EQ(cudaMemcpy(host.data(), d, 2 * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host[0], 2);
  ASSERT_EQ(cudaFree(d), cudaSuccess);  // waits for the device: the non-blocking fill ran
  EXPECT_EQ(cudaemu::PendingOperations(nonblocking), 0u);
  ASSERT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(nonblocking), cudaSuccess);
}

TEST_F(DeferredCopyTest, PageableSourcesAreStagedAndPageableDestinationsWaited) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4 * sizeof(int)), cudaSuccess);
  int source[4] = {1, 2, 3, 4};
  ASSERT_EQ(cudaMemcpyAsync(d, source, sizeof source, cudaMemcpyHostToDevice, s), cudaSuccess);
  source[0] = 99;  // allowed at once: CUDA staged the pageable source
  int back[4] = {};
  ASSERT_EQ(cudaMemcpyAsync(back, d, sizeof back, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(back[0], 1);  // a copy into pageable memory returns when it is done
  int* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, sizeof back), cudaSuccess);
  pinned[0] = -1;
  ASSERT_EQ(cudaMemcpyAsync(pinned, d, sizeof back, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(pinned[0], -1);  // pinned: asynchronous, not there until the stream is waited for
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(pinned[3], 4);
  ASSERT_EQ(cudaFreeHost(pinned), cudaSuccess);
  ASSERT_EQ(cudaFree(d), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST_F(DeferredMemoryTest, FreeAsyncFreesInStreamOrder) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const size_t before = cudaemu::DeviceAllocatedBytes(0);
  int* d = nullptr;
  ASSERT_EQ(cudaMallocAsync(&d, 1024, s), cudaSuccess);
  Fill(d, 256, 1, s);
  ASSERT_EQ(cudaFreeAsync(d, s), cudaSuccess);
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(0), before + cudaemu::kAllocationGranularity);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(0), before);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// The profiler's view: which calls make the host wait, in which region, and from where.
TEST(HostCallTest, WaitsAndAllocationsAreRecordedWithTheirRegionAndCaller) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* device = nullptr;
  void* pinned = nullptr;
  std::vector<char> pageable(256);
  cudaemu::ResetHostCalls();
  {
    cudaemu::RegionScope region("asynchronous");
    ASSERT_EQ(cudaMallocHost(&pinned, 256), cudaSuccess);
    {
      cudaemu::RegionScope inner("allocation");
      ASSERT_EQ(cudaMalloc(&device, 256), cudaSuccess);
    }
    cudaEvent_t event;
    ASSERT_EQ(cudaEventCreate(&event), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(device, 1, 256, stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(pinned, device, 256, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(event, stream), cudaSuccess);
    cudaEventQuery(event);  // a query never waits
    cudaStreamQuery(stream);
    EXPECT_EQ(cudaemu::CountHostWaits("asynchronous"), 0u);
    ASSERT_EQ(cudaEventDestroy(event), cudaSuccess);
  }
  {
    cudaemu::RegionScope region("waits");
    ASSERT_EQ(cudaMemcpyAsync(pageable.data(), device, 256, cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(device, pageable.data(), 256, cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaFree(device), cudaSuccess);
    ASSERT_EQ(cudaFreeHost(pinned), cudaSuccess);
  }
  EXPECT_EQ(cudaemu::CountHostWaits("waits"), 6u);
  EXPECT_EQ(cudaemu::CountCalls("cudaMemcpyAsync (pageable)", "waits"), 2u);
  EXPECT_EQ(cudaemu::CountCalls("cudaMalloc", "allocation"), 1u);
  EXPECT_EQ(cudaemu::CountCalls("cudaHostAlloc", "asynchronous"), 1u);
  EXPECT_EQ(cudaemu::CountHostWaits(""), 0u);
  const std::vector<cudaemu::HostCall> calls = cudaemu::HostCalls();
  ASSERT_FALSE(calls.empty());
  // The caller is this test's code, not the emulator's.
  EXPECT_NE(calls.front().caller, nullptr);
  EXPECT_FALSE(cudaemu::DescribeCaller(calls.front().caller).empty());
  cudaemu::ResetHostCalls();
  EXPECT_TRUE(cudaemu::HostCalls().empty());
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Timing events are stamped when their stream reaches them; elapsed time needs both reached
// and timing enabled.
TEST(EventTimingTest, ElapsedTimeBetweenReachedEvents) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t start, end, untimed;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(start, stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(p, 0, 1 << 20, stream), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(end, stream), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, stream), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, end), cudaErrorNotReady);  // the memset waits
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  for (cudaEvent_t e : {start, end, untimed}) ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(ThreadTest, HostThreadsShareTheDevices) {
  std::vector<std::thread> threads;
  std::vector<int> results(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &results] {
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      int* d = nullptr;
      cudaMalloc(&d, 1000 * sizeof(int));
      for (int round = 0; round < 20; ++round) Fill(d, 1000, t * 100 + round, s);
      std::vector<int> host(1000);
      cudaMemcpyAsync(host.data(), d, 1000 * sizeof(int), cudaMemcpyDeviceToHost, s);
      results[t] = host[999];
      cudaFree(d);
      cudaStreamDestroy(s);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(results[t], t * 100 + 19);
}

}  // namespace
