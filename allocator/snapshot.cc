#include "allocator/snapshot.h"

#include <cstdint>

#include "allocator/internal/json_writer.h"

namespace actpack::allocator {

size_t SegmentSnapshot::allocated_size() const {
  size_t sum = 0;
  for (const BlockInfo& block : blocks) {
    if (block.state == BlockState::kActiveAllocated) sum += block.size;
  }
  return sum;
}

size_t SegmentSnapshot::active_size() const {
  size_t sum = 0;
  for (const BlockInfo& block : blocks) {
    if (block.state != BlockState::kInactive) sum += block.size;
  }
  return sum;
}

size_t SegmentSnapshot::requested_size() const {
  size_t sum = 0;
  for (const BlockInfo& block : blocks) {
    if (block.state != BlockState::kInactive) sum += block.requested_size;
  }
  return sum;
}

void AddToSnapshot(int device, const CachingPool& pool, const TracingAdaptor* trace,
                   MemorySnapshot& snapshot) {
  for (SegmentInfo& info : pool.Segments()) {
    SegmentSnapshot segment;
    static_cast<SegmentInfo&>(segment) = std::move(info);
    segment.device = device;
    snapshot.segments.push_back(std::move(segment));
  }
  if (trace != nullptr) {
    if (snapshot.device_traces.size() <= static_cast<size_t>(device)) {
      snapshot.device_traces.resize(device + 1);
    }
    std::vector<TraceEntry> entries = trace->Entries();
    auto& device_trace = snapshot.device_traces[device];
    device_trace.insert(device_trace.end(), entries.begin(), entries.end());
  }
}

absl::string_view BlockStateName(BlockState state) {
  switch (state) {
    case BlockState::kActiveAllocated:
      return "active_allocated";
    case BlockState::kActivePendingFree:
      return "active_pending_free";
    case BlockState::kInactive:
      return "inactive";
  }
  return "inactive";
}

absl::string_view SegmentTypeName(bool is_small) { return is_small ? "small" : "large"; }

std::string SnapshotToJson(const MemorySnapshot& snapshot) {
  internal::JsonWriter json;
  auto empty_frames = [&json] {
    json.Key("frames");
    json.BeginArray();
    json.EndArray();
  };
  json.BeginObject();

  json.Key("segments");
  json.BeginArray();
  for (const SegmentSnapshot& segment : snapshot.segments) {
    json.BeginObject();
    json.Key("device");
    json.Int(segment.device);
    json.Key("address");
    json.UInt(segment.address);
    json.Key("total_size");
    json.UInt(segment.total_size);
    json.Key("allocated_size");
    json.UInt(segment.allocated_size());
    json.Key("active_size");
    json.UInt(segment.active_size());
    json.Key("requested_size");
    json.UInt(segment.requested_size());
    json.Key("stream");
    json.UInt(reinterpret_cast<uintptr_t>(segment.stream));
    json.Key("segment_type");
    json.String(SegmentTypeName(segment.is_small));
    json.Key("segment_pool_id");
    json.BeginArray();
    json.Int(0);
    json.Int(0);
    json.EndArray();
    json.Key("is_expandable");
    json.Bool(false);
    empty_frames();
    json.Key("blocks");
    json.BeginArray();
    for (const BlockInfo& block : segment.blocks) {
      json.BeginObject();
      json.Key("address");
      json.UInt(block.address);
      json.Key("size");
      json.UInt(block.size);
      json.Key("requested_size");
      json.UInt(block.requested_size);
      json.Key("state");
      json.String(BlockStateName(block.state));
      empty_frames();
      json.EndObject();
    }
    json.EndArray();
    json.EndObject();
  }
  json.EndArray();

  json.Key("device_traces");
  json.BeginArray();
  for (const std::vector<TraceEntry>& trace : snapshot.device_traces) {
    json.BeginArray();
    for (const TraceEntry& entry : trace) {
      json.BeginObject();
      json.Key("action");
      json.String(MemoryActionName(entry.action));
      json.Key("addr");
      json.UInt(entry.address);
      json.Key("size");
      json.UInt(entry.size);
      // actpack's addition ("size" is the block size); memory_viz ignores unknown keys.
      json.Key("requested_size");
      json.UInt(entry.requested_size);
      json.Key("stream");
      json.UInt(reinterpret_cast<uintptr_t>(entry.stream));
      json.Key("time_us");
      json.Int(entry.time_us);
      empty_frames();
      json.EndObject();
    }
    json.EndArray();
  }
  json.EndArray();

  json.Key("allocator_settings");
  json.BeginObject();
  for (const auto& [key, value] : snapshot.allocator_settings) {
    json.Key(key);
    json.String(value);
  }
  json.EndObject();

  json.EndObject();
  return json.Take();
}

}  // namespace actpack::allocator
