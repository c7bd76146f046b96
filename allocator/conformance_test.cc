// The conformance suite every allocator stack must pass (RMM's mr_tests): alignment, no overlap,
// usage accounting, statistics against a shadow model, and — for stacks that cache — reuse,
// split and coalesce, and stream rules.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "allocator/budget_adaptor.h"
#include "allocator/caching_pool.h"
#include "allocator/cuda_memory_resource.h"
#include "allocator/host_memory_resource.h"
#include "allocator/memory_resource.h"
#include "allocator/statistics_adaptor.h"
#include "allocator/stream_events.h"
#include "allocator/tracing_adaptor.h"
#include "allocator/units.h"
#include "allocator/vmm_memory_resource.h"
#include "gtest/gtest.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace actpack::allocator {
namespace {

using namespace literals;

// A stack of resources, bottom first; destroyed top first.
struct Stack {
  std::unique_ptr<StreamEvents> events = std::make_unique<HostStreamEvents>();
  std::vector<std::unique_ptr<MemoryResource>> layers;
  // Device memory (CUDA) is filled and read through the CUDA runtime, never dereferenced on
  // the host; its streams are real ones. Host stacks take any tag as a stream.
  bool device = false;
  Stream stream_a = reinterpret_cast<Stream>(0xA);
  Stream stream_b = reinterpret_cast<Stream>(0xB);
  bool caches = false;
  CachingPool* pool = nullptr;
  bool budgeted = false;  // a budget adaptor above the pool: its allocations carry a limit
  // The backend keeps what is given back for reuse (VMM): without a pool above it, what the
  // statistics call reserved (segments handed out) is its allocated part.
  bool backend_caches = false;
  // The smallest block the stack hands out for a request, and how much larger it may be: the
  // pool does not split off large-pool remainders of <= 1 MiB, so such blocks keep them.
  size_t (*block_size)(size_t bytes) = nullptr;
  // The segment a caching stack reserves for a block (the pool's rule; budgeted stacks give
  // mid-size blocks their own segments).
  std::function<size_t(size_t block)> segment_size;
  size_t (*block_slack)(size_t bytes) = nullptr;

  template <typename T, typename... Args>
  T* Push(Args&&... args) {
    auto layer = std::make_unique<T>(std::forward<Args>(args)...);
    T* raw = layer.get();
    layers.push_back(std::move(layer));
    return raw;
  }
  MemoryResource* top() const { return layers.back().get(); }
  ~Stack() {
    while (!layers.empty()) layers.pop_back();
#if ACTPACK_WITH_CUDA
    if (device) {
      cudaStreamDestroy(static_cast<cudaStream_t>(stream_a));
      cudaStreamDestroy(static_cast<cudaStream_t>(stream_b));
    }
#endif
  }

  // Sets `bytes` bytes at `p` to `value`.
  void Fill(void* p, uint8_t value, size_t bytes) const {
    if (!device) {
      std::memset(p, value, bytes);
      return;
    }
#if ACTPACK_WITH_CUDA
    ASSERT_EQ(cudaMemset(p, value, bytes), cudaSuccess);
#endif
  }

  // Whether every byte of [p, p + bytes) is `value`.
  bool AllEqual(const void* p, uint8_t value, size_t bytes) const {
    const auto* bytes_at = static_cast<const uint8_t*>(p);
    if (!device) {
      return std::all_of(bytes_at, bytes_at + bytes, [&](uint8_t b) { return b == value; });
    }
    std::vector<uint8_t> host(bytes);
#if ACTPACK_WITH_CUDA
    EXPECT_EQ(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
#endif
    return std::all_of(host.begin(), host.end(), [&](uint8_t b) { return b == value; });
  }
};

size_t HostBlockSize(size_t bytes) { return RoundUp(bytes, kAllocationAlignment); }
size_t GranuleBlockSize(size_t bytes) { return RoundUp(bytes, 2_MiB); }
size_t NoSlack(size_t bytes) { return 0; }
// A large block keeps a tail too small to serve the large pool; under a budget that pool serves
// requests above 512 KiB, so it splits off more.
size_t PoolSlack(size_t bytes) { return RoundBlockSize(bytes) > kSmallSize ? kSmallSize : 0; }
size_t BudgetPoolSlack(size_t bytes) {
  return RoundBlockSize(bytes) > kLargestSharedUnderBudget ? kLargestSharedUnderBudget : 0;
}

struct StackFactory {
  std::string name;
  std::function<std::unique_ptr<Stack>()> make;
};

void PrintTo(const StackFactory& factory, std::ostream* os) { *os << factory.name; }

// The stack shapes under test, each over a backend the stack's first layer is.
enum class Shape { kBackend, kStatsBudget, kPool, kTraceStatsBudgetPool };

void Build(Stack* stack, Shape shape) {
  MemoryResource* backend = stack->top();
  stack->block_size = backend->AllocationGranularity() > 1 ? GranuleBlockSize : HostBlockSize;
  stack->block_slack = NoSlack;
  if (shape == Shape::kBackend) return;
  if (shape == Shape::kStatsBudget) {
    stack->Push<StatisticsAdaptor>(stack->Push<BudgetAdaptor>(backend, 4_GiB));
    return;
  }
  stack->pool = stack->Push<CachingPool>(backend, stack->events.get());
  stack->caches = true;
  stack->block_size = RoundBlockSize;
  stack->block_slack = PoolSlack;
  // Segments are whole units of the backend (a VMM backend's 2 MiB granules).
  const size_t unit = std::max<size_t>(1, backend->AllocationGranularity());
  stack->segment_size = [unit](size_t block) { return RoundUp(SegmentSizeFor(block), unit); };
  if (shape == Shape::kPool) return;
  auto* budget = stack->Push<BudgetAdaptor>(stack->pool, 4_GiB);
  stack->Push<TracingAdaptor>(stack->Push<StatisticsAdaptor>(budget), 1024);
  stack->budgeted = true;
  stack->block_slack = BudgetPoolSlack;
  stack->segment_size = [unit](size_t block) {
    return RoundUp(SegmentSizeFor(block, true), unit);
  };
}

const std::pair<const char*, Shape> kShapes[] = {{"", Shape::kBackend},
                                                 {"StatsBudgetOn", Shape::kStatsBudget},
                                                 {"CachingPoolOn", Shape::kPool},
                                                 {"TraceStatsBudgetPoolOn", Shape::kTraceStatsBudgetPool}};

#if ACTPACK_WITH_CUDA
// A stack on CUDA device 0 with two streams of its own, over cudaMalloc or over the driver's
// virtual memory management.
std::unique_ptr<Stack> CudaStack(bool virtual_memory) {
  auto stack = std::make_unique<Stack>();
  stack->device = true;
  cudaStream_t a = nullptr, b = nullptr;
  EXPECT_EQ(cudaStreamCreate(&a), cudaSuccess);
  EXPECT_EQ(cudaStreamCreate(&b), cudaSuccess);
  stack->stream_a = a;
  stack->stream_b = b;
  stack->events = std::make_unique<CudaStreamEvents>(0);
  if (virtual_memory) {
    absl::StatusOr<std::unique_ptr<VmmMemoryResource>> vmm = VmmMemoryResource::Create(0);
    EXPECT_TRUE(vmm.ok()) << vmm.status();
    stack->layers.push_back(*std::move(vmm));
    stack->backend_caches = true;
  } else {
    stack->Push<CudaMemoryResource>(0);
  }
  return stack;
}

bool HaveCudaDevice() {
  absl::StatusOr<int> count = CudaDeviceCount();
  return count.ok() && *count > 0;
}
#endif

std::vector<StackFactory> Factories() {
  std::vector<StackFactory> factories;
  for (const auto& [prefix, shape] : kShapes) {
    factories.push_back({std::string(prefix) + "Host", [shape = shape] {
                           auto stack = std::make_unique<Stack>();
                           stack->Push<HostMemoryResource>();
                           Build(stack.get(), shape);
                           return stack;
                         }});
#if ACTPACK_WITH_CUDA
    if (HaveCudaDevice()) {
      factories.push_back({std::string(prefix) + "Cuda", [shape = shape] {
                             auto stack = CudaStack(/*virtual_memory=*/false);
                             Build(stack.get(), shape);
                             return stack;
                           }});
    }
    if (HaveCudaDevice() && VirtualMemorySupport(0).ok()) {
      factories.push_back({std::string(prefix) + "CudaVmm", [shape = shape] {
                             auto stack = CudaStack(/*virtual_memory=*/true);
                             Build(stack.get(), shape);
                             return stack;
                           }});
    }
#endif
  }
  return factories;
}

class ConformanceTest : public ::testing::TestWithParam<StackFactory> {
 protected:
  void SetUp() override {
    stack_ = GetParam().make();
    mr_ = stack_->top();
    kStreamA = stack_->stream_a;
    kStreamB = stack_->stream_b;
  }

  void* MustAllocate(size_t bytes, Stream stream = nullptr) {
    absl::StatusOr<void*> p = mr_->Allocate(bytes, stream);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  }

  std::unique_ptr<Stack> stack_;
  MemoryResource* mr_ = nullptr;
  Stream kStreamA = nullptr;
  Stream kStreamB = nullptr;
};

// Sizes around every boundary of the pool's size classes.
const size_t kEdgeSizes[] = {1,          7,          255,        256,       257,
                             511,        512,        513,        4095,      1_MiB - 1,
                             1_MiB,      1_MiB + 1,  2_MiB,      3_MiB,     10_MiB - 1,
                             10_MiB,     10_MiB + 5, 20_MiB + 1, 25_MiB};

// Log-uniform sizes from 1 B to `max`: mostly small, like real tensors.
size_t RandomSize(std::mt19937_64& rng, size_t max) {
  std::uniform_real_distribution<double> log_size(0.0, std::log2(static_cast<double>(max)));
  return std::max<size_t>(1, static_cast<size_t>(std::exp2(log_size(rng))));
}

TEST_P(ConformanceTest, ZeroBytesGiveNullAndNullFreesNothing) {
  absl::StatusOr<void*> p = mr_->Allocate(0, kStreamA);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, nullptr);
  mr_->Deallocate(nullptr, 0, kStreamA);
  EXPECT_EQ(mr_->GetUsage().allocated_bytes, 0u);
}

TEST_P(ConformanceTest, EveryPointerIsAligned) {
  for (size_t bytes : kEdgeSizes) {
    void* p = MustAllocate(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kAllocationAlignment, 0u) << bytes;
    mr_->Deallocate(p, bytes);
  }
}

TEST_P(ConformanceTest, UsageCountsRoundedBlocks) {
  std::vector<void*> live;
  size_t at_least = 0, at_most = 0;
  for (size_t bytes : kEdgeSizes) {
    live.push_back(MustAllocate(bytes, kStreamA));
    at_least += stack_->block_size(bytes);
    at_most += stack_->block_size(bytes) + stack_->block_slack(bytes);
    const MemoryUsage usage = mr_->GetUsage();
    EXPECT_GE(usage.allocated_bytes, at_least) << bytes;
    EXPECT_LE(usage.allocated_bytes, at_most) << bytes;
    EXPECT_GE(usage.reserved_bytes, usage.allocated_bytes);
  }
  for (size_t i = 0; i < live.size(); ++i) mr_->Deallocate(live[i], kEdgeSizes[i], kStreamA);
  EXPECT_EQ(mr_->GetUsage().allocated_bytes, 0u);
  mr_->EmptyCache();
  EXPECT_EQ(mr_->GetUsage().reserved_bytes, 0u);
}

// Live allocations never overlap: every allocation is filled with its own byte and checked
// before it is freed, and address ranges are checked against each other on allocation.
TEST_P(ConformanceTest, LiveAllocationsDoNotOverlap) {
  struct Live {
    uint8_t* ptr;
    size_t bytes;
    uint8_t fill;
    Stream stream;
  };
  std::mt19937_64 rng(42);
  std::vector<Live> live;
  std::map<uintptr_t, uintptr_t> ranges;  // begin -> end of live allocations
  auto check_and_free = [&](size_t index) {
    Live entry = live[index];
    const bool intact = stack_->AllEqual(entry.ptr, entry.fill, entry.bytes);
    EXPECT_TRUE(intact) << "allocation of " << entry.bytes << " bytes was overwritten";
    ranges.erase(reinterpret_cast<uintptr_t>(entry.ptr));
    mr_->Deallocate(entry.ptr, entry.bytes, entry.stream);
    live[index] = live.back();
    live.pop_back();
  };
  for (int op = 0; op < 600; ++op) {
    if (live.size() >= 40 || (!live.empty() && rng() % 3 == 0)) {
      check_and_free(rng() % live.size());
      continue;
    }
    const size_t bytes = RandomSize(rng, 8_MiB);
    const Stream stream = rng() % 2 ? kStreamA : kStreamB;
    auto* p = static_cast<uint8_t*>(MustAllocate(bytes, stream));
    ASSERT_NE(p, nullptr);
    const auto begin = reinterpret_cast<uintptr_t>(p);
    auto next = ranges.lower_bound(begin);
    if (next != ranges.end()) {
      ASSERT_LE(begin + bytes, next->first) << "overlaps the next range";
    }
    if (next != ranges.begin()) {
      ASSERT_LE(std::prev(next)->second, begin) << "overlaps the previous range";
    }
    ranges[begin] = begin + bytes;
    const auto fill = static_cast<uint8_t>(op);
    stack_->Fill(p, fill, bytes);
    live.push_back({p, bytes, fill, stream});
  }
  while (!live.empty()) check_and_free(live.size() - 1);
  EXPECT_EQ(mr_->GetUsage().allocated_bytes, 0u);
}

TEST_P(ConformanceTest, FreedBlockIsReusedOnItsStream) {
  if (!stack_->caches) GTEST_SKIP() << GetParam().name << " does not cache";
  void* first = MustAllocate(1_MiB, kStreamA);
  mr_->Deallocate(first, 1_MiB, kStreamA);
  const size_t reserved = mr_->GetUsage().reserved_bytes;
  void* second = MustAllocate(1_MiB - 100, kStreamA);
  EXPECT_EQ(second, first);
  EXPECT_EQ(mr_->GetUsage().reserved_bytes, reserved);
  mr_->Deallocate(second, 1_MiB - 100, kStreamA);
}

TEST_P(ConformanceTest, BlocksSplitAndCoalesce) {
  if (!stack_->caches) GTEST_SKIP() << GetParam().name << " does not cache";
  // Small pool: two blocks carved from one 2 MiB segment, merged again when both are free.
  auto* a = static_cast<char*>(MustAllocate(256_KiB, kStreamA));
  auto* b = static_cast<char*>(MustAllocate(256_KiB, kStreamA));
  EXPECT_EQ(b, a + 256_KiB);
  EXPECT_EQ(mr_->GetUsage().reserved_bytes, 2_MiB);
  mr_->Deallocate(a, 256_KiB, kStreamA);
  mr_->Deallocate(b, 256_KiB, kStreamA);
  // Fits only in the merged block's start (under a budget the small pool's largest request is
  // 512 KiB: larger ones get segments of their own).
  const size_t whole_bytes = stack_->budgeted ? kLargestSharedUnderBudget : 1_MiB;
  void* whole = MustAllocate(whole_bytes, kStreamA);
  EXPECT_EQ(whole, a);
  EXPECT_EQ(mr_->GetUsage().reserved_bytes, 2_MiB);
  mr_->Deallocate(whole, whole_bytes, kStreamA);

  if (stack_->budgeted) {
    // Under a budget a free block is split only when the budget leaves no room for a segment
    // of the request's size: a block that fits without a split is taken whole, a smaller
    // request gets a segment of its own (and a fully free segment can always be released).
    void* first = MustAllocate(8_MiB, kStreamA);
    mr_->Deallocate(first, 8_MiB, kStreamA);
    void* close = MustAllocate(8_MiB - 512_KiB, kStreamA);
    EXPECT_EQ(close, first);
    void* x = MustAllocate(3_MiB, kStreamA);
    const size_t three = stack_->segment_size(3_MiB), five = stack_->segment_size(5_MiB);
    EXPECT_EQ(mr_->GetUsage().reserved_bytes, 2_MiB + 8_MiB + three);
    mr_->Deallocate(close, 8_MiB - 512_KiB, kStreamA);
    void* y = MustAllocate(5_MiB, kStreamA);
    EXPECT_NE(y, first);
    EXPECT_EQ(mr_->GetUsage().reserved_bytes, 2_MiB + 8_MiB + three + five);
    mr_->Deallocate(x, 3_MiB, kStreamA);
    mr_->Deallocate(y, 5_MiB, kStreamA);
    EXPECT_EQ(mr_->EmptyCache(), 2_MiB + 8_MiB + three + five);
    return;
  }
  // Large pool: 3 and 5 MiB are carved from a cached 8 MiB block; 8 MiB reuses the merged space.
  const size_t reserved = 2_MiB + stack_->segment_size(8_MiB);
  void* first = MustAllocate(8_MiB, kStreamA);
  mr_->Deallocate(first, 8_MiB, kStreamA);
  auto* x = static_cast<char*>(MustAllocate(3_MiB, kStreamA));
  auto* y = static_cast<char*>(MustAllocate(5_MiB, kStreamA));
  EXPECT_EQ(x, first);
  EXPECT_EQ(y, x + 3_MiB);
  EXPECT_EQ(mr_->GetUsage().reserved_bytes, reserved);
  mr_->Deallocate(y, 5_MiB, kStreamA);
  mr_->Deallocate(x, 3_MiB, kStreamA);
  void* z = MustAllocate(8_MiB, kStreamA);
  EXPECT_EQ(z, x);
  EXPECT_EQ(mr_->GetUsage().reserved_bytes, reserved);
  mr_->Deallocate(z, 8_MiB, kStreamA);
  EXPECT_EQ(mr_->EmptyCache(), reserved);
  EXPECT_EQ(mr_->GetUsage().reserved_bytes, 0u);
}

TEST_P(ConformanceTest, CachedBlocksStayWithTheirStream) {
  if (!stack_->caches) GTEST_SKIP() << GetParam().name << " does not cache";
  void* on_a = MustAllocate(4_MiB, kStreamA);
  mr_->Deallocate(on_a, 4_MiB, kStreamA);
  // Reusing A's block on B could overwrite memory A's pending work still reads.
  void* on_b = MustAllocate(4_MiB, kStreamB);
  EXPECT_NE(on_b, on_a);
  EXPECT_EQ(mr_->GetUsage().reserved_bytes, 2 * stack_->segment_size(4_MiB));
  void* again_on_a = MustAllocate(4_MiB, kStreamA);
  EXPECT_EQ(again_on_a, on_a);
  mr_->Deallocate(on_b, 4_MiB, kStreamB);
  mr_->Deallocate(again_on_a, 4_MiB, kStreamA);
}

TEST_P(ConformanceTest, EmptyCacheKeepsLiveMemory) {
  auto* keep = static_cast<uint8_t*>(MustAllocate(4_MiB, kStreamA));
  stack_->Fill(keep, 0x5A, 4_MiB);
  void* drop = MustAllocate(12_MiB, kStreamA);
  mr_->Deallocate(drop, 12_MiB, kStreamA);
  mr_->EmptyCache();
  const MemoryUsage usage = mr_->GetUsage();
  EXPECT_EQ(usage.allocated_bytes, stack_->block_size(4_MiB));
  // Only the segment holding `keep` stays.
  EXPECT_EQ(usage.reserved_bytes,
            stack_->caches ? stack_->segment_size(4_MiB) : stack_->block_size(4_MiB));
  EXPECT_TRUE(stack_->AllEqual(keep, 0x5A, 4_MiB));
  mr_->Deallocate(keep, 4_MiB, kStreamA);
  mr_->EmptyCache();
  EXPECT_EQ(mr_->GetUsage().reserved_bytes, 0u);
}

#if ACTPACK_WITH_CUDA
// The stream-ordering contract on a device whose streams really lag: a block freed while
// another stream's queued work still writes it is not handed out until that work has run.
// Reused early, the late write would land on the new owner's data.
TEST_P(ConformanceTest, ABlockWaitsForTheStreamsItWasUsedOn) {
  if (!stack_->device || !stack_->caches) GTEST_SKIP() << "needs a caching stack on a device";
  const cudaStream_t b = static_cast<cudaStream_t>(kStreamB);
  void* p = MustAllocate(1_MiB, kStreamA);
  ASSERT_TRUE(stack_->pool->RecordStream(p, kStreamB).ok());
  ASSERT_EQ(cudaMemsetAsync(p, 0x07, 1_MiB, b), cudaSuccess);  // queued on B, not yet run
  mr_->Deallocate(p, 1_MiB, kStreamA);
  void* q = MustAllocate(1_MiB, kStreamA);
  ASSERT_EQ(cudaMemsetAsync(q, 0x09, 1_MiB, static_cast<cudaStream_t>(kStreamA)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(stack_->AllEqual(q, 0x09, 1_MiB)) << (q == p ? "reused before B finished" : "");
  mr_->Deallocate(q, 1_MiB, kStreamA);
  // Once B is done the block is reusable.
  void* r = MustAllocate(1_MiB, kStreamA);
  EXPECT_TRUE(r == p || r == q);
  mr_->Deallocate(r, 1_MiB, kStreamA);
}

// cudaMalloc failing (the device, not a budget, is full) makes a caching stack release what it
// caches and try again, as PyTorch's allocator does, before it reports out of memory.
TEST_P(ConformanceTest, DeviceOutOfMemoryReleasesTheCacheAndRetries) {
  if (!stack_->device || !stack_->caches) GTEST_SKIP() << "needs a caching stack on a device";
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  ASSERT_LE(free_bytes, 2_GiB) << "run with a small device (CUDAEMU_DEVICE_MEMORY) or skip";
  const size_t big = RoundUp(free_bytes * 6 / 10, 2_MiB);
  void* on_a = MustAllocate(big, kStreamA);
  mr_->Deallocate(on_a, big, kStreamA);  // cached for stream A
  EXPECT_GE(mr_->GetUsage().reserved_bytes, big);
  // B cannot reuse A's block, and two such segments do not fit: the cache must go first.
  void* on_b = MustAllocate(big, kStreamB);
  ASSERT_NE(on_b, nullptr);
  EXPECT_LT(mr_->GetUsage().reserved_bytes, 2 * big);
  mr_->Deallocate(on_b, big, kStreamB);
  // Past what the device has, the error says what was asked.
  absl::StatusOr<void*> too_big = mr_->Allocate(free_bytes + 1_GiB, kStreamA);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted) << too_big.status();
  EXPECT_NE(too_big.status().message().find("out of memory"), absl::string_view::npos)
      << too_big.status();
  mr_->EmptyCache();
}
#endif

// A StatisticsAdaptor over the stack agrees with a model that knows only the requests and the
// stack's rounding rule, after every operation.
TEST_P(ConformanceTest, StatisticsMatchShadowModel) {
  StatisticsAdaptor stats(mr_);
  struct Live {
    void* ptr;
    size_t bytes;
    Stream stream;
  };
  std::vector<Live> live;
  int64_t live_blocks = 0, live_requested = 0, allocs = 0, frees = 0;
  // The model knows block sizes up to the stack's slack: it tracks the bounds.
  int64_t live_min = 0, live_max = 0, peak_min = 0, peak_max = 0;
  std::mt19937_64 rng(7);
  for (int op = 0; op < 3000; ++op) {
    if (!live.empty() && (live.size() >= 64 || rng() % 2 == 0)) {
      const size_t index = rng() % live.size();
      const Live entry = live[index];
      live[index] = live.back();
      live.pop_back();
      stats.Deallocate(entry.ptr, entry.bytes, entry.stream);
      --live_blocks;
      live_min -= stack_->block_size(entry.bytes);
      live_max -= stack_->block_size(entry.bytes) + stack_->block_slack(entry.bytes);
      live_requested -= entry.bytes;
      ++frees;
    } else {
      const size_t bytes = RandomSize(rng, 24_MiB);
      const Stream stream = rng() % 2 ? kStreamA : kStreamB;
      absl::StatusOr<void*> p = stats.Allocate(bytes, stream);
      ASSERT_TRUE(p.ok()) << p.status();
      live.push_back({*p, bytes, stream});
      ++live_blocks;
      live_min += stack_->block_size(bytes);
      live_max += stack_->block_size(bytes) + stack_->block_slack(bytes);
      live_requested += bytes;
      ++allocs;
    }
    if (op % 500 == 250) stats.EmptyCache();
    peak_min = std::max(peak_min, live_min);
    peak_max = std::max(peak_max, live_max);
    const MemoryStats s = stats.GetStats();
    const MemoryUsage usage = stats.GetUsage();
    ASSERT_EQ(s.allocation.current, live_blocks) << "op " << op;
    ASSERT_GE(s.allocated_bytes.current, live_min) << "op " << op;
    ASSERT_LE(s.allocated_bytes.current, live_max) << "op " << op;
    ASSERT_GE(s.allocated_bytes.peak, peak_min) << "op " << op;
    ASSERT_LE(s.allocated_bytes.peak, peak_max) << "op " << op;
    ASSERT_GE(s.allocated_bytes.peak, s.allocated_bytes.current) << "op " << op;
    ASSERT_EQ(s.requested_bytes.current, live_requested) << "op " << op;
    // Host events complete at once: nothing waits, so active equals allocated.
    ASSERT_EQ(s.active_bytes.current, s.allocated_bytes.current) << "op " << op;
    ASSERT_EQ(s.active.current, live_blocks) << "op " << op;
    const size_t reserved = stack_->backend_caches && !stack_->caches ? usage.allocated_bytes
                                                                       : usage.reserved_bytes;
    ASSERT_EQ(s.reserved_bytes.current, static_cast<int64_t>(reserved)) << op;
    ASSERT_EQ(s.allocated_bytes.current, static_cast<int64_t>(usage.allocated_bytes)) << op;
    ASSERT_EQ(s.num_allocs, allocs);
    ASSERT_EQ(s.num_frees, frees);
    ASSERT_EQ(s.allocated_bytes.allocated - s.allocated_bytes.freed, s.allocated_bytes.current);
    ASSERT_EQ(s.reserved_bytes.allocated - s.reserved_bytes.freed, s.reserved_bytes.current);
    ASSERT_GE(s.reserved_bytes.peak, s.reserved_bytes.current);
  }
  for (const Live& entry : live) stats.Deallocate(entry.ptr, entry.bytes, entry.stream);
  stats.EmptyCache();
  const MemoryStats s = stats.GetStats();
  EXPECT_EQ(s.allocated_bytes.current, 0);
  EXPECT_EQ(s.reserved_bytes.current, 0);
  EXPECT_EQ(s.segment.current, 0);
  EXPECT_EQ(s.num_ooms, 0);
  stats.ResetPeak();
  EXPECT_EQ(stats.GetStats().allocated_bytes.peak, 0);
}

INSTANTIATE_TEST_SUITE_P(AllStacks, ConformanceTest, ::testing::ValuesIn(Factories()),
                         [](const ::testing::TestParamInfo<StackFactory>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace actpack::allocator
