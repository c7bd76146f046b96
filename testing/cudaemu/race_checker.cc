// The race checker: cudaemu's answer to compute-sanitizer's racecheck, initcheck (for shared
// memory) and memcheck, for blocks of any size.
//
// `--config=cudaemu_race` compiles the kernel sources with -fsanitize=thread, so the compiler
// calls __tsan_read4(address), __tsan_write8(address), __tsan_atomic64_fetch_add(...) and so on
// around every memory access. No TSan runtime is linked: this file defines those functions and
// checks each access a CUDA thread makes against CUDA's rules:
// - global memory: two accesses to a byte by different threads, at least one a write and not
//   both atomic, race unless ordered: threads of one block are ordered by __syncthreads, lanes
//   of one warp by __syncwarp over both; different blocks of a launch are never ordered.
// - shared memory: the same within the block, and a read of a byte the block has not written
//   (a GPU gives each block uninitialised shared memory).
// - any other address: device memory out of bounds, or host memory, which a kernel cannot see.
// Shuffles, ballots and votes exchange registers, not memory: they order nothing here.
// The first finding stops the program with both accesses, the kernel, block and threads.
//
// Per byte the checker keeps the last write and the reads since, as (thread, warp clock) in the
// block's current barrier epoch; a barrier starts a new epoch (everything before is ordered),
// and warp clocks are vector clocks over the 32 lanes, joined at each __syncwarp.
#include <link.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "testing/cudaemu/internal.h"

namespace cudaemu::internal {
namespace {

constexpr uint64_t kNoBlock = ~uint64_t{0};
constexpr size_t kPageBytes = 4096;

enum Flag : uint8_t {
  kHasWrite = 1,
  kWriteAtomic = 2,
  // What earlier blocks of the launch did (global memory).
  kPrevRead = 4,
  kPrevWrite = 8,
  kPrevAtomicRead = 16,
  kPrevAtomicWrite = 32,
};

struct Access {
  uint32_t thread = 0;
  uint32_t clock = 0;  // the thread's own warp clock at the access
  bool atomic = false;
};

struct Cell {
  uint64_t block = kNoBlock;  // the block the detail below belongs to
  uint32_t write_epoch = 0;
  uint32_t reads_epoch = 0;
  uint8_t flags = 0;
  uint8_t read_count = 0;
  Access write;
  Access reads[2];
  std::unique_ptr<std::vector<Access>> more_reads;  // broadcast reads by many threads
};

enum class Space { kIgnore, kGlobal, kShared, kConstant };

struct Segment {
  uintptr_t lo, hi;
  bool writable;
};

class Checker final : public RaceObserver {
 public:
  void BlockBegin(const KernelLaunch& launch, uint64_t block, uint32_t threads) override {
    if (TrafficRecorder* traffic = GetTrafficRecorder()) traffic->BlockBegin(launch);
    launch_ = &launch;
    block_ = block;
    threads_ = threads;
    epoch_ = 1;
    ResetClocks();
  }

  void BlockBarrier() override {
    ++epoch_;
    ResetClocks();
  }

  void WarpSync(uint32_t warp, uint32_t mask) override {
    uint32_t joined[32] = {};
    const uint32_t first = warp * 32;
    for (uint32_t lane = 0; lane < 32; ++lane) {
      if (((mask >> lane) & 1u) == 0) continue;
      const uint32_t* vc = Clock(first + lane);
      for (int j = 0; j < 32; ++j) joined[j] = std::max(joined[j], vc[j]);
    }
    for (uint32_t lane = 0; lane < 32; ++lane) {
      if (((mask >> lane) & 1u) == 0) continue;
      uint32_t* vc = Clock(first + lane);
      std::memcpy(vc, joined, sizeof joined);
      ++vc[lane];
    }
  }

  void KernelEnd() override {
    if (TrafficRecorder* traffic = GetTrafficRecorder()) traffic->KernelEnd();
    pages_.clear();
    last_page_ = ~uintptr_t{0};
    last_cells_ = nullptr;
  }

  void OnAccess(const void* address, size_t bytes, bool write, bool atomic, const void* pc) {
    const ThreadContext* t = CurrentThread();
    if (t == nullptr || bytes == 0) return;  // host code in a kernel source file
    // The checker's own work: a template it calls (std::string's constructor, building a
    // report) may resolve to an instrumented copy from a kernel's source file, whose accesses
    // come back here while the kernel's thread is current.
    static thread_local bool checking = false;
    if (checking) return;
    checking = true;
    Observe(t, address, bytes, write, atomic, pc);
    checking = false;
  }

 private:
  void Observe(const ThreadContext* t, const void* address, size_t bytes, bool write, bool atomic,
               const void* pc) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(address);
    if (a >= t->stack_lo && a < t->stack_hi) return;  // the thread's own registers and locals
    const Space space = Classify(a, bytes, write);
    if (space == Space::kIgnore || space == Space::kConstant) return;
    TrafficRecorder* traffic = GetTrafficRecorder();
    if (traffic != nullptr && traffic->recording()) {
      traffic->Access(*t, a, bytes, write, space == Space::kGlobal, pc);
      if (!traffic->check_races()) return;
    }
    for (size_t i = 0; i < bytes; ++i) Check(a + i, space, t->thread, write, atomic);
  }

  uint32_t* Clock(uint32_t thread) { return &clocks_[size_t{thread} * 32]; }

  void ResetClocks() {
    clocks_.assign(size_t{threads_} * 32, 0);
    for (uint32_t t = 0; t < threads_; ++t) Clock(t)[t % 32] = 1;
  }

  uint32_t OwnClock(uint32_t thread) { return Clock(thread)[thread % 32]; }

  // Whether `earlier` (by thread p in this block's current epoch) is ordered before an access
  // of `thread` now.
  bool Ordered(const Access& earlier, uint32_t epoch, uint32_t thread) {
    if (earlier.thread == thread || epoch < epoch_) return true;
    if (earlier.thread / 32 != thread / 32) return false;
    return Clock(thread)[earlier.thread % 32] >= earlier.clock;
  }

  static bool IsBuiltin(uintptr_t a) {
    auto in = [a](const void* v, size_t n) {
      const uintptr_t b = reinterpret_cast<uintptr_t>(v);
      return a >= b && a < b + n;
    };
    return in(&threadIdx, sizeof threadIdx) || in(&blockIdx, sizeof blockIdx) ||
           in(&blockDim, sizeof blockDim) || in(&gridDim, sizeof gridDim);
  }

  const Segment* FindSegment(uintptr_t a) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      for (const Segment& s : segments_) {
        if (a >= s.lo && a < s.hi) return &s;
      }
      if (attempt == 0) LoadSegments();  // a library loaded since
    }
    return nullptr;
  }

  void LoadSegments() {
    segments_.clear();
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
          auto* segments = static_cast<std::vector<Segment>*>(out);
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& ph = info->dlpi_phdr[i];
            if (ph.p_type != PT_LOAD) continue;
            const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
            segments->push_back({lo, lo + ph.p_memsz, (ph.p_flags & PF_W) != 0});
          }
          return 0;
        },
        &segments_);
  }

  Space Classify(uintptr_t a, size_t bytes, bool write) {
    if (IsBuiltin(a)) return Space::kIgnore;
    Allocation found;
    if (FindAllocation(a, bytes, &found)) return Space::kGlobal;
    if (const Segment* s = FindSegment(a)) {
      // __shared__ variables are statics of the kernel's object file; read-only statics are
      // constant memory (tables), which no thread may write.
      if (s->writable) return Space::kShared;
      if (write) Report(a, "a write to constant (read-only) memory", "");
      return Space::kConstant;
    }
    std::string where;
    if (NearestAllocationBelow(a, &found) && a >= found.base) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "; the nearest allocation below is [%p, +%zu) on %s, %zu bytes before",
                    reinterpret_cast<void*>(found.base), found.size,
                    found.device >= 0 ? "the device" : "pinned host memory",
                    static_cast<size_t>(a - (found.base + found.size)));
      where = buf;
    }
    Report(a, write ? "an out-of-bounds write: not device, pinned or shared memory"
                    : "an out-of-bounds read: not device, pinned or shared memory",
           where);
  }

  Cell& CellAt(uintptr_t a) {
    const uintptr_t page = a / kPageBytes;
    if (page != last_page_) {
      std::unique_ptr<Cell[]>& cells = pages_[page];
      if (!cells) cells.reset(new Cell[kPageBytes]);
      last_page_ = page;
      last_cells_ = cells.get();
    }
    return last_cells_[a % kPageBytes];
  }

  void Check(uintptr_t a, Space space, uint32_t thread, bool write, bool atomic) {
    Cell& c = CellAt(a);
    if (c.block != block_) {
      if (space == Space::kShared) {
        // Each block has its own shared memory: nothing carries over.
        c.flags = 0;
      } else if (c.block != kNoBlock) {
        uint8_t prev = c.flags & (kPrevRead | kPrevWrite | kPrevAtomicRead | kPrevAtomicWrite);
        if (c.flags & kHasWrite) prev |= (c.flags & kWriteAtomic) ? kPrevAtomicWrite : kPrevWrite;
        for (uint32_t i = 0; i < c.read_count; ++i) prev |= c.reads[i].atomic ? kPrevAtomicRead : kPrevRead;
        if (c.more_reads) {
          for (const Access& r : *c.more_reads) prev |= r.atomic ? kPrevAtomicRead : kPrevRead;
        }
        c.flags = prev;
      }
      c.block = block_;
      c.read_count = 0;
      c.more_reads.reset();
    }
    // Against earlier blocks of this launch (global memory).
    if (space == Space::kGlobal) {
      const bool conflict =
          write ? (atomic ? (c.flags & (kPrevRead | kPrevWrite))
                          : (c.flags & (kPrevRead | kPrevWrite | kPrevAtomicRead | kPrevAtomicWrite)))
                : (atomic ? (c.flags & kPrevWrite) : (c.flags & (kPrevWrite | kPrevAtomicWrite)));
      if (conflict) {
        Report(a, std::string(write ? "a write" : "a read") + " to global memory that another block of "
                      "the same launch accessed (blocks are never ordered within a launch)",
               Who(thread, write, atomic));
      }
    }
    const Access now{thread, OwnClock(thread), atomic};
    if (c.flags & kHasWrite) {
      if (!Ordered(c.write, c.write_epoch, thread) && !(atomic && (c.flags & kWriteAtomic))) {
        Report(a, "a data race with an earlier write: no __syncthreads or __syncwarp between",
               Who(c.write.thread, true, c.flags & kWriteAtomic) + " then " + Who(thread, write, atomic));
      }
    } else if (!write && space == Space::kShared) {
      Report(a, "a read of shared memory this block has not written (it is uninitialised on a GPU)",
             Who(thread, write, atomic));
    }
    if (c.reads_epoch != epoch_) {
      c.read_count = 0;
      c.more_reads.reset();
      c.reads_epoch = epoch_;
    }
    if (write) {
      auto check_read = [&](const Access& r) {
        if (!Ordered(r, c.reads_epoch, thread) && !(atomic && r.atomic)) {
          Report(a, "a data race with an earlier read: no __syncthreads or __syncwarp between",
                 Who(r.thread, false, r.atomic) + " then " + Who(thread, write, atomic));
        }
      };
      for (uint32_t i = 0; i < c.read_count; ++i) check_read(c.reads[i]);
      if (c.more_reads) {
        for (const Access& r : *c.more_reads) check_read(r);
      }
      c.flags |= kHasWrite;
      c.flags = atomic ? (c.flags | kWriteAtomic) : (c.flags & ~kWriteAtomic);
      c.write = now;
      c.write_epoch = epoch_;
      c.read_count = 0;
      c.more_reads.reset();
      return;
    }
    for (uint32_t i = 0; i < c.read_count; ++i) {
      if (c.reads[i].thread == thread) {
        c.reads[i] = now;
        return;
      }
    }
    if (c.read_count < 2) {
      c.reads[c.read_count++] = now;
      return;
    }
    if (!c.more_reads) c.more_reads = std::make_unique<std::vector<Access>>();
    for (Access& r : *c.more_reads) {
      if (r.thread == thread) {
        r = now;
        return;
      }
    }
    c.more_reads->push_back(now);
  }

  std::string Who(uint32_t thread, bool write, bool atomic) const {
    const dim3 b = launch_->block;
    char buf[120];
    std::snprintf(buf, sizeof buf, "thread (%u,%u,%u) %s%s", thread % b.x, thread / b.x % b.y,
                  thread / (b.x * b.y), atomic ? "atomic " : "", write ? "write" : "read");
    return buf;
  }

  [[noreturn]] void Report(uintptr_t a, const std::string& what, const std::string& detail) {
    const dim3 g = launch_->grid;
    char buf[200];
    std::snprintf(buf, sizeof buf, "race checker: %s at %p in kernel %s, block (%u,%u,%u): ",
                  what.c_str(), reinterpret_cast<void*>(a), launch_->name,
                  static_cast<unsigned>(block_ % g.x), static_cast<unsigned>(block_ / g.x % g.y),
                  static_cast<unsigned>(block_ / (uint64_t{g.x} * g.y)));
    Fatal(buf + detail);
  }

  const KernelLaunch* launch_ = nullptr;
  uint64_t block_ = kNoBlock;
  uint32_t threads_ = 0;
  uint32_t epoch_ = 1;
  std::vector<uint32_t> clocks_;
  std::vector<Segment> segments_;
  std::unordered_map<uintptr_t, std::unique_ptr<Cell[]>> pages_;
  uintptr_t last_page_ = ~uintptr_t{0};
  Cell* last_cells_ = nullptr;
};

Checker& TheChecker() {
  static auto* checker = new Checker;
  return *checker;
}

// Registered before main: instrumented code calls __tsan_init from its constructors too.
[[maybe_unused]] const bool registered = [] {
  SetRaceObserver(&TheChecker());
  return true;
}();

// `pc`: the instrumented access's return address, which names its instruction (the traffic
// recorder groups a warp's accesses by it).
inline void Read(const void* a, size_t n, const void* pc) {
  TheChecker().OnAccess(a, n, false, false, pc);
}
inline void Write(const void* a, size_t n, const void* pc) {
  TheChecker().OnAccess(a, n, true, false, pc);
}
inline void AtomicRead(const volatile void* a, size_t n, const void* pc) {
  TheChecker().OnAccess(const_cast<const void*>(a), n, false, true, pc);
}
inline void AtomicWrite(const volatile void* a, size_t n, const void* pc) {
  TheChecker().OnAccess(const_cast<const void*>(a), n, true, true, pc);
}

}  // namespace
}  // namespace cudaemu::internal

// ---- the instrumentation interface (what -fsanitize=thread code calls) ----

using cudaemu::internal::AtomicRead;
using cudaemu::internal::AtomicWrite;
using cudaemu::internal::Read;
using cudaemu::internal::Write;

extern "C" {

void __tsan_init() { cudaemu::internal::SetRaceObserver(&cudaemu::internal::TheChecker()); }
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_ignore_thread_begin() {}
void __tsan_ignore_thread_end() {}

#define CUDAEMU_PLAIN_ACCESS(n)                                               \
  void __tsan_read##n(void* a) { Read(a, n, __builtin_return_address(0)); }                        \
  void __tsan_write##n(void* a) { Write(a, n, __builtin_return_address(0)); }                      \
  void __tsan_unaligned_read##n(void* a) { Read(a, n, __builtin_return_address(0)); }              \
  void __tsan_unaligned_write##n(void* a) { Write(a, n, __builtin_return_address(0)); }            \
  void __tsan_volatile_read##n(void* a) { Read(a, n, __builtin_return_address(0)); }               \
  void __tsan_volatile_write##n(void* a) { Write(a, n, __builtin_return_address(0)); }             \
  void __tsan_unaligned_volatile_read##n(void* a) { Read(a, n, __builtin_return_address(0)); }     \
  void __tsan_unaligned_volatile_write##n(void* a) { Write(a, n, __builtin_return_address(0)); }   \
  void __tsan_read##n##_pc(void* a, void* pc) { Read(a, n, pc); }                    \
  void __tsan_write##n##_pc(void* a, void* pc) { Write(a, n, pc); }
CUDAEMU_PLAIN_ACCESS(1)
CUDAEMU_PLAIN_ACCESS(2)
CUDAEMU_PLAIN_ACCESS(4)
CUDAEMU_PLAIN_ACCESS(8)
CUDAEMU_PLAIN_ACCESS(16)
#undef CUDAEMU_PLAIN_ACCESS

void __tsan_read_range(void* a, unsigned long n) { Read(a, n, __builtin_return_address(0)); }
void __tsan_write_range(void* a, unsigned long n) { Write(a, n, __builtin_return_address(0)); }
void __tsan_vptr_read(void** a) { Read(a, sizeof(void*), __builtin_return_address(0)); }
void __tsan_vptr_update(void** a, void*) { Write(a, sizeof(void*), __builtin_return_address(0)); }

void* __tsan_memcpy(void* d, const void* s, unsigned long n) {
  Read(s, n, __builtin_return_address(0));
  Write(d, n, __builtin_return_address(0));
  return std::memcpy(d, s, n);
}
void* __tsan_memmove(void* d, const void* s, unsigned long n) {
  Read(s, n, __builtin_return_address(0));
  Write(d, n, __builtin_return_address(0));
  return std::memmove(d, s, n);
}
void* __tsan_memset(void* d, int v, unsigned long n) {
  Write(d, n, __builtin_return_address(0));
  return std::memset(d, v, n);
}

// Atomics: the instrumented code no longer performs them, so these do (sequentially
// consistent, which includes every weaker order the caller asked for).
#define CUDAEMU_ATOMICS(bits, T)                                                                \
  T __tsan_atomic##bits##_load(const volatile T* a, int) {                                      \
    AtomicRead(a, sizeof(T), __builtin_return_address(0));                                         \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                \
  }                                                                                             \
  void __tsan_atomic##bits##_store(volatile T* a, T v, int) {                                   \
    AtomicWrite(a, sizeof(T), __builtin_return_address(0));                                        \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                   \
  }                                                                                             \
  T __tsan_atomic##bits##_exchange(volatile T* a, T v, int) {                                   \
    AtomicWrite(a, sizeof(T), __builtin_return_address(0));                                        \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                         \
  }                                                                                             \
  T __tsan_atomic##bits##_fetch_add(volatile T* a, T v, int) {                                  \
    AtomicWrite(a, sizeof(T), __builtin_return_address(0));                                        \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                          \
  }                                                                                             \
  T __tsan_atomic##bits##_fetch_sub(volatile T* a, T v, int) {                                  \
    AtomicWrite(a, sizeof(T), __builtin_return_address(0));                                        \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                          \
  }                                                                                             \
  T __tsan_atomic##bits##_fetch_and(volatile T* a, T v, int) {                                  \
    AtomicWrite(a, sizeof(T), __builtin_return_address(0));                                        \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                          \
  }                                                                                             \
  T __tsan_atomic##bits##_fetch_or(volatile T* a, T v, int) {                                   \
    AtomicWrite(a, sizeof(T), __builtin_return_address(0));                                        \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                           \
  }                                                                                             \
  T __tsan_atomic##bits##_fetch_xor(volatile T* a, T v, int) {                                  \
    AtomicWrite(a, sizeof(T), __builtin_return_address(0));                                        \
    return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                          \
  }                                                                                             \
  T __tsan_atomic##bits##_fetch_nand(volatile T* a, T v, int) {                                 \
    AtomicWrite(a, sizeof(T), __builtin_return_address(0));                                        \
    return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                         \
  }                                                                                             \
  int __tsan_atomic##bits##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {       \
    AtomicWrite(a, sizeof(T), __builtin_return_address(0));                                        \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);     \
  }                                                                                             \
  int __tsan_atomic##bits##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {         \
    AtomicWrite(a, sizeof(T), __builtin_return_address(0));                                        \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);     \
  }                                                                                             \
  T __tsan_atomic##bits##_compare_exchange_val(volatile T* a, T c, T v, int, int) {             \
    AtomicWrite(a, sizeof(T), __builtin_return_address(0));                                        \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);           \
    return c;                                                                                   \
  }
CUDAEMU_ATOMICS(8, char)
CUDAEMU_ATOMICS(16, short)
CUDAEMU_ATOMICS(32, int)
CUDAEMU_ATOMICS(64, long)
#undef CUDAEMU_ATOMICS

void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) {}

}  // extern "C"
