// A randomized stress test of the full stack — trace(stats(budget(pool(backend)))) — from
// several threads: mixed allocations, frees, cross-stream uses and cache releases, checking that
// no allocation is corrupted, that the budget holds, and that pool, statistics and trace agree
// at the end. On the host (over a million operations) stream events complete a few queries
// later; on CUDA (a GPU, or the emulator under --config=cudaemu) the streams are real, their
// work lags until queried or waited for, the device is smaller than the budget (so cudaMalloc
// fails and the pool releases its cache and retries), and the blocks are stamped through
// stream-ordered copies.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "allocator/budget_adaptor.h"
#include "allocator/caching_pool.h"
#include "allocator/cuda_memory_resource.h"
#include "allocator/host_memory_resource.h"
#include "allocator/internal/manual_stream_events.h"
#include "allocator/statistics_adaptor.h"
#include "allocator/tracing_adaptor.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace actpack::allocator {
namespace {

using namespace literals;

constexpr int kThreads = 4;
// ThreadSanitizer runs ~20x slower; it needs the interleavings, not the count.
#if defined(__SANITIZE_THREAD__)
constexpr int64_t kHostOpsPerThread = 60'000;
#else
constexpr int64_t kHostOpsPerThread = 260'000;  // 4 threads: > 10^6 operations
#endif
// Every CUDA operation is a few runtime calls (and, under the emulator, queued work); under
// AddressSanitizer those take ~10x longer, and it needs every path, not the count.
#if defined(__SANITIZE_ADDRESS__)
constexpr int64_t kCudaOpsPerThread = 10'000;
#else
constexpr int64_t kCudaOpsPerThread = 40'000;
#endif
constexpr size_t kBudget = 2_GiB;
constexpr size_t kMaxLivePerThread = 64;

struct Live {
  uint8_t* ptr;
  size_t bytes;
  Stream stream;
  uint64_t tag;
};

// How the test reaches the memory and the streams of one backend.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual MemoryResource* resource() = 0;
  virtual StreamEvents* events() = 0;
  virtual Stream StreamOf(int thread) = 0;
  virtual Stream shared_stream() = 0;
  virtual void Write(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  virtual void Read(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  virtual int64_t ops_per_thread() const = 0;
  virtual void CheckAfterwards(const MemoryStats& stats) {}
};

class HostBackend final : public Backend {
 public:
  HostBackend() { events_.set_complete_after_queries(3); }
  MemoryResource* resource() override { return &host_; }
  StreamEvents* events() override { return &events_; }
  Stream StreamOf(int thread) override { return reinterpret_cast<Stream>(0x1000 + thread); }
  Stream shared_stream() override { return reinterpret_cast<Stream>(0x2000); }
  void Write(void* dst, const void* src, size_t bytes, Stream) override {
    std::memcpy(dst, src, bytes);
  }
  void Read(void* dst, const void* src, size_t bytes, Stream) override {
    std::memcpy(dst, src, bytes);
  }
  int64_t ops_per_thread() const override { return kHostOpsPerThread; }
  void CheckAfterwards(const MemoryStats& stats) override {
    EXPECT_EQ(events_.live(), 0);
    EXPECT_GT(events_.recorded(), 0);
  }

 private:
  HostMemoryResource host_;
  internal::ManualStreamEvents events_;
};

#if ACTPACK_WITH_CUDA
class CudaBackend final : public Backend {
 public:
  CudaBackend() : device_(0), events_(0) {
    for (cudaStream_t& s : streams_) EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess);
  }
  ~CudaBackend() override {
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  }
  MemoryResource* resource() override { return &device_; }
  StreamEvents* events() override { return &events_; }
  Stream StreamOf(int thread) override { return streams_[thread]; }
  Stream shared_stream() override { return streams_[kThreads]; }
  void Write(void* dst, const void* src, size_t bytes, Stream stream) override {
    EXPECT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                              static_cast<cudaStream_t>(stream)),
              cudaSuccess);
  }
  void Read(void* dst, const void* src, size_t bytes, Stream stream) override {
    // Into pageable memory: returns once the stream has done everything before it.
    EXPECT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
                              static_cast<cudaStream_t>(stream)),
              cudaSuccess);
  }
  int64_t ops_per_thread() const override { return kCudaOpsPerThread; }
  void CheckAfterwards(const MemoryStats& stats) override {
    // The device (768 MiB under the emulator) filled before the budget: cudaMalloc failed and
    // the pool released its cache and retried.
    size_t free_bytes = 0, total = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
    if (total < kBudget) {
      EXPECT_GT(stats.num_alloc_retries, 0);
    }
  }

 private:
  CudaMemoryResource device_;
  CudaStreamEvents events_;
  cudaStream_t streams_[kThreads + 1] = {};
};
#endif

// Marks both ends of an allocation; a block handed out twice or overrun is caught on free.
void Stamp(Backend& backend, const Live& live) {
  backend.Write(live.ptr, &live.tag, std::min<size_t>(8, live.bytes), live.stream);
  if (live.bytes >= 16) backend.Write(live.ptr + live.bytes - 8, &live.tag, 8, live.stream);
}

bool StampIntact(Backend& backend, const Live& live) {
  uint64_t head = 0, tail = 0;
  backend.Read(&head, live.ptr, std::min<size_t>(8, live.bytes), live.stream);
  uint64_t expected_head = 0;
  std::memcpy(&expected_head, &live.tag, std::min<size_t>(8, live.bytes));
  if (head != expected_head) return false;
  if (live.bytes < 16) return true;
  backend.Read(&tail, live.ptr + live.bytes - 8, 8, live.stream);
  return tail == live.tag;
}

size_t RandomSize(std::mt19937_64& rng) {
  const uint64_t kind = rng() % 1000;
  auto log_uniform = [&](double lo, double hi) {
    std::uniform_real_distribution<double> d(std::log2(lo), std::log2(hi));
    return static_cast<size_t>(std::exp2(d(rng)));
  };
  if (kind < 800) return std::max<size_t>(1, log_uniform(1, 1_MiB));
  if (kind < 985) return log_uniform(1_MiB, 10_MiB);
  if (kind < 999) return log_uniform(10_MiB, 48_MiB);
  return 3_GiB;  // over the budget: must fail cleanly
}

std::unique_ptr<Backend> MakeBackend(const std::string& name) {
#if ACTPACK_WITH_CUDA
  if (name == "Cuda") return std::make_unique<CudaBackend>();
#endif
  return std::make_unique<HostBackend>();
}

std::vector<std::string> BackendNames() {
  std::vector<std::string> names = {"Host"};
#if ACTPACK_WITH_CUDA
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (devices.ok() && *devices > 0) names.push_back("Cuda");
#endif
  return names;
}

class StressTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StressTest, ManyThreadsMixedOperations) {
  std::unique_ptr<Backend> backend = MakeBackend(GetParam());
  const int64_t ops_per_thread = backend->ops_per_thread();
  CachingPool pool(backend->resource(), backend->events());
  BudgetAdaptor budget(&pool, kBudget);
  StatisticsAdaptor stats(&budget);
  TracingAdaptor trace(&stats, 4096);
  std::atomic<int64_t> pressure_calls{0};
  budget.AddPressureCallback([&](size_t) {
    pressure_calls.fetch_add(1, std::memory_order_relaxed);
    return size_t{0};
  });

  std::atomic<int64_t> allocs{0}, frees{0}, failures{0}, corrupted{0}, over_budget{0};
  auto worker = [&](int thread) {
    std::mt19937_64 rng(1234 + thread);
    std::vector<Live> live;
    uint64_t serial = 0;
    int64_t my_allocs = 0, my_frees = 0, my_failures = 0;
    auto free_one = [&](size_t index) {
      const Live entry = live[index];
      if (!StampIntact(*backend, entry)) corrupted.fetch_add(1);
      trace.Deallocate(entry.ptr, entry.bytes, entry.stream);
      live[index] = live.back();
      live.pop_back();
      ++my_frees;
    };
    for (int64_t op = 0; op < ops_per_thread; ++op) {
      const uint64_t choice = rng() % 100;
      if (choice < 2 && !live.empty()) {
        // Hand a block to another thread's stream: its reuse must wait for an event.
        const Live& entry = live[rng() % live.size()];
        EXPECT_TRUE(
            pool.RecordStream(entry.ptr, backend->StreamOf((thread + 1) % kThreads)).ok());
      } else if (choice < 3 && op % 5000 == 0) {
        trace.EmptyCache();
      } else if (live.size() >= kMaxLivePerThread || (choice < 50 && !live.empty())) {
        free_one(rng() % live.size());
      } else {
        const size_t bytes = RandomSize(rng);
        const Stream stream =
            rng() % 8 == 0 ? backend->shared_stream() : backend->StreamOf(thread);
        absl::StatusOr<void*> p = trace.Allocate(bytes, stream);
        if (!p.ok()) {
          EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
          ++my_failures;
          continue;
        }
        ++my_allocs;
        Live entry{static_cast<uint8_t*>(*p), bytes, stream,
                   (uint64_t{static_cast<uint64_t>(thread)} << 56) | ++serial};
        Stamp(*backend, entry);
        live.push_back(entry);
      }
      if (op % 1024 == 0 && pool.GetUsage().reserved_bytes > kBudget) over_budget.fetch_add(1);
    }
    while (!live.empty()) free_one(live.size() - 1);
    allocs.fetch_add(my_allocs);
    frees.fetch_add(my_frees);
    failures.fetch_add(my_failures);
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& t : threads) t.join();

  EXPECT_EQ(corrupted.load(), 0);
  EXPECT_EQ(over_budget.load(), 0);
  EXPECT_GE(allocs.load() + frees.load() + failures.load(), kThreads * ops_per_thread * 9 / 10);
  EXPECT_GT(failures.load(), 0);  // the over-budget requests
  EXPECT_GE(pressure_calls.load(), failures.load());
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();

  MemoryStats s = stats.GetStats();
  EXPECT_EQ(s.num_allocs, allocs.load());
  EXPECT_EQ(s.num_frees, frees.load());
  EXPECT_EQ(s.num_ooms, failures.load());
  EXPECT_EQ(s.allocation.current, 0);
  EXPECT_EQ(s.allocated_bytes.current, 0);
  EXPECT_LE(s.reserved_bytes.peak, static_cast<int64_t>(kBudget));
  EXPECT_EQ(s.reserved_bytes.current, static_cast<int64_t>(pool.GetUsage().reserved_bytes));

  trace.EmptyCache();  // waits for the events still pending
  s = stats.GetStats();
  EXPECT_EQ(s.active_bytes.current, 0);
  EXPECT_EQ(s.requested_bytes.current, 0);
  EXPECT_EQ(s.reserved_bytes.current, 0);
  EXPECT_EQ(backend->resource()->GetUsage().reserved_bytes, 0u);
  backend->CheckAfterwards(s);
  EXPECT_EQ(trace.Entries().size(), 4096u);
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
}

INSTANTIATE_TEST_SUITE_P(Backends, StressTest, ::testing::ValuesIn(BackendNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace actpack::allocator
