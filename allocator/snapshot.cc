#include "allocator/snapshot.h"

#include <cstdint>

#include "nlohmann/json.hpp"

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

nlohmann::ordered_json SnapshotDocument(const MemorySnapshot& snapshot) {
  using Json = nlohmann::ordered_json;
  // Addresses and streams are integers, as in torch.cuda.memory._snapshot().
  const auto stream_id = [](void* stream) { return reinterpret_cast<uintptr_t>(stream); };
  Json segments = Json::array();
  for (const SegmentSnapshot& segment : snapshot.segments) {
    Json blocks = Json::array();
    for (const BlockInfo& block : segment.blocks) {
      blocks.push_back({{"address", block.address},
                        {"size", block.size},
                        {"requested_size", block.requested_size},
                        {"state", BlockStateName(block.state)},
                        {"frames", Json::array()}});
    }
    segments.push_back({{"device", segment.device},
                        {"address", segment.address},
                        {"total_size", segment.total_size},
                        {"allocated_size", segment.allocated_size()},
                        {"active_size", segment.active_size()},
                        {"requested_size", segment.requested_size()},
                        {"stream", stream_id(segment.stream)},
                        {"segment_type", SegmentTypeName(segment.is_small)},
                        {"segment_pool_id", {0, 0}},
                        {"is_expandable", false},
                        {"frames", Json::array()},
                        {"blocks", std::move(blocks)}});
  }
  Json device_traces = Json::array();
  for (const std::vector<TraceEntry>& trace : snapshot.device_traces) {
    Json entries = Json::array();
    for (const TraceEntry& entry : trace) {
      entries.push_back({{"action", MemoryActionName(entry.action)},
                         {"addr", entry.address},
                         {"size", entry.size},
                         // actpack's addition ("size" is the block size); memory_viz ignores
                         // unknown keys.
                         {"requested_size", entry.requested_size},
                         {"stream", stream_id(entry.stream)},
                         {"time_us", entry.time_us},
                         {"frames", Json::array()}});
    }
    device_traces.push_back(std::move(entries));
  }
  Json settings = Json::object();
  for (const auto& [key, value] : snapshot.allocator_settings) settings[key] = value;
  return {{"segments", std::move(segments)},
          {"device_traces", std::move(device_traces)},
          {"allocator_settings", std::move(settings)}};
}

}  // namespace actpack::allocator
