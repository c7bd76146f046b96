// The session with CUDA tensors, on actpack's own caching pool over the CUDA backend (a GPU, or
// the CUDA emulator under --config=cudaemu, whose streams lag until something waits for them).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "allocator/budget_adaptor.h"
#include "allocator/caching_pool.h"
#include "allocator/cuda_memory_resource.h"
#include "codecs/registry.h"
#include "gtest/gtest.h"
#include "runtime/measurement.h"
#include "runtime/session.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if defined(CUDAEMU)
#include "cudaemu/control.h"
#endif

namespace actpack::runtime {
namespace {

#if !ACTPACK_WITH_CUDA

TEST(SessionCudaTest, NeedsCuda) {
  GTEST_SKIP() << "built without CUDA (bazel test --config=cudaemu runs these on the emulator)";
}

#else

// Device memory from the pool, on the stream it was allocated on, as torch's allocator hands
// out the plugin's buffers. A shrink is what the plugin's is: a smaller allocation on the
// buffer's stream and a copy queued there. Allocating checks that the session holds no lock
// (an allocation at a budget's cap runs its pressure callbacks on this thread).
class PoolBuffer final : public Buffer {
 public:
  // Allocates and frees through `memory` (the pool, or an adaptor over it).
  PoolBuffer(allocator::MemoryResource* memory, allocator::CachingPool* pool, void* data,
             size_t size, void* stream)
      : memory_(memory), pool_(pool), data_(static_cast<uint8_t*>(data)), size_(size),
        stream_(stream) {}
  ~PoolBuffer() override { memory_->Deallocate(data_, size_, stream_); }
  uint8_t* data() override { return data_; }
  size_t size() const override { return size_; }
  absl::Status ShrinkTo(size_t bytes) override {
    CheckNoneHeld("a test buffer's shrink allocates");
    absl::StatusOr<void*> smaller = memory_->Allocate(bytes, stream_);
    if (!smaller.ok()) return smaller.status();
    if (cudaMemcpyAsync(*smaller, data_, bytes, cudaMemcpyDeviceToDevice,
                        static_cast<cudaStream_t>(stream_)) != cudaSuccess) {
      memory_->Deallocate(*smaller, bytes, stream_);
      return absl::InternalError("cudaMemcpyAsync");
    }
    memory_->Deallocate(data_, size_, stream_);
    data_ = static_cast<uint8_t*>(*smaller);
    size_ = bytes;
    return absl::OkStatus();
  }
  absl::Status RecordStream(void* stream) override { return pool_->RecordStream(data_, stream); }

 private:
  allocator::MemoryResource* memory_;
  allocator::CachingPool* pool_;
  uint8_t* data_;
  size_t size_;
  void* stream_;
};

// Scratch (codec counters) from the same pool.
class PoolScratch final : public codecs::ScratchAllocator {
 public:
  explicit PoolScratch(allocator::CachingPool* pool) : pool_(pool) {}
  absl::StatusOr<void*> Allocate(size_t bytes, void* stream) override {
    return pool_->Allocate(bytes, stream);
  }
  void Deallocate(void* ptr, size_t bytes, void* stream) override {
    pool_->Deallocate(ptr, bytes, stream);
  }

 private:
  allocator::CachingPool* pool_;
};

class SessionCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> devices = allocator::CudaDeviceCount();
    if (!devices.ok() || *devices == 0) GTEST_SKIP() << "no CUDA device visible";
    ASSERT_EQ(cudaStreamCreateWithFlags(&pack_stream_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&unpack_stream_, cudaStreamNonBlocking), cudaSuccess);
    device_ = std::make_unique<allocator::CudaMemoryResource>(0);
    events_ = std::make_unique<allocator::CudaStreamEvents>(0);
    pool_ = std::make_unique<allocator::CachingPool>(device_.get(), events_.get());
    scratch_ = std::make_unique<PoolScratch>(pool_.get());
  }
  void TearDown() override {
    if (pool_ == nullptr) return;
    cudaDeviceSynchronize();
    pool_.reset();
    cudaStreamDestroy(pack_stream_);
    cudaStreamDestroy(unpack_stream_);
  }

  // Buffers from `memory` (the pool when null).
  BufferFactory Factory(allocator::MemoryResource* memory = nullptr) {
    return [this, memory](size_t bytes, const codecs::ExecContext& context)
               -> absl::StatusOr<std::unique_ptr<Buffer>> {
      CheckNoneHeld("a test buffer allocates");
      allocator::MemoryResource* from = memory != nullptr ? memory : pool_.get();
      absl::StatusOr<void*> p = from->Allocate(bytes, context.stream);
      if (!p.ok()) return p.status();
      return std::unique_ptr<Buffer>(
          new PoolBuffer(from, pool_.get(), *p, bytes, context.stream));
    };
  }

  codecs::ExecContext On(cudaStream_t stream) {
    codecs::ExecContext context;
    context.device = codecs::Device::kCuda;
    context.stream = stream;
    context.scratch = scratch_.get();
    return context;
  }

  // A [rows, cols] float tensor on the device, filled with `value` plus a little noise.
  void* DeviceTensor(int64_t numel, float value, uint32_t seed) {
    std::vector<float> host(numel);
    std::mt19937 rng(seed);
    std::normal_distribution<float> noise(0.0f, 0.01f);
    for (float& v : host) v = value + noise(rng);
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, numel * 4), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data(), numel * 4, cudaMemcpyHostToDevice), cudaSuccess);
    live_.push_back(p);
    return p;
  }

  std::vector<void*> live_;
  cudaStream_t pack_stream_ = nullptr, unpack_stream_ = nullptr;
  std::unique_ptr<allocator::CudaMemoryResource> device_;
  std::unique_ptr<allocator::CudaStreamEvents> events_;
  std::unique_ptr<allocator::CachingPool> pool_;
  std::unique_ptr<PoolScratch> scratch_;
};

SavedTensorInfo Info(int64_t rows, int64_t cols, uintptr_t storage) {
  SavedTensorInfo info;
  info.shape = {rows, cols};
  info.strides = {cols, 1};
  info.storage = storage;
  info.device = codecs::Device::kCuda;
  info.producer = "MmBackward0";
  return info;
}

// Backward often runs on another stream than forward. A packed buffer read on that stream must
// not be handed out again before the read has run: here the next pack (on the forward stream)
// would take the block at once and overwrite it while the decode still waits in its queue.
TEST_F(SessionCudaTest, AnUnpackOnAnotherStreamKeepsTheBufferUntilItHasRun) {
  SessionOptions options;
  options.codec = *ParseCodecChoice("quant8");
  options.min_bytes = 1024;
  Session session(options, Factory());
  const int64_t rows = 64, cols = 256, numel = rows * cols;

  void* first = DeviceTensor(numel, 1.0f, 1);
  SavedTensorInfo info = Info(rows, cols, 1);
  PackPlan plan = session.Plan(info);
  ASSERT_EQ(plan.action, PackAction::kPack);
  absl::StatusOr<std::shared_ptr<PackedTensor>> packed =
      session.Pack(info, plan, {first, codecs::DType::kFloat32, {rows, cols}, codecs::Device::kCuda},
                   On(pack_stream_));
  ASSERT_TRUE(packed.ok()) << packed.status();

  void* output = nullptr;
  ASSERT_EQ(cudaMalloc(&output, numel * 4), cudaSuccess);
  live_.push_back(output);
  ASSERT_TRUE(session
                  .Unpack(**packed, {output, codecs::DType::kFloat32, {rows, cols},
                                     codecs::Device::kCuda},
                          On(unpack_stream_))
                  .ok());
  packed->reset();  // autograd drops the handle once backward has it

  // Forward of the next step packs a tensor of the same size on the forward stream.
  void* second = DeviceTensor(numel, -5.0f, 2);
  SavedTensorInfo next = Info(rows, cols, 2);
  PackPlan next_plan = session.Plan(next);
  absl::StatusOr<std::shared_ptr<PackedTensor>> again = session.Pack(
      next, next_plan, {second, codecs::DType::kFloat32, {rows, cols}, codecs::Device::kCuda},
      On(pack_stream_));
  ASSERT_TRUE(again.ok()) << again.status();

  ASSERT_EQ(cudaStreamSynchronize(unpack_stream_), cudaSuccess);
  std::vector<float> decoded(numel);
  ASSERT_EQ(cudaMemcpy(decoded.data(), output, numel * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < numel; i += 97) {
    ASSERT_NEAR(decoded[i], 1.0f, 0.05f) << "element " << i << ": the decode read another tensor";
  }
  again->reset();
  for (void* p : live_) cudaFree(p);
}

// What a user sees of a buffer corrupted in device memory while it waited for backward: the
// gradient input is NaN (never garbage), and the step's end raises naming the saved tensor and
// its module.
TEST_F(SessionCudaTest, ACorruptedBufferDecodesAsNaNAndTheStepSaysWhich) {
  SessionOptions options;
  options.codec = *ParseCodecChoice("quant4");
  options.min_bytes = 1024;
  Session session(options, Factory());
  const int64_t rows = 32, cols = 256, numel = rows * cols;
  void* input = DeviceTensor(numel, 0.5f, 3);
  SavedTensorInfo info = Info(rows, cols, 1);
  info.module = "encoder.layers.3.mlp";
  const PackPlan plan = session.Plan(info);
  absl::StatusOr<std::shared_ptr<PackedTensor>> packed = session.Pack(
      info, plan, {input, codecs::DType::kFloat32, {rows, cols}, codecs::Device::kCuda},
      On(pack_stream_));
  ASSERT_TRUE(packed.ok()) << packed.status();
  ASSERT_EQ(cudaStreamSynchronize(pack_stream_), cudaSuccess);
  // One payload byte changes (a stray write into the pool's memory).
  uint8_t byte = 0;
  uint8_t* at = const_cast<uint8_t*>((*packed)->data()) + codecs::kHeaderSize + 100;
  ASSERT_EQ(cudaMemcpy(&byte, at, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  byte ^= 0x40;
  ASSERT_EQ(cudaMemcpy(at, &byte, 1, cudaMemcpyHostToDevice), cudaSuccess);

  void* output = DeviceTensor(numel, 0.0f, 4);
  ASSERT_TRUE(session
                  .Unpack(**packed, {output, codecs::DType::kFloat32, {rows, cols},
                                     codecs::Device::kCuda},
                          On(pack_stream_))
                  .ok());
  const absl::Status ended = session.EndStep();
  EXPECT_EQ(ended.code(), absl::StatusCode::kDataLoss) << ended;
  EXPECT_NE(ended.message().find("encoder.layers.3.mlp"), absl::string_view::npos) << ended;
  EXPECT_NE(ended.message().find("checksum"), absl::string_view::npos) << ended;
  std::vector<float> decoded(numel);
  ASSERT_EQ(cudaMemcpy(decoded.data(), output, numel * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < numel; ++i) ASSERT_TRUE(std::isnan(decoded[i])) << "element " << i;
  packed->reset();
}

// A non-finite activation under a codec that cannot hold it: on the GPU the session does not
// wait to find out, so the decode writes NaN (the step's gradients are not finite, and
// GradScaler skips it as it would in plain training); the step's end flags the tensor, and from
// the next step on it is kept exact.
TEST_F(SessionCudaTest, ANonFiniteActivationDecodesAsNaNOnceAndIsKeptExactAfter) {
  SessionOptions options;
  options.codec = *ParseCodecChoice("quant2");
  options.min_bytes = 1024;
  Session session(options, Factory());
  const int64_t rows = 16, cols = 256, numel = rows * cols;
  void* input = DeviceTensor(numel, 1.0f, 5);
  const float inf = std::numeric_limits<float>::infinity();
  ASSERT_EQ(cudaMemcpy(static_cast<float*>(input) + 1000, &inf, 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  void* output = DeviceTensor(numel, 0.0f, 6);
  for (int step = 0; step < 2; ++step) {
    SavedTensorInfo info = Info(rows, cols, 1);
    info.module = "head";
    const PackPlan plan = session.Plan(info);
    if (step == 1) {
      EXPECT_EQ(plan.action, PackAction::kKeep);
      EXPECT_EQ(plan.reason, KeepReason::kNonFiniteOnDevice);
      break;
    }
    ASSERT_EQ(plan.action, PackAction::kPack);
    absl::StatusOr<std::shared_ptr<PackedTensor>> packed = session.Pack(
        info, plan, {input, codecs::DType::kFloat32, {rows, cols}, codecs::Device::kCuda},
        On(pack_stream_));
    ASSERT_TRUE(packed.ok()) << packed.status();
    ASSERT_TRUE(session
                    .Unpack(**packed, {output, codecs::DType::kFloat32, {rows, cols},
                                       codecs::Device::kCuda},
                            On(pack_stream_))
                    .ok());
    packed->reset();
    ASSERT_TRUE(session.EndStep().ok());
    std::vector<float> decoded(numel);
    ASSERT_EQ(cudaMemcpy(decoded.data(), output, numel * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < numel; ++i) ASSERT_TRUE(std::isnan(decoded[i])) << "element " << i;
    const SavedRecord record = session.Records().front();
    EXPECT_EQ(record.reason, KeepReason::kNonFiniteOnDevice) << record.note;
    EXPECT_EQ(session.Totals().exact_fallbacks, 1u);
  }
}

// A tensor saved twice (dedup) and read by two backward streams at once: each decode checks
// the buffer in a status of its own. Sharing the encode's, the two checks summed their
// payloads into one slot and each saw a checksum mismatch: NaN for a buffer nothing corrupted.
TEST_F(SessionCudaTest, ATensorDecodedOnTwoStreamsAtOnceDecodesRightOnBoth) {
#if !defined(CUDAEMU)
  GTEST_SKIP() << "interleaving two streams' work needs the CUDA emulator";
#else
  SessionOptions options;
  options.codec = *ParseCodecChoice("quant8");
  options.min_bytes = 1024;
  Session session(options, Factory());
  const int64_t rows = 32, cols = 256, numel = rows * cols;
  void* input = DeviceTensor(numel, 0.5f, 11);
  SavedTensorInfo info = Info(rows, cols, 1);
  const PackPlan plan = session.Plan(info);
  absl::StatusOr<std::shared_ptr<PackedTensor>> packed = session.Pack(
      info, plan, {input, codecs::DType::kFloat32, {rows, cols}, codecs::Device::kCuda},
      On(pack_stream_));
  ASSERT_TRUE(packed.ok()) << packed.status();
  ASSERT_EQ(cudaStreamSynchronize(pack_stream_), cudaSuccess);
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  void* out_a = DeviceTensor(numel, 0.0f, 12);
  void* out_b = DeviceTensor(numel, 0.0f, 13);
  const codecs::DType f32 = codecs::DType::kFloat32;
  ASSERT_TRUE(session.Unpack(**packed, {out_a, f32, {rows, cols}, codecs::Device::kCuda},
                             On(unpack_stream_)).ok());
  ASSERT_TRUE(session.Unpack(**packed, {out_b, f32, {rows, cols}, codecs::Device::kCuda},
                             On(other)).ok());
  // The two decodes' operations in turns: each check's sum lands between the other's.
  for (bool ran = true; ran;) {
    const bool a = cudaemu::RunOne(unpack_stream_);
    const bool b = cudaemu::RunOne(other);
    ran = a || b;
  }
  ASSERT_TRUE(session.EndStep().ok());
  for (void* out : {out_a, out_b}) {
    std::vector<float> decoded(numel);
    ASSERT_EQ(cudaMemcpy(decoded.data(), out, numel * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < numel; ++i) {
      ASSERT_NEAR(decoded[i], 0.5f, 0.05f) << "element " << i << " of the " <<
          (out == out_a ? "first" : "second") << " decode";
    }
  }
  packed->reset();
  cudaStreamDestroy(other);
  for (void* p : live_) cudaFree(p);
#endif
}

// An eb buffer shrinks to its encoding once the host sees the size, and that copy is an
// allocation: at the budget's cap it runs the pressure callbacks, which take the session's
// lock. The shrink runs with no lock held, so the callback gets in (and the buffer stays at
// its bound when nothing could be freed). Shrinking under the lock, this test stops in the
// buffer's lock check (or, without it, waits for itself forever).
TEST_F(SessionCudaTest, PressureFromAShrinkAtTheCapReachesTheSession) {
  allocator::BudgetAdaptor budget(pool_.get(), allocator::kNoCap);
  SessionOptions options;
  options.codec = *ParseCodecChoice("eb");
  options.min_bytes = 1024;
  Session session(options, Factory(&budget));
  int pressure_calls = 0;
  budget.AddPressureCallback([&](size_t) {
    session.StartRelief();
    ++pressure_calls;
    return size_t{0};
  });
  // 16 MiB of smooth data: eb's encoding is a few MiB, a block of the large pool.
  const int64_t rows = 1024, cols = 4096, numel = rows * cols;
  void* input = DeviceTensor(numel, 1.0f, 21);
  SavedTensorInfo info = Info(rows, cols, 1);
  const PackPlan plan = session.Plan(info);
  absl::StatusOr<std::shared_ptr<PackedTensor>> packed = session.Pack(
      info, plan, {input, codecs::DType::kFloat32, {rows, cols}, codecs::Device::kCuda},
      On(pack_stream_));
  ASSERT_TRUE(packed.ok()) << packed.status();
  const size_t bound = (*packed)->stored_bytes();
  ASSERT_EQ(cudaStreamSynchronize(pack_stream_), cudaSuccess);  // its size reached the host
  budget.SetBudget(pool_->GetUsage().reserved_bytes);  // no room for another segment
  void* output = DeviceTensor(numel, 0.0f, 22);
  ASSERT_TRUE(session.Unpack(**packed, {output, codecs::DType::kFloat32, {rows, cols},
                                        codecs::Device::kCuda},
                             On(pack_stream_)).ok());
  EXPECT_GE(pressure_calls, 1);
  EXPECT_EQ(session.Policy().pressure_events, 1u);
  EXPECT_EQ((*packed)->stored_bytes(), bound) << "no room for the smaller copy: kept as it was";
  ASSERT_TRUE(session.EndStep().ok());
  std::vector<float> decoded(numel);
  ASSERT_EQ(cudaMemcpy(decoded.data(), output, numel * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < numel; i += 101) ASSERT_NEAR(decoded[i], 1.0f, 0.05f) << i;
  // With room again the next resolve shrinks it.
  packed->reset();
  for (void* p : live_) cudaFree(p);
}

// A profile step's sample of a CUDA tensor is measured from one queued copy into pinned
// memory, after the step's status read: the same numbers the host measures on the same data,
// and the plan of the step it was taken in stands.
TEST_F(SessionCudaTest, AProfileSampleIsMeasuredAtTheStepsEndAsTheHostWould) {
  SessionOptions options;
  options.codec = *ParseCodecChoice("auto");
  options.min_bytes = 1024;
  options.budget_bytes = 1 << 20;
  options.max_rel_rms = 0.0;
  Session session(options, Factory());
  const int64_t rows = 64, cols = 256, numel = rows * cols;
  std::vector<float> host(numel);
  std::mt19937 rng(31);
  std::normal_distribution<float> normal;
  for (float& v : host) v = normal(rng);
  void* input = nullptr;
  ASSERT_EQ(cudaMalloc(&input, numel * 4), cudaSuccess);
  live_.push_back(input);
  ASSERT_EQ(cudaMemcpy(input, host.data(), numel * 4, cudaMemcpyHostToDevice), cudaSuccess);
  SavedTensorInfo info = Info(rows, cols, 1);
  PackPlan plan = session.Plan(info);
  ASSERT_FALSE(plan.measure.empty());
  const PackPlan before = plan;
  const codecs::TensorView device{input, codecs::DType::kFloat32, {rows, cols},
                                  codecs::Device::kCuda};
  session.MeasureCandidates(plan, device, On(pack_stream_));
  EXPECT_EQ(codecs::FormatCodecSpec(plan.params), codecs::FormatCodecSpec(before.params))
      << "a device sample is measured later: the step packs as planned";
  const std::vector<SavedRecord> planned = session.Records();
  for (const PolicyCandidate& c : planned.front().candidates) {
    if (c.spec != kNotPacked) EXPECT_FALSE(std::isfinite(c.error)) << c.spec << " measured early";
  }
  absl::StatusOr<std::shared_ptr<PackedTensor>> packed =
      session.Pack(info, plan, device, On(pack_stream_));
  ASSERT_TRUE(packed.ok()) << packed.status();
  ASSERT_TRUE(session.EndStep().ok());
  const SavedRecord record = session.Records().front();
  const codecs::TensorView on_host{host.data(), codecs::DType::kFloat32, {rows, cols},
                                   codecs::Device::kCpu};
  for (size_t i = 0; i < plan.measure.size(); ++i) {
    const CodecMeasurement expected = MeasureOnHost(SampleOf(on_host), numel, plan.measure[i]);
    EXPECT_EQ(record.candidates[i + 1].bytes, expected.bytes) << record.candidates[i + 1].spec;
    EXPECT_EQ(record.candidates[i + 1].error, expected.RelativeError())
        << record.candidates[i + 1].spec;
  }
  packed->reset();
}

// eb's and bitpack's sizes are decided on the device. A record's first encoding gets room for
// its bound; from its second on, a buffer of the last one's size and an eighth, so that at the
// forward's peak (the host far ahead of the device, nothing resolved) it holds about its
// encoding, not its bound. Decodes read it before and after the host has seen where it went.
class SizedOnDeviceTest : public SessionCudaTest,
                          public ::testing::WithParamInterface<const char*> {
 protected:
  // A float32 tensor for eb (smooth, or noisy: a larger encoding), int64 indices below
  // `range` for bitpack.
  void* Data(int64_t numel, bool noisy, uint32_t seed, int64_t range = 4096) {
    const bool indices = std::string(GetParam()) == "bitpack";
    std::vector<uint8_t> host(numel * (indices ? 8 : 4));
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < numel; ++i) {
      if (indices) {
        const int64_t v = static_cast<int64_t>(rng() % static_cast<uint64_t>(range));
        std::memcpy(host.data() + 8 * i, &v, 8);
      } else {
        const float v = std::sin(0.01f * static_cast<float>(i)) + (noisy ? normal(rng) : 0.0f);
        std::memcpy(host.data() + 4 * i, &v, 4);
      }
    }
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, host.size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    live_.push_back(p);
    return p;
  }
  codecs::DType DType() const {
    return std::string(GetParam()) == "bitpack" ? codecs::DType::kInt64 : codecs::DType::kFloat32;
  }
  SavedTensorInfo InfoOf(int64_t numel, uintptr_t storage) {
    SavedTensorInfo info = Info(1, numel, storage);
    info.shape = {numel};
    info.strides = {1};
    info.dtype = DType();
    info.producer = std::string(GetParam()) == "bitpack" ? "MaxPool2DWithIndicesBackward0"
                                                         : "MmBackward0";
    return info;
  }
  std::unique_ptr<Session> MakeSession() {
    SessionOptions options;
    options.codec = *ParseCodecChoice(std::string(GetParam()) == "bitpack" ? "quant8" : "eb");
    options.min_bytes = 1024;
    options.profile_every = 1000;
    return std::make_unique<Session>(options, Factory());
  }
  // What the CPU decodes from the same data: the reference a device decode must equal.
  std::vector<uint8_t> Expected(void* data, int64_t numel) {
    const size_t bytes = numel * codecs::ElementSize(DType());
    std::vector<uint8_t> host(bytes), decoded(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), data, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    codecs::CodecParams params = *codecs::ParseCodecSpec(
        std::string(GetParam()) == "bitpack" ? "bitpack" : "eb");
    const codecs::TensorView view{host.data(), DType(), {numel}, codecs::Device::kCpu};
    std::vector<uint8_t> encoded(*codecs::MaxEncodedSize(view.Spec(), params));
    absl::StatusOr<size_t> used = codecs::Encode(view, params, encoded.data(), encoded.size(), {});
    EXPECT_TRUE(used.ok()) << used.status();
    EXPECT_TRUE(codecs::Decode(encoded.data(), *used,
                               {decoded.data(), DType(), {numel}, codecs::Device::kCpu}, {})
                    .ok());
    return decoded;
  }
  // Packs `data`, optionally lets the host see its size, unpacks and returns the output.
  std::vector<uint8_t> RoundTrip(Session& session, void* data, int64_t numel, uintptr_t storage,
                                 uint64_t* stored, bool settle = false) {
    const SavedTensorInfo info = InfoOf(numel, storage);
    const PackPlan plan = session.Plan(info);
    EXPECT_EQ(plan.action, PackAction::kPack);
    absl::StatusOr<std::shared_ptr<PackedTensor>> packed =
        session.Pack(info, plan, {data, DType(), {numel}, codecs::Device::kCuda}, On(pack_stream_));
    EXPECT_TRUE(packed.ok()) << packed.status();
    if (!packed.ok()) return {};
    *stored = (*packed)->stored_bytes();
    if (settle) EXPECT_EQ(cudaStreamSynchronize(pack_stream_), cudaSuccess);
    const size_t bytes = numel * codecs::ElementSize(DType());
    void* output = nullptr;
    EXPECT_EQ(cudaMalloc(&output, bytes), cudaSuccess);
    live_.push_back(output);
    EXPECT_TRUE(session.Unpack(**packed, {output, DType(), {numel}, codecs::Device::kCuda},
                               On(unpack_stream_)).ok());
    packed->reset();
    EXPECT_EQ(cudaStreamSynchronize(unpack_stream_), cudaSuccess);
    std::vector<uint8_t> decoded(bytes);
    EXPECT_EQ(cudaMemcpy(decoded.data(), output, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return decoded;
  }
};

TEST_P(SizedOnDeviceTest, FromItsSecondStepARecordHoldsItsLastSizeNotItsBound) {
  const int64_t numel = 1 << 16;
  auto session = MakeSession();
  void* data = Data(numel, /*noisy=*/false, 41);
  const std::vector<uint8_t> expected = Expected(data, numel);
  uint64_t first = 0, second = 0, third = 0;
  EXPECT_EQ(RoundTrip(*session, data, numel, 1, &first), expected);
  ASSERT_TRUE(session->EndStep().ok());
  const uint64_t encoded = session->Records().front().sized_bytes;
  ASSERT_GT(encoded, 0u) << "the host resolved its size at the step's end";
  ASSERT_LT(encoded, first);
  // The host sees nothing before the decodes: packed and unpacked as at a forward's peak.
  EXPECT_EQ(RoundTrip(*session, data, numel, 1, &second), expected);
  EXPECT_LE(second, (encoded + encoded / 8 + 255) / 256 * 256);
  EXPECT_LT(second, first);
  ASSERT_TRUE(session->EndStep().ok());
  // Resolved before its decode: read where it was put.
  EXPECT_EQ(RoundTrip(*session, data, numel, 1, &third, /*settle=*/true), expected);
  EXPECT_EQ(third, second);
  ASSERT_TRUE(session->EndStep().ok());
  for (void* p : live_) cudaFree(p);
}

// An encoding larger than its last one by more than the eighth goes to the step's spill room
// and decodes from there; the step's end moves it out if it still lives.
TEST_P(SizedOnDeviceTest, AnEncodingThatOutgrowsItsBufferSpillsAndDecodesRight) {
  const int64_t numel = 1 << 16;
  auto session = MakeSession();
  void* small = Data(numel, /*noisy=*/false, 51, 16);
  void* large = Data(numel, /*noisy=*/true, 52, 1 << 20);
  uint64_t stored = 0;
  RoundTrip(*session, small, numel, 1, &stored);
  ASSERT_TRUE(session->EndStep().ok());
  const std::vector<uint8_t> expected = Expected(large, numel);
  EXPECT_EQ(RoundTrip(*session, large, numel, 1, &stored), expected);
  ASSERT_TRUE(session->EndStep().ok());
  // Its record learned the larger size: the next one fits its buffer again.
  EXPECT_EQ(RoundTrip(*session, large, numel, 1, &stored), expected);
  ASSERT_TRUE(session->EndStep().ok());
  for (void* p : live_) cudaFree(p);
}

// Two encodings outgrow their buffers in one step and the spill room holds neither: each
// decodes as NaN (zeros for integers), the step's end says which tensor and why, and from
// then on their records get room for their bound again.
TEST_P(SizedOnDeviceTest, WhatFitsNowhereDecodesAsNaNAndTheStepSaysSo) {
  // Small encodings first, so that the spill room is the minimum (1 MiB); then two tensors
  // whose encodings are larger than that.
  const int64_t numel = std::string(GetParam()) == "bitpack" ? 1 << 18 : 1 << 20;
  auto session = MakeSession();
  void* small = Data(numel, /*noisy=*/false, 61, 16);
  void* large = Data(numel, /*noisy=*/true, 62, int64_t{1} << 40);
  uint64_t stored = 0;
  for (uintptr_t storage : {1, 2}) RoundTrip(*session, small, numel, storage, &stored);
  ASSERT_TRUE(session->EndStep().ok());
  RoundTrip(*session, large, numel, 1, &stored);
  // The second cannot have found room, whatever the first did.
  const std::vector<uint8_t> out = RoundTrip(*session, large, numel, 2, &stored);
  const absl::Status ended = session->EndStep();
  EXPECT_EQ(ended.code(), absl::StatusCode::kDataLoss) << ended;
  EXPECT_NE(ended.message().find("outgrew"), absl::string_view::npos) << ended;
  if (DType() == codecs::DType::kFloat32) {
    float v;
    std::memcpy(&v, out.data(), 4);
    EXPECT_TRUE(std::isnan(v));
  } else {
    EXPECT_EQ(out, std::vector<uint8_t>(out.size(), 0));
  }
  const std::vector<uint8_t> expected = Expected(large, numel);
  EXPECT_EQ(RoundTrip(*session, large, numel, 1, &stored), expected);
  ASSERT_TRUE(session->EndStep().ok());
  for (void* p : live_) cudaFree(p);
}

INSTANTIATE_TEST_SUITE_P(Codecs, SizedOnDeviceTest, ::testing::Values("eb", "bitpack"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// ---- the host's waits in a training step's pattern of packs and unpacks ----

// One tensor autograd saves: its shape, dtype and producer.
struct Saved {
  std::vector<int64_t> shape;
  codecs::DType dtype;
  const char* producer;
};

// A step's saved tensors, in forward order, shaped like a ResNet's stage (float32 activations
// and batch-norm inputs, max_pool2d's int64 indices) or a GPT block's (float16 and bfloat16
// activations, dropout's bool masks, attention probabilities).
std::vector<Saved> ResNetPattern() {
  using codecs::DType;
  return {{{2, 8, 16, 16}, DType::kFloat32, "ConvolutionBackward0"},
          {{2, 8, 16, 16}, DType::kFloat32, "NativeBatchNormBackward0"},
          {{2, 8, 16, 16}, DType::kFloat32, "ReluBackward0"},
          {{2, 8, 8, 16}, DType::kInt64, "MaxPool2DWithIndicesBackward0"},
          {{2, 16, 8, 16}, DType::kFloat32, "ConvolutionBackward0"},
          {{2, 16, 8, 16}, DType::kFloat32, "NativeBatchNormBackward0"},
          {{2, 16, 8, 16}, DType::kFloat32, "ReluBackward0"}};
}
std::vector<Saved> GptPattern() {
  using codecs::DType;
  return {{{2, 32, 64}, DType::kFloat32, "NativeLayerNormBackward0"},
          {{2, 32, 64}, DType::kFloat16, "MmBackward0"},
          {{2, 2, 32, 32}, DType::kBFloat16, "SoftmaxBackward0"},
          {{2, 2, 32, 32}, DType::kBool, "NativeDropoutBackward0"},
          {{2, 32, 256}, DType::kFloat16, "GeluBackward0"},
          {{2, 32, 64}, DType::kBool, "NativeDropoutBackward0"}};
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

struct StepWaits {
  uint64_t profile = 0, pack = 0, unpack = 0, end = 0, mallocs = 0;
};

class SessionWaitTest : public SessionCudaTest,
                        public ::testing::WithParamInterface<std::tuple<const char*, bool>> {
 protected:
  // A device tensor of `saved` with values a codec takes (finite, in [-2, 2]; 0/1 for bool;
  // indices below 256 for integers), from `seed`.
  void* Fill(const Saved& saved, uint32_t seed) {
    const int64_t numel = Numel(saved.shape);
    const size_t width = codecs::ElementSize(saved.dtype);
    std::vector<uint8_t> host(numel * width);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
    for (int64_t i = 0; i < numel; ++i) {
      const float v = uniform(rng);
      uint8_t* at = host.data() + i * width;
      switch (saved.dtype) {
        case codecs::DType::kBool: *at = v > 0; break;
        case codecs::DType::kInt64: {
          const int64_t index = static_cast<int64_t>(rng() % 256);
          std::memcpy(at, &index, 8);
          break;
        }
        case codecs::DType::kFloat32: std::memcpy(at, &v, 4); break;
        default: {  // float16 / bfloat16: the top half of a float is a bfloat16; 0x3c00 is 1.0
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          const uint16_t half = saved.dtype == codecs::DType::kBFloat16
                                    ? static_cast<uint16_t>(bits >> 16)
                                    : static_cast<uint16_t>(0x3800 + (rng() % 0x800));
          std::memcpy(at, &half, 2);
        }
      }
    }
    void* p = DeviceTensor(static_cast<int64_t>((host.size() + 3) / 4), 0.0f, 0);
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    return p;
  }

  // What the plugin does at a profile step: the session measures the candidates from a
  // sample it stages itself.
  void Measure(Session& session, PackPlan& plan, const Saved& saved, void* data) {
    session.MeasureCandidates(plan, {data, saved.dtype, saved.shape, codecs::Device::kCuda},
                              On(pack_stream_));
  }

  // Runs `steps` steps of `pattern`: packs in forward order, unpacks in reverse (backward),
  // then the step's end, reporting a peak of `other` bytes plus what the packs held; returns
  // each step's waits, by where they were made. eb's unpacks may wait (once a step).
  std::vector<StepWaits> Run(Session& session, const std::vector<Saved>& pattern, int steps,
                             uint64_t other, bool eb) {
    std::vector<StepWaits> waits;
#if defined(CUDAEMU)
    std::vector<void*> inputs;
    for (size_t i = 0; i < pattern.size(); ++i) inputs.push_back(Fill(pattern[i], i + 1));
    std::vector<void*> outputs;
    for (const Saved& saved : pattern) {
      outputs.push_back(DeviceTensor(
          (Numel(saved.shape) * codecs::ElementSize(saved.dtype) + 3) / 4, 0.0f, 0));
    }
    for (int step = 0; step < steps; ++step) {
      cudaemu::ResetHostCalls();
      std::vector<std::shared_ptr<PackedTensor>> packed(pattern.size());
      for (size_t i = 0; i < pattern.size(); ++i) {
        const Saved& saved = pattern[i];
        SavedTensorInfo info = Info(1, Numel(saved.shape), i + 1);
        info.shape = saved.shape;
        info.strides.assign(saved.shape.size(), 1);
        info.dtype = saved.dtype;
        info.producer = saved.producer;
        info.module = "block." + std::to_string(i);
        PackPlan plan = session.Plan(info);
        {
          cudaemu::RegionScope region("profile");
          Measure(session, plan, saved, inputs[i]);
        }
        if (plan.action != PackAction::kPack) continue;
        cudaemu::RegionScope region("pack");
        absl::StatusOr<std::shared_ptr<PackedTensor>> p = session.Pack(
            info, plan, {inputs[i], saved.dtype, saved.shape, codecs::Device::kCuda},
            On(pack_stream_));
        EXPECT_TRUE(p.ok()) << p.status();
        if (p.ok()) packed[i] = *p;
      }
      const uint64_t peak = other + session.Totals().live_stored;
      for (size_t i = pattern.size(); i-- > 0;) {
        if (packed[i] == nullptr) continue;
        {
          cudaemu::RegionScope region("unpack");
          const absl::Status unpacked = session.Unpack(
              *packed[i],
              {outputs[i], pattern[i].dtype, pattern[i].shape, codecs::Device::kCuda},
              On(pack_stream_));
          EXPECT_TRUE(unpacked.ok()) << unpacked;
        }
        packed[i].reset();  // autograd drops the saved tensor once its node has run
      }
      {
        cudaemu::RegionScope region("end of step");
        const absl::Status ended = session.EndStep(peak, peak, 0);
        EXPECT_TRUE(ended.ok()) << ended;
      }
      StepWaits w;
      w.profile = cudaemu::CountHostWaits("profile");
      w.pack = cudaemu::CountHostWaits("pack");
      w.unpack = cudaemu::CountHostWaits("unpack");
      w.end = cudaemu::CountHostWaits("end of step");
      for (const char* region : {"profile", "pack", "unpack", "end of step"}) {
        w.mallocs += cudaemu::CountCalls("cudaMalloc", region) +
                     cudaemu::CountCalls("cudaFree", region);
      }
      for (const cudaemu::HostCall& call : cudaemu::HostCalls()) {
        const bool expected = call.region == "end of step";
        if (call.waits && !expected) {
          ADD_FAILURE() << "step " << step << ": " << call.api << " in " << call.region
                        << ", called from " << cudaemu::DescribeCaller(call.caller);
        }
      }
      waits.push_back(w);
    }
#endif
    return waits;
  }
};

// Packing, unpacking and profiling a CUDA tensor never makes the host wait, and a step waits
// once, at its end, for every status and every profile sample together, profile steps
// included (their samples are copied once, queued, into pinned memory), and eb's decodes read
// what its encodes decided on the device. In steady state (after the three profile steps, the
// first plan, and a step of eb and bitpack in buffers sized from the last) nothing is
// cudaMalloc'ed or freed.
TEST_P(SessionWaitTest, PacksUnpacksAndProfilesNeverWaitAndAStepWaitsOnce) {
#if !defined(CUDAEMU)
  GTEST_SKIP() << "counting host waits needs the CUDA emulator (--config=cudaemu)";
#else
  const auto [codec, gpt] = GetParam();
  const std::vector<Saved> pattern = gpt ? GptPattern() : ResNetPattern();
  uint64_t raw = 0;
  for (const Saved& saved : pattern) raw += Numel(saved.shape) * codecs::ElementSize(saved.dtype);
  SessionOptions options;
  options.codec = *ParseCodecChoice(codec);
  options.min_bytes = 512;
  // auto: a budget that needs packing, so the policy plans harsher codecs (eb among them).
  options.budget_bytes = raw * 3 / 4;
  Session session(options, Factory());
  const bool eb = std::string(codec) == "eb" || std::string(codec) == "auto";
  const std::vector<StepWaits> waits = Run(session, pattern, 6, raw / 4, eb);
  ASSERT_EQ(waits.size(), 6u);
  // The counts, printed so that a failure shows every step's.
  std::string counts;
  for (const StepWaits& w : waits) {
    counts += absl::StrCat(" [profile ", w.profile, ", pack ", w.pack, ", unpack ", w.unpack,
                           ", end ", w.end, "]");
  }
  std::printf("host waits per step, %s %s:%s\n", codec, gpt ? "gpt" : "resnet", counts.c_str());
  if (std::string(codec) == "auto") {
    // The policy chose among several codecs, eb among them at some point: the counts above
    // cover their deferred paths.
    std::set<std::string> chosen;
    for (const SavedRecord& record : session.Records()) chosen.insert(record.codec);
    EXPECT_GE(chosen.size(), 2u) << absl::StrJoin(chosen, ", ");
  }
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(step);
    EXPECT_EQ(waits[step].profile, 0u);
    EXPECT_EQ(waits[step].pack, 0u);
    EXPECT_EQ(waits[step].unpack, 0u);
    EXPECT_EQ(waits[step].end, 1u);
    if (step >= 4) {
      EXPECT_EQ(waits[step].mallocs, 0u);
    }
  }
  EXPECT_EQ(session.Totals().unpacks, session.Totals().packs);
  // The profile steps timed the codecs on the device (events read at the steps' ends).
  EXPECT_GT(session.Totals().codec_nanoseconds, 0u);
  // Every wait the emulator saw was one of the session's status reads.
  uint64_t reads = 0;
  for (const StepWaits& w : waits) reads += w.profile + w.pack + w.unpack + w.end;
  EXPECT_EQ(session.Totals().device_status_reads, reads);
#endif
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, SessionWaitTest,
    ::testing::Combine(::testing::Values("identity", "quant2", "quant8", "division", "pool",
                                         "eb", "auto"),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<const char*, bool>>& info) {
      return std::string(std::get<0>(info.param)) + (std::get<1>(info.param) ? "_gpt" : "_resnet");
    });

#endif  // ACTPACK_WITH_CUDA

}  // namespace
}  // namespace actpack::runtime
