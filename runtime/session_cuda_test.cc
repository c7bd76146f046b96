// The session with CUDA tensors, on actpack's own caching pool over the CUDA backend (a GPU, or
// the CUDA emulator under --config=cudaemu, whose streams lag until something waits for them).
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "allocator/caching_pool.h"
#include "allocator/cuda_memory_resource.h"
#include "codecs/registry.h"
#include "gtest/gtest.h"
#include "runtime/session.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace actpack::runtime {
namespace {

#if !ACTPACK_WITH_CUDA

TEST(SessionCudaTest, NeedsCuda) {
  GTEST_SKIP() << "built without CUDA (bazel test --config=cudaemu runs these on the emulator)";
}

#else

// Device memory from the pool, on the stream it was allocated on, as torch's allocator hands
// out the plugin's buffers.
class PoolBuffer final : public Buffer {
 public:
  PoolBuffer(allocator::CachingPool* pool, void* data, size_t size, void* stream)
      : pool_(pool), data_(static_cast<uint8_t*>(data)), size_(size), stream_(stream) {}
  ~PoolBuffer() override { pool_->Deallocate(data_, size_, stream_); }
  uint8_t* data() override { return data_; }
  size_t size() const override { return size_; }
  absl::Status RecordStream(void* stream) override { return pool_->RecordStream(data_, stream); }

 private:
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

  BufferFactory Factory() {
    return [this](size_t bytes, const codecs::ExecContext& context)
               -> absl::StatusOr<std::unique_ptr<Buffer>> {
      absl::StatusOr<void*> p = pool_->Allocate(bytes, context.stream);
      if (!p.ok()) return p.status();
      return std::unique_ptr<Buffer>(new PoolBuffer(pool_.get(), *p, bytes, context.stream));
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

#endif  // ACTPACK_WITH_CUDA

}  // namespace
}  // namespace actpack::runtime
