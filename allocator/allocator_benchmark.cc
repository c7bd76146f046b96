// Replays the allocation trace of one training step against actpack's host pool and against
// glibc malloc, and reports per-operation latency and, at the trace's peak, reserved vs allocated
// memory (fragmentation).
//
// The traces are generated to look like what PyTorch's allocator sees in one step (forward:
// activations kept for backward plus short-lived temporaries and workspaces; backward in reverse,
// freeing saved activations as it goes, allocating gradients; an optimizer step with per-parameter
// temporaries; zero_grad(set_to_none) freeing the gradients):
//  * cnn: a ResNet-18-like network, CIFAR-sized, batch 64, fp32;
//  * transformer: a 4-layer GPT-2-small-width decoder, batch 4, sequence 256, bf16.
// Counters: ns_per_op (per allocation or free), x_malloc (time relative to glibc malloc replaying
// the same trace in the same run), and at the trace's peak: requested_MiB (live bytes asked for),
// allocated_MiB (blocks after rounding), reserved_MiB (taken from the OS), reserved_over_requested.
//
// Run: bazel run -c opt //allocator:allocator_benchmark
#include <malloc.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "allocator/caching_pool.h"
#include "allocator/host_memory_resource.h"
#include "allocator/pluggable.h"
#include "allocator/units.h"
#include "benchmark/benchmark.h"

namespace actpack::allocator {
namespace {

struct TraceOp {
  bool is_alloc;
  uint32_t id;
  size_t bytes;
};

class TraceBuilder {
 public:
  uint32_t Alloc(size_t bytes) {
    const uint32_t id = next_id_++;
    sizes_.push_back(bytes);
    ops_.push_back({true, id, bytes});
    return id;
  }
  void Free(uint32_t id) { ops_.push_back({false, id, sizes_[id]}); }
  // A temporary: allocated and freed right away (workspaces, intermediate results).
  void Temporary(size_t bytes) { Free(Alloc(bytes)); }
  size_t SizeOf(uint32_t id) const { return sizes_[id]; }
  std::vector<TraceOp> Take() { return std::move(ops_); }

 private:
  std::vector<TraceOp> ops_;
  std::vector<size_t> sizes_;
  uint32_t next_id_ = 0;
};

// One step of a ResNet-18-like CNN on 32x32 images, batch 64, fp32.
std::vector<TraceOp> CnnStepTrace() {
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
  TraceBuilder trace;
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
std::vector<TraceOp> TransformerStepTrace() {
  constexpr size_t kBatch = 4, kSeq = 256, kHidden = 768, kHeads = 12, kLayers = 4, kVocab = 50257;
  constexpr size_t kHalf = 2, kFloat = 4;
  const size_t tokens = kBatch * kSeq;
  const size_t hidden_act = tokens * kHidden * kHalf;
  const size_t scores = kBatch * kHeads * kSeq * kSeq * kHalf;
  TraceBuilder trace;
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
  std::function<void*(size_t)> allocate;
  std::function<void(void*, size_t)> deallocate;
};

// Replays `ops` once; `ptrs` is scratch indexed by op id.
inline void Replay(const std::vector<TraceOp>& ops, std::vector<void*>& ptrs,
                   const Target& target) {
  for (const TraceOp& op : ops) {
    if (op.is_alloc) {
      ptrs[op.id] = target.allocate(op.bytes);
    } else {
      target.deallocate(ptrs[op.id], op.bytes);
    }
  }
}

size_t MaxId(const std::vector<TraceOp>& ops) {
  size_t max_id = 0;
  for (const TraceOp& op : ops) max_id = std::max<size_t>(max_id, op.id);
  return max_id + 1;
}

double NsPerOp(const std::vector<TraceOp>& ops, const Target& target, int replays) {
  std::vector<void*> ptrs(MaxId(ops));
  for (int i = 0; i < 3; ++i) Replay(ops, ptrs, target);  // warm up (glibc adapts its thresholds)
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < replays; ++i) Replay(ops, ptrs, target);
  const auto ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start);
  return ns.count() / (static_cast<double>(ops.size()) * replays);
}

size_t MallocReservedBytes() {
  const struct mallinfo2 info = mallinfo2();
  return info.arena + info.hblkhd;
}

Target MallocTarget() {
  return {[](size_t bytes) { return std::malloc(bytes); },
          [](void* ptr, size_t) { std::free(ptr); }};
}

// Bytes at the trace's peak of live requested bytes, measured on one replay. Reserved bytes
// are counted from `reserved_before`, the target's footprint before this benchmark started.
struct PeakMemory {
  size_t requested = 0, allocated = 0, reserved = 0;
};

PeakMemory MeasurePeak(const std::vector<TraceOp>& ops, const Target& target,
                       const std::function<MemoryUsage()>& usage, size_t reserved_before) {
  std::vector<void*> ptrs(MaxId(ops));
  PeakMemory peak;
  size_t live = 0;
  for (const TraceOp& op : ops) {
    if (op.is_alloc) {
      ptrs[op.id] = target.allocate(op.bytes);
      live += op.bytes;
      if (live > peak.requested) {
        const MemoryUsage u = usage();
        peak = {live, u.allocated_bytes, u.reserved_bytes - reserved_before};
      }
    } else {
      target.deallocate(ptrs[op.id], op.bytes);
      live -= op.bytes;
    }
  }
  return peak;
}

void RunReplay(benchmark::State& state, const std::string& key, const std::vector<TraceOp>& ops,
               const Target& target, const std::function<MemoryUsage()>& usage,
               bool compare_with_malloc) {
  std::vector<void*> ptrs(MaxId(ops));
  // Google Benchmark calls this several times; memory is measured on the first call only, while
  // the heap is as fresh as it gets (glibc keeps freed memory, which later calls would count).
  static auto* peaks = new std::map<std::string, PeakMemory>;
  const size_t reserved_before = usage().reserved_bytes;
  Replay(ops, ptrs, target);  // warm the cache: steady state is what a training loop sees
  if (peaks->count(key) == 0) (*peaks)[key] = MeasurePeak(ops, target, usage, reserved_before);
  const PeakMemory peak = (*peaks)[key];
  for (auto _ : state) {
    Replay(ops, ptrs, target);
    benchmark::DoNotOptimize(ptrs.data());
  }
  state.counters["ns_per_op"] = benchmark::Counter(
      static_cast<double>(state.iterations() * ops.size()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["ops_per_step"] = static_cast<double>(ops.size());
  state.counters["requested_MiB"] = static_cast<double>(peak.requested) / kMiB;
  if (peak.allocated > 0) {
    state.counters["allocated_MiB"] = static_cast<double>(peak.allocated) / kMiB;
  }
  state.counters["reserved_MiB"] = static_cast<double>(peak.reserved) / kMiB;
  state.counters["reserved_over_requested"] =
      static_cast<double>(peak.reserved) / static_cast<double>(peak.requested);
  if (compare_with_malloc) {
    // The baseline, measured now, in this run, on the same trace, right after ours.
    const double ours = NsPerOp(ops, target, 100);
    const double malloc_ns = NsPerOp(ops, MallocTarget(), 100);
    state.counters["x_malloc"] = ours / malloc_ns;
  }
}

const std::vector<TraceOp>& Trace(int which) {
  static const auto* cnn = new std::vector<TraceOp>(CnnStepTrace());
  static const auto* transformer = new std::vector<TraceOp>(TransformerStepTrace());
  return which == 0 ? *cnn : *transformer;
}

void SetLabel(benchmark::State& state) {
  state.SetLabel(state.range(0) == 0 ? "cnn" : "transformer");
}

// glibc malloc: the baseline, registered first so that its heap starts clean. "reserved" is the
// growth of glibc's arena plus mmapped chunks (mallinfo2) over the replay; glibc does not report
// allocated bytes. glibc reuses free memory that earlier benchmarks left in its heap without
// growing, so only the first trace run in a process is measured fairly: for the transformer's
// figure run --benchmark_filter='GlibcMalloc/1'.
void BM_GlibcMalloc(benchmark::State& state) {
  SetLabel(state);
  RunReplay(state, "malloc" + std::to_string(state.range(0)), Trace(state.range(0)),
            MallocTarget(),
            [] {
              return MemoryUsage{MallocReservedBytes(), 0};
            },
            /*compare_with_malloc=*/false);
}
BENCHMARK(BM_GlibcMalloc)->Arg(0)->Arg(1);

// actpack's process-wide host pool: pool + budget + statistics + trace, as torch's CPU
// allocator uses it.
void BM_ActpackHostPool(benchmark::State& state) {
  SetLabel(state);
  AllocatorStack& stack = HostPool();
  stack.EmptyCache();  // start cold, like a fresh process
  Target target{[&stack](size_t bytes) { return *stack.Allocate(bytes); },
                [&stack](void* ptr, size_t bytes) { stack.Deallocate(ptr, bytes); }};
  RunReplay(state, "host_pool" + std::to_string(state.range(0)), Trace(state.range(0)), target,
            [&stack] { return stack.pool().GetUsage(); }, /*compare_with_malloc=*/true);
  stack.EmptyCache();  // give the memory back: glibc's numbers below would count it
}
BENCHMARK(BM_ActpackHostPool)->Arg(0)->Arg(1);

// The caching pool alone, to show what the adaptors cost.
void BM_ActpackBarePool(benchmark::State& state) {
  SetLabel(state);
  HostMemoryResource host;
  HostStreamEvents events;
  CachingPool pool(&host, &events);
  Target target{[&pool](size_t bytes) { return *pool.Allocate(bytes); },
                [&pool](void* ptr, size_t bytes) { pool.Deallocate(ptr, bytes); }};
  RunReplay(state, "bare_pool" + std::to_string(state.range(0)), Trace(state.range(0)), target,
            [&pool] { return pool.GetUsage(); }, /*compare_with_malloc=*/true);
}
BENCHMARK(BM_ActpackBarePool)->Arg(0)->Arg(1);


}  // namespace
}  // namespace actpack::allocator
