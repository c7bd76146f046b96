// Every allocation a training step's packs make, failed in turn (allocator/
// fault_injection_adaptor.h), on the CPU and on CUDA (a GPU, or the emulator under
// --config=cudaemu): each failure is a clear kResourceExhausted from the call that needed the
// memory, no byte of the pool stays allocated once the step's tensors are dropped, and the steps
// after it pack and decode as a run without the failure does.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/caching_pool.h"
#include "allocator/fault_injection_adaptor.h"
#include "allocator/host_memory_resource.h"
#include "gtest/gtest.h"
#include "runtime/measurement.h"
#include "runtime/session.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>

#include "allocator/cuda_memory_resource.h"
#endif

namespace actpack::runtime {
namespace {

// Memory from a resource, as the plugin's buffers come from torch's allocator.
class ResourceBuffer final : public Buffer {
 public:
  ResourceBuffer(allocator::MemoryResource* resource, void* data, size_t size, void* stream)
      : resource_(resource), data_(static_cast<uint8_t*>(data)), size_(size), stream_(stream) {}
  ~ResourceBuffer() override { resource_->Deallocate(data_, size_, stream_); }
  uint8_t* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  allocator::MemoryResource* resource_;
  uint8_t* data_;
  size_t size_;
  void* stream_;
};

struct Saved {
  std::vector<int64_t> shape;
  codecs::DType dtype;
  const char* producer;
};

// A small step: float activations (a codec's), max_pool2d's int64 indices (bitpack).
std::vector<Saved> Pattern() {
  using codecs::DType;
  return {{{2, 8, 16, 16}, DType::kFloat32, "ConvolutionBackward0"},
          {{2, 8, 8, 16}, DType::kInt64, "MaxPool2DWithIndicesBackward0"},
          {{2, 16, 8, 16}, DType::kFloat32, "NativeBatchNormBackward0"},
          {{2, 16, 8, 16}, DType::kFloat32, "ReluBackward0"}};
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t Bytes(const Saved& saved) { return Numel(saved.shape) * codecs::ElementSize(saved.dtype); }

// Finite values in [-2, 2] (indices below 256 for integers), from `seed`.
std::vector<uint8_t> HostData(const Saved& saved, uint32_t seed) {
  std::vector<uint8_t> host(Bytes(saved));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  for (int64_t i = 0; i < Numel(saved.shape); ++i) {
    if (saved.dtype == codecs::DType::kInt64) {
      const int64_t index = static_cast<int64_t>(rng() % 256);
      std::memcpy(host.data() + 8 * i, &index, 8);
    } else {
      const float v = uniform(rng);
      std::memcpy(host.data() + 4 * i, &v, 4);
    }
  }
  return host;
}

struct Param {
  const char* codec;
  codecs::Device device;
};

class SessionFaultTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    device_ = GetParam().device;
    if (device_ == codecs::Device::kCuda) {
#if ACTPACK_WITH_CUDA
      absl::StatusOr<int> devices = allocator::CudaDeviceCount();
      if (!devices.ok() || *devices == 0) GTEST_SKIP() << "no CUDA device visible";
      cudaStream_t stream = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      stream_ = stream;
#else
      GTEST_SKIP() << "built without CUDA (bazel test --config=cudaemu runs these on the emulator)";
#endif
    }
    const std::vector<Saved> pattern = Pattern();
    for (size_t i = 0; i < pattern.size(); ++i) {
      const Saved& saved = pattern[i];
      host_inputs_.push_back(HostData(saved, static_cast<uint32_t>(i + 1)));
      inputs_.push_back(Memory(Bytes(saved)));
      outputs_.push_back(Memory(Bytes(saved)));
      Upload(inputs_.back(), host_inputs_.back());
    }
  }

  void TearDown() override {
#if ACTPACK_WITH_CUDA
    if (device_ == codecs::Device::kCuda) {
      cudaDeviceSynchronize();
      for (void* p : device_memory_) cudaFree(p);
      if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    }
#endif
  }

  // Memory for inputs and outputs, outside the pool under test.
  void* Memory(size_t bytes) {
    if (device_ == codecs::Device::kCpu) {
      host_memory_.emplace_back(bytes);
      return host_memory_.back().data();
    }
    void* p = nullptr;
#if ACTPACK_WITH_CUDA
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    device_memory_.push_back(p);
#endif
    return p;
  }
  void Upload(void* dst, const std::vector<uint8_t>& host) {
    if (device_ == codecs::Device::kCpu) {
      std::memcpy(dst, host.data(), host.size());
      return;
    }
#if ACTPACK_WITH_CUDA
    ASSERT_EQ(cudaMemcpy(dst, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
#endif
  }
  std::vector<uint8_t> Download(const void* src, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    if (device_ == codecs::Device::kCpu) {
      std::memcpy(host.data(), src, bytes);
      return host;
    }
#if ACTPACK_WITH_CUDA
    EXPECT_EQ(cudaMemcpy(host.data(), src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
#endif
    return host;
  }

  codecs::ExecContext Context() const {
    codecs::ExecContext context;
    context.device = device_;
    context.stream = stream_;
    return context;
  }

  // The stack under test: a caching pool over the device's backend, the faults above it.
  struct Stack {
    std::unique_ptr<allocator::MemoryResource> backend;
    std::unique_ptr<allocator::StreamEvents> events;
    std::unique_ptr<allocator::CachingPool> pool;
    std::unique_ptr<allocator::FaultInjectionAdaptor> faults;
  };
  Stack MakeStack() {
    Stack s;
    if (device_ == codecs::Device::kCpu) {
      s.backend = std::make_unique<allocator::HostMemoryResource>();
      s.events = std::make_unique<allocator::HostStreamEvents>();
    } else {
#if ACTPACK_WITH_CUDA
      s.backend = std::make_unique<allocator::CudaMemoryResource>(0);
      s.events = std::make_unique<allocator::CudaStreamEvents>(0);
#endif
    }
    s.pool = std::make_unique<allocator::CachingPool>(s.backend.get(), s.events.get());
    s.faults = std::make_unique<allocator::FaultInjectionAdaptor>(s.pool.get());
    return s;
  }
  static BufferFactory Factory(allocator::MemoryResource* resource) {
    return [resource](size_t bytes, const codecs::ExecContext& context)
               -> absl::StatusOr<std::unique_ptr<Buffer>> {
      absl::StatusOr<void*> p = resource->Allocate(bytes, context.stream);
      if (!p.ok()) return p.status();
      return std::unique_ptr<Buffer>(new ResourceBuffer(resource, *p, bytes, context.stream));
    };
  }

  // One step: pack in forward order, unpack in reverse, then its end, as autograd and the
  // plugin do. A failed pack ends the forward (autograd drops what it saved and the step
  // raises); a failed unpack ends the backward. Returns the first error; *decoded holds the
  // outputs of a step that completed.
  absl::Status Step(Session& session, std::vector<std::vector<uint8_t>>* decoded) {
    const std::vector<Saved> pattern = Pattern();
    absl::Status first = absl::OkStatus();
    std::vector<std::shared_ptr<PackedTensor>> packed(pattern.size());
    for (size_t i = 0; i < pattern.size() && first.ok(); ++i) {
      SavedTensorInfo info;
      info.shape = pattern[i].shape;
      info.strides.assign(info.shape.size(), 1);
      info.dtype = pattern[i].dtype;
      info.device = device_;
      info.storage = i + 1;
      info.producer = pattern[i].producer;
      info.module = absl::StrCat("block.", i);
      const PackPlan plan = session.Plan(info);
      for (size_t m = 0; m < plan.measure.size(); ++m) {
        session.RecordMeasurement(
            plan.record, m,
            MeasureOnHost({host_inputs_[i].data(), info.dtype, info.shape, codecs::Device::kCpu},
                          Numel(info.shape), plan.measure[m]));
      }
      if (plan.action != PackAction::kPack) continue;
      absl::StatusOr<std::shared_ptr<PackedTensor>> p =
          session.Pack(info, plan, {inputs_[i], info.dtype, info.shape, device_}, Context());
      if (p.ok()) {
        packed[i] = *p;
      } else {
        first = p.status();
      }
    }
    for (size_t i = pattern.size(); first.ok() && i-- > 0;) {
      if (packed[i] == nullptr) continue;
      first = session.Unpack(*packed[i],
                             {outputs_[i], pattern[i].dtype, pattern[i].shape, device_},
                             Context());
      packed[i].reset();
    }
    packed.clear();  // autograd drops the graph, whatever happened
    const absl::Status ended = session.EndStep();
    if (first.ok()) first = ended;
    if (first.ok() && decoded != nullptr) {
      decoded->clear();
      for (size_t i = 0; i < pattern.size(); ++i) {
        decoded->push_back(Download(outputs_[i], Bytes(pattern[i])));
      }
    }
    return first;
  }

  static SessionOptions Options() {
    SessionOptions options;
    options.codec = *ParseCodecChoice(GetParam().codec);
    options.min_bytes = 512;
    return options;
  }

  codecs::Device device_ = codecs::Device::kCpu;
  void* stream_ = nullptr;
  std::vector<std::vector<uint8_t>> host_inputs_;
  std::vector<void*> inputs_, outputs_;
  std::vector<std::vector<uint8_t>> host_memory_;
  std::vector<void*> device_memory_;
};

constexpr int kSteps = 4;  // three profile steps and a steady one

TEST_P(SessionFaultTest, EveryAllocationOfAStepFailsCleanlyAndTheNextStepsWork) {
  // The run without failures: how many allocations its steps make, what the last one decodes,
  // and what the pool holds at the end (the statuses' memory on CUDA).
  std::vector<std::vector<uint8_t>> expected;
  uint64_t allocations = 0;
  size_t held = 0;
  {
    Stack stack = MakeStack();
    Session session(Options(), Factory(stack.faults.get()));
    for (int step = 0; step < kSteps; ++step) {
      ASSERT_TRUE(Step(session, &expected).ok());
    }
    allocations = stack.faults->allocations();
    held = stack.pool->GetUsage().allocated_bytes;
  }
  ASSERT_GT(allocations, static_cast<uint64_t>(kSteps));
  std::printf("%s on %s: %llu allocations over %d steps, each failed in turn\n", GetParam().codec,
              device_ == codecs::Device::kCuda ? "CUDA" : "the CPU",
              static_cast<unsigned long long>(allocations), kSteps);
  for (uint64_t k = 1; k <= allocations; ++k) {
    SCOPED_TRACE(absl::StrCat("failing allocation ", k, " of ", allocations));
    Stack stack = MakeStack();
    Session session(Options(), Factory(stack.faults.get()));
    stack.faults->FailAt(k);
    int failed_steps = 0;
    std::vector<std::vector<uint8_t>> decoded;
    for (int step = 0; step < kSteps + 1; ++step) {
      const absl::Status status = Step(session, &decoded);
      if (status.ok()) continue;
      ++failed_steps;
      EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
      EXPECT_NE(status.message().find("injected failure"), absl::string_view::npos) << status;
    }
    EXPECT_TRUE(stack.faults->failed());
    EXPECT_EQ(failed_steps, 1);
    // Nothing the failed step took is still held: only what a clean run holds at its end, and
    // no status slot.
    EXPECT_EQ(stack.pool->GetUsage().allocated_bytes, held);
    EXPECT_EQ(session.LiveStatusSlots(), 0u);
    // The steps after it decode what a clean run's do (eb, identity and bitpack are
    // deterministic; quant8's draws depend on how many tensors were packed before: within one
    // step of its grid, the group's range (at most 4 here) over 255, the step stored in
    // bfloat16, so up to 2^-7 larger).
    ASSERT_EQ(decoded.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      if (std::string(GetParam().codec) != "quant8" || Pattern()[i].dtype != codecs::DType::kFloat32) {
        EXPECT_EQ(decoded[i], expected[i]) << "tensor " << i;
        continue;
      }
      for (size_t j = 0; j < decoded[i].size(); j += 4) {
        float a, b;
        std::memcpy(&a, decoded[i].data() + j, 4);
        std::memcpy(&b, expected[i].data() + j, 4);
        ASSERT_NEAR(a, b, 4.0f / 255 * (1 + 0x1p-7f)) << "tensor " << i << " element " << j / 4;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Devices, SessionFaultTest,
    ::testing::Values(Param{"eb", codecs::Device::kCpu}, Param{"quant8", codecs::Device::kCpu},
                      Param{"identity", codecs::Device::kCpu}, Param{"eb", codecs::Device::kCuda},
                      Param{"quant8", codecs::Device::kCuda},
                      Param{"identity", codecs::Device::kCuda}),
    [](const ::testing::TestParamInfo<Param>& info) {
      return absl::StrCat(info.param.codec,
                          info.param.device == codecs::Device::kCuda ? "_cuda" : "_cpu");
    });

}  // namespace
}  // namespace actpack::runtime
