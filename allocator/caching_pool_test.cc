#include "allocator/caching_pool.h"

#include <cstring>
#include <vector>

#include "allocator/budget_adaptor.h"
#include "allocator/host_memory_resource.h"
#include "allocator/internal/manual_stream_events.h"
#include "allocator/statistics_adaptor.h"
#include "allocator/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace actpack::allocator {
namespace {

using internal::ManualStreamEvents;
using ::testing::HasSubstr;
using namespace literals;

const Stream kStreamA = reinterpret_cast<Stream>(0xA);
const Stream kStreamB = reinterpret_cast<Stream>(0xB);
const Stream kStreamC = reinterpret_cast<Stream>(0xC);

class CachingPoolTest : public ::testing::Test {
 protected:
  void* Alloc(size_t bytes, Stream stream = kStreamA) {
    absl::StatusOr<void*> p = pool_.Allocate(bytes, stream);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  }
  size_t BlockSize(const void* p) {
    absl::StatusOr<AllocationInfo> info = pool_.Lookup(p);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->size : 0;
  }
  void ExpectConsistent() { EXPECT_TRUE(pool_.CheckInvariants().ok()) << pool_.CheckInvariants(); }

  HostMemoryResource host_;
  ManualStreamEvents events_;
  CachingPool pool_{&host_, &events_};
};

TEST(CachingPoolSizesTest, RoundsLikePyTorch) {
  EXPECT_EQ(RoundBlockSize(1), 512u);
  EXPECT_EQ(RoundBlockSize(512), 512u);
  EXPECT_EQ(RoundBlockSize(513), 1024u);
  EXPECT_EQ(RoundBlockSize(1_MiB + 1), 1_MiB + 512);
  EXPECT_EQ(SegmentSizeFor(512), 2_MiB);
  EXPECT_EQ(SegmentSizeFor(1_MiB), 2_MiB);
  EXPECT_EQ(SegmentSizeFor(1_MiB + 512), 20_MiB);
  EXPECT_EQ(SegmentSizeFor(10_MiB - 512), 20_MiB);
  EXPECT_EQ(SegmentSizeFor(10_MiB), 10_MiB);
  // Under a budget, mid-size blocks (above 512 KiB) do not share segments; the small pool does.
  EXPECT_TRUE(InSmallPool(1_MiB, /*under_budget=*/false));
  EXPECT_FALSE(InSmallPool(1_MiB + 512, /*under_budget=*/false));
  EXPECT_TRUE(InSmallPool(512_KiB, /*under_budget=*/true));
  EXPECT_FALSE(InSmallPool(512_KiB + 512, /*under_budget=*/true));
  EXPECT_EQ(SegmentSizeFor(512_KiB, /*under_budget=*/true), 2_MiB);
  EXPECT_EQ(SegmentSizeFor(512_KiB + 512, /*under_budget=*/true), 512_KiB + 512);
  EXPECT_EQ(SegmentSizeFor(1_MiB, /*under_budget=*/true), 1_MiB);
  EXPECT_EQ(SegmentSizeFor(1_MiB + 512, /*under_budget=*/true), 1_MiB + 512);
  EXPECT_EQ(SegmentSizeFor(8_MiB, /*under_budget=*/true), 8_MiB);
  EXPECT_EQ(SegmentSizeFor(9_MiB - 512, /*under_budget=*/true), 9_MiB - 512);
  // ... rounded up to whole 2 MiB (host huge pages) where that wastes at most 1/16 and less
  // than a block the large pool could split off.
  EXPECT_EQ(SegmentSizeFor(4_MiB - 160_KiB, /*under_budget=*/true), 4_MiB);
  EXPECT_EQ(SegmentSizeFor(4_MiB - 160_KiB), 20_MiB);
  EXPECT_EQ(SegmentSizeFor(2_MiB + 512, /*under_budget=*/true), 2_MiB + 512);
  EXPECT_EQ(SegmentSizeFor(4_MiB - 256_KiB, /*under_budget=*/true), 4_MiB - 256_KiB);
  EXPECT_EQ(SegmentSizeFor(10_MiB - 600_KiB, /*under_budget=*/true), 10_MiB - 600_KiB);
  EXPECT_EQ(SegmentSizeFor(10_MiB - 500_KiB, /*under_budget=*/true), 10_MiB);
  EXPECT_EQ(SegmentSizeFor(10_MiB + 512, /*under_budget=*/true), 12_MiB);
  EXPECT_EQ(SegmentSizeFor(11_MiB), 12_MiB);
}

TEST_F(CachingPoolTest, SmallRequestsShareTwoMiBSegments) {
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(Alloc(512_KiB));
  EXPECT_EQ(pool_.Segments().size(), 1u);
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 2_MiB);
  blocks.push_back(Alloc(1));
  EXPECT_EQ(pool_.Segments().size(), 2u);
  EXPECT_EQ(BlockSize(blocks.back()), 512u);
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 4_MiB);
  ExpectConsistent();
  for (void* p : blocks) pool_.Deallocate(p, 0, kStreamA);
  ExpectConsistent();
}

TEST_F(CachingPoolTest, LargeRequestsGetTheirOwnRoundedSegment) {
  void* p = Alloc(11_MiB);
  ASSERT_EQ(pool_.Segments().size(), 1u);
  EXPECT_EQ(pool_.Segments()[0].total_size, 12_MiB);
  // The 1 MiB tail is not worth a large-pool block: the block keeps it.
  EXPECT_EQ(BlockSize(p), 12_MiB);
  EXPECT_FALSE(pool_.Segments()[0].is_small);
  pool_.Deallocate(p, 11_MiB, kStreamA);
}

TEST_F(CachingPoolTest, BestFitTakesTheSmallestCachedBlock) {
  // One 20 MiB segment: a(3) s1(2) b(6) s2(2) rest(7); freeing a and b leaves holes of 3 and 6.
  auto* a = static_cast<char*>(Alloc(3_MiB));
  void* s1 = Alloc(2_MiB);
  auto* b = static_cast<char*>(Alloc(6_MiB));
  void* s2 = Alloc(2_MiB);
  EXPECT_EQ(b, a + 5_MiB);
  EXPECT_EQ(pool_.Segments().size(), 1u);
  pool_.Deallocate(a, 3_MiB, kStreamA);
  pool_.Deallocate(b, 6_MiB, kStreamA);
  ExpectConsistent();

  void* five = Alloc(5_MiB);  // the 6 MiB hole fits best; its 1 MiB rest is not split off
  EXPECT_EQ(five, b);
  EXPECT_EQ(BlockSize(five), 6_MiB);
  void* two_and_half = Alloc(2_MiB + 512_KiB);  // then the 3 MiB hole
  EXPECT_EQ(two_and_half, a);
  void* seven = Alloc(7_MiB);  // the tail
  EXPECT_EQ(seven, a + 13_MiB);
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 20_MiB);
  ExpectConsistent();
  for (void* p : {five, two_and_half, seven, s1, s2}) pool_.Deallocate(p, 0, kStreamA);
  ExpectConsistent();
  ASSERT_EQ(pool_.Segments().size(), 1u);
  EXPECT_EQ(pool_.Segments()[0].blocks.size(), 1u);  // everything merged back
}

TEST_F(CachingPoolTest, FreeMergesWithBothNeighbours) {
  auto* a = static_cast<char*>(Alloc(256_KiB));
  auto* b = static_cast<char*>(Alloc(256_KiB));
  auto* c = static_cast<char*>(Alloc(256_KiB));
  ASSERT_EQ(b, a + 256_KiB);
  ASSERT_EQ(c, b + 256_KiB);
  pool_.Deallocate(a, 256_KiB, kStreamA);
  pool_.Deallocate(c, 256_KiB, kStreamA);
  EXPECT_EQ(pool_.Segments()[0].blocks.size(), 3u);  // a | b | c+tail
  pool_.Deallocate(b, 256_KiB, kStreamA);
  ASSERT_EQ(pool_.Segments()[0].blocks.size(), 1u);
  EXPECT_EQ(pool_.Segments()[0].blocks[0].size, 2_MiB);
  EXPECT_EQ(pool_.Segments()[0].blocks[0].state, BlockState::kInactive);
  ExpectConsistent();
}

TEST_F(CachingPoolTest, RecordedStreamDelaysReuseUntilItsEventCompletes) {
  void* p = Alloc(1_MiB, kStreamA);
  ASSERT_TRUE(pool_.RecordStream(p, kStreamB).ok());
  pool_.Deallocate(p, 1_MiB, kStreamA);
  EXPECT_EQ(events_.recorded(), 1);
  ASSERT_EQ(pool_.Segments()[0].blocks[0].state, BlockState::kActivePendingFree);
  ExpectConsistent();

  // Stream B may still be reading p: the next request must not get it.
  void* q = Alloc(1_MiB, kStreamA);
  EXPECT_NE(q, p);
  pool_.Deallocate(q, 1_MiB, kStreamA);

  events_.CompleteStream(kStreamB);
  void* r = Alloc(1_MiB, kStreamA);
  EXPECT_EQ(r, p);
  EXPECT_EQ(events_.live(), 0);  // the event was released
  pool_.Deallocate(r, 1_MiB, kStreamA);
  ExpectConsistent();
}

TEST_F(CachingPoolTest, RecordStreamOnTheOwnStreamRecordsNothing) {
  void* p = Alloc(4_KiB, kStreamA);
  ASSERT_TRUE(pool_.RecordStream(p, kStreamA).ok());
  pool_.Deallocate(p, 4_KiB, kStreamA);
  EXPECT_EQ(events_.recorded(), 0);
  EXPECT_EQ(Alloc(4_KiB, kStreamA), p);
}

TEST_F(CachingPoolTest, EveryRecordedStreamMustComplete) {
  void* p = Alloc(64_KiB, kStreamA);
  ASSERT_TRUE(pool_.RecordStream(p, kStreamB).ok());
  ASSERT_TRUE(pool_.RecordStream(p, kStreamC).ok());
  ASSERT_TRUE(pool_.RecordStream(p, kStreamC).ok());  // once is enough
  pool_.Deallocate(p, 64_KiB, kStreamA);
  EXPECT_EQ(events_.recorded(), 2);
  events_.CompleteStream(kStreamB);
  EXPECT_NE(Alloc(64_KiB, kStreamA), p);
  events_.CompleteStream(kStreamC);
  EXPECT_EQ(Alloc(64_KiB, kStreamA), p);
  ExpectConsistent();
}

TEST_F(CachingPoolTest, RecordStreamOfUnknownPointerIsNotFound) {
  int not_from_pool = 0;
  absl::Status status = pool_.RecordStream(&not_from_pool, kStreamB);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool_.Lookup(&not_from_pool).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CachingPoolTest, LookupReportsSizeAndStream) {
  void* p = Alloc(1000, kStreamB);
  absl::StatusOr<AllocationInfo> info = pool_.Lookup(p);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->size, 1024u);
  EXPECT_EQ(info->requested_size, 1000u);
  EXPECT_EQ(info->stream, kStreamB);
}

TEST_F(CachingPoolTest, SegmentContainingFindsTheSegmentOfAnyInteriorAddress) {
  void* a = Alloc(3_MiB);  // a 20 MiB segment
  void* b = Alloc(4_MiB);  // carved from the same segment, after `a`
  const auto base = reinterpret_cast<uintptr_t>(a);
  for (void* p : {a, b, static_cast<void*>(static_cast<char*>(a) + 20_MiB - 1)}) {
    absl::StatusOr<CachingPool::SegmentRange> segment = pool_.SegmentContaining(p);
    ASSERT_TRUE(segment.ok()) << segment.status();
    EXPECT_EQ(segment->address, base);
    EXPECT_EQ(segment->size, 20_MiB);
  }
  // One past the end is not this segment (the pool holds no other one).
  EXPECT_EQ(pool_.SegmentContaining(static_cast<char*>(a) + 20_MiB).status().code(),
            absl::StatusCode::kNotFound);
  int not_from_pool = 0;
  EXPECT_THAT(std::string(pool_.SegmentContaining(&not_from_pool).status().message()),
              HasSubstr("is not inside a segment"));
  pool_.Deallocate(b, 4_MiB, kStreamA);
  pool_.Deallocate(a, 3_MiB, kStreamA);
}

// A block still waiting for another stream is handed to its own stream (which is ordered
// after that stream's event), not waited for on the host; its segment then goes back.
TEST_F(CachingPoolTest, EmptyCacheHandsOverPendingBlocksAndKeepsLiveOnes) {
  void* live = Alloc(3_MiB, kStreamA);
  void* pending = Alloc(1_MiB, kStreamA);
  ASSERT_TRUE(pool_.RecordStream(pending, kStreamB).ok());
  pool_.Deallocate(pending, 1_MiB, kStreamA);
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 22_MiB);
  EXPECT_EQ(pool_.EmptyCache(), 2_MiB);
  EXPECT_EQ(events_.waits(), 0);
  EXPECT_EQ(events_.stream_waits(), 1);
  EXPECT_EQ(events_.live(), 0);
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 20_MiB);
  EXPECT_EQ(pool_.GetUsage().allocated_bytes, 3_MiB);
  ExpectConsistent();
  pool_.Deallocate(live, 3_MiB, kStreamA);
  EXPECT_EQ(pool_.EmptyCache(), 20_MiB);
  EXPECT_EQ(host_.GetUsage().reserved_bytes, 0u);
}

// At the limit a block another stream has not finished with is handed to its own stream: the
// stream is ordered after the other stream's event (cudaStreamWaitEvent on CUDA), and the host
// waits for nothing. Where a stream cannot be ordered, the host waits instead.
TEST_F(CachingPoolTest, AtTheLimitPendingBlocksAreHandedOverWithoutAHostWait) {
  void* a = *pool_.AllocateWithin(8_MiB, kStreamA, 16_MiB);
  void* b = *pool_.AllocateWithin(8_MiB, kStreamA, 16_MiB);
  ASSERT_TRUE(pool_.RecordStream(b, kStreamB).ok());
  pool_.Deallocate(b, 8_MiB, kStreamA);  // waits for stream B's event
  // Only b's memory fits another 8 MiB under the limit.
  absl::StatusOr<void*> c = pool_.AllocateWithin(8_MiB, kStreamA, 16_MiB);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, b);
  EXPECT_EQ(events_.waits(), 0);
  EXPECT_EQ(events_.stream_waits(), 1);
  EXPECT_EQ(events_.live(), 0);
  ExpectConsistent();

  events_.set_fail_stream_waits(true);
  ASSERT_TRUE(pool_.RecordStream(*c, kStreamB).ok());
  pool_.Deallocate(*c, 8_MiB, kStreamA);
  absl::StatusOr<void*> d = pool_.AllocateWithin(8_MiB, kStreamA, 16_MiB);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, b);
  EXPECT_EQ(events_.waits(), 1);
  ExpectConsistent();
  pool_.Deallocate(a, 8_MiB, kStreamA);
  pool_.Deallocate(*d, 8_MiB, kStreamA);
}

// A reserve-limit failure says what limit would have served it: the segments holding live
// blocks, plus the segment it needed, with every free segment given back.
TEST_F(CachingPoolTest, AReserveLimitFailureCarriesTheLimitThatWouldHaveFitted) {
  void* a = *pool_.AllocateWithin(12_MiB, kStreamA, 32_MiB);
  void* b = *pool_.AllocateWithin(6_MiB, kStreamA, 32_MiB);
  pool_.Deallocate(b, 6_MiB, kStreamA);  // free: would go back
  absl::StatusOr<void*> c = pool_.AllocateWithin(24_MiB, kStreamA, 32_MiB);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(IsReserveLimitExceeded(c.status()));
  EXPECT_EQ(ReserveLimitNeeded(c.status()), 12_MiB + 24_MiB);
  EXPECT_FALSE(ReserveLimitNeeded(absl::ResourceExhaustedError("device")).has_value());
  ExpectConsistent();
  pool_.Deallocate(a, 12_MiB, kStreamA);
}

// A backend that holds memory in 2 MiB units (a VMM backend's granules), on the host.
class GranularHost final : public MemoryResource {
 public:
  HostMemoryResource host;

 private:
  absl::StatusOr<void*> DoAllocate(size_t bytes, Stream stream, size_t limit) override {
    return host.Allocate(RoundUp(bytes, 2_MiB), stream);
  }
  void DoDeallocate(void* ptr, size_t bytes, Stream stream) override {
    host.Deallocate(ptr, RoundUp(bytes, 2_MiB), stream);
  }
  MemoryUsage DoGetUsage() const override { return host.GetUsage(); }
  size_t DoAllocationGranularity() const override { return 2_MiB; }
};

// Segments are whole units of such a backend: a budget counts what the device holds, and the
// rest of a unit serves the next block instead of lying outside every segment.
TEST(CachingPoolGranularityTest, SegmentsAreWholeUnitsOfTheBackend) {
  GranularHost backend;
  HostStreamEvents events;
  CachingPool pool(&backend, &events);
  void* p = *pool.AllocateWithin(600_KiB, kStreamA, 64_MiB);  // a segment of its own
  EXPECT_EQ(pool.GetUsage().reserved_bytes, 2_MiB);
  EXPECT_EQ(backend.GetUsage().reserved_bytes, 2_MiB);
  void* q = *pool.AllocateWithin(1_MiB, kStreamA, 64_MiB);  // from the same unit
  EXPECT_EQ(pool.GetUsage().reserved_bytes, 2_MiB);
  void* r = *pool.AllocateWithin(3_MiB, kStreamA, 64_MiB);
  EXPECT_EQ(pool.GetUsage().reserved_bytes, 6_MiB);
  EXPECT_TRUE(pool.CheckInvariants().ok());
  pool.Deallocate(p, 600_KiB, kStreamA);
  pool.Deallocate(q, 1_MiB, kStreamA);
  pool.Deallocate(r, 3_MiB, kStreamA);
  EXPECT_EQ(pool.EmptyCache(), 6_MiB);
  EXPECT_EQ(backend.GetUsage().reserved_bytes, 0u);
}

// At the limit the pool releases what the new segment lacks, not the whole cache: under a budget
// it is at its limit every step, and each released segment's pages are faulted in again when
// one is next reserved. The smallest cached segment that covers the lack goes first.
TEST_F(CachingPoolTest, ReserveLimitReleasesOnlyWhatTheNewSegmentLacks) {
  // An upstream that cannot remap (a budget stacked on the host): segments are released.
  BudgetAdaptor no_remap(&host_, 1024_MiB);
  CachingPool pool(&no_remap, &events_);
  StatisticsAdaptor stats(&pool);
  pool.Deallocate(*pool.Allocate(3_MiB, kStreamA), 3_MiB, kStreamA);  // a shared 20 MiB segment
  pool.Deallocate(*pool.Allocate(3_MiB, kStreamB), 3_MiB, kStreamB);
  absl::StatusOr<void*> own = pool.AllocateWithin(6_MiB, kStreamA, 48_MiB);  // its own 6 MiB
  ASSERT_TRUE(own.ok()) << own.status();
  pool.Deallocate(*own, 6_MiB, kStreamA);
  EXPECT_EQ(pool.GetUsage().reserved_bytes, 46_MiB);
  // Stream C has no cached block. 12 MiB lack 10: one 20 MiB segment goes, not all three.
  absl::StatusOr<void*> p = pool.AllocateWithin(12_MiB, kStreamC, 48_MiB);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(pool.GetUsage().reserved_bytes, 20_MiB + 6_MiB + 12_MiB);
  // 14 MiB lack 4: the 6 MiB segment covers it, the remaining 20 MiB one stays.
  absl::StatusOr<void*> q = pool.AllocateWithin(14_MiB, kStreamC, 48_MiB);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(pool.GetUsage().reserved_bytes, 20_MiB + 12_MiB + 14_MiB);
  // 22 MiB lack 20: the 20 MiB segment covers it; the free 14 MiB one stays.
  pool.Deallocate(*q, 14_MiB, kStreamC);
  absl::StatusOr<void*> r = pool.AllocateWithin(22_MiB, kStreamC, 48_MiB);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(pool.GetUsage().reserved_bytes, 12_MiB + 14_MiB + 22_MiB);
  // One retry per allocation in the statistics, however many segments it released.
  EXPECT_EQ(stats.GetStats().num_alloc_retries, 3);
  EXPECT_TRUE(pool.CheckInvariants().ok());
  pool.Deallocate(*p, 12_MiB, kStreamC);
  pool.Deallocate(*r, 22_MiB, kStreamC);
}

// At the limit a cached segment with no room for the request becomes the new segment, its pages
// moved rather than unmapped and faulted in again: the 8 MiB segment shrinks to the 6 MiB one in
// place. An upstream that cannot remap (here a budget stacked on the host) gets the release.
TEST_F(CachingPoolTest, AtTheLimitAFreeSegmentIsRemappedIntoTheNewOne) {
  StatisticsAdaptor stats(&pool_);
  absl::StatusOr<void*> eight = pool_.AllocateWithin(8_MiB, kStreamA, 10_MiB);
  ASSERT_TRUE(eight.ok()) << eight.status();
  std::memset(*eight, 1, 8_MiB);
  pool_.Deallocate(*eight, 8_MiB, kStreamA);
  // 6 MiB + 8 MiB cached pass 10 MiB; the cached block is too large to take without a split.
  absl::StatusOr<void*> six = pool_.AllocateWithin(6_MiB, kStreamA, 10_MiB);
  ASSERT_TRUE(six.ok()) << six.status();
  EXPECT_EQ(*six, *eight);
  EXPECT_EQ(static_cast<unsigned char*>(*six)[6_MiB - 1], 1);  // the same pages
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 6_MiB);
  EXPECT_EQ(host_.GetUsage().reserved_bytes, 6_MiB);
  EXPECT_EQ(stats.GetStats().num_alloc_retries, 1);
  ExpectConsistent();
  pool_.Deallocate(*six, 6_MiB, kStreamA);

  BudgetAdaptor no_remap(&host_, 1024_MiB);
  CachingPool pool(&no_remap, &events_);
  void* a = *pool.AllocateWithin(8_MiB, kStreamA, 10_MiB);
  pool.Deallocate(a, 8_MiB, kStreamA);
  absl::StatusOr<void*> b = pool.AllocateWithin(6_MiB, kStreamA, 10_MiB);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(pool.GetUsage().reserved_bytes, 6_MiB);
  EXPECT_TRUE(pool.CheckInvariants().ok());
  pool.Deallocate(*b, 6_MiB, kStreamA);
}

// Under a generous budget a step's requests reuse the last step's blocks: a 12 MiB + 512 B
// buffer (an identity-packed 12 MiB activation with its header) reserves a 14 MiB segment, and
// once freed it merges back with the segment's tail into one 14 MiB block, which the next
// step's same request must take (it was refused as "too large to take without a split", and
// the cache grew by a segment a step until the budget's end).
TEST_F(CachingPoolTest, UnderABudgetRepeatedRequestsReuseTheirMergedSegments) {
  for (int step = 0; step < 4; ++step) {
    absl::StatusOr<void*> a = pool_.AllocateWithin(12_MiB + 512, kStreamA, 1024_MiB);
    absl::StatusOr<void*> b = pool_.AllocateWithin(4_MiB, kStreamA, 1024_MiB);
    ASSERT_TRUE(a.ok() && b.ok());
    pool_.Deallocate(*a, 12_MiB + 512, kStreamA);
    pool_.Deallocate(*b, 4_MiB, kStreamA);
    EXPECT_EQ(pool_.GetUsage().reserved_bytes, 14_MiB + 4_MiB) << "step " << step;
    ExpectConsistent();
  }
}

// A small block living between two holes of a small segment keeps either from serving a 1 MiB
// request; under a 3 MiB limit (one small segment and a 1 MiB one) a second 1 MiB block then
// finds no room though 2 MiB + 4 KiB are in use. With 768 KiB and 1 MiB blocks in segments of
// their own, and the small pool's holes left to them only at the limit, it fits.
TEST_F(CachingPoolTest, UnderABudgetSmallBlocksDoNotPinTheHolesOfMidSizeOnes) {
  const size_t limit = 3_MiB;
  auto alloc = [&](size_t bytes) {
    absl::StatusOr<void*> p = pool_.AllocateWithin(bytes, kStreamA, limit);
    EXPECT_TRUE(p.ok()) << bytes << ": " << p.status();
    EXPECT_LE(pool_.GetUsage().reserved_bytes, limit);
    return p.ok() ? *p : nullptr;
  };
  void* a = alloc(768_KiB);
  void* s = alloc(256_KiB);
  void* c = alloc(1_MiB);
  pool_.Deallocate(s, 256_KiB, kStreamA);
  void* t = alloc(4_KiB);  // lives on, where `s` was
  pool_.Deallocate(a, 768_KiB, kStreamA);
  pool_.Deallocate(c, 1_MiB, kStreamA);
  void* x = alloc(1_MiB);
  void* y = alloc(1_MiB);
  ExpectConsistent();
  for (auto [p, bytes] : {std::pair{x, 1_MiB}, {y, 1_MiB}}) {
    if (p != nullptr) pool_.Deallocate(p, bytes, kStreamA);
  }
  pool_.EmptyCache();
  // At the limit a block above the small pool's sizes takes a hole of a small segment too.
  void* big = alloc(2_MiB - 8_KiB);
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 2_MiB);
  ExpectConsistent();
  pool_.Deallocate(big, 2_MiB - 8_KiB, kStreamA);
  pool_.Deallocate(t, 4_KiB, kStreamA);
}

TEST_F(CachingPoolTest, UpstreamFailureReleasesCachedSegmentsAndRetries) {
  // The pool's upstream itself refuses to pass 40 MiB.
  BudgetAdaptor capped_host(&host_, 40_MiB);
  CachingPool pool(&capped_host, &events_);
  pool.Deallocate(*pool.Allocate(3_MiB, kStreamA), 3_MiB, kStreamA);
  pool.Deallocate(*pool.Allocate(3_MiB, kStreamB), 3_MiB, kStreamB);
  absl::StatusOr<void*> p = pool.Allocate(12_MiB, kStreamC);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(host_.GetUsage().reserved_bytes, 12_MiB);
  pool.Deallocate(*p, 12_MiB, kStreamC);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

// What the system counts outside the pool (another library's buffers) shrinks the room a
// limit leaves: here 10 MiB of a 40 MiB limit are taken by someone else.
TEST_F(CachingPoolTest, MemoryCountedOutsideThePoolShrinksTheLimit) {
  std::vector<size_t> asked_with;
  pool_.SetOutsideCounter([&](size_t reserved) {
    asked_with.push_back(reserved);
    return 10_MiB;
  });
  absl::StatusOr<void*> first = pool_.AllocateWithin(20_MiB, kStreamA, 40_MiB);  // 20 + 10 <= 40
  ASSERT_TRUE(first.ok()) << first.status();
  void* a = *first;
  absl::StatusOr<void*> b = pool_.AllocateWithin(12_MiB, kStreamA, 40_MiB);  // 20 + 12 + 10 > 40
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(std::string(b.status().message()),
              HasSubstr("10.00 MiB more counted by the system outside the pool"));
  absl::StatusOr<void*> c = pool_.AllocateWithin(10_MiB, kStreamA, 40_MiB);  // exactly 40
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(asked_with.empty());
  EXPECT_EQ(asked_with.front(), 0u);  // the pool's reserved bytes before the first segment
  // Without a limit the counter is not asked (it may be expensive).
  const size_t asked = asked_with.size();
  pool_.Deallocate(Alloc(64_MiB, kStreamB), 64_MiB, kStreamB);
  EXPECT_EQ(asked_with.size(), asked);
  pool_.SetOutsideCounter(nullptr);
  pool_.Deallocate(a, 20_MiB, kStreamA);
  pool_.Deallocate(*c, 10_MiB, kStreamA);
  ExpectConsistent();
}

TEST_F(CachingPoolTest, FailureOverTheLimitLeavesThePoolConsistent) {
  void* live = Alloc(4_KiB);
  absl::StatusOr<void*> p = pool_.AllocateWithin(30_MiB, kStreamA, 20_MiB);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(IsReserveLimitExceeded(p.status())) << p.status();
  EXPECT_THAT(std::string(p.status().message()),
              HasSubstr("could not reserve a 30.00 MiB segment for a 30.00 MiB request"));
  ExpectConsistent();
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 2_MiB);
  EXPECT_EQ(Alloc(4_KiB), static_cast<char*>(live) + 4_KiB);
}

// A block whose other stream's event cannot be recorded stays out of the cache until one can
// be: the next calls record it, and it is reused once that event completes.
TEST_F(CachingPoolTest, FailedEventRecordKeepsTheBlockOutUntilAnEventIsRecorded) {
  void* p = Alloc(8_KiB, kStreamA);
  ASSERT_TRUE(pool_.RecordStream(p, kStreamB).ok());
  events_.set_fail_records(true);
  pool_.Deallocate(p, 8_KiB, kStreamA);
  EXPECT_EQ(pool_.Segments()[0].blocks[0].state, BlockState::kActivePendingFree);
  void* q = Alloc(8_KiB, kStreamA);  // recording still fails: not p
  EXPECT_NE(q, p);
  events_.set_fail_records(false);
  void* r = Alloc(8_KiB, kStreamA);  // recorded now, pending on B
  EXPECT_NE(r, p);
  EXPECT_EQ(events_.recorded(), 1);
  events_.CompleteStream(kStreamB);
  pool_.Deallocate(q, 8_KiB, kStreamA);
  pool_.Deallocate(r, 8_KiB, kStreamA);
  EXPECT_EQ(pool_.EmptyCache(), 2_MiB);  // its segment went back
  EXPECT_EQ(pool_.GetUsage().reserved_bytes, 0u);
  ExpectConsistent();
}

TEST_F(CachingPoolTest, SegmentsDescribeEveryBlock) {
  void* a = Alloc(100, kStreamA);
  void* b = Alloc(3_MiB, kStreamB);
  std::vector<SegmentInfo> segments = pool_.Segments();
  ASSERT_EQ(segments.size(), 2u);
  const SegmentInfo& small = segments[0].is_small ? segments[0] : segments[1];
  const SegmentInfo& large = segments[0].is_small ? segments[1] : segments[0];
  EXPECT_EQ(small.total_size, 2_MiB);
  EXPECT_EQ(small.stream, kStreamA);
  ASSERT_EQ(small.blocks.size(), 2u);
  EXPECT_EQ(small.blocks[0].address, reinterpret_cast<uintptr_t>(a));
  EXPECT_EQ(small.blocks[0].size, 512u);
  EXPECT_EQ(small.blocks[0].requested_size, 100u);
  EXPECT_EQ(small.blocks[0].state, BlockState::kActiveAllocated);
  EXPECT_EQ(small.blocks[1].size, 2_MiB - 512);
  EXPECT_EQ(small.blocks[1].state, BlockState::kInactive);
  EXPECT_EQ(large.total_size, 20_MiB);
  EXPECT_EQ(large.blocks[0].address, reinterpret_cast<uintptr_t>(b));
}

TEST(CachingPoolLifetimeTest, DestructorReturnsEverySegment) {
  HostMemoryResource host;
  HostStreamEvents events;
  {
    CachingPool pool(&host, &events);
    ASSERT_TRUE(pool.Allocate(5_MiB).ok());  // never freed
    pool.Deallocate(*pool.Allocate(100), 100);
    EXPECT_EQ(host.GetUsage().reserved_bytes, 22_MiB);
  }
  EXPECT_EQ(host.GetUsage().reserved_bytes, 0u);
}

TEST(CachingPoolDeathTest, FreeingAPointerThatIsNotAllocatedAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  HostMemoryResource host;
  HostStreamEvents events;
  CachingPool pool(&host, &events);
  void* p = *pool.Allocate(100);
  pool.Deallocate(p, 100);
  EXPECT_DEATH(pool.Deallocate(p, 100), "not allocated");
}

}  // namespace
}  // namespace actpack::allocator
