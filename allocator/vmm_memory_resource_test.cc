// The VMM backend on the CUDA emulator: reuse without driver calls, the ordering of a granule's
// old and new work, the lazy unmap, giving memory back, a second device, the fallback where
// VMM is missing, and a failure at every driver and runtime call site leaving nothing behind.
#include "allocator/vmm_memory_resource.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "allocator/allocator_stack.h"
#include "allocator/budget_adaptor.h"
#include "allocator/caching_pool.h"
#include "allocator/cuda_memory_resource.h"
#include "allocator/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if defined(CUDAEMU)
#include "cudaemu/control.h"
#endif

namespace actpack::allocator {
namespace {

using ::testing::HasSubstr;
using namespace literals;

#if !ACTPACK_WITH_CUDA

TEST(VmmMemoryResourceTest, SaysCudaIsNotCompiledIn) {
  EXPECT_EQ(VirtualMemorySupport(0).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(VmmMemoryResource::Create(0).status().code(), absl::StatusCode::kUnimplemented);
}

#elif !defined(CUDAEMU)

TEST(VmmMemoryResourceTest, NeedsTheEmulator) {
  GTEST_SKIP() << "these tests drive the CUDA emulator (--config=cudaemu)";
}

#else

constexpr size_t kGranule = 2_MiB;

// The virtual memory calls of the driver.
const char* const kDriverCalls[] = {"cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate",
                                    "cuMemRelease",        "cuMemMap",         "cuMemSetAccess",
                                    "cuMemUnmap"};

uint64_t DriverCalls(const std::string& region) {
  uint64_t n = 0;
  for (const char* api : kDriverCalls) n += cudaemu::CountCalls(api, region);
  return n;
}

class VmmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Queued work runs only when something waits for it, so that ordering mistakes show.
    saved_schedule_ = cudaemu::ScheduleName();
    cudaemu::SetSchedule("forward");
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&a_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&b_, cudaStreamNonBlocking), cudaSuccess);
    charged_ = cudaemu::DeviceAllocatedBytes(0);
    address_space_ = cudaemu::ReservedAddressBytes();
    cudaemu::ResetHostCalls();
  }
  void TearDown() override {
    cudaemu::ClearFailures();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaStreamDestroy(a_), cudaSuccess);
    ASSERT_EQ(cudaStreamDestroy(b_), cudaSuccess);
    cudaemu::SetSchedule(saved_schedule_);
  }

  std::unique_ptr<VmmMemoryResource> Make(int device = 0, size_t arena = 256_MiB) {
    absl::StatusOr<std::unique_ptr<VmmMemoryResource>> vmm = VmmMemoryResource::Create(device, arena);
    EXPECT_TRUE(vmm.ok()) << vmm.status();
    return vmm.ok() ? *std::move(vmm) : nullptr;
  }

  // Nothing of the backend left on the device: memory, mappings, address space.
  void ExpectNothingLeft() {
    EXPECT_EQ(cudaemu::DeviceAllocatedBytes(0), charged_);
    EXPECT_EQ(cudaemu::PhysicalAllocations(0), 0u);
    EXPECT_EQ(cudaemu::MappedBytes(0), 0u);
    EXPECT_EQ(cudaemu::ReservedAddressBytes(), address_space_);
  }

  std::vector<uint8_t> Read(const void* p, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

  cudaStream_t a_ = nullptr, b_ = nullptr;
  size_t charged_ = 0, address_space_ = 0;
  std::string saved_schedule_;
};

TEST_F(VmmTest, SegmentsAreWholeGranulesOfTheDevice) {
  auto vmm = Make();
  ASSERT_NE(vmm, nullptr);
  EXPECT_EQ(vmm->AllocationGranularity(), kGranule);
  void* p = *vmm->Allocate(3_MiB, a_);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kGranule, 0u);
  EXPECT_EQ(vmm->GetUsage().reserved_bytes, 4_MiB);
  EXPECT_EQ(vmm->GetUsage().allocated_bytes, 4_MiB);
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(0), charged_ + 4_MiB);
  // Device memory to the runtime: a copy across both granules works.
  ASSERT_EQ(cudaMemsetAsync(p, 7, 4_MiB, a_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_EQ(Read(static_cast<char*>(p) + 2_MiB - 1, 2), std::vector<uint8_t>(2, 7));
  vmm->Deallocate(p, 3_MiB, a_);
  EXPECT_EQ(vmm->GetUsage().allocated_bytes, 0u);
  EXPECT_EQ(vmm->GetUsage().reserved_bytes, 4_MiB);  // kept for the next segment
  vmm.reset();
  ExpectNothingLeft();
}

// A segment given back is the next one's memory where it lies: no driver call at all, and
// neighbours given back separately have merged.
TEST_F(VmmTest, AGivenBackSegmentIsReusedInPlaceWithoutADriverCall) {
  auto vmm = Make();
  void* x = *vmm->Allocate(4_MiB, a_);
  void* y = *vmm->Allocate(6_MiB, a_);
  ASSERT_EQ(static_cast<char*>(y), static_cast<char*>(x) + 4_MiB);
  vmm->Deallocate(x, 4_MiB, a_);
  vmm->Deallocate(y, 6_MiB, a_);
  cudaemu::ResetHostCalls();
  {
    cudaemu::RegionScope region("reuse");
    void* z = *vmm->Allocate(10_MiB, a_);  // both together
    EXPECT_EQ(z, x);
    vmm->Deallocate(z, 10_MiB, a_);
    void* u = *vmm->Allocate(2_MiB, b_);  // a smaller one, on another stream
    void* v = *vmm->Allocate(8_MiB, a_);
    EXPECT_EQ(u, x);
    EXPECT_EQ(v, static_cast<char*>(x) + 2_MiB);
    vmm->Deallocate(u, 2_MiB, b_);
    vmm->Deallocate(v, 8_MiB, a_);
  }
  EXPECT_EQ(DriverCalls("reuse"), 0u);
  EXPECT_EQ(cudaemu::CountHostWaits("reuse"), 0u);
  EXPECT_EQ(cudaemu::CountCalls("cudaMalloc", "reuse") + cudaemu::CountCalls("cudaFree", "reuse"),
            0u);
  EXPECT_EQ(vmm->GetState().physical_bytes, 10_MiB);
}

// The content check across a handover: stream A writes a block and queues a read of it; the
// segment is given back and its granules go to a larger segment on stream B. B's work must run
// after A's (B waits for A's event: no host wait), and A's queued read of the old address must
// still see A's data (the old address stays mapped until A's work is done).
TEST_F(VmmTest, AGranuleHandedToAnotherStreamKeepsBothStreamsData) {
  auto vmm = Make();
  void* old_segment = *vmm->Allocate(4_MiB, a_);
  void* blocker = *vmm->Allocate(2_MiB, a_);  // keeps the old segment from growing in place
  uint8_t* a_saw = nullptr;
  uint8_t* b_saw = nullptr;
  ASSERT_EQ(cudaMallocHost(&a_saw, 4_MiB), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&b_saw, 6_MiB), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(old_segment, 0xAA, 4_MiB, a_), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(a_saw, old_segment, 4_MiB, cudaMemcpyDeviceToHost, a_), cudaSuccess);
  EXPECT_EQ(cudaemu::PendingOperations(a_), 2u);  // nothing of A has run
  vmm->Deallocate(old_segment, 4_MiB, a_);
  cudaemu::ResetHostCalls();
  void* new_segment = nullptr;
  {
    cudaemu::RegionScope region("handover");
    new_segment = *vmm->Allocate(6_MiB, b_);
  }
  // The old granules moved (the old range cannot grow past `blocker`), and one more was made.
  EXPECT_NE(new_segment, old_segment);
  EXPECT_EQ(cudaemu::CountCalls("cuMemCreate", "handover"), 1u);
  EXPECT_EQ(cudaemu::CountCalls("cuMemMap", "handover"), 3u);
  EXPECT_EQ(cudaemu::CountCalls("cuMemUnmap", "handover"), 0u);
  EXPECT_EQ(cudaemu::CountCalls("cudaEventSynchronize", "handover"), 0u);
  EXPECT_EQ(cudaemu::CountHostWaits("handover"), 1u);  // the new run's cuMemSetAccess
  EXPECT_EQ(vmm->GetState().physical_bytes, 8_MiB);  // 2 reused + 1 new + the blocker's
  // The old address keeps its mapping (A's queued read uses it): 2 granules mapped twice.
  EXPECT_EQ(vmm->GetState().mapped_bytes, 12_MiB);
  EXPECT_EQ(vmm->GetState().retiring_mappings, 0u);
  ASSERT_EQ(cudaMemsetAsync(new_segment, 0xBB, 6_MiB, b_), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b_saw, new_segment, 6_MiB, cudaMemcpyDeviceToHost, b_), cudaSuccess);
  // B first: its wait runs A's work before its own.
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);
  EXPECT_EQ(cudaemu::PendingOperations(a_), 0u);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  for (size_t i = 0; i < 4_MiB; i += 4093) ASSERT_EQ(a_saw[i], 0xAA) << i;
  for (size_t i = 0; i < 6_MiB; i += 4093) ASSERT_EQ(b_saw[i], 0xBB) << i;
  EXPECT_EQ(Read(new_segment, 6_MiB), std::vector<uint8_t>(6_MiB, 0xBB));
  // Given back, the new segment's granules are ready at either address; the old one, which
  // the next segment of its size finds mapped, costs no driver call.
  vmm->Deallocate(new_segment, 6_MiB, b_);
  cudaemu::ResetHostCalls();
  {
    cudaemu::RegionScope region("again");
    void* again = *vmm->Allocate(4_MiB, a_);
    EXPECT_EQ(again, old_segment);
    vmm->Deallocate(again, 4_MiB, a_);
  }
  EXPECT_EQ(DriverCalls("again"), 0u);
  vmm->Deallocate(blocker, 2_MiB, a_);
  ASSERT_EQ(cudaFreeHost(a_saw), cudaSuccess);
  ASSERT_EQ(cudaFreeHost(b_saw), cudaSuccess);
  vmm.reset();
  ExpectNothingLeft();
}

// Reused in place on another stream: no address changes, B only waits for A's event.
TEST_F(VmmTest, InPlaceReuseOnAnotherStreamIsOrderedAfterTheOldWork) {
  auto vmm = Make();
  void* p = *vmm->Allocate(2_MiB, a_);
  ASSERT_EQ(cudaMemsetAsync(p, 1, 2_MiB, a_), cudaSuccess);
  vmm->Deallocate(p, 2_MiB, a_);
  cudaemu::ResetHostCalls();
  void* q = nullptr;
  {
    cudaemu::RegionScope region("reuse");
    q = *vmm->Allocate(2_MiB, b_);
  }
  EXPECT_EQ(q, p);
  EXPECT_EQ(DriverCalls("reuse"), 0u);
  EXPECT_EQ(cudaemu::CountHostWaits("reuse"), 0u);
  ASSERT_EQ(cudaMemsetAsync(q, 2, 2_MiB, b_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);  // runs A's memset first
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_EQ(Read(q, 2_MiB), std::vector<uint8_t>(2_MiB, 2));
  vmm->Deallocate(q, 2_MiB, b_);
}

// EmptyCache gives free granules back without waiting: at once where their work is done,
// else on a later call once it is.
TEST_F(VmmTest, EmptyCacheReleasesDoneGranulesNowAndTheRestWhenTheirWorkIsDone) {
  auto vmm = Make();
  void* done = *vmm->Allocate(2_MiB, a_);
  void* busy = *vmm->Allocate(4_MiB, b_);
  void* live = *vmm->Allocate(2_MiB, a_);
  ASSERT_EQ(cudaMemsetAsync(busy, 3, 4_MiB, b_), cudaSuccess);  // queued, not run
  vmm->Deallocate(done, 2_MiB, a_);
  vmm->Deallocate(busy, 4_MiB, b_);
  cudaemu::ResetHostCalls();
  {
    cudaemu::RegionScope region("empty");
    EXPECT_EQ(vmm->EmptyCache(), 2_MiB);
  }
  EXPECT_EQ(cudaemu::CountHostWaits("empty"), 1u);  // the cuMemUnmap of the done granule
  EXPECT_EQ(cudaemu::CountCalls("cudaEventSynchronize", "empty"), 0u);
  EXPECT_EQ(vmm->GetUsage().reserved_bytes, 6_MiB);
  EXPECT_EQ(vmm->GetState().pending_release_bytes, 4_MiB);
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(0), charged_ + 6_MiB);
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);
  vmm->Deallocate(live, 2_MiB, a_);  // any later call releases what became free
  EXPECT_EQ(vmm->GetState().pending_release_bytes, 0u);
  EXPECT_EQ(vmm->EmptyCache(), 2_MiB);
  EXPECT_EQ(vmm->GetUsage().reserved_bytes, 0u);
  EXPECT_EQ(vmm->GetState().arenas, 0u);
  ExpectNothingLeft();
}

// Given back and not yet released, a granule is still the next segment's before a new one.
TEST_F(VmmTest, GranulesWaitingForReleaseAreReusedFirst) {
  auto vmm = Make();
  void* p = *vmm->Allocate(4_MiB, a_);
  // Work enough that the event queries of the calls below (each runs one operation on the
  // emulator) do not finish it.
  for (int i = 0; i < 8; ++i) ASSERT_EQ(cudaMemsetAsync(p, i, 4_MiB, a_), cudaSuccess);
  vmm->Deallocate(p, 4_MiB, a_);
  EXPECT_EQ(vmm->EmptyCache(), 0u);
  cudaemu::ResetHostCalls();
  {
    cudaemu::RegionScope region("reuse");
    void* q = *vmm->Allocate(4_MiB, b_);
    vmm->Deallocate(q, 4_MiB, b_);
  }
  EXPECT_EQ(cudaemu::CountCalls("cuMemCreate", "reuse"), 0u);
  EXPECT_EQ(cudaemu::CountHostWaits("reuse"), 1u);  // mapped elsewhere: one cuMemSetAccess
  EXPECT_EQ(vmm->GetState().physical_bytes, 4_MiB);
}

TEST_F(VmmTest, ASecondDeviceGetsItsOwnMemory) {
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t s1 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const size_t on_one = cudaemu::DeviceAllocatedBytes(1);
  auto vmm = Make(/*device=*/1);
  ASSERT_NE(vmm, nullptr);
  EXPECT_EQ(vmm->device(), 1);
  void* p = *vmm->Allocate(4_MiB, s1);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);  // the caller's device is kept
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(1), on_one + 4_MiB);
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(0), charged_);
  cudaPointerAttributes attributes;
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, p), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 1);
  vmm->Deallocate(p, 4_MiB, s1);
  vmm.reset();
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(1), on_one);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

// Where the device has no VMM, the stack says so and serves from cudaMalloc.
TEST_F(VmmTest, WithoutVirtualMemoryTheStackFallsBackToCudaMalloc) {
  cudaemu::SetVirtualMemorySupported(0, false);
  EXPECT_EQ(VirtualMemorySupport(0).code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(VmmMemoryResource::Create(0).status().message()),
              HasSubstr("does not support CUDA virtual memory management"));
  {
    AllocatorStack stack(Backend::kCuda, 0, AllocatorConfig{});
    EXPECT_THAT(stack.backend_description(),
                HasSubstr("cudaMalloc (virtual memory management unavailable"));
    void* p = *stack.Allocate(1_MiB, a_);
    stack.Deallocate(p, 1_MiB, a_);
  }
  cudaemu::SetVirtualMemorySupported(0, true);
  EXPECT_TRUE(VirtualMemorySupport(0).ok());
  AllocatorStack stack(Backend::kCuda, 0, AllocatorConfig{});
  EXPECT_THAT(stack.backend_description(), HasSubstr("CUDA virtual memory"));
  AllocatorConfig malloc_config;
  malloc_config.cuda_memory = CudaMemory::kMalloc;
  AllocatorStack malloc_stack(Backend::kCuda, 0, malloc_config);
  EXPECT_EQ(malloc_stack.backend_description(), "cudaMalloc (configured)");
}

// Under a budget the pool counts the backend's free granules against it: reserving n bytes
// holds reserved + max(cached, n), since the backend serves from its cache first. Counted as
// if the backend held nothing, a lowered budget would be passed by what the backend keeps.
TEST_F(VmmTest, ThePoolCountsTheBackendsCacheAgainstItsLimit) {
  auto vmm = Make();
  CudaStreamEvents events(0);
  CachingPool pool(vmm.get(), &events);
  BudgetAdaptor budget(&pool, 16_MiB);
  void* a = *budget.Allocate(10_MiB, a_);
  void* b = *budget.Allocate(4_MiB, a_);
  budget.Deallocate(a, 10_MiB, a_);
  // 6 MiB do not fit beside 14 reserved, and a's 10 MiB segment is too large to carve without
  // stranding the rest: it goes back to the backend, which serves the new segment from it in
  // place and keeps the other 4 MiB mapped for the next one.
  cudaemu::ResetHostCalls();
  void* c = nullptr;
  {
    cudaemu::RegionScope region("handover");
    c = *budget.Allocate(6_MiB, a_);
  }
  EXPECT_EQ(c, a);
  EXPECT_EQ(DriverCalls("handover"), 0u);
  EXPECT_EQ(pool.GetUsage().reserved_bytes, 10_MiB);
  EXPECT_EQ(pool.GetUsage().upstream_cached_bytes, 4_MiB);
  EXPECT_EQ(pool.GetUsage().footprint_bytes(), 14_MiB);
  EXPECT_EQ(vmm->GetUsage().reserved_bytes, 14_MiB);
  // Lowered to 13 MiB, a 2 MiB segment fits beside the 10 reserved only once the backend's
  // 4 MiB go back to the device.
  budget.SetBudget(13_MiB);
  void* d = *budget.Allocate(2_MiB, a_);
  EXPECT_EQ(pool.GetUsage().footprint_bytes(), 12_MiB);
  EXPECT_EQ(vmm->GetUsage().reserved_bytes, 12_MiB);
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(0), charged_ + 12_MiB);
  budget.SetBudget(16_MiB);
  absl::StatusOr<void*> e = budget.Allocate(6_MiB, a_);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted);
  // In use: b, c and d's 12 MiB; the request's 6 MiB segment on top.
  EXPECT_EQ(SmallestFittingBudget(e.status()), 18_MiB);
  EXPECT_THAT(std::string(e.status().message()),
              HasSubstr("the smallest budget that would have fitted it: 18.00 MiB"));
  EXPECT_TRUE(pool.CheckInvariants().ok());
  budget.Deallocate(b, 4_MiB, a_);
  budget.Deallocate(c, 6_MiB, a_);
  budget.Deallocate(d, 2_MiB, a_);
  EXPECT_EQ(pool.EmptyCache(), 12_MiB);
  EXPECT_EQ(pool.GetUsage().footprint_bytes(), 0u);
}

// A failure at every call site of the backend: each surfaces as kResourceExhausted or a clear
// error (or is absorbed: an event that cannot be recorded becomes a stream wait), the pool
// stays consistent, and once the stack is gone nothing is left on the device.
struct Site {
  const char* api;
  int error;  // what the call fails with (0: out of memory)
};

class VmmFailureTest : public VmmTest, public ::testing::WithParamInterface<Site> {
 protected:
  // A small training-like pattern under a budget: fresh granules, in-place reuse, a move to
  // another stream (map, access, lazy unmap), cross-stream waits, EmptyCache and teardown.
  void Scenario(bool* failed) {
    std::unique_ptr<VmmMemoryResource> vmm;
    {
      absl::StatusOr<std::unique_ptr<VmmMemoryResource>> made = VmmMemoryResource::Create(0);
      if (!made.ok()) {
        *failed = true;
        EXPECT_THAT(std::string(made.status().message()), HasSubstr("actpack: "));
        return;
      }
      vmm = *std::move(made);
    }
    CudaStreamEvents events(0);
    auto pool = std::make_unique<CachingPool>(vmm.get(), &events);
    BudgetAdaptor budget(pool.get(), 24_MiB);
    auto allocate = [&](size_t bytes, cudaStream_t stream) -> void* {
      absl::StatusOr<void*> p = budget.Allocate(bytes, stream);
      if (!p.ok()) {
        *failed = true;
        EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
        EXPECT_THAT(std::string(p.status().message()), HasSubstr("actpack: ")) << p.status();
        return nullptr;
      }
      EXPECT_EQ(cudaMemsetAsync(*p, 1, bytes, stream), cudaSuccess);
      return *p;
    };
    auto free = [&](void* p, size_t bytes, cudaStream_t stream) {
      if (p != nullptr) budget.Deallocate(p, bytes, stream);
    };
    for (int step = 0; step < 3; ++step) {
      void* x = allocate(6_MiB, a_);
      void* y = allocate(4_MiB, a_);
      if (y != nullptr) {
        EXPECT_TRUE(pool->RecordStream(y, b_).ok());
      }
      free(x, 6_MiB, a_);
      void* z = allocate(10_MiB, b_);
      free(y, 4_MiB, a_);
      void* w = allocate(12_MiB, a_);
      free(z, 10_MiB, b_);
      free(w, 12_MiB, a_);
      EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
    }
    pool->EmptyCache();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    void* again = allocate(2_MiB, a_);  // the stack still works
    free(again, 2_MiB, a_);
    EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
    pool.reset();
    vmm.reset();
  }
};

TEST_P(VmmFailureTest, EveryCallOfTheSiteFailingOnceLeavesNothingBehind) {
  const Site site = GetParam();
  // How many calls of the site one run makes.
  const uint64_t before = cudaemu::CallCount(site.api);
  bool failed = false;
  Scenario(&failed);
  ASSERT_FALSE(failed);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectNothingLeft();
  const uint64_t calls = cudaemu::CallCount(site.api) - before;
  ASSERT_GT(calls, 0u) << site.api << " is not called: not a call site";
  for (uint64_t k = 1; k <= calls; ++k) {
    SCOPED_TRACE(std::string(site.api) + " failing at call " + std::to_string(k));
    cudaemu::FailCall(site.api, k, site.error);
    Scenario(&failed);
    cudaemu::ClearFailures();
    (void)cudaGetLastError();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ExpectNothingLeft();
  }
}

INSTANTIATE_TEST_SUITE_P(
    CallSites, VmmFailureTest,
    ::testing::Values(Site{"cuDeviceGet", 0}, Site{"cuDeviceGetAttribute", 0},
                      Site{"cuMemGetAllocationGranularity", 0}, Site{"cudaMemGetInfo", 0},
                      Site{"cuMemAddressReserve", 0}, Site{"cuMemCreate", 0},
                      Site{"cuMemMap", 0}, Site{"cuMemSetAccess", 0}, Site{"cuMemUnmap", 0},
                      Site{"cuMemRelease", 0}, Site{"cuMemAddressFree", 0},
                      Site{"cudaEventCreateWithFlags", 0}, Site{"cudaEventRecord", 0},
                      Site{"cudaEventQuery", 0}, Site{"cudaStreamWaitEvent", 0}),
    [](const ::testing::TestParamInfo<Site>& info) { return std::string(info.param.api); });

#endif  // CUDAEMU

}  // namespace
}  // namespace actpack::allocator
