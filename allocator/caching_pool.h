// caching_pool.h — a caching allocator on a backend, modelled on PyTorch's CUDACachingAllocator.
//
// The pool reserves large *segments* from its upstream (a backend) and carves them into *blocks*.
// A freed block stays cached for the next request on the same stream instead of going back to
// the device, because cudaMalloc/cudaFree are slow and synchronise the device. The policy is
// PyTorch's, so that memory behaves the way PyTorch users expect:
//  * requests are rounded up to a multiple of 512 B;
//  * blocks of <= 1 MiB come from the small pool, carved from 2 MiB segments; larger blocks come
//    from the large pool: requests of 1-10 MiB get 20 MiB segments, larger ones a segment of
//    their size rounded up to 2 MiB;
//  * a request takes the best-fitting (smallest, then lowest-address) cached block of its stream
//    and pool; the rest of the block is split off when it is large enough to be useful (>= 512 B
//    in the small pool, > 1 MiB in the large pool); a freed block merges with free neighbours;
//  * when the upstream cannot provide a new segment (or the segment would pass the reserve limit
//    of AllocateWithin), the pool hands over blocks still waiting for other streams (below),
//    returns fully free segments to the upstream (under a limit only what the new segment
//    lacks) and tries again before failing.
// Blocks used on other streams (RecordStream) are reused only after events on those streams
// have completed; see the contract in memory_resource.h. Where the pool needs such a block
// before its events have completed (at the limit, and in EmptyCache) it does not wait on the
// host: the block's own stream is made to wait for those events (StreamEvents::StreamWait,
// cudaStreamWaitEvent), after which the block is the stream's like any block freed on it, and
// a segment given back to the upstream is given back on that stream. Only the destructor waits.
// Segments are whole multiples of the upstream's AllocationGranularity (a VMM backend's 2 MiB).
// What such a backend caches beside the pool's segments counts against a reserve limit:
// reserving n bytes then holds reserved + max(backend cache, n), since the backend reuses its
// cache first. One mutex guards the pool.
//
// Example:
//   HostMemoryResource host;
//   HostStreamEvents events;
//   CachingPool pool(&host, &events);
//   void* p = *pool.Allocate(3_MiB, stream_a);  // reserves a 20 MiB segment
//   pool.RecordStream(p, stream_b);              // p is also used on stream_b
//   pool.Deallocate(p, 3_MiB, stream_a);         // reusable once stream_b's event completes
//   pool.EmptyCache();                           // returns the free segment to `host`
#ifndef ACTPACK_ALLOCATOR_CACHING_POOL_H_
#define ACTPACK_ALLOCATOR_CACHING_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/memory_resource.h"
#include "allocator/stream_events.h"
#include "allocator/units.h"

namespace actpack::allocator {

// PyTorch's size classes (c10/cuda/CUDACachingAllocator.cpp).
inline constexpr size_t kMinBlockSize = 512;           // every block is a multiple of this
inline constexpr size_t kSmallSize = 1 * kMiB;         // largest request of the small pool
inline constexpr size_t kSmallSegmentSize = 2 * kMiB;  // segment size of the small pool
inline constexpr size_t kMinLargeAlloc = 10 * kMiB;    // requests below share 20 MiB segments
inline constexpr size_t kLargeSegmentSize = 20 * kMiB;
inline constexpr size_t kRoundLarge = 2 * kMiB;  // larger requests are rounded up to this
// Under a budget, requests above a quarter of a small segment leave the small pool (below).
inline constexpr size_t kLargestSharedUnderBudget = kSmallSegmentSize / 4;

// InSmallPool
//
// Whether a block of `block_size` comes from the small pool's shared 2 MiB segments. Under a
// budget only blocks of up to 512 KiB do: a 768 KiB or 1 MiB block leaves a hole in its segment
// that the small blocks living beside it pin, and a cap of a few segments runs out with the
// holes (a 2-layer LM under 14 MiB failed a 1 MiB request with 4.5 MiB cached in such pieces
// and 9.5 MiB in use). Above that they get segments of their own, released whole.
bool InSmallPool(size_t block_size, bool under_budget);

// RoundBlockSize
//
// The block size the pool hands out for a request of `bytes` (> 0).
size_t RoundBlockSize(size_t bytes);

// SegmentSizeFor
//
// The segment the pool reserves when no cached block fits a block of `block_size`. Under a
// budget a mid-size block (512 KiB-10 MiB) gets a segment of exactly its size, not a shared 20 MiB
// one: tails of shared segments that later requests cannot use count against the budget (two
// 8 MiB attention blocks a segment stranded ~20% of a transformer step's budget in 4 MiB
// tails), and so would a rounding remainder too small for the large pool to split off.
size_t SegmentSizeFor(size_t block_size, bool under_budget = false);

// BlockState
//
// The states of PyTorch's snapshot: handed out; freed but waiting for stream events; cached.
enum class BlockState { kActiveAllocated, kActivePendingFree, kInactive };

// BlockInfo / SegmentInfo
//
// A read-only view of the pool for snapshots and tests.
struct BlockInfo {
  uintptr_t address = 0;
  size_t size = 0;
  size_t requested_size = 0;  // 0 for cached blocks
  BlockState state = BlockState::kInactive;
};

struct SegmentInfo {
  uintptr_t address = 0;
  size_t total_size = 0;
  Stream stream = nullptr;
  bool is_small = false;         // from the small pool
  std::vector<BlockInfo> blocks;  // by address, covering the segment
};

// AllocationInfo
//
// What the pool knows about a live allocation.
struct AllocationInfo {
  size_t size = 0;            // block size after rounding
  size_t requested_size = 0;  // what the caller asked for
  Stream stream = nullptr;    // the stream it was allocated on
};

// CachingPool
//
// See the file comment. `upstream` and `events` are not owned and must outlive the pool. The
// destructor returns every segment to the upstream, including segments with blocks still
// allocated (using such a block afterwards is the caller's bug).
class CachingPool final : public MemoryResource {
 public:
  CachingPool(MemoryResource* upstream, StreamEvents* events);
  ~CachingPool() override;

  // RecordStream
  //
  // Marks the live allocation `ptr` as used on `stream` too (torch's Tensor.record_stream): when
  // it is freed, the pool records an event on `stream` and reuses the block only after it has
  // completed. kNotFound if `ptr` is not a live allocation of this pool.
  absl::Status RecordStream(const void* ptr, Stream stream);

  // Lookup
  //
  // The size and stream of the live allocation `ptr`; kNotFound if there is none. Lets callers
  // that only keep the pointer (torch's CPU allocator) free with the right arguments.
  absl::StatusOr<AllocationInfo> Lookup(const void* ptr) const;

  // SegmentContaining
  //
  // The start and size of the segment that holds `ptr` (any address inside it): the memory the
  // upstream handed out, which is what torch's getBaseAllocation (CUDA IPC) needs. kNotFound if
  // no segment of this pool holds `ptr`.
  struct SegmentRange {
    uintptr_t address = 0;
    size_t size = 0;
  };
  absl::StatusOr<SegmentRange> SegmentContaining(const void* ptr) const;

  // Segments
  //
  // Every segment with its blocks, by address.
  std::vector<SegmentInfo> Segments() const;

  // SetOutsideCounter
  //
  // Memory the system counts against a reserve limit that this pool does not hold: `counter`
  // gets the bytes the pool holds (its reserved bytes and what its upstream caches beside
  // them: GetUsage().footprint_bytes()) and returns the rest of what the system counts (e.g.
  // the process's resident set above its start, less those bytes). A segment reserved
  // under a limit must then fit the limit less that; the counter runs only then (a few times
  // per step: it may read /proc or ask the CUDA driver). It must not call into the pool. An
  // empty function stops counting.
  using OutsideCounter = std::function<size_t(size_t pool_reserved_bytes)>;
  void SetOutsideCounter(OutsideCounter counter);
  // Whether a counter is set.
  bool CountsOutside() const;

  // CheckInvariants
  //
  // Walks every segment and index and returns kInternal describing the first inconsistency
  // (blocks that do not tile their segment, unmerged free neighbours, a cached block missing from
  // the free index, counters that disagree with the blocks). For tests; O(blocks).
  absl::Status CheckInvariants() const;

 private:
  struct Block;
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeBlocks = std::set<Block*, BlockOrder>;
  struct Segment {
    size_t size = 0;
    Stream stream = nullptr;
    bool is_small = false;
    Block* head = nullptr;  // the block at the segment's start
  };

  absl::StatusOr<void*> DoAllocate(size_t bytes, Stream stream, size_t reserve_limit) override;
  void DoDeallocate(void* ptr, size_t bytes, Stream stream) override;
  // Hands over pending blocks, returns every fully free segment and has the upstream give
  // back what it caches. Returns the footprint released.
  size_t DoEmptyCache() override;
  MemoryUsage DoGetUsage() const override;

  // All of the following need mutex_ held.
  FreeBlocks& FreeBlocksFor(bool is_small) { return is_small ? small_free_ : large_free_; }
  // The smallest free block of at least `size` bytes on `stream`, if it is at most `max_size`.
  Block* TakeBestFit(size_t size, Stream stream, bool is_small,
                     size_t max_size = std::numeric_limits<size_t>::max());
  absl::StatusOr<Block*> ReserveSegment(size_t block_size, size_t bytes, Stream stream,
                                        bool is_small, size_t reserve_limit);
  void FreeBlock(Block* block);
  // Records an event of `use` for `block` (pending until it completes); false when it cannot
  // be recorded now (then `block` waits in unrecorded_).
  bool RecordUse(Stream use, Block* block);
  void RecordUnrecorded();
  void ProcessCompletedEvents();
  // Waits on the host for every pending event; returns whether a block became free. Teardown
  // only.
  bool WaitForAllEvents();
  // Frees every block waiting for other streams by ordering its own stream after their events
  // (no host wait; the host waits only for an event a stream cannot be ordered after). Returns
  // whether a block became free.
  bool HandOverPendingBlocks();
  // The segment the pool reserves for a block of `block_size`: SegmentSizeFor in whole units of
  // the upstream's granularity.
  size_t SegmentBytes(size_t block_size, bool under_budget) const;
  // What the upstream caches beside the pool's segments.
  size_t UpstreamCachedBytes() const;
  // The reserve limit under which a segment of `segment_size` would fit now, with every fully
  // free segment and the upstream's cache given back.
  size_t NeededReserve(size_t segment_size, size_t outside) const;
  // The segments with one block, a cached one.
  std::vector<Block*> FreeSegments() const;
  // Returns fully free segments but `keep` to the upstream until at least `wanted` bytes went
  // back (all of them by default); returns the bytes released.
  size_t ReleaseFreeSegments(size_t wanted = std::numeric_limits<size_t>::max(),
                             const Block* keep = nullptr);
  // At the limit: a free segment becomes a new one of `segment_size`, its memory kept
  // (MemoryResource::Remap), once other free segments made room for it (`over_limit`: the
  // bytes by which the new segment would pass the limit now). An error when the upstream
  // cannot remap or no free segment can lend; then nothing was remapped.
  absl::StatusOr<void*> RemapFreeSegment(size_t segment_size, Stream stream,
                                         const std::function<size_t()>& over_limit);
  void ReleaseSegment(Block* head);

  MemoryResource* const upstream_;
  StreamEvents* const events_;
  const size_t granularity_;  // the upstream's

  mutable std::mutex mutex_;
  bool upstream_remaps_ = true;  // until the upstream says it cannot
  FreeBlocks small_free_;
  FreeBlocks large_free_;
  absl::flat_hash_map<uintptr_t, Block*> allocated_;
  std::map<uintptr_t, Segment> segments_;
  // Events recorded at free time, per stream in recording order (a stream completes them in
  // order, so only the front of each queue needs to be asked).
  absl::flat_hash_map<Stream, std::deque<std::pair<StreamEvents::Event, Block*>>> pending_events_;
  size_t pending_event_count_ = 0;
  // Stream uses of freed blocks whose event could not be recorded yet: recorded again on later
  // calls (capturing more of the stream's work than at the free, which is safe).
  std::vector<std::pair<Stream, Block*>> unrecorded_;
  OutsideCounter outside_counter_;
  // Written under mutex_; read without it by GetUsage.
  std::atomic<size_t> reserved_bytes_{0};
  std::atomic<size_t> allocated_bytes_{0};
};

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_CACHING_POOL_H_
