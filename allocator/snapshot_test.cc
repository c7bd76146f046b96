#include "allocator/snapshot.h"

#include <string>

#include "allocator/caching_pool.h"
#include "allocator/host_memory_resource.h"
#include "allocator/internal/manual_stream_events.h"
#include "allocator/tracing_adaptor.h"
#include "allocator/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace actpack::allocator {
namespace {

using ::testing::HasSubstr;
using namespace literals;

TEST(SnapshotDocumentTest, WritesTorchsSnapshotShape) {
  MemorySnapshot snapshot;
  SegmentSnapshot segment;
  segment.device = 1;
  segment.address = 4096;
  segment.total_size = 2048;
  segment.stream = reinterpret_cast<Stream>(7);
  segment.is_small = true;
  segment.blocks = {{4096, 512, 500, BlockState::kActiveAllocated},
                    {4608, 512, 300, BlockState::kActivePendingFree},
                    {5120, 1024, 0, BlockState::kInactive}};
  snapshot.segments.push_back(segment);
  snapshot.device_traces.resize(2);
  snapshot.device_traces[1].push_back(
      {MemoryAction::kSegmentAlloc, 4096, 2048, 2048, reinterpret_cast<Stream>(7),
       1700000000000000});
  snapshot.device_traces[1].push_back(
      {MemoryAction::kOom, 0, 1 << 20, 1000000, nullptr, 1700000000000001});
  snapshot.allocator_settings = {{"backend", "host"}, {"note", "say \"hi\"\n"}};

  EXPECT_EQ(
      SnapshotDocument(snapshot).dump(),
      "{\"segments\":[{\"device\":1,\"address\":4096,\"total_size\":2048,"
      "\"allocated_size\":512,\"active_size\":1024,\"requested_size\":800,\"stream\":7,"
      "\"segment_type\":\"small\",\"segment_pool_id\":[0,0],\"is_expandable\":false,"
      "\"frames\":[],\"blocks\":["
      "{\"address\":4096,\"size\":512,\"requested_size\":500,\"state\":\"active_allocated\","
      "\"frames\":[]},"
      "{\"address\":4608,\"size\":512,\"requested_size\":300,\"state\":\"active_pending_free\","
      "\"frames\":[]},"
      "{\"address\":5120,\"size\":1024,\"requested_size\":0,\"state\":\"inactive\","
      "\"frames\":[]}]}],"
      "\"device_traces\":[[],[{\"action\":\"segment_alloc\",\"addr\":4096,\"size\":2048,"
      "\"requested_size\":2048,\"stream\":7,\"time_us\":1700000000000000,\"frames\":[]},"
      "{\"action\":\"oom\",\"addr\":0,\"size\":1048576,\"requested_size\":1000000,"
      "\"stream\":0,"
      "\"time_us\":1700000000000001,\"frames\":[]}]],"
      "\"allocator_settings\":{\"backend\":\"host\",\"note\":\"say \\\"hi\\\"\\n\"}}");
}

TEST(SnapshotDocumentTest, EmptySnapshot) {
  EXPECT_EQ(SnapshotDocument(MemorySnapshot{}).dump(),
            "{\"segments\":[],\"device_traces\":[],\"allocator_settings\":{}}");
}

TEST(AddToSnapshotTest, CapturesALivePool) {
  HostMemoryResource host;
  internal::ManualStreamEvents events;
  CachingPool pool(&host, &events);
  TracingAdaptor trace(&pool);
  void* a = *trace.Allocate(3_MiB);
  void* b = *trace.Allocate(100);
  ASSERT_TRUE(pool.RecordStream(b, reinterpret_cast<Stream>(2)).ok());
  trace.Deallocate(b, 100);

  MemorySnapshot snapshot;
  AddToSnapshot(0, pool, &trace, snapshot);
  ASSERT_EQ(snapshot.segments.size(), 2u);
  size_t allocated = 0, active = 0, reserved = 0;
  for (const SegmentSnapshot& segment : snapshot.segments) {
    allocated += segment.allocated_size();
    active += segment.active_size();
    reserved += segment.total_size;
  }
  EXPECT_EQ(allocated, pool.GetUsage().allocated_bytes);
  EXPECT_EQ(active, 3_MiB + 512);  // b waits for stream 2
  EXPECT_EQ(reserved, pool.GetUsage().reserved_bytes);
  ASSERT_EQ(snapshot.device_traces.size(), 1u);
  EXPECT_EQ(snapshot.device_traces[0].size(), 5u);  // 2 x (segment_alloc, alloc), free_requested

  const std::string json = SnapshotDocument(snapshot).dump();
  EXPECT_THAT(json, HasSubstr("\"state\":\"active_pending_free\""));
  EXPECT_THAT(json, HasSubstr("\"action\":\"free_requested\""));
  trace.Deallocate(a, 3_MiB);
}

}  // namespace
}  // namespace actpack::allocator
