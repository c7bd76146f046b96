#include "allocator/caching_pool.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace actpack::allocator {

// A block is a run of bytes inside a segment. Blocks of a segment form a doubly linked list by
// address; a block is in exactly one of: allocated_ (handed out), a free index (cached), or
// waiting for stream events (pending_events > 0).
struct CachingPool::Block {
  uintptr_t address = 0;
  size_t size = 0;
  size_t requested_size = 0;
  Stream stream = nullptr;  // the stream of its segment
  bool is_small = false;
  bool allocated = false;
  int pending_events = 0;
  std::vector<Stream> stream_uses;  // other streams that used it (RecordStream)
  Block* prev = nullptr;
  Block* next = nullptr;

  bool IsCached() const { return !allocated && pending_events == 0; }
};

bool CachingPool::BlockOrder::operator()(const Block* a, const Block* b) const {
  const auto stream_a = reinterpret_cast<uintptr_t>(a->stream);
  const auto stream_b = reinterpret_cast<uintptr_t>(b->stream);
  if (stream_a != stream_b) return stream_a < stream_b;
  if (a->size != b->size) return a->size < b->size;
  return a->address < b->address;
}

namespace {

// Invariant violations are the caller's bug (a pointer this pool never handed out) or ours; going
// on would corrupt memory, so stop loudly.
[[noreturn]] void Die(const char* what, const void* ptr) {
  std::fprintf(stderr, "actpack: caching pool: %s (%p)\n", what, ptr);
  std::abort();
}

// A copy of `status` with `context` in front of its message and the same payloads, so that a
// reserve-limit error stays recognisable.
absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  absl::Status result(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&result](absl::string_view url, const absl::Cord& payload) {
    result.SetPayload(url, payload);
  });
  return result;
}

}  // namespace

size_t RoundBlockSize(size_t bytes) {
  return bytes < kMinBlockSize ? kMinBlockSize : RoundUp(bytes, kMinBlockSize);
}

bool InSmallPool(size_t block_size, bool under_budget) {
  return block_size <= (under_budget ? kLargestSharedUnderBudget : kSmallSize);
}

size_t SegmentSizeFor(size_t block_size, bool under_budget) {
  if (InSmallPool(block_size, under_budget)) return kSmallSegmentSize;
  if (block_size >= kMinLargeAlloc) return RoundUp(block_size, kRoundLarge);
  if (!under_budget) return kLargeSegmentSize;
  // A host segment is backed by huge pages up to its last whole 2 MiB and by 4 KiB pages after
  // it, each a page fault whenever the segment is mapped again: a 3.84 MiB segment costs 471
  // faults, the whole 4 MiB one 2. Rounding up is worth a little waste, never a block's worth.
  if (block_size > kRoundLarge) {
    const size_t whole = RoundUp(block_size, kRoundLarge);
    const size_t waste = whole - block_size;
    if (waste <= block_size / 16 && waste < kLargestSharedUnderBudget) return whole;
  }
  return block_size;
}

CachingPool::CachingPool(MemoryResource* upstream, StreamEvents* events)
    : upstream_(upstream),
      events_(events),
      granularity_(std::max<size_t>(1, upstream->AllocationGranularity())) {}

size_t CachingPool::SegmentBytes(size_t block_size, bool under_budget) const {
  return RoundUp(SegmentSizeFor(block_size, under_budget), granularity_);
}

size_t CachingPool::UpstreamCachedBytes() const { return upstream_->GetUsage().cached_bytes(); }

CachingPool::~CachingPool() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!unrecorded_.empty()) RecordUnrecorded();
  WaitForAllEvents();
  while (!segments_.empty()) ReleaseSegment(segments_.begin()->second.head);
  allocated_.clear();
  small_free_.clear();
  large_free_.clear();
}

absl::StatusOr<void*> CachingPool::DoAllocate(size_t bytes, Stream stream, size_t reserve_limit) {
  const size_t size = RoundBlockSize(bytes);
  const bool under_budget = reserve_limit != kNoCap;
  const bool is_small = InSmallPool(size, under_budget);
  // The smallest tail of a large block worth a block of its own: one the large pool can serve.
  const size_t large_split = under_budget ? kLargestSharedUnderBudget : kSmallSize;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!unrecorded_.empty()) RecordUnrecorded();
  if (pending_event_count_ > 0) ProcessCompletedEvents();

  Block* block = nullptr;
  if (!is_small && under_budget) {
    // Under a budget, a block carved from a larger free one strands the rest of that segment
    // for as long as it lives (a segment is released whole): a packed activation cut from a
    // freed 4 MiB gradient buffer keeps 2.6 MiB unusable for the 4 MiB buffers that follow.
    // So: a free block that fits without a split, else a segment of the request's own size,
    // and a split only when the budget leaves no room for one. A free block no larger than the
    // segment this request would reserve strands nothing a new one would not: a 12 MiB + 512 B
    // request reserves 14 MiB, and once its block has merged back with its segment's free tail
    // only a 14 MiB block is there to reuse (refusing it grew the cache by every step's such
    // requests: 84 MiB a step on a 2-layer transformer under a generous budget).
    const size_t fits = std::max(size + large_split, SegmentBytes(size, /*under_budget=*/true));
    block = TakeBestFit(size, stream, /*is_small=*/false, /*max_size=*/fits);
    if (block == nullptr) {
      absl::StatusOr<Block*> segment = ReserveSegment(size, bytes, stream, false, reserve_limit);
      if (segment.ok()) {
        block = *segment;
      } else {
        if (!IsReserveLimitExceeded(segment.status())) return segment.status();
        // At the limit: a piece of any free large block, else a hole in a small segment.
        block = TakeBestFit(size, stream, /*is_small=*/false);
        if (block == nullptr) block = TakeBestFit(size, stream, /*is_small=*/true);
        if (block == nullptr) return segment.status();
      }
    }
  } else {
    block = TakeBestFit(size, stream, is_small);
  }
  if (block == nullptr) {
    absl::StatusOr<Block*> segment = ReserveSegment(size, bytes, stream, is_small, reserve_limit);
    // At the limit, a small request may take a piece of a free large block rather than fail:
    // the large pool's free memory already counts against the limit.
    if (!segment.ok() && is_small && IsReserveLimitExceeded(segment.status())) {
      block = TakeBestFit(size, stream, /*is_small=*/false);
    }
    if (block == nullptr) {
      if (!segment.ok()) return segment.status();
      block = *segment;
    }
  }

  // Split off the tail when it is big enough to serve another request of the same pool. Large
  // remainders no larger than the small pool's largest request are not worth a block: they
  // would only serve small requests, which the large pool never does.
  const size_t remaining = block->size - size;
  if (block->is_small ? remaining >= kMinBlockSize : remaining > large_split) {
    auto* tail = new Block;
    tail->address = block->address + size;
    tail->size = remaining;
    tail->stream = block->stream;
    tail->is_small = block->is_small;
    tail->prev = block;
    tail->next = block->next;
    if (block->next != nullptr) block->next->prev = tail;
    block->next = tail;
    block->size = size;
    FreeBlocksFor(block->is_small).insert(tail);
  }

  block->allocated = true;
  block->requested_size = bytes;
  allocated_.emplace(block->address, block);
  allocated_bytes_.store(allocated_bytes_.load(std::memory_order_relaxed) + block->size,
                         std::memory_order_relaxed);
  Notify({MemoryAction::kAlloc, block->address, block->size, bytes, stream});
  return reinterpret_cast<void*>(block->address);
}

CachingPool::Block* CachingPool::TakeBestFit(size_t size, Stream stream, bool is_small,
                                             size_t max_size) {
  FreeBlocks& free_blocks = FreeBlocksFor(is_small);
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = free_blocks.lower_bound(&key);
  if (it == free_blocks.end() || (*it)->stream != stream || (*it)->size > max_size) {
    return nullptr;
  }
  Block* block = *it;
  free_blocks.erase(it);
  return block;
}

absl::StatusOr<CachingPool::Block*> CachingPool::ReserveSegment(size_t block_size, size_t bytes,
                                                                Stream stream, bool is_small,
                                                                size_t reserve_limit) {
  const size_t segment_size = SegmentBytes(block_size, reserve_limit != kNoCap);
  const bool limited = reserve_limit != kNoCap;
  auto outside_bytes = [&](size_t held) -> size_t {
    return limited && outside_counter_ ? outside_counter_(held) : 0;
  };
  // What the pool and its upstream would hold with the segment reserved: the upstream serves
  // it from its cache first (0 for backends that do not cache).
  auto held_after = [&](size_t reserved, size_t upstream_cached) {
    return reserved + std::max(upstream_cached, segment_size);
  };
  // The bytes by which reserving the segment now would pass the limit; 0 when it fits.
  auto over_limit = [&]() -> size_t {
    if (!limited) return 0;
    const size_t reserved = reserved_bytes_.load(std::memory_order_relaxed);
    const size_t cached = UpstreamCachedBytes();
    const size_t wanted = held_after(reserved, cached) + outside_bytes(reserved + cached);
    return wanted > reserve_limit ? wanted - reserve_limit : 0;
  };
  auto try_reserve = [&]() -> absl::StatusOr<void*> {
    if (limited) {
      const size_t reserved = reserved_bytes_.load(std::memory_order_relaxed);
      const size_t cached = UpstreamCachedBytes();
      const size_t outside = outside_bytes(reserved + cached);
      if (held_after(reserved, cached) + outside > reserve_limit) {
        return ReserveLimitExceeded(absl::StrCat(
            "actpack: caching pool cannot reserve a ", FormatBytes(segment_size),
            " segment within the reserve limit of ", FormatBytes(reserve_limit), " (",
            FormatBytes(reserved), " reserved",
            cached > 0 ? absl::StrCat(", ", FormatBytes(cached), " cached by the backend")
                       : std::string(),
            outside > 0 ? absl::StrCat(", ", FormatBytes(outside),
                                       " more counted by the system outside the pool")
                        : std::string(),
            ")"));
      }
    }
    return upstream_->Allocate(segment_size, stream);
  };

  absl::StatusOr<void*> memory = try_reserve();
  if (!memory.ok()) {
    // Free what the cache holds and try once more, as PyTorch does before raising OOM. Blocks
    // waiting for other streams are handed to their own stream first (no host wait): they may
    // complete a fully free segment.
    const bool freed_blocks = HandOverPendingBlocks();
    if (freed_blocks) {
      if (Block* block = TakeBestFit(block_size, stream, is_small)) return block;
    }
    // Release only what the new segment lacks, a segment at a time: a released segment's pages
    // are faulted in again when it is next reserved, and under a budget the pool is at its
    // limit every step.
    // One retry in the statistics however many segments it takes, as PyTorch counts them.
    bool retried = false;
    auto retry = [&](absl::StatusOr<void*> attempt) {
      if (!retried) Notify({MemoryAction::kAllocRetry, 0, block_size, bytes, stream});
      retried = true;
      memory = std::move(attempt);
    };
    if (freed_blocks) retry(try_reserve());
    if (!memory.ok() && IsReserveLimitExceeded(memory.status())) {
      absl::StatusOr<void*> moved = RemapFreeSegment(segment_size, stream, over_limit);
      if (moved.ok()) retry(std::move(moved));
    }
    while (!memory.ok() && IsReserveLimitExceeded(memory.status()) &&
           ReleaseFreeSegments(std::max<size_t>(over_limit(), 1)) > 0) {
      retry(try_reserve());
    }
    // Still over with more cached by the upstream than the segment takes from it: that cache
    // is what passes the limit (after the limit was lowered, or the system's count outside the
    // pool grew), and goes back.
    if (!memory.ok() && IsReserveLimitExceeded(memory.status()) &&
        UpstreamCachedBytes() > segment_size && upstream_->EmptyCache() > 0) {
      retry(try_reserve());
    }
    // Refused by the upstream itself (the device is full): everything cached goes back.
    if (!memory.ok() && !IsReserveLimitExceeded(memory.status()) && ReleaseFreeSegments() > 0) {
      retry(try_reserve());
    }
    if (!memory.ok()) {
      absl::Status status = WithContext(
          memory.status(),
          absl::StrCat("actpack: caching pool could not reserve a ", FormatBytes(segment_size),
                       " segment for a ", FormatBytes(bytes), " request (",
                       FormatBytes(reserved_bytes_.load(std::memory_order_relaxed)),
                       " reserved, ",
                       FormatBytes(allocated_bytes_.load(std::memory_order_relaxed)),
                       " allocated)"));
      if (IsReserveLimitExceeded(status)) {
        const size_t outside =
            outside_bytes(reserved_bytes_.load(std::memory_order_relaxed) + UpstreamCachedBytes());
        status = ReserveLimitExceeded(status.message(), NeededReserve(segment_size, outside));
      }
      return status;
    }
  }

  auto* block = new Block;
  block->address = reinterpret_cast<uintptr_t>(*memory);
  block->size = segment_size;
  block->stream = stream;
  block->is_small = is_small;
  segments_.emplace(block->address, Segment{segment_size, stream, is_small, block});
  reserved_bytes_.store(reserved_bytes_.load(std::memory_order_relaxed) + segment_size,
                        std::memory_order_relaxed);
  Notify({MemoryAction::kSegmentAlloc, block->address, segment_size, segment_size, stream});
  return block;
}

void CachingPool::DoDeallocate(void* ptr, size_t bytes, Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocated_.end()) Die("Deallocate of a pointer that is not allocated", ptr);
  Block* block = it->second;
  allocated_.erase(it);
  block->allocated = false;
  allocated_bytes_.store(allocated_bytes_.load(std::memory_order_relaxed) - block->size,
                         std::memory_order_relaxed);
  Notify({MemoryAction::kFreeRequested, block->address, block->size, block->requested_size,
          block->stream});

  if (block->stream_uses.empty()) {
    FreeBlock(block);
    return;
  }
  for (Stream use : block->stream_uses) {
    ++block->pending_events;
    if (!RecordUse(use, block)) unrecorded_.emplace_back(use, block);
  }
  block->stream_uses.clear();
}

bool CachingPool::RecordUse(Stream use, Block* block) {
  absl::StatusOr<StreamEvents::Event> event = events_->Record(use);
  if (!event.ok()) {
    // Without an event nothing tells when `use` is done with the block: it stays out of the
    // cache until one can be recorded (on a later call), which never hands out memory in use.
    std::fprintf(stderr, "actpack: caching pool: keeping a %s block out of the cache for now: %s\n",
                 FormatBytes(block->size).c_str(), event.status().ToString().c_str());
    return false;
  }
  ++pending_event_count_;
  pending_events_[use].emplace_back(*event, block);
  return true;
}

void CachingPool::RecordUnrecorded() {
  std::vector<std::pair<Stream, Block*>> waiting;
  waiting.swap(unrecorded_);
  for (const auto& [use, block] : waiting) {
    if (!RecordUse(use, block)) unrecorded_.emplace_back(use, block);
  }
}

void CachingPool::FreeBlock(Block* block) {
  Notify({MemoryAction::kFreeCompleted, block->address, block->size, block->requested_size,
          block->stream});
  block->requested_size = 0;
  FreeBlocks& free_blocks = FreeBlocksFor(block->is_small);
  if (Block* prev = block->prev; prev != nullptr && prev->IsCached()) {
    free_blocks.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    delete block;
    block = prev;
  }
  if (Block* next = block->next; next != nullptr && next->IsCached()) {
    free_blocks.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    delete next;
  }
  free_blocks.insert(block);
}

void CachingPool::ProcessCompletedEvents() {
  for (auto it = pending_events_.begin(); it != pending_events_.end();) {
    auto& queue = it->second;
    while (!queue.empty() && events_->IsComplete(queue.front().first)) {
      auto [event, block] = queue.front();
      queue.pop_front();
      events_->Release(event);
      --pending_event_count_;
      if (--block->pending_events == 0) FreeBlock(block);
    }
    if (queue.empty()) {
      pending_events_.erase(it++);
    } else {
      ++it;
    }
  }
}

bool CachingPool::HandOverPendingBlocks() {
  if (!unrecorded_.empty()) RecordUnrecorded();
  bool freed = false;
  for (auto& [use_stream, queue] : pending_events_) {
    for (auto [event, block] : queue) {
      // From now on the block's stream runs after the work `use_stream` had queued when the
      // block was freed: reusing the block on its stream is ordered, as for any block freed
      // there.
      absl::Status ordered = events_->StreamWait(block->stream, event);
      if (!ordered.ok()) {
        std::fprintf(stderr, "actpack: caching pool: waiting on the host instead: %s\n",
                     ordered.ToString().c_str());
        events_->Wait(event);
      }
      events_->Release(event);
      --pending_event_count_;
      if (--block->pending_events == 0) {
        FreeBlock(block);
        freed = true;
      }
    }
  }
  pending_events_.clear();
  return freed;
}

size_t CachingPool::NeededReserve(size_t segment_size, size_t outside) const {
  size_t free_segments = 0;
  for (const Block* block : FreeSegments()) free_segments += block->size;
  return reserved_bytes_.load(std::memory_order_relaxed) - free_segments + segment_size + outside;
}

bool CachingPool::WaitForAllEvents() {
  bool freed = false;
  for (auto& [stream, queue] : pending_events_) {
    for (auto [event, block] : queue) {
      events_->Wait(event);
      events_->Release(event);
      --pending_event_count_;
      if (--block->pending_events == 0) {
        FreeBlock(block);
        freed = true;
      }
    }
  }
  pending_events_.clear();
  return freed;
}

std::vector<CachingPool::Block*> CachingPool::FreeSegments() const {
  std::vector<Block*> free_segments;
  for (const FreeBlocks* free_blocks : {&small_free_, &large_free_}) {
    for (Block* block : *free_blocks) {
      if (block->prev == nullptr && block->next == nullptr) free_segments.push_back(block);
    }
  }
  return free_segments;
}

absl::StatusOr<void*> CachingPool::RemapFreeSegment(size_t segment_size, Stream stream,
                                                    const std::function<size_t()>& over_limit) {
  if (!upstream_remaps_) return absl::UnimplementedError("the upstream does not remap");
  // The lender: the free segment with the most pages to lend, the smallest of those.
  Block* lender = nullptr;
  for (Block* block : FreeSegments()) {
    const size_t lends = std::min(block->size, segment_size);
    const size_t best = lender == nullptr ? 0 : std::min(lender->size, segment_size);
    if (lender == nullptr || lends > best || (lends == best && block->size < lender->size)) {
      lender = block;
    }
  }
  if (lender == nullptr) return absl::NotFoundError("no free segment");
  // Room for the new segment once the lender's bytes are its: other free segments go first.
  if (const size_t over = over_limit(); over > lender->size) {
    ReleaseFreeSegments(over - lender->size, /*keep=*/lender);
    if (over_limit() > lender->size) return absl::NotFoundError("no room even with the lender");
  }
  const uintptr_t address = lender->address;
  const size_t size = lender->size;
  absl::StatusOr<void*> moved =
      upstream_->Remap(reinterpret_cast<void*>(address), size, segment_size, stream);
  if (!moved.ok()) {
    if (absl::IsUnimplemented(moved.status())) upstream_remaps_ = false;
    return moved.status();  // the lender is as it was, still cached
  }
  FreeBlocksFor(lender->is_small).erase(lender);
  const Segment segment = segments_.extract(address).mapped();
  delete lender;
  Notify({MemoryAction::kSegmentFree, address, size, size, segment.stream});
  reserved_bytes_.store(reserved_bytes_.load(std::memory_order_relaxed) - size,
                        std::memory_order_relaxed);
  return moved;
}

size_t CachingPool::ReleaseFreeSegments(size_t wanted, const Block* keep) {
  std::vector<Block*> free_segments = FreeSegments();
  free_segments.erase(std::remove(free_segments.begin(), free_segments.end(), keep),
                      free_segments.end());
  // The smallest segment that covers `wanted` alone, else the largest first: fewest bytes and
  // fewest segments to map again later.
  std::sort(free_segments.begin(), free_segments.end(),
            [](const Block* a, const Block* b) { return a->size > b->size; });
  auto covering = std::find_if(free_segments.rbegin(), free_segments.rend(),
                               [wanted](const Block* b) { return b->size >= wanted; });
  if (covering != free_segments.rend()) std::iter_swap(covering, free_segments.begin());
  size_t released = 0;
  for (Block* block : free_segments) {
    if (released >= wanted) break;
    FreeBlocksFor(block->is_small).erase(block);
    released += block->size;
    ReleaseSegment(block);
  }
  return released;
}

// Returns the segment starting at `head` to the upstream and deletes its blocks. The caller has
// taken the blocks out of every index.
void CachingPool::ReleaseSegment(Block* head) {
  const uintptr_t address = head->address;
  auto it = segments_.find(address);
  const Segment segment = it->second;
  segments_.erase(it);
  for (Block* block = head; block != nullptr;) {
    Block* next = block->next;
    delete block;
    block = next;
  }
  Notify({MemoryAction::kSegmentFree, address, segment.size, segment.size, segment.stream});
  upstream_->Deallocate(reinterpret_cast<void*>(address), segment.size, segment.stream);
  reserved_bytes_.store(reserved_bytes_.load(std::memory_order_relaxed) - segment.size,
                        std::memory_order_relaxed);
}

void CachingPool::SetOutsideCounter(OutsideCounter counter) {
  std::lock_guard<std::mutex> lock(mutex_);
  outside_counter_ = std::move(counter);
}

bool CachingPool::CountsOutside() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<bool>(outside_counter_);
}

size_t CachingPool::DoEmptyCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t before = reserved_bytes_.load(std::memory_order_relaxed) + UpstreamCachedBytes();
  HandOverPendingBlocks();
  ReleaseFreeSegments();
  upstream_->EmptyCache();
  const size_t after = reserved_bytes_.load(std::memory_order_relaxed) + UpstreamCachedBytes();
  return before > after ? before - after : 0;
}

MemoryUsage CachingPool::DoGetUsage() const {
  return {reserved_bytes_.load(std::memory_order_relaxed),
          allocated_bytes_.load(std::memory_order_relaxed), UpstreamCachedBytes()};
}

absl::Status CachingPool::RecordStream(const void* ptr, Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocated_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("actpack: RecordStream: %p is not a live allocation", ptr));
  }
  Block* block = it->second;
  // Its own stream orders reuse already.
  if (stream == block->stream) return absl::OkStatus();
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) ==
      block->stream_uses.end()) {
    block->stream_uses.push_back(stream);
  }
  return absl::OkStatus();
}

absl::StatusOr<AllocationInfo> CachingPool::Lookup(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocated_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("actpack: Lookup: %p is not a live allocation", ptr));
  }
  return AllocationInfo{it->second->size, it->second->requested_size, it->second->stream};
}

absl::StatusOr<CachingPool::SegmentRange> CachingPool::SegmentContaining(const void* ptr) const {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  // The last segment starting at or before `address`.
  auto it = segments_.upper_bound(address);
  if (it != segments_.begin()) {
    --it;
    if (address - it->first < it->second.size) return SegmentRange{it->first, it->second.size};
  }
  return absl::NotFoundError(
      absl::StrFormat("actpack: SegmentContaining: %p is not inside a segment of this pool", ptr));
}

std::vector<SegmentInfo> CachingPool::Segments() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<SegmentInfo> segments;
  segments.reserve(segments_.size());
  for (const auto& [address, segment] : segments_) {
    SegmentInfo info;
    info.address = address;
    info.total_size = segment.size;
    info.stream = segment.stream;
    info.is_small = segment.is_small;
    for (const Block* block = segment.head; block != nullptr; block = block->next) {
      BlockState state = block->allocated            ? BlockState::kActiveAllocated
                         : block->pending_events > 0 ? BlockState::kActivePendingFree
                                                     : BlockState::kInactive;
      info.blocks.push_back({block->address, block->size, block->requested_size, state});
    }
    segments.push_back(std::move(info));
  }
  return segments;
}

absl::Status CachingPool::CheckInvariants() const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  size_t reserved = 0, allocated = 0, cached_blocks = 0, allocated_blocks = 0, pending = 0;
  for (const auto& [address, segment] : segments_) {
    reserved += segment.size;
    if (segment.head == nullptr || segment.head->address != address ||
        segment.head->prev != nullptr) {
      return fail("segment ", address, " has a bad head block");
    }
    uintptr_t expected_address = address;
    const Block* prev = nullptr;
    for (const Block* block = segment.head; block != nullptr; block = block->next) {
      if (block->address != expected_address) return fail("blocks of ", address, " leave a gap");
      if (block->prev != prev) return fail("broken prev link in segment ", address);
      if (block->size == 0 || block->size % kMinBlockSize != 0) {
        return fail("block ", block->address, " has size ", block->size);
      }
      if (block->stream != segment.stream || block->is_small != segment.is_small) {
        return fail("block ", block->address, " disagrees with its segment");
      }
      const FreeBlocks& free_blocks = block->is_small ? small_free_ : large_free_;
      const bool indexed = free_blocks.count(const_cast<Block*>(block)) > 0;
      if (block->IsCached()) {
        ++cached_blocks;
        if (!indexed) return fail("cached block ", block->address, " is not in the free index");
        if (prev != nullptr && prev->IsCached()) {
          return fail("cached neighbours at ", prev->address, " were not merged");
        }
      } else if (indexed) {
        return fail("block ", block->address, " in use is in the free index");
      }
      if (block->allocated) {
        ++allocated_blocks;
        allocated += block->size;
        auto it = allocated_.find(block->address);
        if (it == allocated_.end() || it->second != block) {
          return fail("allocated block ", block->address, " is not indexed");
        }
      }
      if (block->pending_events > 0) pending += block->pending_events;
      expected_address += block->size;
      prev = block;
    }
    if (expected_address != address + segment.size) {
      return fail("blocks of ", address, " do not cover its ", segment.size, " bytes");
    }
  }
  if (cached_blocks != small_free_.size() + large_free_.size()) {
    return fail("free index holds ", small_free_.size() + large_free_.size(), " blocks, ",
                cached_blocks, " are cached");
  }
  if (allocated_blocks != allocated_.size()) return fail("allocated index is stale");
  if (reserved != reserved_bytes_.load()) {
    return fail("reserved_bytes ", reserved_bytes_.load(), " but segments hold ", reserved);
  }
  if (allocated != allocated_bytes_.load()) {
    return fail("allocated_bytes ", allocated_bytes_.load(), " but blocks hold ", allocated);
  }
  if (pending < pending_event_count_) return fail("more pending events than waiting blocks");
  return absl::OkStatus();
}

}  // namespace actpack::allocator
