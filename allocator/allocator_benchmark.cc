// Replays the allocation trace of one training step against actpack's host pool and against
// glibc malloc, and reports per-operation latency and, at the trace's peak, reserved vs allocated
// memory (fragmentation).
//
// Two traces are recorded from real training steps (tools/record_trace.py: tools/demo.py's models
// on the CPU through actpack's CPU allocator, read from allocator/testdata/, or from
// $ACTPACK_TRACE_DIR):
//  * cnn_step (recorded): the demo's causal convolutional network, batch 32, context 128;
//  * transformer_step (recorded): the demo's character transformer, batch 32, context 128.
// Two are generated to look like what PyTorch's allocator sees in one step of larger models
// (forward:
// activations kept for backward plus short-lived temporaries and workspaces; backward in reverse,
// freeing saved activations as it goes, allocating gradients; an optimizer step with per-parameter
// temporaries; zero_grad(set_to_none) freeing the gradients):
//  * cnn: a ResNet-18-like network, CIFAR-sized, batch 64, fp32;
//  * transformer: a 4-layer GPT-2-small-width decoder, batch 4, sequence 256, bf16.
// Counters: ns_per_op (per allocation or free); x_malloc, the time relative to settled glibc
// malloc (below) replaying the same trace right after, in this run and in the heap the process
// has by then (malloc_ns_per_op); and at the trace's peak: requested_MiB (live bytes asked for),
// allocated_MiB (blocks after rounding), reserved_MiB (taken from the OS),
// reserved_over_requested.
//
// glibc's speed depends on its history: it starts with a 128 KiB mmap threshold and trims the
// heap top past 128 KiB free, so a fresh process pays mmap/munmap/brk system calls on large
// blocks (BM_GlibcMalloc); each free of an mmapped chunk raises the mmap threshold to that size
// (at most 32 MiB) and the trim threshold to twice it, so a long training process settles where
// blocks up to 32 MiB never leave the heap (BM_GlibcMallocSettled, and x_malloc's baseline; a
// heap with free chunks from earlier work avoids even the trims, which is why malloc_ns_per_op
// can be lower still).
//
// Run: bazel run -c opt //allocator:allocator_benchmark
#include <malloc.h>
#include <time.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/caching_pool.h"
#include "allocator/host_memory_resource.h"
#include "allocator/host_pool.h"
#include "allocator/testing/alloc_trace.h"
#include "allocator/units.h"
#include "benchmark/benchmark.h"

namespace actpack::allocator {
namespace {

// One step of a ResNet-18-like CNN on 32x32 images, batch 64, fp32.
AllocationTrace CnnStepTrace() {
  constexpr size_t kBatch = 64, kFloat = 4;
  struct Layer {
    size_t channels_in, channels_out, side;
  };
  std::vector<Layer> layers;
  size_t in = 3;
  for (auto [channels, side] : {std::pair<size_t, size_t>{64, 32}, {128, 16}, {256, 8}, {512, 4}}) {
    for (int i = 0; i < 4; ++i) {
      layers.push_back({in, channels, side});
      in = channels;
    }
  }
  TraceBuilder trace("cnn (generated)");
  struct Saved {
    uint32_t conv_out, bn_out, relu_out, mean, invstd;
  };
  std::vector<Saved> saved;
  const uint32_t input = trace.Alloc(kBatch * 3 * 32 * 32 * kFloat);
  for (const Layer& layer : layers) {
    const size_t activation = kBatch * layer.channels_out * layer.side * layer.side * kFloat;
    trace.Temporary(std::min<size_t>(activation / 2, 8 * kMiB));  // convolution workspace
    Saved s;
    s.conv_out = trace.Alloc(activation);
    s.mean = trace.Alloc(layer.channels_out * kFloat);
    s.invstd = trace.Alloc(layer.channels_out * kFloat);
    s.bn_out = trace.Alloc(activation);
    s.relu_out = trace.Alloc(activation);
    saved.push_back(s);
  }
  // Head: pooling, linear, loss.
  const uint32_t pooled = trace.Alloc(kBatch * 512 * kFloat);
  const uint32_t logits = trace.Alloc(kBatch * 10 * kFloat);
  const uint32_t loss = trace.Alloc(kFloat);
  trace.Temporary(kBatch * 10 * kFloat);  // log-softmax

  // Backward, last layer first.
  uint32_t grad = trace.Alloc(kBatch * 10 * kFloat);
  trace.Free(loss);
  trace.Free(logits);
  const uint32_t grad_fc = trace.Alloc(512 * 10 * kFloat);
  uint32_t grad_pooled = trace.Alloc(kBatch * 512 * kFloat);
  trace.Free(grad);
  trace.Free(pooled);
  grad = grad_pooled;
  std::vector<uint32_t> param_grads = {grad_fc};
  for (size_t i = layers.size(); i-- > 0;) {
    const Layer& layer = layers[i];
    const size_t activation = kBatch * layer.channels_out * layer.side * layer.side * kFloat;
    const size_t input_activation = kBatch * layer.channels_in * layer.side * layer.side * kFloat;
    const uint32_t grad_relu = trace.Alloc(activation);
    trace.Free(grad);
    trace.Free(saved[i].relu_out);
    const uint32_t grad_bn = trace.Alloc(activation);
    param_grads.push_back(trace.Alloc(layer.channels_out * kFloat));  // gamma
    param_grads.push_back(trace.Alloc(layer.channels_out * kFloat));  // beta
    trace.Free(grad_relu);
    trace.Free(saved[i].bn_out);
    trace.Free(saved[i].mean);
    trace.Free(saved[i].invstd);
    trace.Temporary(std::min<size_t>(activation / 2, 8 * kMiB));  // workspace
    param_grads.push_back(trace.Alloc(layer.channels_in * layer.channels_out * 9 * kFloat));
    grad = trace.Alloc(input_activation);
    trace.Free(grad_bn);
    trace.Free(saved[i].conv_out);
  }
  trace.Free(grad);
  trace.Free(input);
  // Optimizer (SGD with momentum, foreach): a temporary per parameter; then
  // zero_grad(set_to_none=True) frees the gradients.
  for (uint32_t g : param_grads) trace.Temporary(trace.SizeOf(g));
  for (uint32_t g : param_grads) trace.Free(g);
  return trace.Take();
}

// One step of a 4-layer decoder, hidden 768, 12 heads, batch 4, sequence 256, bf16.
AllocationTrace TransformerStepTrace() {
  constexpr size_t kBatch = 4, kSeq = 256, kHidden = 768, kHeads = 12, kLayers = 4, kVocab = 50257;
  constexpr size_t kHalf = 2, kFloat = 4;
  const size_t tokens = kBatch * kSeq;
  const size_t hidden_act = tokens * kHidden * kHalf;
  const size_t scores = kBatch * kHeads * kSeq * kSeq * kHalf;
  TraceBuilder trace("transformer (generated)");
  struct Saved {
    std::vector<uint32_t> ids;
  };
  std::vector<Saved> saved(kLayers);
  const uint32_t embedding = trace.Alloc(hidden_act);
  for (size_t l = 0; l < kLayers; ++l) {
    auto& s = saved[l].ids;
    s.push_back(trace.Alloc(hidden_act));           // ln1 out
    s.push_back(trace.Alloc(tokens * kFloat * 2));  // ln1 mean, rstd
    s.push_back(trace.Alloc(3 * hidden_act));       // qkv
    s.push_back(trace.Alloc(scores));               // attention probabilities
    trace.Temporary(scores);                        // softmax input
    s.push_back(trace.Alloc(scores / 16));          // dropout mask (bool-packed)
    s.push_back(trace.Alloc(hidden_act));           // attention out
    s.push_back(trace.Alloc(hidden_act));           // projection out (residual)
    s.push_back(trace.Alloc(hidden_act));           // ln2 out
    s.push_back(trace.Alloc(tokens * kFloat * 2));  // ln2 mean, rstd
    s.push_back(trace.Alloc(4 * hidden_act));       // fc1 out
    s.push_back(trace.Alloc(4 * hidden_act));       // gelu out
    s.push_back(trace.Alloc(hidden_act));           // fc2 out (residual)
  }
  const uint32_t logits = trace.Alloc(tokens * kVocab * kHalf);
  trace.Temporary(tokens * kVocab * kFloat);  // fp32 log-softmax for the loss
  const uint32_t loss = trace.Alloc(kFloat);

  uint32_t grad = trace.Alloc(tokens * kVocab * kHalf);
  trace.Free(loss);
  trace.Free(logits);
  std::vector<uint32_t> param_grads;
  param_grads.push_back(trace.Alloc(kVocab * kHidden * kHalf));  // tied embedding / lm head
  uint32_t grad_hidden = trace.Alloc(hidden_act);
  trace.Free(grad);
  grad = grad_hidden;
  for (size_t l = kLayers; l-- > 0;) {
    auto& s = saved[l].ids;
    // MLP, then attention, freeing what each part saved.
    for (size_t matrix : {4 * kHidden * kHidden, kHidden * kHidden * 4}) {
      param_grads.push_back(trace.Alloc(matrix * kHalf));
      trace.Temporary(4 * hidden_act);
    }
    for (int k = 0; k < 6; ++k) {
      trace.Free(s.back());
      s.pop_back();
    }
    const uint32_t grad_attention = trace.Alloc(hidden_act);
    trace.Temporary(scores);  // grad of probabilities
    trace.Temporary(scores);  // grad of scores
    param_grads.push_back(trace.Alloc(3 * kHidden * kHidden * kHalf));
    param_grads.push_back(trace.Alloc(kHidden * kHidden * kHalf));
    for (int k = 0; k < 4 && !s.empty(); ++k) {
      trace.Free(s.back());
      s.pop_back();
    }
    const uint32_t next = trace.Alloc(hidden_act);
    trace.Free(grad_attention);
    trace.Free(grad);
    while (!s.empty()) {
      trace.Free(s.back());
      s.pop_back();
    }
    grad = next;
  }
  trace.Free(grad);
  trace.Free(embedding);
  // AdamW, foreach: two temporaries the size of each parameter; then zero_grad.
  for (uint32_t g : param_grads) {
    trace.Temporary(trace.SizeOf(g));
    trace.Temporary(trace.SizeOf(g));
  }
  for (uint32_t g : param_grads) trace.Free(g);
  return trace.Take();
}

// Something that can allocate and free like the replay needs.
struct Target {
  std::function<void*(size_t, Stream)> allocate;
  std::function<void(void*, size_t, Stream)> deallocate;
};

Stream StreamOf(const TraceOp& op) { return reinterpret_cast<Stream>(op.stream); }

// Replays `trace` once; `ptrs` is scratch indexed by slot.
inline void Replay(const AllocationTrace& trace, std::vector<void*>& ptrs, const Target& target) {
  for (const TraceOp& op : trace.ops) {
    if (op.is_alloc) {
      ptrs[op.slot] = target.allocate(op.bytes, StreamOf(op));
    } else {
      target.deallocate(ptrs[op.slot], op.bytes, StreamOf(op));
    }
  }
}

// This thread's CPU time (user and kernel) in nanoseconds: on a shared machine wall time also
// counts other processes' turns, which made the ratio below swing tenfold between runs.
double ThreadCpuNs() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e9 + static_cast<double>(now.tv_nsec);
}

double NsPerOp(const AllocationTrace& trace, const Target& target, int replays) {
  std::vector<void*> ptrs(trace.slots);
  for (int i = 0; i < 3; ++i) Replay(trace, ptrs, target);  // warm up (glibc adapts)
  const double start = ThreadCpuNs();
  for (int i = 0; i < replays; ++i) Replay(trace, ptrs, target);
  return (ThreadCpuNs() - start) / (static_cast<double>(trace.ops.size()) * replays);
}

size_t MallocReservedBytes() {
  const struct mallinfo2 info = mallinfo2();
  return info.arena + info.hblkhd;
}

Target MallocTarget() {
  return {[](size_t bytes, Stream) { return std::malloc(bytes); },
          [](void* ptr, size_t, Stream) { std::free(ptr); }};
}

// Sets glibc's thresholds where a long-running process leaves them (see the file comment), once,
// for the rest of the process.
void SettleGlibc() {
  static const bool settled = [] {
    mallopt(M_MMAP_THRESHOLD, 32 * kMiB);
    mallopt(M_TRIM_THRESHOLD, 64 * kMiB);
    return true;
  }();
  (void)settled;
}

// Bytes at the trace's peak of live requested bytes (right after its op `peak_op`), measured on
// one replay. Reserved bytes are counted from `reserved_before`, the target's footprint before
// this benchmark started.
struct PeakMemory {
  size_t requested = 0, allocated = 0, reserved = 0;
};

PeakMemory MeasurePeak(const AllocationTrace& trace, const Target& target,
                       const std::function<MemoryUsage()>& usage, size_t reserved_before) {
  std::vector<void*> ptrs(trace.slots);
  PeakMemory peak;
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const TraceOp& op = trace.ops[i];
    if (op.is_alloc) {
      ptrs[op.slot] = target.allocate(op.bytes, StreamOf(op));
    } else {
      target.deallocate(ptrs[op.slot], op.bytes, StreamOf(op));
    }
    if (i == trace.peak_op) {
      const MemoryUsage u = usage();
      peak = {trace.peak_live_bytes, u.allocated_bytes, u.reserved_bytes - reserved_before};
    }
  }
  return peak;
}

void RunReplay(benchmark::State& state, const std::string& key, const AllocationTrace& trace,
               const Target& target, const std::function<MemoryUsage()>& usage,
               bool compare_with_malloc) {
  std::vector<void*> ptrs(trace.slots);
  // Google Benchmark calls this several times; memory is measured on the first call only, while
  // the heap is as fresh as it gets (glibc keeps freed memory, which later calls would count).
  static auto* peaks = new std::map<std::string, PeakMemory>;
  const size_t reserved_before = usage().reserved_bytes;
  Replay(trace, ptrs, target);  // warm the cache: steady state is what a training loop sees
  if (peaks->count(key) == 0) (*peaks)[key] = MeasurePeak(trace, target, usage, reserved_before);
  const PeakMemory peak = (*peaks)[key];
  for (auto _ : state) {
    Replay(trace, ptrs, target);
    benchmark::DoNotOptimize(ptrs.data());
  }
  state.counters["ns_per_op"] = benchmark::Counter(
      static_cast<double>(state.iterations() * trace.ops.size()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["ops_per_step"] = static_cast<double>(trace.ops.size());
  state.counters["requested_MiB"] = static_cast<double>(peak.requested) / kMiB;
  if (peak.allocated > 0) {
    state.counters["allocated_MiB"] = static_cast<double>(peak.allocated) / kMiB;
  }
  state.counters["reserved_MiB"] = static_cast<double>(peak.reserved) / kMiB;
  state.counters["reserved_over_requested"] =
      static_cast<double>(peak.reserved) / static_cast<double>(peak.requested);
  if (compare_with_malloc) {
    // The baseline, measured now, in this run, on the same trace, right after ours.
    SettleGlibc();
    const double ours = NsPerOp(trace, target, 100);
    const double malloc_ns = NsPerOp(trace, MallocTarget(), 100);
    state.counters["malloc_ns_per_op"] = malloc_ns;
    state.counters["x_malloc"] = ours / malloc_ns;
  }
}

// The traces by benchmark argument: 0, 1 generated; 2, 3 recorded (read once).
constexpr int kTraceCount = 4;

std::string TraceDir() {
  const char* dir = std::getenv("ACTPACK_TRACE_DIR");
  return dir != nullptr ? dir : "allocator/testdata";
}

const absl::StatusOr<AllocationTrace>& Trace(int which) {
  static const auto* traces = [] {
    auto* all = new std::vector<absl::StatusOr<AllocationTrace>>;
    all->push_back(CnnStepTrace());
    all->push_back(TransformerStepTrace());
    all->push_back(ReadAllocationTrace(TraceDir() + "/cnn_step.trace"));
    all->push_back(ReadAllocationTrace(TraceDir() + "/transformer_step.trace"));
    return all;
  }();
  return (*traces)[which];
}

// The trace of this run, labelled; nullptr (and the run skipped with the reason) if it could not
// be read.
const AllocationTrace* TraceFor(benchmark::State& state) {
  const absl::StatusOr<AllocationTrace>& trace = Trace(static_cast<int>(state.range(0)));
  if (!trace.ok()) {
    state.SkipWithError(std::string(trace.status().message()).c_str());
    return nullptr;
  }
  state.SetLabel(trace->name);
  return &*trace;
}

void TraceArgs(benchmark::internal::Benchmark* b) {
  for (int i = 0; i < kTraceCount; ++i) b->Arg(i);
}

// glibc malloc: the baseline, registered first so that its heap starts clean. "reserved" is the
// growth of glibc's arena plus mmapped chunks (mallinfo2) over the replay; glibc does not report
// allocated bytes. glibc reuses free memory that earlier benchmarks left in its heap without
// growing, so only the first trace run in a process is measured fairly: for another trace's
// figure run it alone, e.g. --benchmark_filter='GlibcMalloc/2$'.
void BM_GlibcMalloc(benchmark::State& state) {
  const AllocationTrace* trace = TraceFor(state);
  if (trace == nullptr) return;
  RunReplay(state, "malloc" + std::to_string(state.range(0)), *trace, MallocTarget(),
            [] {
              return MemoryUsage{MallocReservedBytes(), 0};
            },
            /*compare_with_malloc=*/false);
}
BENCHMARK(BM_GlibcMalloc)->Apply(TraceArgs);

// glibc settled. Only latency: the heap holds what earlier benchmarks freed, so its growth would
// not be this trace's footprint.
void BM_GlibcMallocSettled(benchmark::State& state) {
  const AllocationTrace* trace = TraceFor(state);
  if (trace == nullptr) return;
  SettleGlibc();
  std::vector<void*> ptrs(trace->slots);
  const Target target = MallocTarget();
  for (int i = 0; i < 3; ++i) Replay(*trace, ptrs, target);
  for (auto _ : state) {
    Replay(*trace, ptrs, target);
    benchmark::DoNotOptimize(ptrs.data());
  }
  state.counters["ns_per_op"] = benchmark::Counter(
      static_cast<double>(state.iterations() * trace->ops.size()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_GlibcMallocSettled)->Apply(TraceArgs);

// actpack's process-wide host pool: pool + budget + statistics + trace, as torch's CPU
// allocator uses it.
void BM_ActpackHostPool(benchmark::State& state) {
  const AllocationTrace* trace = TraceFor(state);
  if (trace == nullptr) return;
  AllocatorStack& stack = HostPool();
  stack.EmptyCache();  // start cold, like a fresh process
  Target target{[&stack](size_t bytes, Stream stream) { return *stack.Allocate(bytes, stream); },
                [&stack](void* ptr, size_t bytes, Stream stream) {
                  stack.Deallocate(ptr, bytes, stream);
                }};
  RunReplay(state, "host_pool" + std::to_string(state.range(0)), *trace, target,
            [&stack] { return stack.pool().GetUsage(); }, /*compare_with_malloc=*/true);
  stack.EmptyCache();  // give the memory back: glibc's numbers below would count it
}
BENCHMARK(BM_ActpackHostPool)->Apply(TraceArgs);

// The caching pool alone, to show what the adaptors cost.
void BM_ActpackBarePool(benchmark::State& state) {
  const AllocationTrace* trace = TraceFor(state);
  if (trace == nullptr) return;
  HostMemoryResource host;
  HostStreamEvents events;
  CachingPool pool(&host, &events);
  Target target{[&pool](size_t bytes, Stream stream) { return *pool.Allocate(bytes, stream); },
                [&pool](void* ptr, size_t bytes, Stream stream) {
                  pool.Deallocate(ptr, bytes, stream);
                }};
  RunReplay(state, "bare_pool" + std::to_string(state.range(0)), *trace, target,
            [&pool] { return pool.GetUsage(); }, /*compare_with_malloc=*/true);
}
BENCHMARK(BM_ActpackBarePool)->Apply(TraceArgs);


}  // namespace
}  // namespace actpack::allocator
