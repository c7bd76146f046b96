// Training steps under a budget that binds, on actpack's CUDA allocator stack (the CUDA
// emulator under --config=cudaemu*): every activation, gradient, packed buffer and status comes
// from one budgeted stack, as when actpack's allocator serves torch, and the stack's pressure
// callback re-packs what the plan kept exact, as the plugin's relief does. What a profiler
// would see of such a step is counted: in steady state at the cap, no cudaMalloc, no cudaFree
// and one host wait per step (the session's status read), profile steps included.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/allocator_stack.h"
#include "gtest/gtest.h"
#include "runtime/session.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if defined(CUDAEMU)
#include "cudaemu/control.h"
#endif

namespace actpack::runtime {
namespace {

#if !defined(CUDAEMU)

TEST(SessionCapTest, NeedsTheEmulator) {
  GTEST_SKIP() << "counting a step's CUDA calls needs the CUDA emulator (--config=cudaemu)";
}

#else

// A packed tensor's bytes from the stack, as torch's tensors come from actpack's allocator;
// a shrink is a smaller allocation and a copy on the buffer's stream, as the plugin's is.
class StackBuffer final : public Buffer {
 public:
  StackBuffer(allocator::AllocatorStack* stack, void* data, size_t size, void* stream)
      : stack_(stack), data_(static_cast<uint8_t*>(data)), size_(size), stream_(stream) {}
  ~StackBuffer() override { stack_->Deallocate(data_, size_, stream_); }
  uint8_t* data() override { return data_; }
  size_t size() const override { return size_; }
  absl::Status ShrinkTo(size_t bytes) override {
    if (bytes + bytes / 8 >= size_) return absl::OkStatus();
    absl::StatusOr<void*> smaller = stack_->Allocate(bytes, stream_);
    if (!smaller.ok()) return smaller.status();
    cudaMemcpyAsync(*smaller, data_, bytes, cudaMemcpyDeviceToDevice,
                    static_cast<cudaStream_t>(stream_));
    stack_->Deallocate(data_, size_, stream_);
    data_ = static_cast<uint8_t*>(*smaller);
    size_ = bytes;
    return absl::OkStatus();
  }
  absl::Status RecordStream(void* stream) override {
    return stack_->pool().RecordStream(data_, stream);
  }

 private:
  allocator::AllocatorStack* stack_;
  uint8_t* data_;
  size_t size_;
  void* stream_;
};

// One layer's saved tensor: a float activation of `numel` elements, or max_pool2d's indices.
struct Layer {
  int64_t numel;
  codecs::DType dtype;
  const char* producer;
};

// A CNN-like step: activations of several sizes (blocks of their own segments under a budget,
// and small ones sharing segments), indices for bitpack.
std::vector<Layer> Layers() {
  using codecs::DType;
  return {{512 << 10, DType::kFloat32, "ConvolutionBackward0"},
          {512 << 10, DType::kFloat32, "NativeBatchNormBackward0"},
          {128 << 10, DType::kInt64, "MaxPool2DWithIndicesBackward0"},
          {768 << 10, DType::kFloat32, "ConvolutionBackward0"},
          {768 << 10, DType::kFloat32, "NativeBatchNormBackward0"},
          {256 << 10, DType::kFloat32, "ConvolutionBackward0"},
          {512 << 10, DType::kFloat32, "MmBackward0"},
          {384 << 10, DType::kFloat32, "GeluBackward0"}};
}

size_t BytesOf(const Layer& layer) { return layer.numel * codecs::ElementSize(layer.dtype); }

struct CapCase {
  const char* codec;
  double room;  // the budget beyond the weights and one small segment, as a share of the raw
                // activations
};

class SessionCapTest : public ::testing::TestWithParam<CapCase> {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    allocator::AllocatorConfig config;
    config.backend = allocator::Backend::kCuda;
    config.record_trace = false;
    stack_ = std::make_unique<allocator::AllocatorStack>(allocator::Backend::kCuda, 0, config);
    // Values a codec takes: smooth floats, indices below 4096; in pinned memory, so that
    // copying them in (the test's own work) makes no host wait.
    const std::vector<Layer> layers = Layers();
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& layer = layers[i];
      void* pinned = nullptr;
      ASSERT_EQ(cudaHostAlloc(&pinned, BytesOf(layer), 0), cudaSuccess);
      uint8_t* host = static_cast<uint8_t*>(pinned);
      std::mt19937 rng(static_cast<uint32_t>(i + 1));
      std::normal_distribution<float> noise(0.0f, 1.0f);
      for (int64_t j = 0; j < layer.numel; ++j) {
        if (layer.dtype == codecs::DType::kInt64) {
          const int64_t index = static_cast<int64_t>(rng() % 4096);
          std::memcpy(host + 8 * j, &index, 8);
        } else {
          const float v = std::sin(0.001f * static_cast<float>(j)) + 0.1f * noise(rng);
          std::memcpy(host + 4 * j, &v, 4);
        }
      }
      host_.push_back(host);
    }
  }
  void TearDown() override {
    cudaDeviceSynchronize();
    weights_.reset();
    stack_.reset();
    for (uint8_t* host : host_) cudaFreeHost(host);
    cudaStreamDestroy(stream_);
  }

  BufferFactory Factory() {
    return [this](size_t bytes, const codecs::ExecContext& context)
               -> absl::StatusOr<std::unique_ptr<Buffer>> {
      absl::StatusOr<void*> p = stack_->Allocate(bytes, context.stream);
      if (!p.ok()) return p.status();
      return std::unique_ptr<Buffer>(new StackBuffer(stack_.get(), *p, bytes, context.stream));
    };
  }

  codecs::ExecContext Context() const {
    codecs::ExecContext context;
    context.device = codecs::Device::kCuda;
    context.stream = stream_;
    return context;
  }

  // Device memory of the step from the stack (an activation, a gradient), freed on the stream.
  struct Tensor {
    allocator::AllocatorStack* stack = nullptr;
    void* data = nullptr;
    size_t bytes = 0;
    void* stream = nullptr;
    ~Tensor() {
      if (data != nullptr) stack->Deallocate(data, bytes, stream);
    }
  };
  std::unique_ptr<Tensor> NewTensor(size_t bytes) {
    absl::StatusOr<void*> p = stack_->Allocate(bytes, stream_);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    return std::unique_ptr<Tensor>(new Tensor{stack_.get(), *p, bytes, stream_});
  }

  // The plugin's relief: the rest of the step packs harsh, and tensors the plan kept exact
  // are re-packed with their harshest codec, largest first, until `needed` bytes are free.
  struct Kept {
    std::unique_ptr<Tensor> tensor;
    SavedTensorInfo info;
    int record = -1;
    std::shared_ptr<PackedTensor> packed;
  };
  size_t Relieve(Session& session, size_t needed) {
    session.StartRelief();
    size_t freed = 0;
    for (Kept& kept : kept_) {
      if (freed >= needed || kept.tensor == nullptr) continue;
      const PackPlan plan = session.ReliefPlan(kept.record);
      if (plan.action != PackAction::kPack) continue;
      absl::StatusOr<std::shared_ptr<PackedTensor>> packed = session.Pack(
          kept.info, plan, {kept.tensor->data, kept.info.dtype, kept.info.shape,
                            codecs::Device::kCuda},
          Context());
      if (!packed.ok()) continue;
      kept.packed = *packed;
      freed += kept.tensor->bytes;
      kept.tensor.reset();
    }
    return freed;
  }

  // One step: each layer's activation is made (a copy of its data), saved (planned, measured on
  // profile steps, packed or kept), and dropped once packed; backward unpacks each into a fresh
  // tensor in reverse and drops it; then the step's end. `other` stands for what the step holds
  // besides the saved tensors (weights, gradients, optimizer state).
  absl::Status Step(Session& session) {
    const std::vector<Layer> layers = Layers();
    std::vector<std::shared_ptr<PackedTensor>> packed(layers.size());
    kept_.clear();
    kept_.resize(layers.size());
    absl::Status status = absl::OkStatus();
    for (size_t i = 0; i < layers.size() && status.ok(); ++i) {
      const Layer& layer = layers[i];
      std::unique_ptr<Tensor> activation = NewTensor(BytesOf(layer));
      if (activation == nullptr) return absl::ResourceExhaustedError("activation");
      cudaMemcpyAsync(activation->data, host_[i], BytesOf(layer), cudaMemcpyHostToDevice, stream_);
      SavedTensorInfo info;
      info.shape = {layer.numel};
      info.strides = {1};
      info.dtype = layer.dtype;
      info.device = codecs::Device::kCuda;
      info.storage = i + 1;
      info.version = static_cast<uint32_t>(steps_);
      info.producer = layer.producer;
      info.module = absl::StrCat("layer", i);
      PackPlan plan = session.Plan(info);
      const codecs::TensorView view{activation->data, layer.dtype, info.shape,
                                    codecs::Device::kCuda};
      session.MeasureCandidates(plan, view, Context());
      if (plan.action != PackAction::kPack) {
        kept_[i] = Kept{std::move(activation), info, plan.record, nullptr};
        continue;
      }
      absl::StatusOr<std::shared_ptr<PackedTensor>> p = session.Pack(info, plan, view, Context());
      if (!p.ok()) {
        status = p.status();
        break;
      }
      packed[i] = *p;
    }
    for (size_t i = layers.size(); status.ok() && i-- > 0;) {
      std::shared_ptr<PackedTensor> saved = packed[i] != nullptr ? packed[i] : kept_[i].packed;
      std::unique_ptr<Tensor> gradient = NewTensor(BytesOf(layers[i]));
      if (gradient == nullptr) return absl::ResourceExhaustedError("gradient");
      if (saved != nullptr) {
        std::unique_ptr<Tensor> decoded = NewTensor(BytesOf(layers[i]));
        if (decoded == nullptr) return absl::ResourceExhaustedError("decoded");
        status = session.Unpack(*saved, {decoded->data, layers[i].dtype, {layers[i].numel},
                                         codecs::Device::kCuda},
                                Context());
      }
      packed[i].reset();
      kept_[i] = Kept{};
    }
    packed.clear();
    kept_.clear();
    const allocator::MemoryStats stats = stack_->stats().GetStats();
    const absl::Status ended = session.EndStep(stats.allocated_bytes.peak,
                                               stats.reserved_bytes.peak, 0);
    stack_->stats().ResetPeak();
    ++steps_;
    return status.ok() ? ended : status;
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<allocator::AllocatorStack> stack_;
  std::unique_ptr<Tensor> weights_;  // what the step holds besides its activations
  std::vector<uint8_t*> host_;  // pinned
  std::vector<Kept> kept_;
  int steps_ = 0;
};

TEST_P(SessionCapTest, AtTheCapAStepWaitsOnceAndNeitherMallocsNorFrees) {
  uint64_t raw = 0;
  for (const Layer& layer : Layers()) raw += BytesOf(layer);
  SessionOptions options;
  options.codec = *ParseCodecChoice(GetParam().codec);
  options.min_bytes = 4096;
  options.profile_every = 3;  // a profile step (the fourth) among the counted ones
  // Weights, optimizer state and gradients: 8 MiB held throughout. Beyond them, one small
  // segment (statuses and small buffers share 2 MiB segments) and a share of the activations.
  constexpr uint64_t kWeights = uint64_t{8} << 20, kSmallSegment = uint64_t{2} << 20;
  const uint64_t budget =
      kWeights + kSmallSegment + static_cast<uint64_t>(GetParam().room * static_cast<double>(raw));
  options.budget_bytes = budget;
  stack_->budget().SetBudget(budget);
  weights_ = NewTensor(kWeights);
  ASSERT_NE(weights_, nullptr);
  Session session(options, Factory());
  stack_->budget().AddPressureCallback([&](size_t needed) { return Relieve(session, needed); });
  constexpr int kWarmUp = 2, kCounted = 2;
  std::string counts;
  for (int step = 0; step < kWarmUp + kCounted; ++step) {
    cudaemu::ResetHostCalls();
    const int64_t retries_before = stack_->stats().GetStats().num_alloc_retries;
    const absl::Status status = Step(session);
    ASSERT_TRUE(status.ok()) << "step " << step << ": " << status << counts;
    uint64_t waits = 0, mallocs = 0, frees = 0;
    std::map<std::string, int> waited;
    for (const cudaemu::HostCall& call : cudaemu::HostCalls()) {
      waits += call.waits;
      if (call.waits) ++waited[call.api + " from " + cudaemu::DescribeCaller(call.caller)];
      mallocs += call.api == "cudaMalloc";
      frees += call.api == "cudaFree";
    }
    for (const auto& [what, n] : waited) absl::StrAppend(&counts, " {", what, ": ", n, "}");
    absl::StrAppend(&counts, " [waits ", waits, ", cudaMalloc ", mallocs, ", cudaFree ", frees,
                    ", retries ", stack_->stats().GetStats().num_alloc_retries - retries_before,
                    "]");
    if (step < kWarmUp) continue;
    SCOPED_TRACE(absl::StrCat("step ", step, ":", counts));
    EXPECT_LE(waits, 1u);
    EXPECT_EQ(mallocs, 0u);
    EXPECT_EQ(frees, 0u);
  }
  std::printf("%s at the cap, per step:%s\n", GetParam().codec, counts.c_str());
  const allocator::MemoryStats stats = stack_->stats().GetStats();
  EXPECT_LE(static_cast<uint64_t>(stats.reserved_bytes.peak), budget) << "the cap held";
  EXPECT_GT(stats.num_alloc_retries, 0) << "the cap never bound: the test proves nothing";
  EXPECT_EQ(session.Totals().unpacks, session.Totals().packs);
}

INSTANTIATE_TEST_SUITE_P(Codecs, SessionCapTest,
                         ::testing::Values(CapCase{"auto", 0.8}, CapCase{"quant4", 0.8}),
                         [](const ::testing::TestParamInfo<CapCase>& info) {
                           return std::string(info.param.codec);
                         });

#endif  // CUDAEMU

}  // namespace
}  // namespace actpack::runtime
