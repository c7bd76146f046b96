// alloc_trace.h — allocation traces: the sequence of allocations and frees of a program, as text,
// to replay through an allocator (allocator_benchmark, tools/gpu_allocator_benchmark.py).
//
// The format, one operation per line (tools/record_trace.py writes it from a real training step):
//   # actpack allocation trace v1        <- '#' starts a comment; blank lines are ignored
//   alloc 0 1048576 0                   <- alloc ID SIZE STREAM: SIZE bytes requested on STREAM
//   alloc 1 512 0
//   free 0                              <- free ID: frees the live allocation ID
// IDs are any unsigned integers; an ID may be reused once freed. Every allocation must be freed
// by the end, so that a trace can be replayed over and over.
//
// This is benchmark and test support, outside the sources the pip build compiles.
//
// Example:
//   absl::StatusOr<AllocationTrace> trace = ReadAllocationTrace("allocator/testdata/cnn.trace");
//   if (!trace.ok()) return trace.status();
//   std::vector<void*> ptrs(trace->slots);
//   for (const TraceOp& op : trace->ops) { ... }
#ifndef ACTPACK_ALLOCATOR_TESTING_ALLOC_TRACE_H_
#define ACTPACK_ALLOCATOR_TESTING_ALLOC_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace actpack::allocator {

// TraceOp
//
// One operation. `slot` indexes the replay's pointer table (dense, one per allocation, so a
// replay needs no map); a free carries the size and stream of its allocation, which is what
// MemoryResource::Deallocate takes.
struct TraceOp {
  bool is_alloc = true;
  uint32_t slot = 0;
  size_t bytes = 0;
  uint64_t stream = 0;
};

// AllocationTrace
//
// A parsed trace. `peak_live_bytes` is the most bytes requested and not yet freed at once;
// `peak_op` the index in `ops` of the allocation that reached it first.
struct AllocationTrace {
  std::string name;
  std::vector<TraceOp> ops;
  size_t slots = 0;
  size_t allocations = 0;
  size_t peak_live_bytes = 0;
  size_t peak_op = 0;
};

// TraceBuilder
//
// Builds a trace in code (the generated traces of allocator_benchmark).
class TraceBuilder {
 public:
  explicit TraceBuilder(std::string name) { trace_.name = std::move(name); }

  // Returns the slot, for Free.
  uint32_t Alloc(size_t bytes, uint64_t stream = 0);
  void Free(uint32_t slot);
  // A temporary: allocated and freed right away (workspaces, intermediate results).
  void Temporary(size_t bytes) { Free(Alloc(bytes)); }
  size_t SizeOf(uint32_t slot) const { return sizes_[slot]; }
  // The trace; every allocation must have been freed.
  AllocationTrace Take();

 private:
  AllocationTrace trace_;
  std::vector<size_t> sizes_;
  std::vector<uint64_t> streams_;
  size_t live_bytes_ = 0;
};

// ParseAllocationTrace
//
// Parses the text of a trace; `name` (a file name) prefixes error messages. kInvalidArgument
// naming the line for a malformed line, a number out of range, an alloc of a live ID, a free of an
// ID that is not live, allocations never freed, or a trace without operations.
absl::StatusOr<AllocationTrace> ParseAllocationTrace(absl::string_view text,
                                                     absl::string_view name);

// ReadAllocationTrace
//
// Reads and parses the file at `path`; kNotFound if it cannot be read.
absl::StatusOr<AllocationTrace> ReadAllocationTrace(const std::string& path);

// FormatAllocationTrace
//
// The text of `trace` (IDs are the slots), which ParseAllocationTrace reads back.
std::string FormatAllocationTrace(const AllocationTrace& trace);

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_TESTING_ALLOC_TRACE_H_
