// The C++ replay loop of benchmarks/alloc_replay.py: allocation traces replayed through an
// allocator at the cost an allocation has inside torch (no Python call per op). Built on first
// use by torch.utils.cpp_extension.load (alloc_replay.replay_module()); not part of the actpack
// wheel: a benchmark's tool, not the library's.
//
// Targets:
//  * "malloc": glibc;
//  * (alloc_fn, free_fn, last_error_fn, device): functions with the signatures of actpack's C
//    ABI (allocator/pluggable.h: actpack_alloc, actpack_free, actpack_last_error), by address —
//    what torch's CUDAPluggableAllocator calls;
//  * a tensor: the c10 allocator its storage came from (torch's CUDA caching allocator or
//    cudaMallocAsync, whichever this process runs; torch's or actpack's CPU allocator). It
//    allocates on the current stream: stream handles are ignored.
#include <torch/extension.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

namespace py = pybind11;

// One replayed operation: (is_alloc, slot, bytes, stream handle).
using ReplayOp = std::tuple<bool, uint32_t, size_t, uintptr_t>;

using AllocFn = void* (*)(size_t, int, void*);
using FreeFn = void (*)(void*, size_t, int, void*);
using LastErrorFn = const char* (*)();

// Replays `ops` `repeats` times through `allocate` / `deallocate`; calls `on_pause` once, after
// op `pause_at` of the first pass. Returns the seconds all passes took.
template <typename Slot, typename Allocate, typename Deallocate>
double ReplayLoop(const std::vector<ReplayOp>& ops, int repeats, int64_t pause_at,
                  const std::optional<py::function>& on_pause, Allocate allocate,
                  Deallocate deallocate) {
  uint32_t slots = 0;
  for (const ReplayOp& op : ops) slots = std::max(slots, std::get<1>(op) + 1);
  std::vector<Slot> table(slots);
  const auto start = std::chrono::steady_clock::now();
  for (int pass = 0; pass < repeats; ++pass) {
    for (size_t i = 0; i < ops.size(); ++i) {
      const auto& [is_alloc, slot, bytes, stream] = ops[i];
      if (is_alloc) {
        table[slot] = allocate(bytes, reinterpret_cast<void*>(stream));
      } else {
        deallocate(table[slot], bytes, reinterpret_cast<void*>(stream));
      }
      if (pass == 0 && static_cast<int64_t>(i) == pause_at && on_pause) (*on_pause)();
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void CheckReplayOps(const std::vector<ReplayOp>& ops) {
  std::vector<bool> live;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& [is_alloc, slot, bytes, stream] = ops[i];
    if (slot >= live.size()) live.resize(slot + 1);
    TORCH_CHECK_VALUE(live[slot] != is_alloc, "actpack: replay op ", i, ": ",
                      is_alloc ? "alloc into" : "free of", " slot ", slot, ", which is ",
                      is_alloc ? "live" : "not live");
    live[slot] = is_alloc;
  }
  TORCH_CHECK_VALUE(std::find(live.begin(), live.end(), true) == live.end(),
                    "actpack: the replayed ops leave allocations live; a trace must free "
                    "everything");
}

// Allocation failures raise. Returns the seconds of all passes.
double Replay(const std::vector<ReplayOp>& ops, const py::object& target, int repeats,
              int64_t pause_at, std::optional<py::function> on_pause) {
  TORCH_CHECK_VALUE(repeats >= 1, "actpack: repeats must be >= 1, got ", repeats);
  CheckReplayOps(ops);
  if (py::isinstance<py::str>(target)) {
    const std::string name = target.cast<std::string>();
    TORCH_CHECK_VALUE(name == "malloc", "actpack: unknown replay target '", name,
                      "'; expected 'malloc', (alloc_fn, free_fn, last_error_fn, device) or a "
                      "tensor");
    return ReplayLoop<void*>(
        ops, repeats, pause_at, on_pause,
        [](size_t bytes, void*) {
          void* ptr = std::malloc(bytes);
          TORCH_CHECK(ptr != nullptr || bytes == 0, "actpack: malloc(", bytes, ") failed");
          return ptr;
        },
        [](void* ptr, size_t, void*) { std::free(ptr); });
  }
  if (py::isinstance<py::tuple>(target)) {
    const auto [alloc_address, free_address, last_error_address, device] =
        target.cast<std::tuple<uintptr_t, uintptr_t, uintptr_t, int>>();
    TORCH_CHECK_VALUE(alloc_address != 0 && free_address != 0 && last_error_address != 0,
                      "actpack: a C ABI target needs three function addresses, got a null one");
    const auto alloc_fn = reinterpret_cast<AllocFn>(alloc_address);
    const auto free_fn = reinterpret_cast<FreeFn>(free_address);
    const auto last_error_fn = reinterpret_cast<LastErrorFn>(last_error_address);
    return ReplayLoop<void*>(
        ops, repeats, pause_at, on_pause,
        [=](size_t bytes, void* stream) {
          void* ptr = alloc_fn(bytes, device, stream);
          TORCH_CHECK(ptr != nullptr || bytes == 0, "actpack: allocating ", bytes,
                      " bytes failed: ", last_error_fn());
          return ptr;
        },
        [=](void* ptr, size_t bytes, void* stream) { free_fn(ptr, bytes, device, stream); });
  }
  const at::Tensor tensor = target.cast<at::Tensor>();
  c10::Allocator* c10_allocator = tensor.storage().allocator();
  TORCH_CHECK_VALUE(c10_allocator != nullptr,
                    "actpack: the target tensor's storage has no allocator (made from a blob?)");
  return ReplayLoop<c10::DataPtr>(
      ops, repeats, pause_at, on_pause,
      [c10_allocator](size_t bytes, void*) { return c10_allocator->allocate(bytes); },
      [](c10::DataPtr& ptr, size_t, void*) { ptr.clear(); });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("replay", &Replay, py::arg("ops"), py::arg("target"), py::arg("repeats") = 1,
        py::arg("pause_at") = -1, py::arg("on_pause") = py::none());
}
