// Training steps through the CUDA allocator stack (AllocatorStack, Backend::kCuda) under a
// budget that binds, on the CUDA emulator: what the host does per step once the pool has
// settled. At the cap the pool gives segments back and takes new ones every step; that must
// cost no cudaFree, no cudaMalloc and no host wait, on either stream and on any device.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "allocator/allocator_stack.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if defined(CUDAEMU)
#include "cudaemu/control.h"
#endif

namespace actpack::allocator {
namespace {

using namespace literals;

#if !defined(CUDAEMU)

TEST(CudaStackTest, NeedsTheEmulator) {
  GTEST_SKIP() << "these tests count the CUDA emulator's calls (--config=cudaemu)";
}

#else

// What a step made the host do.
struct StepCounts {
  uint64_t mallocs = 0;
  uint64_t frees = 0;
  uint64_t host_waits = 0;
  uint64_t driver_calls = 0;  // the VMM calls (cuMem*)
  uint64_t retries = 0;       // times the pool gave cache back to fit a request
};

const char* const kDriverCalls[] = {"cuMemAddressReserve", "cuMemAddressFree", "cuMemCreate",
                                    "cuMemRelease",        "cuMemMap",         "cuMemSetAccess",
                                    "cuMemUnmap"};

// A model's step, as an allocator sees it: forward keeps activations of many sizes (some also
// used on a side stream, as a prefetch or communication stream would), with a workspace freed
// at once per layer; backward frees them in reverse while gradients come and go; parameter
// gradients live across steps. Every block is written on its stream, so the device has work
// queued on it when it is freed.
class TrainingStep {
 public:
  TrainingStep(AllocatorStack* stack, cudaStream_t main, cudaStream_t side)
      : stack_(stack), main_(main), side_(side) {}

  // False when an allocation failed (what it said is in `error`); everything the step holds
  // is freed either way.
  bool Run(std::string* error) {
    bool ok = true;
    auto allocate = [&](size_t bytes, cudaStream_t stream) -> void* {
      if (!ok) return nullptr;
      absl::StatusOr<void*> p = stack_->Allocate(bytes, stream);
      if (!p.ok()) {
        ok = false;
        *error = std::string(p.status().ToString());
        return nullptr;
      }
      EXPECT_EQ(cudaMemsetAsync(*p, 0x5a, bytes, stream), cudaSuccess);
      return *p;
    };
    auto free = [&](void* p, size_t bytes, cudaStream_t stream) {
      if (p != nullptr) stack_->Deallocate(p, bytes, stream);
    };
    if (parameters_.empty()) {
      for (size_t bytes : {4_MiB, 4_MiB + 512_KiB}) parameters_.push_back({allocate(bytes, main_), bytes});
    }
    std::vector<Live> activations;
    int n = 0;
    for (int layer = 0; layer < kLayers; ++layer) {
      for (size_t bytes : kActivations) {
        void* p = allocate(bytes, main_);
        if (p != nullptr && ++n % 3 == 0) {
          EXPECT_TRUE(stack_->pool().RecordStream(p, side_).ok());
          EXPECT_EQ(cudaMemsetAsync(p, 0x33, bytes, side_), cudaSuccess);
        }
        activations.push_back({p, bytes});
      }
      void* workspace = allocate(kWorkspace, main_);
      free(workspace, kWorkspace, main_);
    }
    Live gradient{nullptr, 0};
    for (auto it = activations.rbegin(); it != activations.rend(); ++it) {
      void* input_gradient = allocate(it->bytes, main_);
      free(it->p, it->bytes, main_);
      free(gradient.p, gradient.bytes, main_);
      gradient = {input_gradient, it->bytes};
    }
    free(gradient.p, gradient.bytes, main_);
    return ok;
  }

  void FreeParameters() {
    for (const Live& p : parameters_) {
      if (p.p != nullptr) stack_->Deallocate(p.p, p.bytes, main_);
    }
    parameters_.clear();
  }

 private:
  struct Live {
    void* p;
    size_t bytes;
  };
  static constexpr int kLayers = 4;
  static constexpr size_t kActivations[] = {3_MiB,       768_KiB, 6_MiB,        12_MiB + 4_KiB,
                                            256_KiB,     5_MiB,   1536_KiB,     9_MiB + 100_KiB};
  static constexpr size_t kWorkspace = 2_MiB + 512_KiB;

  AllocatorStack* const stack_;
  const cudaStream_t main_;
  const cudaStream_t side_;
  std::vector<Live> parameters_;
};

uint64_t DriverCalls(const std::string& region) {
  uint64_t n = 0;
  for (const char* api : kDriverCalls) n += cudaemu::CountCalls(api, region);
  return n;
}

class CudaStackTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    saved_schedule_ = cudaemu::ScheduleName();
    cudaemu::SetSchedule("forward");  // queued work runs when something waits for it
    device_ = GetParam();
    ASSERT_EQ(cudaSetDevice(device_), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&main_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), cudaSuccess);
    for (int d = 0; d < 2; ++d) charged_[d] = cudaemu::DeviceAllocatedBytes(d);
  }
  void TearDown() override {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaStreamDestroy(main_), cudaSuccess);
    ASSERT_EQ(cudaStreamDestroy(side_), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    cudaemu::ClearFailures();
    cudaemu::SetSchedule(saved_schedule_);
  }

  // The budget: the smallest of a few above the step's peak in use under which steps run,
  // so that the cap binds every step.
  size_t MeasureBudget() {
    static size_t measured[2] = {0, 0};
    if (measured[device_] != 0) return measured[device_];
    measured[device_] = Measure();
    return measured[device_];
  }
  size_t Measure() {
    size_t peak = 0;
    {
      AllocatorStack stack(Backend::kCuda, device_, AllocatorConfig{});
      TrainingStep step(&stack, main_, side_);
      std::string error;
      EXPECT_TRUE(step.Run(&error)) << error;
      step.FreeParameters();
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      peak = static_cast<size_t>(stack.stats().GetStats().allocated_bytes.peak);
    }
    for (size_t room = 8_MiB; room <= 64_MiB; room += 8_MiB) {
      AllocatorConfig config;
      config.budget_bytes = peak + room;
      AllocatorStack stack(Backend::kCuda, device_, config);
      TrainingStep step(&stack, main_, side_);
      std::string error;
      bool fits = true;
      for (int i = 0; i < 3 && fits; ++i) fits = step.Run(&error);
      step.FreeParameters();
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (fits) return config.budget_bytes;
    }
    ADD_FAILURE() << "no budget up to 64 MiB above the peak fits the step";
    return 0;
  }

  // One step, with what it made the host do.
  StepCounts CountedStep(AllocatorStack& stack, TrainingStep& step) {
    const int64_t retries_before = stack.stats().GetStats().num_alloc_retries;
    cudaemu::ResetHostCalls();
    std::string error;
    {
      cudaemu::RegionScope region("step");
      EXPECT_TRUE(step.Run(&error)) << error;
    }
    StepCounts counts;
    counts.mallocs = cudaemu::CountCalls("cudaMalloc", "step");
    counts.frees = cudaemu::CountCalls("cudaFree", "step");
    counts.host_waits = cudaemu::CountHostWaits("step");
    counts.driver_calls = DriverCalls("step");
    counts.retries = static_cast<uint64_t>(stack.stats().GetStats().num_alloc_retries - retries_before);
    // The step's one host wait, outside the allocator (a loss read back to the host).
    EXPECT_EQ(cudaStreamSynchronize(main_), cudaSuccess);
    EXPECT_TRUE(stack.pool().CheckInvariants().ok()) << stack.pool().CheckInvariants();
    return counts;
  }

  int device_ = 0;
  cudaStream_t main_ = nullptr, side_ = nullptr;
  size_t charged_[2] = {0, 0};
  std::string saved_schedule_;
};

INSTANTIATE_TEST_SUITE_P(Devices, CudaStackTest, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "Device" + std::to_string(info.param);
                         });

// The steady state at the cap: the pool hands segments over every step (the budget binds),
// with no cudaFree, no cudaMalloc, no driver call and no host wait. Over cudaMalloc the same
// steps cost a cudaFree and a cudaMalloc per handover and a cudaEventSynchronize for blocks
// the side stream had not finished with.
TEST_P(CudaStackTest, StepsAtTheCapMakeNoDeviceAllocationAndNoHostWait) {
  AllocatorConfig config;
  config.budget_bytes = MeasureBudget();
  AllocatorStack stack(Backend::kCuda, device_, config);
  TrainingStep step(&stack, main_, side_);
  constexpr int kWarmUp = 6, kMeasured = 4;
  for (int i = 0; i < kWarmUp + kMeasured; ++i) {
    const StepCounts c = CountedStep(stack, step);
    std::printf("device %d, step %d: %llu cudaMalloc, %llu cudaFree, %llu host waits, %llu VMM "
                "calls, %llu handovers at the cap\n",
                device_, i, static_cast<unsigned long long>(c.mallocs),
                static_cast<unsigned long long>(c.frees),
                static_cast<unsigned long long>(c.host_waits),
                static_cast<unsigned long long>(c.driver_calls),
                static_cast<unsigned long long>(c.retries));
    if (i < kWarmUp) continue;
    SCOPED_TRACE("step " + std::to_string(i));
    EXPECT_GT(c.retries, 0u) << "the budget does not bind: the test would prove nothing";
    EXPECT_EQ(c.mallocs, 0u);
    EXPECT_EQ(c.frees, 0u);
    EXPECT_EQ(c.host_waits, 0u);
    EXPECT_EQ(c.driver_calls, 0u);
  }
  EXPECT_LE(stack.pool().GetUsage().reserved_bytes, config.budget_bytes);
  // Only this stack's device holds memory.
  const int other = 1 - device_;
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(other), charged_[other]);
  EXPECT_GT(cudaemu::DeviceAllocatedBytes(device_), charged_[device_]);
  step.FreeParameters();
}

// Pressure at the cap: the budget's callbacks run (the runtime compresses harder there) with
// nothing given back to the device and nothing waited for on the host before them.
TEST_P(CudaStackTest, PressureCallbacksRunWithoutHostWaitsOrDeviceFrees) {
  AllocatorConfig config;
  config.budget_bytes = 40_MiB;
  AllocatorStack stack(Backend::kCuda, device_, config);
  std::vector<void*> live;
  for (int i = 0; i < 3; ++i) live.push_back(*stack.Allocate(10_MiB, main_));
  // A block the side stream still writes, freed: pending on the side stream's event.
  void* shared = *stack.Allocate(6_MiB, main_);
  ASSERT_TRUE(stack.pool().RecordStream(shared, side_).ok());
  ASSERT_EQ(cudaMemsetAsync(shared, 1, 6_MiB, side_), cudaSuccess);
  stack.Deallocate(shared, 6_MiB, main_);
  void* freed = live.back();
  live.pop_back();
  int calls = 0;
  uint64_t waits_before_callback = 0, frees_before_callback = 0;
  stack.budget().AddPressureCallback([&](size_t needed) -> size_t {
    if (calls++ == 0) {
      waits_before_callback = cudaemu::CountHostWaits("pressure");
      frees_before_callback = cudaemu::CountCalls("cudaFree", "pressure");
      stack.Deallocate(freed, 10_MiB, main_);  // what the runtime frees
      return 10_MiB;
    }
    return 0;
  });
  cudaemu::ResetHostCalls();
  {
    cudaemu::RegionScope region("pressure");
    absl::StatusOr<void*> p = stack.Allocate(20_MiB, main_);  // 36 in use + 20 > 40
    ASSERT_TRUE(p.ok()) << p.status();
    live.push_back(*p);
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(waits_before_callback, 0u);
  EXPECT_EQ(frees_before_callback, 0u);
  EXPECT_EQ(cudaemu::CountCalls("cudaEventSynchronize", "pressure"), 0u);
  EXPECT_TRUE(stack.pool().CheckInvariants().ok()) << stack.pool().CheckInvariants();
  for (void* p : live) stack.Free(p);
}

// Failures of the device's calls mid-step, at chosen calls: each step either completes or
// fails with kResourceExhausted, the pool stays consistent, the next steps work, and nothing
// is left on the device once the stack is gone.
TEST_P(CudaStackTest, FailedDeviceCallsMidStepLeaveTheStackWorking) {
  if (device_ != 0) GTEST_SKIP() << "device 0's run covers the calls";
  const size_t budget = MeasureBudget();
  for (const char* api : {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cudaEventRecord",
                          "cudaStreamWaitEvent"}) {
    for (uint64_t k : {1, 5}) {
      SCOPED_TRACE(std::string(api) + " failing at call " + std::to_string(k));
      {
        AllocatorConfig config;
        config.budget_bytes = budget;
        AllocatorStack stack(Backend::kCuda, device_, config);
        TrainingStep step(&stack, main_, side_);
        std::string error;
        cudaemu::FailCall(api, k);  // from the first step on, while the pool fills
        for (int i = 0; i < 3; ++i) {
          if (!step.Run(&error)) {
            EXPECT_NE(error.find("RESOURCE_EXHAUSTED"), std::string::npos) << error;
          }
          EXPECT_TRUE(stack.pool().CheckInvariants().ok()) << stack.pool().CheckInvariants();
        }
        cudaemu::ClearFailures();
        (void)cudaGetLastError();
        EXPECT_TRUE(step.Run(&error)) << error;
        step.FreeParameters();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      }
      EXPECT_EQ(cudaemu::DeviceAllocatedBytes(device_), charged_[device_]);
      EXPECT_EQ(cudaemu::MappedBytes(device_), 0u);
      EXPECT_EQ(cudaemu::PhysicalAllocations(device_), 0u);
    }
  }
}

#endif  // CUDAEMU

}  // namespace
}  // namespace actpack::allocator
