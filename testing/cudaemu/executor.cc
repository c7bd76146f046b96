// The executor: runs a kernel's CUDA threads as fibers on the calling host thread (under the
// concurrent schedule, several blocks at once, each on a host thread of its own).
//
// A block's threads are fibers with their own stacks (a guard page below each). The scheduler
// resumes runnable fibers in the schedule's order; a fiber runs until it finishes or reaches a
// barrier or a warp collective, where it waits. When no fiber can run, waiting warps are
// resolved (every lane of a mask arrived at the same collective: results delivered), then a
// block barrier (every live thread at the same __syncthreads: all released). Anything else is
// a program a GPU would not run correctly, and stops the process with the block and thread.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "testing/cudaemu/internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define CUDAEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDAEMU_ASAN 1
#endif
#endif
#ifdef CUDAEMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#error "cudaemu switches fibers with x86-64 assembly"
#endif

// cudaemu_switch(save, to): saves the callee-saved registers and the FP control words on the
// current stack, stores the stack pointer in *save, and resumes the stack `to` saved earlier.
extern "C" void cudaemu_switch(void** save, void* to);
asm(R"(
.text
.globl cudaemu_switch
.type cudaemu_switch,@function
cudaemu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size cudaemu_switch,.-cudaemu_switch
.section .note.GNU-stack,"",@progbits
.text
)");

namespace cudaemu {
namespace internal {
namespace {

enum class FiberState { kRunnable, kAtCollective, kAtBarrier, kDone };

struct Fiber {
  char* stack = nullptr;  // lowest usable byte (the guard page is below)
  size_t stack_size = 0;
  void* sp = nullptr;
  uint3 tid{0, 0, 0};
  uint32_t linear = 0;
  FiberState state = FiberState::kDone;
  // The collective or barrier this fiber waits at.
  CollectiveOp op = kSyncWarp;
  unsigned mask = 0;
  uint64_t bits = 0;
  int arg = 0;
  int width = 32;
  Site site;
  uint64_t result = 0;
};

struct BlockRun {
  const KernelLaunch* launch = nullptr;
  uint3 index{0, 0, 0};
  uint64_t linear = 0;
  uint32_t threads = 0;
};

// A host thread's fibers; their stacks go with the thread.
struct Fibers : std::vector<Fiber> {
  ~Fibers() {
    for (Fiber& f : *this) {
      if (f.stack != nullptr) munmap(f.stack - 4096, f.stack_size + 4096);
    }
  }
};

// Scheduler state of the block this host thread runs (one kernel runs at a time, under
// DeviceLock(); its blocks run on the launching thread, or on several under the concurrent
// schedule).
thread_local Fibers fibers;
thread_local BlockRun block;
thread_local Fiber* current = nullptr;
thread_local void* scheduler_sp = nullptr;
thread_local ThreadContext context;
thread_local bool turns_at_atomics = false;
#ifdef CUDAEMU_ASAN
thread_local void* scheduler_fake_stack = nullptr;
thread_local const void* scheduler_stack_bottom = nullptr;
thread_local size_t scheduler_stack_size = 0;
#endif

size_t StackSize() {
  const char* s = getenv("CUDAEMU_STACK_KB");
#ifdef CUDAEMU_ASAN
  const size_t kb = s ? strtoul(s, nullptr, 10) : 256;
#else
  const size_t kb = s ? strtoul(s, nullptr, 10) : 128;
#endif
  return kb * 1024;
}

std::string Where(const Fiber* f) {
  char buf[200];
  snprintf(buf, sizeof buf, " in kernel %s (block %u,%u,%u thread %u,%u,%u)", block.launch->name,
           block.index.x, block.index.y, block.index.z, f ? f->tid.x : 0, f ? f->tid.y : 0,
           f ? f->tid.z : 0);
  return buf;
}

bool SameSite(const Site& a, const Site& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         (a.file_name() == b.file_name() || std::strcmp(a.file_name(), b.file_name()) == 0);
}

std::string SiteName(const Site& s) {
  return std::string(s.file_name()) + ":" + std::to_string(s.line());
}

const char* OpName(CollectiveOp op) {
  switch (op) {
    case kSyncWarp: return "__syncwarp";
    case kShflXor: return "__shfl_xor_sync";
    case kShflUp: return "__shfl_up_sync";
    case kShflDown: return "__shfl_down_sync";
    case kShfl: return "__shfl_sync";
    case kBallot: return "__ballot_sync";
    case kAny: return "__any_sync";
    case kAll: return "__all_sync";
  }
  return "?";
}

void SwitchTo(Fiber* f) {
  current = f;
  threadIdx = f->tid;
  context.thread = f->linear;
  context.stack_lo = reinterpret_cast<uintptr_t>(f->stack);
  context.stack_hi = context.stack_lo + f->stack_size;
#ifdef CUDAEMU_ASAN
  __sanitizer_start_switch_fiber(&scheduler_fake_stack, f->stack, f->stack_size);
#endif
  cudaemu_switch(&scheduler_sp, f->sp);
#ifdef CUDAEMU_ASAN
  __sanitizer_finish_switch_fiber(scheduler_fake_stack, &scheduler_stack_bottom,
                                  &scheduler_stack_size);
#endif
  current = nullptr;
}

// Back to the scheduler from a fiber that waits.
void Yield() {
  Fiber* f = current;
#ifdef CUDAEMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, scheduler_stack_bottom, scheduler_stack_size);
#endif
  cudaemu_switch(&f->sp, scheduler_sp);
#ifdef CUDAEMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

// Where a new fiber starts (cudaemu_switch "returns" into it).
void FiberEntry() {
#ifdef CUDAEMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack_bottom, &scheduler_stack_size);
#endif
  block.launch->body(block.launch->closure.get());
  current->state = FiberState::kDone;
#ifdef CUDAEMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, scheduler_stack_bottom, scheduler_stack_size);
#endif
  void* dead = nullptr;
  cudaemu_switch(&dead, scheduler_sp);
  __builtin_unreachable();
}

void PrepareFiber(Fiber& f, size_t stack_size) {
  if (f.stack == nullptr || f.stack_size != stack_size) {
    if (f.stack != nullptr) munmap(f.stack - 4096, f.stack_size + 4096);
    void* m = mmap(nullptr, stack_size + 4096, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) Fatal("cannot map a fiber stack");
    mprotect(m, 4096, PROT_NONE);  // a stack overflow faults instead of corrupting a neighbour
    f.stack = static_cast<char*>(m) + 4096;
    f.stack_size = stack_size;
  }
#ifdef CUDAEMU_ASAN
  // A reused stack still carries the redzones of the frames the last thread never returned
  // from: FiberEntry's, at the top (every block runs its threads to the end, and a function
  // ASan instruments clears its frame's redzones as it returns). Clearing the whole stack's
  // shadow instead, 32 KiB per thread per block, was a third of an emulated test's time.
  constexpr size_t kEntryFrames = 8192;
  const size_t entry = std::min(f.stack_size, kEntryFrames);
  ASAN_UNPOISON_MEMORY_REGION(f.stack + f.stack_size - entry, entry);
#endif
  // The initial frame cudaemu_switch pops: MXCSR and x87 control word, six registers, and the
  // return address FiberEntry. The top stays 16-byte aligned minus 8 at entry, as the ABI wants.
  const uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack) + f.stack_size) & ~uintptr_t{15};
  uint64_t* sp = reinterpret_cast<uint64_t*>(top - 72);
  std::memset(sp, 0, 72);
  const uint32_t mxcsr = 0x1F80;
  const uint16_t fpu_control = 0x037F;
  std::memcpy(sp, &mxcsr, 4);
  std::memcpy(reinterpret_cast<char*>(sp) + 4, &fpu_control, 2);
  sp[7] = reinterpret_cast<uint64_t>(&FiberEntry);
  f.sp = sp;
  f.state = FiberState::kRunnable;
}

// Delivers the collectives of warp `w` whose masks have fully arrived. Everything is blocked
// when this runs, so a lane of a mask that is not at the same collective never will be.
bool ResolveWarp(uint32_t w) {
  const uint32_t first = w * 32;
  const uint32_t last = std::min(block.threads, first + 32);
  const uint32_t lanes = last - first;
  bool released = false;
  for (uint32_t i = first; i < last; ++i) {
    Fiber& lead = fibers[i];
    if (lead.state != FiberState::kAtCollective) continue;
    const unsigned mask = lead.mask;
    const uint32_t lead_lane = i - first;
    if (((mask >> lead_lane) & 1u) == 0) {
      Fatal(std::string(OpName(lead.op)) + ": the calling lane is not in its mask" + Where(&lead));
    }
    if (lanes < 32 && (mask >> lanes) != 0) {
      Fatal(std::string(OpName(lead.op)) + ": the mask names lanes past the end of the block" +
            Where(&lead));
    }
    uint64_t values[32] = {};
    for (uint32_t lane = 0; lane < lanes; ++lane) {
      if (((mask >> lane) & 1u) == 0) continue;
      const Fiber& f = fibers[first + lane];
      char buf[240];
      if (f.state == FiberState::kDone) {
        snprintf(buf, sizeof buf, "%s with mask %08x in warp %u: lane %u has exited",
                 OpName(lead.op), mask, w, lane);
        Fatal(buf + Where(&lead));
      }
      if (f.state == FiberState::kAtBarrier) {
        snprintf(buf, sizeof buf, "%s with mask %08x in warp %u: lane %u waits at __syncthreads",
                 OpName(lead.op), mask, w, lane);
        Fatal(buf + Where(&lead));
      }
      if (f.op != lead.op || f.mask != mask || !SameSite(f.site, lead.site) ||
          f.width != lead.width) {
        snprintf(buf, sizeof buf,
                 "divergent warp collective in warp %u: lane %u at %s (mask %08x, %s), "
                 "lane %u at %s (mask %08x, %s)",
                 w, lead_lane, OpName(lead.op), mask, SiteName(lead.site).c_str(), lane,
                 OpName(f.op), f.mask, SiteName(f.site).c_str());
        Fatal(buf + Where(&lead));
      }
      values[lane] = f.bits;
    }
    const int width = lead.width;
    if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
      Fatal(std::string(OpName(lead.op)) + ": width is not a power of two <= 32" + Where(&lead));
    }
    unsigned ballot = 0;
    for (uint32_t lane = 0; lane < lanes; ++lane) {
      if (((mask >> lane) & 1u) && values[lane] != 0) ballot |= 1u << lane;
    }
    for (uint32_t lane = 0; lane < lanes; ++lane) {
      if (((mask >> lane) & 1u) == 0) continue;
      Fiber& f = fibers[first + lane];
      const int base = static_cast<int>(lane) & ~(width - 1);
      int source = static_cast<int>(lane);
      switch (f.op) {
        case kShflXor:
          source = static_cast<int>(lane) ^ f.arg;
          if (source >= base + width) source = static_cast<int>(lane);
          break;
        case kShflUp:
          source = static_cast<int>(lane) - f.arg;
          if (source < base) source = static_cast<int>(lane);
          break;
        case kShflDown:
          source = static_cast<int>(lane) + f.arg;
          if (source >= base + width) source = static_cast<int>(lane);
          break;
        case kShfl:
          source = base + (f.arg & (width - 1));
          break;
        default:
          break;
      }
      switch (f.op) {
        case kShflXor:
        case kShflUp:
        case kShflDown:
        case kShfl:
          if (source < 0 || source >= static_cast<int>(lanes) || ((mask >> source) & 1u) == 0) {
            Fatal(std::string(OpName(f.op)) + ": reads lane " + std::to_string(source) +
                  ", which is not in the mask" + Where(&f));
          }
          f.result = values[source];
          break;
        case kBallot: f.result = ballot; break;
        case kAny: f.result = ballot != 0; break;
        case kAll: f.result = ballot == mask; break;
        case kSyncWarp: f.result = 0; break;
      }
      f.state = FiberState::kRunnable;
    }
    if (lead.op == kSyncWarp) {
      if (RaceObserver* observer = GetRaceObserver()) observer->WarpSync(w, mask);
    }
    released = true;
  }
  return released;
}

void RunBlockFibers(const std::vector<uint32_t>& order) {
  for (;;) {
    bool ran = false;
    for (uint32_t i : order) {
      if (fibers[i].state == FiberState::kRunnable) {
        SwitchTo(&fibers[i]);
        ran = true;
      }
    }
    if (ran) continue;
    bool any_collective = false, any_barrier = false, any_done = false;
    for (uint32_t i = 0; i < block.threads; ++i) {
      any_collective |= fibers[i].state == FiberState::kAtCollective;
      any_barrier |= fibers[i].state == FiberState::kAtBarrier;
      any_done |= fibers[i].state == FiberState::kDone;
    }
    if (any_collective) {
      bool released = false;
      for (uint32_t w = 0; w * 32 < block.threads; ++w) released |= ResolveWarp(w);
      if (released) continue;
      Fatal("warp collectives can never complete" + Where(nullptr));
    }
    if (!any_barrier) return;  // every thread finished
    const Fiber* first_waiting = nullptr;
    for (uint32_t i = 0; i < block.threads; ++i) {
      const Fiber& f = fibers[i];
      if (f.state != FiberState::kAtBarrier) continue;
      if (first_waiting == nullptr) {
        first_waiting = &f;
      } else if (!SameSite(f.site, first_waiting->site)) {
        Fatal("threads of a block wait at different __syncthreads (thread " +
              std::to_string(first_waiting->linear) + " at " + SiteName(first_waiting->site) +
              ", thread " + std::to_string(f.linear) + " at " + SiteName(f.site) + ")" +
              Where(&f));
      }
    }
    if (any_done) {
      Fatal("__syncthreads is not reached by every thread of the block (some exited)" +
            Where(first_waiting));
    }
    if (RaceObserver* observer = GetRaceObserver()) observer->BlockBarrier();
    for (uint32_t i = 0; i < block.threads; ++i) fibers[i].state = FiberState::kRunnable;
  }
}

// Runs block `b` of `launch` on this host thread.
void RunBlock(const KernelLaunch& launch, uint64_t b, std::vector<uint32_t>& thread_order,
              std::mt19937_64* shuffle_threads) {
  const uint32_t threads = launch.block.x * launch.block.y * launch.block.z;
  if (fibers.size() < threads) fibers.resize(threads);
  gridDim = launch.grid;
  blockDim = launch.block;
  context.launch = &launch;
  context.threads = threads;
  block.launch = &launch;
  block.linear = b;
  block.threads = threads;
  block.index = uint3{static_cast<unsigned>(b % launch.grid.x),
                      static_cast<unsigned>(b / launch.grid.x % launch.grid.y),
                      static_cast<unsigned>(b / (uint64_t{launch.grid.x} * launch.grid.y))};
  blockIdx = block.index;
  context.block = b;
  const size_t stack_size = StackSize();
  for (uint32_t i = 0; i < threads; ++i) {
    Fiber& f = fibers[i];
    f.linear = i;
    f.tid = uint3{i % launch.block.x, i / launch.block.x % launch.block.y,
                  i / (launch.block.x * launch.block.y)};
    PrepareFiber(f, stack_size);
  }
  if (shuffle_threads != nullptr) {
    std::shuffle(thread_order.begin(), thread_order.end(), *shuffle_threads);
  }
  if (RaceObserver* observer = GetRaceObserver()) observer->BlockBegin(launch, b, threads);
  RunBlockFibers(thread_order);
}

// The concurrent schedule: `schedule.blocks` host threads take the blocks in `order` as they
// finish the last, so that a block that waits on another (a look-back, a flag) sees it run.
void RunBlocksConcurrently(const KernelLaunch& launch, const std::vector<uint64_t>& order,
                           uint32_t workers) {
  const uint32_t threads = launch.block.x * launch.block.y * launch.block.z;
  std::atomic<size_t> next{0};
  std::vector<std::thread> running;
  for (uint32_t w = 0; w < workers; ++w) {
    running.emplace_back([&] {
      turns_at_atomics = true;
      std::vector<uint32_t> thread_order(threads);
      std::iota(thread_order.begin(), thread_order.end(), 0u);
      for (size_t k = next++; k < order.size(); k = next++) {
        RunBlock(launch, order[k], thread_order, nullptr);
      }
    });
  }
  for (std::thread& t : running) t.join();
}

}  // namespace

const ThreadContext* CurrentThread() { return current != nullptr ? &context : nullptr; }

void RunKernel(const KernelLaunch& launch) {
  const uint32_t threads = launch.block.x * launch.block.y * launch.block.z;
  const uint64_t blocks = uint64_t{launch.grid.x} * launch.grid.y * launch.grid.z;
  const Schedule& schedule = CurrentSchedule();
  std::mt19937_64 rng(schedule.seed * 0x9e3779b97f4a7c15ull + launch.schedule_index);

  std::vector<uint64_t> block_order(blocks);
  std::iota(block_order.begin(), block_order.end(), uint64_t{0});
  std::vector<uint32_t> thread_order(threads);
  std::iota(thread_order.begin(), thread_order.end(), 0u);
  if (schedule.kind == ScheduleKind::kReverse) {
    std::reverse(block_order.begin(), block_order.end());
    std::reverse(thread_order.begin(), thread_order.end());
  } else if (schedule.kind == ScheduleKind::kRandom ||
             schedule.kind == ScheduleKind::kConcurrent) {
    std::shuffle(block_order.begin(), block_order.end(), rng);
  }
  RaceObserver* observer = GetRaceObserver();
  if (schedule.kind == ScheduleKind::kConcurrent && blocks > 1) {
    TrafficRecorder* traffic = GetTrafficRecorder();
#ifdef CUDAEMU_ASAN
    Fatal("the concurrent schedule runs blocks on several host threads, which this "
          "AddressSanitizer build does not support (shared memory is one static): use the plain "
          "emulated build");
#endif
    if (observer != nullptr || (traffic != nullptr && traffic->recording())) {
      Fatal("the concurrent schedule runs blocks on several host threads; the race checker and "
            "the traffic recorder watch one: use forward, reverse or random with them");
    }
    RunBlocksConcurrently(launch, block_order,
                          static_cast<uint32_t>(std::min<uint64_t>(schedule.blocks, blocks)));
    return;
  }
  turns_at_atomics = schedule.kind == ScheduleKind::kConcurrent;
  for (uint64_t b : block_order) {
    RunBlock(launch, b, thread_order,
             schedule.kind == ScheduleKind::kRandom ? &rng : nullptr);
  }
  turns_at_atomics = false;
  if (observer != nullptr) observer->KernelEnd();
}

}  // namespace internal

uint64_t Collective(CollectiveOp op, unsigned mask, uint64_t bits, int arg, int width,
                    const Site& site) {
  internal::Fiber* f = internal::current;
  if (f == nullptr) internal::Fatal(std::string(internal::OpName(op)) + " called outside a kernel");
  f->op = op;
  f->mask = mask;
  f->bits = bits;
  f->arg = arg;
  f->width = width;
  f->site = site;
  f->state = internal::FiberState::kAtCollective;
  internal::Yield();
  return f->result;
}

void MisalignedVectorAccess(const void* address, size_t bytes, bool write) {
  const internal::ThreadContext* t = internal::CurrentThread();
  char buf[300];
  if (t == nullptr) {
    std::snprintf(buf, sizeof buf, "a misaligned %zu-byte vector %s at %p outside a kernel", bytes,
                  write ? "write" : "read", address);
    internal::Fatal(buf);
  }
  const dim3 g = t->launch->grid;
  const dim3 b = t->launch->block;
  std::snprintf(buf, sizeof buf,
                "a misaligned %zu-byte vector %s at %p (a GPU faults: misaligned address) in "
                "kernel %s, block (%u,%u,%u), thread (%u,%u,%u)",
                bytes, write ? "write" : "read", address, t->launch->name,
                static_cast<unsigned>(t->block % g.x), static_cast<unsigned>(t->block / g.x % g.y),
                static_cast<unsigned>(t->block / (uint64_t{g.x} * g.y)), t->thread % b.x,
                t->thread / b.x % b.y, t->thread / (b.x * b.y));
  internal::Fatal(buf);
}

void AtomicTurn() {
  if (internal::current == nullptr || !internal::turns_at_atomics) return;
  // The other blocks' host threads get the processor (a GPU's blocks move in step; here a poll
  // would otherwise spin out its whole slice before a block it waits for writes), and the
  // block's other fibers a turn.
  std::this_thread::yield();
  internal::Yield();  // still runnable: the scheduler resumes it after the block's other fibers
}

void SyncThreads(const Site& site) {
  internal::Fiber* f = internal::current;
  if (f == nullptr) internal::Fatal("__syncthreads called outside a kernel");
  f->site = site;
  f->state = internal::FiberState::kAtBarrier;
  internal::Yield();
}

bool ConcurrentScheduleAvailable() {
#ifdef CUDAEMU_ASAN
  return false;
#else
  return !RaceCheckerActive();
#endif
}

}  // namespace cudaemu
