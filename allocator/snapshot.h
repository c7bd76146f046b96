// snapshot.h — the allocator's state in the shape of torch.cuda.memory._snapshot().
//
// Through torch's CUDAPluggableAllocator PyTorch cannot take memory snapshots; actpack takes its
// own. A MemorySnapshot holds every segment of the pool with its blocks (address, size,
// requested size, state) and the recent trace of actions per device. SnapshotDocument makes it
// the dict torch returns — {"segments": [...], "device_traces": [[...]], "allocator_settings":
// {...}} — as JSON text; the Python layer json.loads it and pickles it for
// pytorch.org/memory_viz (`actpack.dump_snapshot("x.pickle")`). Stack frames are not recorded,
// so every "frames" list is empty.
//
// Example:
//   MemorySnapshot snapshot;
//   AddToSnapshot(/*device=*/0, pool, &trace, snapshot);
//   nlohmann::ordered_json document = SnapshotDocument(snapshot);
#ifndef ACTPACK_ALLOCATOR_SNAPSHOT_H_
#define ACTPACK_ALLOCATOR_SNAPSHOT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "allocator/caching_pool.h"
#include "allocator/tracing_adaptor.h"

namespace actpack::allocator {

// SegmentSnapshot
//
// A pool segment and the device it lives on. The sums are torch's per-segment fields.
struct SegmentSnapshot : SegmentInfo {
  int device = 0;

  size_t allocated_size() const;  // blocks handed out
  size_t active_size() const;     // ... plus blocks waiting for stream events
  size_t requested_size() const;  // what the active blocks were requested with
};

// MemorySnapshot
//
// The plain state a snapshot is made of; `device_traces[d]` is device d's trace, oldest first.
struct MemorySnapshot {
  std::vector<SegmentSnapshot> segments;
  std::vector<std::vector<TraceEntry>> device_traces;
  std::vector<std::pair<std::string, std::string>> allocator_settings;
};

// AddToSnapshot
//
// Appends the segments of `pool` and, if `trace` is not null, its entries as device `device`'s
// trace.
void AddToSnapshot(int device, const CachingPool& pool, const TracingAdaptor* trace,
                   MemorySnapshot& snapshot);

// BlockStateName / SegmentTypeName
//
// torch's strings: "active_allocated", "active_pending_free", "inactive"; "small", "large".
absl::string_view BlockStateName(BlockState state);
absl::string_view SegmentTypeName(bool is_small);

// SnapshotDocument
//
// The snapshot as a JSON document shaped like torch.cuda.memory._snapshot()'s dict (members in
// torch's order). Addresses, sizes and streams are integers; times are microseconds since the
// epoch.
nlohmann::ordered_json SnapshotDocument(const MemorySnapshot& snapshot);

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_SNAPSHOT_H_
