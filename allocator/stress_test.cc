// A randomized stress test of the full stack — trace(stats(budget(pool(host)))) — from several
// threads: at least a million mixed allocations, frees, cross-stream uses and cache releases,
// with stream events that complete a few queries later, checking that no allocation is
// corrupted, that the budget holds, and that pool, statistics and trace agree at the end.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "allocator/budget_adaptor.h"
#include "allocator/caching_pool.h"
#include "allocator/host_memory_resource.h"
#include "allocator/internal/manual_stream_events.h"
#include "allocator/statistics_adaptor.h"
#include "allocator/tracing_adaptor.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

namespace actpack::allocator {
namespace {

using namespace literals;

constexpr int kThreads = 4;
// ThreadSanitizer runs ~20x slower; it needs the interleavings, not the count.
#if defined(__SANITIZE_THREAD__)
constexpr int64_t kOpsPerThread = 60'000;
#else
constexpr int64_t kOpsPerThread = 260'000;  // 4 threads: > 10^6 operations
#endif
constexpr size_t kBudget = 2_GiB;
constexpr size_t kMaxLivePerThread = 64;

Stream StreamOf(int thread) { return reinterpret_cast<Stream>(0x1000 + thread); }
const Stream kSharedStream = reinterpret_cast<Stream>(0x2000);

struct Live {
  uint8_t* ptr;
  size_t bytes;
  Stream stream;
  uint64_t tag;
};

// Marks both ends of an allocation; a block handed out twice or overrun is caught on free.
void Stamp(const Live& live) {
  std::memcpy(live.ptr, &live.tag, std::min<size_t>(8, live.bytes));
  if (live.bytes >= 16) std::memcpy(live.ptr + live.bytes - 8, &live.tag, 8);
}

bool StampIntact(const Live& live) {
  uint64_t head = 0, tail = 0;
  std::memcpy(&head, live.ptr, std::min<size_t>(8, live.bytes));
  uint64_t expected_head = 0;
  std::memcpy(&expected_head, &live.tag, std::min<size_t>(8, live.bytes));
  if (head != expected_head) return false;
  if (live.bytes < 16) return true;
  std::memcpy(&tail, live.ptr + live.bytes - 8, 8);
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

TEST(StressTest, ManyThreadsMixedOperations) {
  HostMemoryResource host;
  internal::ManualStreamEvents events;
  events.set_complete_after_queries(3);
  CachingPool pool(&host, &events);
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
      if (!StampIntact(entry)) corrupted.fetch_add(1);
      trace.Deallocate(entry.ptr, entry.bytes, entry.stream);
      live[index] = live.back();
      live.pop_back();
      ++my_frees;
    };
    for (int64_t op = 0; op < kOpsPerThread; ++op) {
      const uint64_t choice = rng() % 100;
      if (choice < 2 && !live.empty()) {
        // Hand a block to another thread's stream: its reuse must wait for an event.
        const Live& entry = live[rng() % live.size()];
        EXPECT_TRUE(pool.RecordStream(entry.ptr, StreamOf((thread + 1) % kThreads)).ok());
      } else if (choice < 3 && op % 5000 == 0) {
        trace.EmptyCache();
      } else if (live.size() >= kMaxLivePerThread || (choice < 50 && !live.empty())) {
        free_one(rng() % live.size());
      } else {
        const size_t bytes = RandomSize(rng);
        const Stream stream = rng() % 8 == 0 ? kSharedStream : StreamOf(thread);
        absl::StatusOr<void*> p = trace.Allocate(bytes, stream);
        if (!p.ok()) {
          EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
          ++my_failures;
          continue;
        }
        ++my_allocs;
        Live entry{static_cast<uint8_t*>(*p), bytes, stream,
                   (uint64_t{static_cast<uint64_t>(thread)} << 56) | ++serial};
        Stamp(entry);
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
  EXPECT_GE(allocs.load() + frees.load() + failures.load(), kThreads * kOpsPerThread * 9 / 10);
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
  EXPECT_EQ(host.GetUsage().reserved_bytes, 0u);
  EXPECT_EQ(events.live(), 0);
  EXPECT_GT(events.recorded(), 0);
  EXPECT_EQ(trace.Entries().size(), 4096u);
  ASSERT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
}

}  // namespace
}  // namespace actpack::allocator
