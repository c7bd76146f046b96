#include "allocator/tracing_adaptor.h"

#include <vector>

#include "allocator/caching_pool.h"
#include "allocator/host_memory_resource.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

namespace actpack::allocator {
namespace {

using namespace literals;

const Stream kStream = reinterpret_cast<Stream>(0x5);

std::vector<MemoryAction> Actions(const std::vector<TraceEntry>& entries) {
  std::vector<MemoryAction> actions;
  for (const TraceEntry& entry : entries) actions.push_back(entry.action);
  return actions;
}

class TracingAdaptorTest : public ::testing::Test {
 protected:
  HostMemoryResource host_;
  HostStreamEvents events_;
  CachingPool pool_{&host_, &events_};
};

TEST_F(TracingAdaptorTest, RecordsThePoolsActionsInOrder) {
  TracingAdaptor trace(&pool_);
  void* p = *trace.Allocate(1000, kStream);
  trace.Deallocate(p, 1000, kStream);
  trace.EmptyCache();
  const std::vector<TraceEntry> entries = trace.Entries();
  EXPECT_EQ(Actions(entries),
            (std::vector<MemoryAction>{MemoryAction::kSegmentAlloc, MemoryAction::kAlloc,
                                       MemoryAction::kFreeRequested, MemoryAction::kFreeCompleted,
                                       MemoryAction::kSegmentFree}));
  ASSERT_EQ(entries.size(), 5u);
  EXPECT_EQ(entries[0].size, 2_MiB);
  EXPECT_EQ(entries[1].address, reinterpret_cast<uintptr_t>(p));
  EXPECT_EQ(entries[1].size, 1024u);
  EXPECT_EQ(entries[1].requested_size, 1000u);  // what a replay of the trace needs
  EXPECT_EQ(entries[2].requested_size, 1000u);
  EXPECT_EQ(entries[0].requested_size, 2_MiB);
  EXPECT_EQ(entries[1].stream, kStream);
  for (size_t i = 1; i < entries.size(); ++i) EXPECT_GE(entries[i].time_us, entries[i - 1].time_us);
  EXPECT_GT(entries[0].time_us, 1600000000LL * 1000000);  // microseconds since the epoch
}

TEST_F(TracingAdaptorTest, RecordsFailedAllocationsAsOom) {
  TracingAdaptor trace(&pool_);
  EXPECT_FALSE(trace.AllocateWithin(8_MiB, kStream, 1_MiB).ok());
  const std::vector<TraceEntry> entries = trace.Entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].action, MemoryAction::kOom);
  EXPECT_EQ(entries[0].size, 8_MiB);
}

TEST_F(TracingAdaptorTest, RingKeepsTheNewestEntries) {
  TracingAdaptor trace(&pool_, /*capacity=*/3);
  void* p = *trace.Allocate(100, kStream);  // segment_alloc, alloc
  trace.Deallocate(p, 100, kStream);        // free_requested, free_completed
  const std::vector<TraceEntry> entries = trace.Entries();
  EXPECT_EQ(Actions(entries),
            (std::vector<MemoryAction>{MemoryAction::kAlloc, MemoryAction::kFreeRequested,
                                       MemoryAction::kFreeCompleted}));
  EXPECT_EQ(trace.dropped(), 1u);
  trace.Clear();
  EXPECT_TRUE(trace.Entries().empty());
}

TEST_F(TracingAdaptorTest, DisabledRecordsNothing) {
  TracingAdaptor trace(&pool_);
  trace.SetEnabled(false);
  trace.Deallocate(*trace.Allocate(100), 100);
  EXPECT_TRUE(trace.Entries().empty());
  trace.SetEnabled(true);
  trace.Deallocate(*trace.Allocate(100), 100);
  EXPECT_EQ(trace.Entries().size(), 3u);  // the cached segment is reused: no segment_alloc
}

TEST(MemoryActionNameTest, MatchesTorchTraceActions) {
  EXPECT_EQ(MemoryActionName(MemoryAction::kAlloc), "alloc");
  EXPECT_EQ(MemoryActionName(MemoryAction::kFreeRequested), "free_requested");
  EXPECT_EQ(MemoryActionName(MemoryAction::kFreeCompleted), "free_completed");
  EXPECT_EQ(MemoryActionName(MemoryAction::kSegmentAlloc), "segment_alloc");
  EXPECT_EQ(MemoryActionName(MemoryAction::kSegmentFree), "segment_free");
  EXPECT_EQ(MemoryActionName(MemoryAction::kOom), "oom");
}

}  // namespace
}  // namespace actpack::allocator
