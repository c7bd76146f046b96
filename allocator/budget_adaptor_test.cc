#include "allocator/budget_adaptor.h"

#include <stdexcept>
#include <vector>

#include "allocator/caching_pool.h"
#include "allocator/host_memory_resource.h"
#include "allocator/statistics_adaptor.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

namespace actpack::allocator {
namespace {

using namespace literals;

// The production stack: stats(budget(pool(host))).
class BudgetAdaptorTest : public ::testing::Test {
 protected:
  void* Alloc(size_t bytes) {
    absl::StatusOr<void*> p = stats_.Allocate(bytes);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  }
  void ExpectConsistent() { EXPECT_TRUE(pool_.CheckInvariants().ok()) << pool_.CheckInvariants(); }

  HostMemoryResource host_;
  HostStreamEvents events_;
  CachingPool pool_{&host_, &events_};
  BudgetAdaptor budget_{&pool_, 64_MiB};
  StatisticsAdaptor stats_{&budget_};
};

TEST_F(BudgetAdaptorTest, AllocationsUpToTheBudgetSucceedAndOneByteMoreFails) {
  void* a = Alloc(32_MiB);
  void* b = Alloc(32_MiB);
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 64_MiB);

  absl::StatusOr<void*> over = stats_.Allocate(1);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.status().message(),
            "actpack: out of budget: requested 1 B with 64.00 MiB in use and 0 B cached; "
            "budget 64.00 MiB; the smallest budget that would have fitted it: 66.00 MiB");
  // Two 32 MiB segments in use and the small pool's 2 MiB one it asked for.
  EXPECT_EQ(SmallestFittingBudget(over.status()), 66_MiB);
  EXPECT_EQ(stats_.GetStats().num_ooms, 1);

  // Nothing changed, and the allocator still works.
  ExpectConsistent();
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 64_MiB);
  EXPECT_EQ(pool_.GetUsage().allocated_bytes, 64_MiB);
  stats_.Deallocate(b, 32_MiB);
  void* c = Alloc(32_MiB);
  EXPECT_EQ(c, b);
  stats_.Deallocate(a, 32_MiB);
  stats_.Deallocate(c, 32_MiB);
  ExpectConsistent();
}

TEST_F(BudgetAdaptorTest, OneRequestOneByteOverTheBudgetFails) {
  absl::StatusOr<void*> over = stats_.Allocate(64_MiB + 1);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().message(),
            "actpack: out of budget: requested 64.00 MiB with 0 B in use and 0 B cached; "
            "budget 64.00 MiB; the smallest budget that would have fitted it: 66.00 MiB");
  EXPECT_EQ(SmallestFittingBudget(over.status()), 66_MiB);  // 64 MiB + 512 B in 2 MiB steps
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 0u);
  void* exact = Alloc(64_MiB);
  EXPECT_NE(exact, nullptr);
  stats_.Deallocate(exact, 64_MiB);
  ExpectConsistent();
}

TEST_F(BudgetAdaptorTest, CachedMemoryIsReleasedBeforeCallbacksRun) {
  int calls = 0;
  budget_.AddPressureCallback([&](size_t) {
    ++calls;
    return size_t{0};
  });
  stats_.Deallocate(Alloc(40_MiB), 40_MiB);  // 40 MiB cached
  void* p = Alloc(50_MiB);                   // fits once the cache is released
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 50_MiB);
  EXPECT_GE(stats_.GetStats().num_alloc_retries, 1);
  stats_.Deallocate(p, 50_MiB);
}

TEST_F(BudgetAdaptorTest, PressureCallbackCanFreeEnoughForTheRequest) {
  void* a = Alloc(30_MiB);
  void* b = Alloc(30_MiB);
  std::vector<size_t> needed_seen;
  budget_.AddPressureCallback([&](size_t needed) -> size_t {
    needed_seen.push_back(needed);
    if (b == nullptr) return 0;
    stats_.Deallocate(b, 30_MiB);  // what the runtime does: free memory it can rebuild
    b = nullptr;
    return 30_MiB;
  });
  void* const b_address = b;
  void* c = Alloc(20_MiB);  // 60 + 20 > 64: needs the callback
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(needed_seen.size(), 1u);
  EXPECT_EQ(needed_seen[0], 16_MiB);  // 60 in use + 20 requested - 64 budget
  // The freed segment becomes one of the request's size (on the host it is remapped in place,
  // its first 20 MiB of pages kept): a 20 MiB block cut from it would strand the other 10 MiB
  // while it lives.
  EXPECT_EQ(c, b_address);
  absl::StatusOr<CachingPool::SegmentRange> segment = pool_.SegmentContaining(c);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(segment->size, 20_MiB);
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 50_MiB);
  stats_.Deallocate(a, 30_MiB);
  stats_.Deallocate(c, 20_MiB);
  ExpectConsistent();
}

TEST_F(BudgetAdaptorTest, CallbacksRunAgainWhileTheyFreeSomething) {
  // Four 12 MiB blocks in segments of their own; a callback that frees one per call (the
  // runtime re-packs one tensor at a time) frees enough only on its second call.
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(Alloc(12_MiB));
  void* rest = Alloc(14_MiB);  // 62 MiB in use
  int calls = 0;
  budget_.AddPressureCallback([&](size_t) -> size_t {
    ++calls;
    if (blocks.empty()) return 0;
    stats_.Deallocate(blocks.back(), 12_MiB);
    blocks.pop_back();
    return 4_MiB;  // claims only what the request lacked; the segment freed is 12 MiB
  });
  void* p = Alloc(24_MiB);  // 62 + 24 > 64: two 12 MiB segments must go
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(calls, 2);
  stats_.Deallocate(p, 24_MiB);
  stats_.Deallocate(rest, 14_MiB);
  for (void* b : blocks) stats_.Deallocate(b, 12_MiB);
  ExpectConsistent();
}

TEST_F(BudgetAdaptorTest, CallbacksRunInOrderBeforeTheFailure) {
  void* a = Alloc(60_MiB);
  std::vector<int> order;
  budget_.AddPressureCallback([&](size_t) {
    order.push_back(1);
    return size_t{0};
  });
  const BudgetAdaptor::CallbackId removed = budget_.AddPressureCallback([&](size_t) {
    order.push_back(99);
    return size_t{0};
  });
  budget_.AddPressureCallback([&](size_t) {
    order.push_back(2);
    return size_t{1};  // claims progress; the retry still fails
  });
  budget_.RemovePressureCallback(removed);
  absl::StatusOr<void*> p = stats_.Allocate(8_MiB);
  ASSERT_FALSE(p.ok());
  // Rounds go on while a callback claims progress, up to a bound.
  std::vector<int> rounds;
  for (int i = 0; i < 16; ++i) rounds.insert(rounds.end(), {1, 2});
  EXPECT_EQ(order, rounds);
  EXPECT_EQ(p.status().message(),
            "actpack: out of budget: requested 8.00 MiB with 60.00 MiB in use and 0 B cached; "
            "budget 64.00 MiB; the smallest budget that would have fitted it: 68.00 MiB");
  stats_.Deallocate(a, 60_MiB);
}

TEST_F(BudgetAdaptorTest, CallbackThatAllocatesAndFailsDoesNotRecurse) {
  void* a = Alloc(60_MiB);
  int calls = 0;
  budget_.AddPressureCallback([&](size_t) {
    ++calls;
    EXPECT_FALSE(stats_.Allocate(32_MiB).ok());
    return size_t{0};
  });
  EXPECT_FALSE(stats_.Allocate(8_MiB).ok());
  EXPECT_EQ(calls, 1);
  stats_.Deallocate(a, 60_MiB);
}

TEST_F(BudgetAdaptorTest, ThrowingCallbackDoesNotDisableLaterPressureHandling) {
  void* a = Alloc(60_MiB);
  bool throw_now = true;
  int calls = 0;
  budget_.AddPressureCallback([&](size_t) -> size_t {
    ++calls;
    if (throw_now) throw std::runtime_error("callback failed");
    return 0;
  });
  EXPECT_THROW((void)stats_.Allocate(8_MiB), std::runtime_error);
  throw_now = false;
  EXPECT_FALSE(stats_.Allocate(8_MiB).ok());
  EXPECT_EQ(calls, 2);  // the second request ran the callbacks again
  stats_.Deallocate(a, 60_MiB);
}

TEST_F(BudgetAdaptorTest, MessageCountsCachedBytesThatCannotHelp) {
  // Fragmentation: a cached hole in a segment that also holds live memory cannot be released.
  // Laid out before the budget (without one the pool carves blocks from cached segments).
  budget_.SetBudget(kNoCap);
  stats_.Deallocate(Alloc(20_MiB), 20_MiB);  // one cached 20 MiB segment to carve from
  void* a = Alloc(3_MiB);
  void* b = Alloc(17_MiB);  // the rest of a's 20 MiB segment
  ASSERT_EQ(pool_.GetUsage().reserved_bytes, 20_MiB);
  budget_.SetBudget(64_MiB);
  stats_.Deallocate(a, 3_MiB);
  void* big = Alloc(44_MiB);  // 20 + 44 = 64
  absl::StatusOr<void*> p = stats_.Allocate(4_MiB);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(),
            "actpack: out of budget: requested 4.00 MiB with 61.00 MiB in use and 3.00 MiB "
            "cached; budget 64.00 MiB; the smallest budget that would have fitted it: "
            "68.00 MiB");
  // The hole cannot be given back: both segments stay, and a 4 MiB one comes on top.
  EXPECT_EQ(SmallestFittingBudget(p.status()), 68_MiB);
  ExpectConsistent();
  stats_.Deallocate(b, 17_MiB);
  stats_.Deallocate(big, 44_MiB);
}

TEST_F(BudgetAdaptorTest, BudgetCanChangeAtAnyTime) {
  void* a = Alloc(30_MiB);
  budget_.SetBudget(32_MiB);
  EXPECT_FALSE(stats_.Allocate(4_MiB).ok());
  budget_.SetBudget(kNoCap);
  void* b = Alloc(1_GiB);
  stats_.Deallocate(a, 30_MiB);
  stats_.Deallocate(b, 1_GiB);
}

TEST(BudgetAdaptorOverBackendTest, CapsANonCachingBackend) {
  HostMemoryResource host;
  BudgetAdaptor budget(&host, 1_MiB);
  void* a = *budget.Allocate(1_MiB - 256);
  void* b = *budget.Allocate(1);  // rounded to 256: exactly at the budget
  absl::StatusOr<void*> c = budget.Allocate(1);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "actpack: out of budget: requested 1 B with 1.00 MiB in use and 0 B cached; "
            "budget 1.00 MiB; the smallest budget that would have fitted it: 1.00 MiB");
  EXPECT_EQ(SmallestFittingBudget(c.status()), 1_MiB + 256);  // no pool: the request on top
  budget.Deallocate(a, 1_MiB - 256);
  budget.Deallocate(b, 1);
  EXPECT_EQ(host.GetUsage().reserved_bytes, 0u);
}

// A device that is full before the budget is: the message says so and keeps the device's words.
class FullDevice final : public MemoryResource {
 private:
  absl::StatusOr<void*> DoAllocate(size_t, Stream, size_t) override {
    return absl::ResourceExhaustedError("device is full");
  }
  void DoDeallocate(void*, size_t, Stream) override {}
  MemoryUsage DoGetUsage() const override { return {}; }
};

TEST(BudgetAdaptorOverBackendTest, DeviceOutOfMemoryIsNotCalledOutOfBudget) {
  FullDevice device;
  BudgetAdaptor budget(&device, 1_GiB);
  int calls = 0;
  budget.AddPressureCallback([&](size_t needed) {
    EXPECT_EQ(needed, 4_MiB);  // the budget has room: the request size
    ++calls;
    return size_t{0};
  });
  absl::StatusOr<void*> p = budget.Allocate(4_MiB);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(p.status().message(),
            "actpack: out of memory within the budget: requested 4.00 MiB with 0 B in use and "
            "0 B cached; budget 1.00 GiB: device is full");
  EXPECT_FALSE(SmallestFittingBudget(p.status()).has_value());  // no budget would have helped
}

// A cache whose limited requests fail while it holds cache, counting EmptyCache calls.
class CountingCache final : public MemoryResource {
 public:
  int empties = 0;

 private:
  absl::StatusOr<void*> DoAllocate(size_t bytes, Stream, size_t limit) override {
    return ReserveLimitExceeded("no room", 70_MiB);
  }
  void DoDeallocate(void*, size_t, Stream) override {}
  size_t DoEmptyCache() override {
    ++empties;
    return 10_MiB;
  }
  MemoryUsage DoGetUsage() const override { return {60_MiB, 50_MiB}; }
};

// The pool gives back what a request lacks before it fails; the budget does not empty the rest
// of the cache before the pressure callbacks (on CUDA each segment given back was a cudaFree,
// which synchronizes the device, and a cudaMalloc when the next step needs it again).
TEST(BudgetAdaptorOverBackendTest, TheCacheIsNotEmptiedBeforeThePressureCallbacks) {
  CountingCache cache;
  BudgetAdaptor budget(&cache, 64_MiB);
  int empties_seen = -1;
  budget.AddPressureCallback([&](size_t) {
    empties_seen = cache.empties;
    return size_t{0};
  });
  absl::StatusOr<void*> p = budget.Allocate(8_MiB);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(empties_seen, 0);
  EXPECT_EQ(cache.empties, 0);
  EXPECT_EQ(SmallestFittingBudget(p.status()), 70_MiB);  // what the cache said it needed
}

TEST(BudgetAdaptorOverBackendTest, InnerBudgetPassesATighterOuterLimitUp) {
  HostMemoryResource host;
  BudgetAdaptor inner(&host, 1_GiB);
  BudgetAdaptor outer(&inner, 1_MiB);
  absl::StatusOr<void*> p = outer.Allocate(2_MiB);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(),
            "actpack: out of budget: requested 2.00 MiB with 0 B in use and 0 B cached; "
            "budget 1.00 MiB; the smallest budget that would have fitted it: 2.00 MiB");
}

}  // namespace
}  // namespace actpack::allocator
