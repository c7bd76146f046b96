#include "allocator/pluggable.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/cuda_memory_resource.h"
#include "allocator/device_allocator.h"
#include "allocator/host_pool.h"
#include "allocator/pressure_callbacks.h"
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
using ::testing::StartsWith;
using namespace literals;

// The device allocator through the C ABI, on the host backend (the logic without a GPU) and on
// the CUDA backend (a GPU, or the CUDA emulator under --config=cudaemu).
class DeviceAllocatorTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    ResetDeviceAllocatorForTesting();
    AllocatorConfig config;
    config.backend = GetParam();
    config.budget_bytes = 64_MiB;
    ASSERT_TRUE(ConfigureDeviceAllocator(config).ok());
    // Host streams are tags; CUDA ones are real: the default stream of each device.
    kStream = GetParam() == Backend::kHost ? reinterpret_cast<void*>(0x77) : nullptr;
  }
  void TearDown() override {
    ResetDeviceAllocatorForTesting();
#if ACTPACK_WITH_CUDA
    for (auto& [device, stream] : streams_) {
      cudaSetDevice(device);
      cudaStreamDestroy(stream);
    }
    cudaSetDevice(0);
#endif
  }

  // Another stream than kStream on `device`.
  void* OtherStream(int device) {
    if (GetParam() == Backend::kHost) return reinterpret_cast<void*>(0x99);
#if ACTPACK_WITH_CUDA
    cudaStream_t s = nullptr;
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
    EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess);
    EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
    streams_.emplace_back(device, s);
    return s;
#else
    return nullptr;
#endif
  }

  // Writes every byte of an allocation on `device` (never dereferencing device memory).
  void Fill(void* p, int value, size_t bytes, int device) {
    if (GetParam() == Backend::kHost) {
      std::memset(p, value, bytes);
      return;
    }
#if ACTPACK_WITH_CUDA
    ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
    ASSERT_EQ(cudaMemset(p, value, bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
#endif
  }

  void* kStream = nullptr;
#if ACTPACK_WITH_CUDA
  std::vector<std::pair<int, cudaStream_t>> streams_;
#endif
};

std::vector<Backend> Backends() {
  std::vector<Backend> backends = {Backend::kHost};
  absl::StatusOr<int> devices = CudaDeviceCount();
  // The tests use devices 0..5.
  if (devices.ok() && *devices >= 6) backends.push_back(Backend::kCuda);
  return backends;
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceAllocatorTest, ::testing::ValuesIn(Backends()),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return std::string(info.param == Backend::kHost ? "Host" : "Cuda");
                         });

TEST_P(DeviceAllocatorTest, AllocAndFreeThroughTheCAbi) {
  void* p = actpack_alloc(4_MiB, 0, kStream);
  ASSERT_NE(p, nullptr) << actpack_last_error();
  Fill(p, 1, 4_MiB, 0);
  AllocatorStack* stack = FindDeviceAllocator(0);
  ASSERT_NE(stack, nullptr);
  EXPECT_EQ(stack->stats().GetStats().allocated_bytes.current, static_cast<int64_t>(4_MiB));
  // Under the budget, a mid-size block gets a segment of its own size.
  EXPECT_EQ(stack->stats().GetStats().reserved_bytes.current, static_cast<int64_t>(4_MiB));
  EXPECT_EQ(FindDeviceAllocator(1), nullptr);  // only used devices get a stack

  actpack_free(p, 4_MiB, 0, kStream);
  EXPECT_EQ(stack->stats().GetStats().allocated_bytes.current, 0);
  actpack_empty_cache();
  EXPECT_EQ(stack->stats().GetStats().reserved_bytes.current, 0);
}

TEST_P(DeviceAllocatorTest, ConfiguringAfterTheFirstAllocationFails) {
  void* p = actpack_alloc(1, 0, kStream);
  ASSERT_NE(p, nullptr);
  absl::Status status = ConfigureDeviceAllocator(AllocatorConfig{Backend::kHost});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("before the first allocation"));
  actpack_free(p, 1, 0, kStream);
}

TEST_P(DeviceAllocatorTest, OverBudgetReturnsNullWithTheReason) {
  void* p = actpack_alloc(64_MiB + 1, 0, kStream);
  EXPECT_EQ(p, nullptr);
  EXPECT_STREQ(actpack_last_error(),
               "actpack: out of budget: requested 64.00 MiB with 0 B in use and 0 B cached; "
               "budget 64.00 MiB; the smallest budget that would have fitted it: 66.00 MiB");
  EXPECT_EQ(FindDeviceAllocator(0)->stats().GetStats().num_ooms, 1);
}

// Backward allocates on autograd's device thread and the error is read on the thread that
// called backward: the reason is the process's (and the device's), not the failing thread's.
TEST_P(DeviceAllocatorTest, TheLastErrorIsReadableFromAnyThread) {
  std::thread autograd([this] { EXPECT_EQ(actpack_alloc(64_MiB + 1, 0, kStream), nullptr); });
  autograd.join();
  EXPECT_THAT(actpack_last_error(), StartsWith("actpack: out of budget"));
  EXPECT_THAT(actpack_last_device_error(0), StartsWith("actpack: out of budget"));
  EXPECT_STREQ(actpack_last_device_error(1), "");
  EXPECT_STREQ(actpack_last_device_error(-1), "");
  // The pointer stays this thread's while another thread fails differently.
  const char* seen = actpack_last_error();
  std::thread other([] { actpack_memory_fraction(2.0, 0); });
  other.join();
  EXPECT_THAT(seen, StartsWith("actpack: out of budget"));
  EXPECT_THAT(actpack_last_error(), HasSubstr("outside (0, 1]"));
  // A later success clears it.
  void* p = actpack_alloc(1_MiB, 0, kStream);
  ASSERT_NE(p, nullptr);
  EXPECT_STREQ(actpack_last_error(), "");
  EXPECT_STREQ(actpack_last_device_error(0), "");
  actpack_free(p, 1_MiB, 0, kStream);
}

TEST_P(DeviceAllocatorTest, AnInjectedFailureReachesTheCallerAsABudgetRefusalWould) {
  AllocatorStack* stack = *DeviceAllocator(0);
  stack->faults().FailAt(2);
  void* first = actpack_alloc(1_MiB, 0, kStream);
  ASSERT_NE(first, nullptr) << actpack_last_error();
  EXPECT_EQ(actpack_alloc(1_MiB, 0, kStream), nullptr);
  EXPECT_THAT(std::string(actpack_last_error()),
              HasSubstr("injected failure of allocation #2 (1048576 bytes)"));
  EXPECT_TRUE(stack->faults().failed());
  // Once: the next request is served, and the statistics saw one out-of-memory and nothing
  // allocated for it.
  void* third = actpack_alloc(1_MiB, 0, kStream);
  ASSERT_NE(third, nullptr) << actpack_last_error();
  EXPECT_EQ(stack->faults().allocations(), 3u);
  EXPECT_EQ(stack->stats().GetStats().num_ooms, 1);
  EXPECT_EQ(stack->stats().GetStats().allocated_bytes.current, static_cast<int64_t>(2_MiB));
  actpack_free(first, 1_MiB, 0, kStream);
  actpack_free(third, 1_MiB, 0, kStream);
  stack->faults().FailAt(0);
}

TEST_P(DeviceAllocatorTest, MemoryFractionSetsTheBudget) {
  void* p = actpack_alloc(1_MiB, 2, kStream);
  ASSERT_NE(p, nullptr);
  actpack_memory_fraction(0.5, 2);
  const size_t budget = FindDeviceAllocator(2)->budget().budget();
  EXPECT_GT(budget, 64_MiB);  // half of this machine's memory
  EXPECT_NE(budget, kNoCap);
  actpack_memory_fraction(1.5, 2);
  EXPECT_THAT(actpack_last_error(), HasSubstr("outside (0, 1]"));
  EXPECT_EQ(FindDeviceAllocator(2)->budget().budget(), budget);
  SetDeviceBudget(-1, 1_GiB);
  EXPECT_EQ(FindDeviceAllocator(2)->budget().budget(), 1_GiB);
  actpack_free(p, 1_MiB, 2, kStream);
}

TEST_P(DeviceAllocatorTest, ABudgetSetBeforeTheStackIsBuiltIsItsBudget) {
  ASSERT_EQ(FindDeviceAllocator(3), nullptr);
  SetDeviceBudget(3, 48_MiB);
  EXPECT_EQ(DeviceBudget(3), 48_MiB);  // read before the build, as actpack.memory_budget does
  EXPECT_EQ(DeviceBudget(1), DeviceAllocatorConfig().budget_bytes);  // the others keep theirs
  void* p = actpack_alloc(1_MiB, 3, kStream);
  ASSERT_NE(p, nullptr) << actpack_last_error();
  EXPECT_EQ(FindDeviceAllocator(3)->budget().budget(), 48_MiB);
  SetDeviceBudget(3, 96_MiB);
  EXPECT_EQ(DeviceBudget(3), 96_MiB);
  EXPECT_EQ(FindDeviceAllocator(3)->budget().budget(), 96_MiB);
  actpack_free(p, 1_MiB, 3, kStream);
}

TEST_P(DeviceAllocatorTest, RecordStreamFindsTheAllocation) {
  void* p = actpack_alloc(4_KiB, 1, kStream);
  ASSERT_NE(p, nullptr);
  actpack_record_stream(p, OtherStream(1));
  EXPECT_STREQ(actpack_last_error(), "");
  int not_allocated = 0;
  actpack_record_stream(&not_allocated, kStream);
  EXPECT_THAT(actpack_last_error(), HasSubstr("not a live allocation"));
  actpack_free(p, 4_KiB, 1, kStream);
}

TEST_P(DeviceAllocatorTest, DeviceOutOfRangeFails) {
  EXPECT_EQ(actpack_alloc(1, kMaxDevices, kStream), nullptr);
  EXPECT_THAT(actpack_last_error(), HasSubstr("outside [0, 64)"));
}

TEST_P(DeviceAllocatorTest, SnapshotCoversEveryDevice) {
  void* a = actpack_alloc(1000, 0, kStream);
  void* b = actpack_alloc(2000, 3, kStream);
  const std::string json = DeviceSnapshot().dump();
  EXPECT_THAT(json, StartsWith("{\"segments\":[{\"device\":0,"));
  EXPECT_THAT(json, HasSubstr("{\"device\":3,"));
  EXPECT_THAT(json, HasSubstr("\"requested_size\":2000"));
  EXPECT_THAT(json, HasSubstr("\"device_traces\":[[{\"action\":\"segment_alloc\""));
  EXPECT_THAT(json, HasSubstr(absl::StrCat("\"allocator_settings\":{\"backend\":\"",
                                           BackendName(GetParam()), "\"}")));
  actpack_free(a, 1000, 0, kStream);
  actpack_free(b, 2000, 3, kStream);
}

TEST_P(DeviceAllocatorTest, PressureCallbackRegisteredBeforeTheStackFreesForARequest) {
  // Device 1 has no stack yet: the callback waits for it without building it.
  void* held = nullptr;
  std::vector<size_t> calls;
  absl::StatusOr<PressureCallbackId> id = RegisterPressureCallback(1, [&](size_t needed) {
    calls.push_back(needed);
    if (held == nullptr) return size_t{0};
    actpack_free(held, 40_MiB, 1, kStream);
    held = nullptr;
    return 40_MiB;
  });
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(FindDeviceAllocator(1), nullptr);

  held = actpack_alloc(40_MiB, 1, kStream);
  ASSERT_NE(held, nullptr) << actpack_last_error();
  void* p = actpack_alloc(40_MiB, 1, kStream);  // 80 MiB > 64 MiB: only fits after the callback
  ASSERT_NE(p, nullptr) << actpack_last_error();
  EXPECT_EQ(held, nullptr);
  EXPECT_EQ(calls, std::vector<size_t>{16_MiB});  // 40 + 40 in use would be 16 MiB over
  EXPECT_EQ(FindDeviceAllocator(1)->stats().GetStats().num_alloc_retries, 1);

  // Unregistered: the next request over the budget fails without asking.
  ASSERT_TRUE(UnregisterPressureCallback(*id).ok());
  EXPECT_EQ(actpack_alloc(40_MiB, 1, kStream), nullptr);
  EXPECT_THAT(actpack_last_error(), StartsWith("actpack: out of budget"));
  EXPECT_EQ(calls.size(), 1u);
  EXPECT_EQ(UnregisterPressureCallback(*id).code(), absl::StatusCode::kNotFound);
  actpack_free(p, 40_MiB, 1, kStream);
}

TEST_P(DeviceAllocatorTest, PressureCallbacksOfABuiltStackRunInOrderUntilOneFreesEnough) {
  void* held = actpack_alloc(60_MiB, 0, kStream);
  ASSERT_NE(held, nullptr);
  std::vector<int> order;
  const PressureCallbackId first = *RegisterPressureCallback(0, [&](size_t) {
    order.push_back(1);
    return size_t{0};  // frees nothing: the next one is asked
  });
  const PressureCallbackId second = *RegisterPressureCallback(0, [&](size_t) {
    order.push_back(2);
    actpack_free(held, 60_MiB, 0, kStream);
    return 60_MiB;
  });
  const PressureCallbackId third = *RegisterPressureCallback(0, [&](size_t) {
    order.push_back(3);
    return size_t{0};
  });
  void* p = actpack_alloc(10_MiB, 0, kStream);
  ASSERT_NE(p, nullptr) << actpack_last_error();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));  // the retry after the second one succeeded
  for (PressureCallbackId id : {first, second, third}) {
    EXPECT_TRUE(UnregisterPressureCallback(id).ok());
  }
  actpack_free(p, 10_MiB, 0, kStream);
}

TEST_P(DeviceAllocatorTest, PressureCallbackOnABadDeviceIsRefused) {
  auto nothing = [](size_t) { return size_t{0}; };
  EXPECT_THAT(std::string(RegisterPressureCallback(kMaxDevices, nothing).status().message()),
              HasSubstr("device 64 is outside [-1 (host), 64)"));
  EXPECT_EQ(RegisterPressureCallback(-2, nothing).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RegisterPressureCallback(0, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(DeviceAllocatorTest, BaseAllocIsTheSegmentHoldingThePointer) {
  // `a` and `b` are carved from one cached 8 MiB segment, `b` after `a`, with the budget
  // lifted (under one the pool gives such blocks segments of their own size).
  actpack_free(actpack_alloc(8_MiB, 2, kStream), 8_MiB, 2, kStream);
  FindDeviceAllocator(2)->budget().SetBudget(kNoCap);
  void* a = actpack_alloc(3_MiB, 2, kStream);
  void* b = actpack_alloc(4_MiB, 2, kStream);
  FindDeviceAllocator(2)->budget().SetBudget(64_MiB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  size_t size = 0;
  EXPECT_EQ(actpack_base_alloc(b, &size), a);
  EXPECT_EQ(size, 8_MiB);
  EXPECT_STREQ(actpack_last_error(), "");

  int elsewhere = 0;
  size = 123;
  EXPECT_EQ(actpack_base_alloc(&elsewhere, &size), &elsewhere);  // torch's default answer
  EXPECT_EQ(size, 123u);
  EXPECT_THAT(actpack_last_error(), HasSubstr("is not in a device segment"));
  actpack_free(b, 4_MiB, 2, kStream);
  actpack_free(a, 3_MiB, 2, kStream);
}

TEST_P(DeviceAllocatorTest, EmptyCacheHookReleasesEveryDevice) {
  actpack_init(2);
  void* a = actpack_alloc(256_KiB, 0, kStream);
  void* b = actpack_alloc(256_KiB, 5, kStream);
  actpack_free(a, 256_KiB, 0, kStream);
  actpack_free(b, 256_KiB, 5, kStream);
  EXPECT_EQ(FindDeviceAllocator(5)->pool().GetUsage().reserved_bytes, 2_MiB);
  actpack_empty_cache();
  EXPECT_EQ(FindDeviceAllocator(0)->pool().GetUsage().reserved_bytes, 0u);
  EXPECT_EQ(FindDeviceAllocator(5)->pool().GetUsage().reserved_bytes, 0u);
}

// A budget counts what the system sees: 40 MiB another library holds (a buffer the process
// touched, or device memory cudaMalloc'ed outside the pool) leave 24 MiB of a 64 MiB budget.
TEST_P(DeviceAllocatorTest, MemoryTheSystemCountsOutsideThePoolTakesFromTheBudget) {
  EXPECT_FALSE(CountsSystemMemory(0));
  ASSERT_TRUE(CountSystemMemory(0).ok());
  EXPECT_TRUE(CountsSystemMemory(0));
  void* outside = nullptr;
  if (GetParam() == Backend::kHost) {
    // Mapped, not malloc'ed: ASan's allocator keeps freed blocks resident in its quarantine.
    outside = mmap(nullptr, 40_MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(outside, MAP_FAILED);
    std::memset(outside, 1, 40_MiB);  // resident once touched
  } else {
#if ACTPACK_WITH_CUDA
    ASSERT_EQ(cudaMalloc(&outside, 40_MiB), cudaSuccess);
#endif
  }
  EXPECT_EQ(actpack_alloc(30_MiB, 0, kStream), nullptr);
  EXPECT_THAT(actpack_last_error(), HasSubstr("out of budget"));
  void* small = actpack_alloc(16_MiB, 0, kStream);  // 16 + 40 <= 64
  EXPECT_NE(small, nullptr) << actpack_last_error();
  actpack_free(small, 16_MiB, 0, kStream);
  if (GetParam() == Backend::kHost) {
    ASSERT_EQ(munmap(outside, 40_MiB), 0);  // the resident set shrinks
  } else {
#if ACTPACK_WITH_CUDA
    ASSERT_EQ(cudaFree(outside), cudaSuccess);
#endif
  }
  void* p = actpack_alloc(30_MiB, 0, kStream);
  EXPECT_NE(p, nullptr) << actpack_last_error();
  actpack_free(p, 30_MiB, 0, kStream);
  StopCountingSystemMemory(0);
  EXPECT_FALSE(CountsSystemMemory(0));
  // Counting again with 12 MiB allowed outside: the same 40 MiB take 28, and 30 + 28 <= 64.
  actpack_empty_cache();
  ASSERT_TRUE(CountSystemMemory(0, 12_MiB).ok());
  if (GetParam() == Backend::kHost) {
    outside = mmap(nullptr, 40_MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(outside, MAP_FAILED);
    std::memset(outside, 1, 40_MiB);
  } else {
#if ACTPACK_WITH_CUDA
    ASSERT_EQ(cudaMalloc(&outside, 40_MiB), cudaSuccess);
#endif
  }
  EXPECT_EQ(actpack_alloc(40_MiB, 0, kStream), nullptr);  // 40 + 28 > 64
  p = actpack_alloc(30_MiB, 0, kStream);
  EXPECT_NE(p, nullptr) << actpack_last_error();
  actpack_free(p, 30_MiB, 0, kStream);
  if (GetParam() == Backend::kHost) {
    ASSERT_EQ(munmap(outside, 40_MiB), 0);
  } else {
#if ACTPACK_WITH_CUDA
    ASSERT_EQ(cudaFree(outside), cudaSuccess);
#endif
  }
  StopCountingSystemMemory(0);
}

// The count starts from a pool without cache: a cached segment never written is reserved but
// not resident, and given back after the count began (a budget run's start gives the cache
// back) it would shrink the pool and not the resident set, so 40 MiB would count as outside.
TEST_P(DeviceAllocatorTest, CountingTheSystemStartsFromAPoolWithoutCache) {
  void* untouched = actpack_alloc(40_MiB, 0, kStream);
  ASSERT_NE(untouched, nullptr) << actpack_last_error();
  actpack_free(untouched, 40_MiB, 0, kStream);
  ASSERT_TRUE(CountSystemMemory(0).ok());
  EXPECT_EQ((*DeviceAllocator(0))->pool().GetUsage().reserved_bytes, 0u);
  actpack_empty_cache();
  void* p = actpack_alloc(30_MiB, 0, kStream);  // 30 + 0 outside <= 64
  EXPECT_NE(p, nullptr) << actpack_last_error();
  actpack_free(p, 30_MiB, 0, kStream);
  StopCountingSystemMemory(0);
}

#if defined(CUDAEMU)
// On a GPU the budget counts this process's memory (NVML's per-process count): another process
// on the same GPU does not take from it. Where NVML does not list this process, the device's
// used memory (cudaMemGetInfo) is counted, and the source says so.
TEST_P(DeviceAllocatorTest, OnAGpuTheSystemCountIsThisProcesssMemory) {
  if (GetParam() != Backend::kCuda) {
    EXPECT_EQ(SystemMemorySource(0), "the process's resident set (VmRSS)");
    GTEST_SKIP() << "the GPU's count is a CUDA matter";
  }
  ASSERT_TRUE(CountSystemMemory(2).ok());
  EXPECT_THAT(SystemMemorySource(2), StartsWith("NVML: this process's memory on GPU 0000:12:00.0"));
  cudaemu::SetOtherProcessMemory(2, 40_MiB);
  void* p = actpack_alloc(30_MiB, 2, kStream);  // 30 + 40 > 64, but the 40 are not ours
  EXPECT_NE(p, nullptr) << actpack_last_error();
  actpack_free(p, 30_MiB, 2, kStream);
  actpack_empty_cache();  // so that the next request reserves, and is counted
  // Our own memory outside the pool still counts.
  void* outside = nullptr;
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&outside, 40_MiB), cudaSuccess);
  EXPECT_EQ(actpack_alloc(30_MiB, 2, kStream), nullptr);
  ASSERT_EQ(cudaFree(outside), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  StopCountingSystemMemory(2);

  cudaemu::SetNvmlListsThisProcess(false);
  actpack_empty_cache();
  ASSERT_TRUE(CountSystemMemory(3).ok());
  EXPECT_THAT(SystemMemorySource(3), StartsWith("cudaMemGetInfo: device 3's used memory"));
  EXPECT_THAT(SystemMemorySource(3), HasSubstr("not in NVML's list"));
  cudaemu::SetOtherProcessMemory(3, 40_MiB);
  EXPECT_EQ(actpack_alloc(30_MiB, 3, kStream), nullptr);  // the device's count includes them
  cudaemu::SetOtherProcessMemory(3, 0);
  StopCountingSystemMemory(3);
  cudaemu::SetNvmlListsThisProcess(true);
  cudaemu::SetOtherProcessMemory(2, 0);
}
#endif

#if ACTPACK_WITH_CUDA
// What the driver sees: a cached segment is still device memory in use; empty_cache gives it
// back (torch.cuda.empty_cache() with actpack's allocator plugged in).
TEST_P(DeviceAllocatorTest, EmptyCacheGivesMemoryBackToTheDevice) {
  if (GetParam() != Backend::kCuda) GTEST_SKIP() << "the driver's count is a CUDA matter";
  ASSERT_EQ(cudaSetDevice(4), cudaSuccess);
  size_t before = 0, after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&before, &total), cudaSuccess);
  void* p = actpack_alloc(10_MiB, 4, kStream);
  ASSERT_NE(p, nullptr) << actpack_last_error();
  actpack_free(p, 10_MiB, 4, kStream);
  ASSERT_EQ(cudaMemGetInfo(&after, &total), cudaSuccess);
  EXPECT_LE(after + 10_MiB, before);  // cached, still the device's
  actpack_empty_cache();
  ASSERT_EQ(cudaMemGetInfo(&after, &total), cudaSuccess);
  EXPECT_EQ(after, before);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}
#endif

TEST(DeviceAllocatorConfigTest, CudaBackendNeedsCuda) {
  ResetDeviceAllocatorForTesting();
  const absl::Status status = ConfigureDeviceAllocator(AllocatorConfig{Backend::kCuda});
  if (CudaSupportCompiledIn()) {
    EXPECT_TRUE(status.ok()) << status;
  } else {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  }
  ResetDeviceAllocatorForTesting();
}

// The host pool cannot be reset (it lives for the process), so its life is one test.
TEST(HostPoolTest, ConfiguredOnceThenServesWithBudgetAndStats) {
  // Registered before the pool exists (and without building it): applied when it is built.
  int pressure_calls = 0;
  const absl::StatusOr<PressureCallbackId> pressure =
      RegisterPressureCallback(kHostDevice, [&](size_t) {
        ++pressure_calls;
        return size_t{0};
      });
  ASSERT_TRUE(pressure.ok());
  ASSERT_TRUE(ConfigureHostPool(32_MiB, 128).ok());
  AllocatorStack& pool = HostPool();
  EXPECT_EQ(&pool, &HostPool());
  EXPECT_EQ(pool.backend(), Backend::kHost);
  EXPECT_EQ(ConfigureHostPool(1_GiB).code(), absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<void*> a = pool.Allocate(12_MiB);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<void*> b = pool.Allocate(10);
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<void*> over = pool.Allocate(20_MiB);
  ASSERT_FALSE(over.ok());
  EXPECT_THAT(std::string(over.status().message()), StartsWith("actpack: out of budget"));
  EXPECT_EQ(pressure_calls, 1);  // asked before failing; freed nothing
  ASSERT_TRUE(UnregisterPressureCallback(*pressure).ok());

  pool.Free(*a);  // c10's deleter knows only the pointer
  pool.Free(*b);
  const MemoryStats stats = pool.stats().GetStats();
  EXPECT_EQ(stats.allocated_bytes.current, 0);
  EXPECT_EQ(stats.requested_bytes.current, 0);
  EXPECT_EQ(stats.num_ooms, 1);
  EXPECT_EQ(stats.allocated_bytes.peak, static_cast<int64_t>(12_MiB + 512));

  const std::string json = HostSnapshot().dump();
  EXPECT_THAT(json, HasSubstr("\"budget_bytes\":\"33554432\""));
  EXPECT_THAT(json, HasSubstr("\"action\":\"oom\""));
  pool.EmptyCache();
  EXPECT_EQ(pool.pool().GetUsage().reserved_bytes, 0u);
  const uint64_t cap = pool.budget().budget();
  pool.budget().SetBudget(kNoCap);  // no cap: "none", as actpack.memory's summary says
  EXPECT_THAT(HostSnapshot().dump(), HasSubstr("\"budget_bytes\":\"none\""));
  pool.budget().SetBudget(cap);
}

}  // namespace
}  // namespace actpack::allocator
