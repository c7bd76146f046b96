#include "allocator/statistics_adaptor.h"

#include <map>
#include <string>

#include "allocator/caching_pool.h"
#include "allocator/host_memory_resource.h"
#include "allocator/internal/manual_stream_events.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

namespace actpack::allocator {
namespace {

using internal::ManualStreamEvents;
using namespace literals;

const Stream kStreamA = reinterpret_cast<Stream>(0xA);
const Stream kStreamB = reinterpret_cast<Stream>(0xB);

class StatisticsAdaptorTest : public ::testing::Test {
 protected:
  HostMemoryResource host_;
  ManualStreamEvents events_;
  CachingPool pool_{&host_, &events_};
  StatisticsAdaptor stats_{&pool_};
};

TEST_F(StatisticsAdaptorTest, CountsBlocksAndSegmentsLikeTorch) {
  void* p = *stats_.Allocate(3_MiB + 1, kStreamA);
  MemoryStats s = stats_.GetStats();
  EXPECT_EQ(s.allocated_bytes.current, static_cast<int64_t>(3_MiB + 512));
  EXPECT_EQ(s.requested_bytes.current, static_cast<int64_t>(3_MiB + 1));
  EXPECT_EQ(s.reserved_bytes.current, static_cast<int64_t>(20_MiB));
  EXPECT_EQ(s.segment.current, 1);
  EXPECT_EQ(s.allocation.current, 1);
  EXPECT_EQ(s.num_allocs, 1);

  stats_.Deallocate(p, 3_MiB + 1, kStreamA);
  s = stats_.GetStats();
  EXPECT_EQ(s.allocated_bytes.current, 0);
  EXPECT_EQ(s.allocated_bytes.peak, static_cast<int64_t>(3_MiB + 512));
  EXPECT_EQ(s.allocated_bytes.freed, static_cast<int64_t>(3_MiB + 512));
  EXPECT_EQ(s.reserved_bytes.current, static_cast<int64_t>(20_MiB));  // cached, still reserved
  EXPECT_EQ(s.num_frees, 1);

  stats_.EmptyCache();
  s = stats_.GetStats();
  EXPECT_EQ(s.reserved_bytes.current, 0);
  EXPECT_EQ(s.reserved_bytes.freed, static_cast<int64_t>(20_MiB));
  EXPECT_EQ(s.segment.freed, 1);
}

TEST_F(StatisticsAdaptorTest, BlocksWaitingForStreamsStayActive) {
  void* p = *stats_.Allocate(1_MiB, kStreamA);
  ASSERT_TRUE(pool_.RecordStream(p, kStreamB).ok());
  stats_.Deallocate(p, 1_MiB, kStreamA);
  MemoryStats s = stats_.GetStats();
  EXPECT_EQ(s.allocated_bytes.current, 0);
  EXPECT_EQ(s.active_bytes.current, static_cast<int64_t>(1_MiB));
  EXPECT_EQ(s.requested_bytes.current, static_cast<int64_t>(1_MiB));
  EXPECT_EQ(s.active.current, 1);

  events_.CompleteStream(kStreamB);
  stats_.Deallocate(*stats_.Allocate(512, kStreamA), 512, kStreamA);  // lets the pool notice
  s = stats_.GetStats();
  EXPECT_EQ(s.active_bytes.current, 0);
  EXPECT_EQ(s.requested_bytes.current, 0);
  EXPECT_EQ(s.active.current, 0);
}

TEST_F(StatisticsAdaptorTest, ResetPeakAndAccumulated) {
  void* big = *stats_.Allocate(30_MiB);
  stats_.Deallocate(big, 30_MiB);
  void* small = *stats_.Allocate(1_KiB);
  EXPECT_EQ(stats_.GetStats().allocated_bytes.peak, static_cast<int64_t>(30_MiB));
  stats_.ResetPeak();
  MemoryStats s = stats_.GetStats();
  EXPECT_EQ(s.allocated_bytes.peak, static_cast<int64_t>(1_KiB));
  EXPECT_EQ(s.reserved_bytes.peak, static_cast<int64_t>(32_MiB));
  stats_.ResetAccumulated();
  s = stats_.GetStats();
  EXPECT_EQ(s.allocated_bytes.allocated, 0);
  EXPECT_EQ(s.allocated_bytes.current, static_cast<int64_t>(1_KiB));
  EXPECT_EQ(s.num_allocs, 0);
  stats_.Deallocate(small, 1_KiB);
}

TEST_F(StatisticsAdaptorTest, WindowPeaksAndTheUsersPeaksRestartApart) {
  void* big = *stats_.Allocate(30_MiB);
  stats_.Deallocate(big, 30_MiB);
  WindowPeaks window = stats_.TakeWindowPeaks();
  EXPECT_EQ(window.allocated_bytes, static_cast<int64_t>(30_MiB));
  EXPECT_EQ(window.reserved_bytes, static_cast<int64_t>(30_MiB));
  // The next window starts at the current values: nothing allocated, the segment cached; the
  // small block takes a small segment of 2 MiB.
  void* small = *stats_.Allocate(1_KiB);
  window = stats_.TakeWindowPeaks();
  EXPECT_EQ(window.allocated_bytes, static_cast<int64_t>(1_KiB));
  EXPECT_EQ(window.reserved_bytes, static_cast<int64_t>(32_MiB));
  // Taking a window left the user's peak alone, and resetting the user's peak leaves the window.
  EXPECT_EQ(stats_.GetStats().allocated_bytes.peak, static_cast<int64_t>(30_MiB));
  big = *stats_.Allocate(10_MiB);
  stats_.Deallocate(big, 10_MiB);
  stats_.ResetPeak();
  EXPECT_EQ(stats_.GetStats().allocated_bytes.peak, static_cast<int64_t>(1_KiB));
  EXPECT_EQ(stats_.TakeWindowPeaks().allocated_bytes, static_cast<int64_t>(10_MiB + 1_KiB));
  stats_.Deallocate(small, 1_KiB);
}

TEST_F(StatisticsAdaptorTest, CountsOomsAndRetries) {
  stats_.Deallocate(*stats_.Allocate(12_MiB, kStreamA), 12_MiB, kStreamA);
  // Within a 16 MiB limit a 14 MiB segment fits only after the cached 12 MiB goes.
  ASSERT_TRUE(stats_.AllocateWithin(14_MiB, kStreamB, 16_MiB).ok());
  EXPECT_FALSE(stats_.AllocateWithin(4_MiB, kStreamB, 16_MiB).ok());
  const MemoryStats s = stats_.GetStats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_ooms, 1);
}

TEST(ToTorchMemoryStatsTest, UsesTorchNames) {
  MemoryStats s;
  s.allocated_bytes.Increase(100);
  s.allocated_bytes.Decrease(40);
  s.segment.Increase(2);
  s.num_ooms = 3;
  std::map<std::string, int64_t> flat;
  for (const auto& [name, value] : ToTorchMemoryStats(s)) flat[name] = value;
  EXPECT_EQ(flat.at("allocated_bytes.all.current"), 60);
  EXPECT_EQ(flat.at("allocated_bytes.all.peak"), 100);
  EXPECT_EQ(flat.at("allocated_bytes.all.allocated"), 100);
  EXPECT_EQ(flat.at("allocated_bytes.all.freed"), 40);
  EXPECT_EQ(flat.at("num_device_alloc"), 2);
  EXPECT_EQ(flat.at("num_ooms"), 3);
  for (const char* key : {"reserved_bytes.all.current", "active_bytes.all.peak",
                          "requested_bytes.all.freed", "allocation.all.current",
                          "segment.all.peak", "active.all.allocated", "num_alloc_retries",
                          "num_device_free", "num_allocs", "num_frees"}) {
    EXPECT_EQ(flat.count(key), 1u) << key;
  }
  EXPECT_EQ(flat.size(), 7u * 4 + 6);
}

}  // namespace
}  // namespace actpack::allocator
