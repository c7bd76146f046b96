#include "allocator/vmm_memory_resource.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/units.h"

#if ACTPACK_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "allocator/cuda_memory_resource.h"
#include "allocator/internal/cuda_device.h"
#include "common/cuda_check.h"
#endif

namespace actpack::allocator {

#if ACTPACK_WITH_CUDA

namespace {

using internal::ReportCudaError;
using internal::ScopedDevice;

// The driver calls, reached through cudaGetDriverEntryPoint so that only cudart is linked.
struct DriverApi {
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_get_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*get_granularity)(size_t*, const CUmemAllocationProp*,
                              CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*address_reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                              unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  // Optional: error names for messages.
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
};

// The ABI version the entry points are asked for: these calls' signatures have not changed
// since CUDA 10.2; 12.0 is the oldest driver a CUDA 12 or 13 runtime runs on.
constexpr unsigned kDriverApiVersion = 12000;

}  // namespace
}  // namespace actpack::allocator

// Weak references: the cudart a process loads first (torch's own) may be older than the one
// compiled against; without cudaGetDriverEntryPointByVersion (CUDA 12.5) the older call serves,
// and without either the backend is unavailable instead of the library failing to load.
#pragma weak cudaGetDriverEntryPoint
#if CUDART_VERSION >= 12050
#pragma weak cudaGetDriverEntryPointByVersion
#endif

namespace actpack::allocator {
namespace {

absl::Status ResolveEntryPoint(const char* symbol, void** function) {
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  *function = nullptr;
  absl::Status status;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#if CUDART_VERSION >= 12050
  if (&cudaGetDriverEntryPointByVersion != nullptr) {
    status = ACTPACK_CUDA_STATUS(cudaGetDriverEntryPointByVersion(
        symbol, function, kDriverApiVersion, cudaEnableDefault, &found));
  } else
#endif
      if (&cudaGetDriverEntryPoint != nullptr) {
    status = ACTPACK_CUDA_STATUS(
        cudaGetDriverEntryPoint(symbol, function, cudaEnableDefault, &found));
  } else {
    return absl::UnavailableError("actpack: the CUDA runtime has no cudaGetDriverEntryPoint");
  }
#pragma GCC diagnostic pop
  if (!status.ok()) return status;
  if (*function == nullptr || found != cudaDriverEntryPointSuccess) {
    *function = nullptr;
    return absl::UnavailableError(
        absl::StrCat("actpack: the CUDA driver does not provide ", symbol));
  }
  return absl::OkStatus();
}

// The process's driver calls, resolved on first success (a failure is retried next time).
absl::StatusOr<const DriverApi*> Driver() {
  static std::mutex mutex;
  static const DriverApi* resolved = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (resolved != nullptr) return resolved;
  auto api = std::make_unique<DriverApi>();
  struct Entry {
    const char* symbol;
    void** function;
    bool required;
  };
  const Entry entries[] = {
      {"cuDeviceGet", reinterpret_cast<void**>(&api->device_get), true},
      {"cuDeviceGetAttribute", reinterpret_cast<void**>(&api->device_get_attribute), true},
      {"cuMemGetAllocationGranularity", reinterpret_cast<void**>(&api->get_granularity), true},
      {"cuMemAddressReserve", reinterpret_cast<void**>(&api->address_reserve), true},
      {"cuMemAddressFree", reinterpret_cast<void**>(&api->address_free), true},
      {"cuMemCreate", reinterpret_cast<void**>(&api->create), true},
      {"cuMemRelease", reinterpret_cast<void**>(&api->release), true},
      {"cuMemMap", reinterpret_cast<void**>(&api->map), true},
      {"cuMemSetAccess", reinterpret_cast<void**>(&api->set_access), true},
      {"cuMemUnmap", reinterpret_cast<void**>(&api->unmap), true},
      {"cuGetErrorName", reinterpret_cast<void**>(&api->get_error_name), false},
      {"cuGetErrorString", reinterpret_cast<void**>(&api->get_error_string), false},
  };
  for (const Entry& entry : entries) {
    const absl::Status status = ResolveEntryPoint(entry.symbol, entry.function);
    if (!status.ok() && entry.required) return status;
  }
  resolved = api.release();
  return resolved;
}

// A driver call's result as a status naming the call and the device: out of memory is
// kResourceExhausted, as CUDA runtime errors are (common/cuda_check.h).
absl::Status DriverStatus(const DriverApi& api, CUresult result, const char* call, int device) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.get_error_name == nullptr || api.get_error_name(result, &name) != CUDA_SUCCESS) {
    name = nullptr;
  }
  if (api.get_error_string == nullptr || api.get_error_string(result, &text) != CUDA_SUCCESS) {
    text = nullptr;
  }
  const std::string what =
      name != nullptr ? absl::StrCat(name, text != nullptr ? absl::StrCat(" (", text, ")") : "")
                      : absl::StrCat("CUresult ", static_cast<int>(result));
  const absl::StatusCode code = result == CUDA_ERROR_OUT_OF_MEMORY
                                    ? absl::StatusCode::kResourceExhausted
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat("actpack: CUDA driver error ", what, " in ", call,
                                         " on device ", device));
}

// The device's CUdevice, after VirtualMemorySupport's checks. The caller has made `device`
// current.
absl::StatusOr<CUdevice> SupportedDevice(const DriverApi& api, int device) {
  CUdevice cu_device = 0;
  absl::Status status = DriverStatus(api, api.device_get(&cu_device, device), "cuDeviceGet", device);
  if (!status.ok()) return status;
  int supported = 0;
  status = DriverStatus(api,
                        api.device_get_attribute(
                            &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                            cu_device),
                        "cuDeviceGetAttribute", device);
  if (!status.ok()) return status;
  if (supported == 0) {
    return absl::UnavailableError(absl::StrCat(
        "actpack: device ", device, " does not support CUDA virtual memory management"));
  }
  return cu_device;
}

CUmemAllocationProp PropFor(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

absl::Status VirtualMemorySupport(int device) {
  absl::StatusOr<const DriverApi*> api = Driver();
  if (!api.ok()) return api.status();
  ScopedDevice scoped(device);
  if (!scoped.status().ok()) return scoped.status();
  return SupportedDevice(**api, device).status();
}

// ---- the resource ----

class VmmMemoryResource::Impl {
 public:
  Impl(int device, const DriverApi* api, size_t granularity, size_t arena_bytes)
      : device_(device), api_(*api), granularity_(granularity), arena_bytes_(arena_bytes) {}
  ~Impl();

  absl::StatusOr<void*> Allocate(size_t bytes, Stream stream, size_t reserve_limit);
  void Deallocate(void* ptr, size_t bytes, Stream stream);
  size_t EmptyCache();

  MemoryUsage Usage() const {
    return {physical_bytes_.load(std::memory_order_relaxed),
            segment_bytes_.load(std::memory_order_relaxed)};
  }
  State GetState() const;

  int device() const { return device_; }
  size_t granularity() const { return granularity_; }

 private:
  // The work queued on `stream` before `event`; `complete` once seen done.
  struct Fence {
    cudaEvent_t event = nullptr;
    Stream stream = nullptr;
    bool complete = false;
  };
  // Null: no work to wait for.
  using FenceRef = std::shared_ptr<Fence>;

  // A physical allocation of one granule, mapped at any number of addresses. `owned`: a live
  // segment maps it (through one of them). `ready`: work on it is done once this fence is
  // (set while not owned). An orphan was given back (EmptyCache) and is released once its
  // mappings are gone, unless a segment takes it first.
  struct Granule {
    uint64_t id = 0;
    CUmemGenericAllocationHandle handle = 0;
    bool owned = false;
    bool orphan = false;
    int mappings = 0;
    FenceRef ready;
  };

  // One granule of address space. `fence`: the last work at this address (recorded when the
  // segment covering it was given back). A retiring slot is unmapped once `fence` completes.
  struct Slot {
    Granule* granule = nullptr;  // mapped (and accessible) to it; nullptr: unmapped
    bool in_segment = false;
    bool retiring = false;
    FenceRef fence;
  };

  struct Arena {
    CUdeviceptr base = 0;
    size_t slot_count = 0;
    std::vector<Slot> slots;  // grown to the highest slot used; unmapped beyond
    size_t segments = 0;
    size_t mapped = 0;

    CUdeviceptr Address(size_t slot, size_t granularity) const {
      return base + slot * granularity;
    }
    Slot& At(size_t index) {
      if (index >= slots.size()) slots.resize(index + 1);
      return slots[index];
    }
    const Slot* Find(size_t index) const { return index < slots.size() ? &slots[index] : nullptr; }
  };

  struct SegmentRecord {
    Arena* arena = nullptr;
    size_t start = 0;
    size_t count = 0;
  };

  // Where a new segment goes: `usable` of its slots are mapped to free granules already.
  struct Window {
    Arena* arena = nullptr;
    size_t start = 0;
    size_t usable = 0;
  };

  // Mapped to a granule no segment holds, at an address no segment covers and not retiring:
  // a segment may take this slot as it is.
  static bool Usable(const Slot* slot) {
    return slot != nullptr && slot->granule != nullptr && !slot->in_segment &&
           !slot->retiring && !slot->granule->owned;
  }
  // Usable, or unmapped: a new segment may cover it.
  static bool Open(const Slot* slot) {
    return slot == nullptr || (slot->granule == nullptr && !slot->retiring) || Usable(slot);
  }

  bool ReadyWindow(size_t count, Window* window) const;
  bool BestWindow(size_t count, Window* window) const;
  absl::Status AddArena(size_t count);
  void FreeEmptyArenas();
  absl::StatusOr<FenceRef> RecordFence(Stream stream);
  // Orders `stream` after `fence`, on the device if it can, else on the host.
  absl::Status OrderAfter(Stream stream, const FenceRef& fence);
  bool IsComplete(const FenceRef& fence);
  absl::StatusOr<Granule*> CreateGranule();
  // cuMemRelease; a granule the driver would not release stays an orphan, tried again later.
  bool ReleaseGranule(Granule* granule);
  void Retire(Arena& arena, size_t slot);
  // Unmaps the retiring slots whose last work is done; releases orphans left unmapped.
  void PollRetiring();
  // Keeps the mapped address space within kAliasesPerGranule mappings per granule.
  void LimitAliases();

  // Mappings kept per granule held: a granule stays mapped where it was while another address
  // maps it too, so that the layouts a periodic pattern needs stay mapped after warm-up.
  static constexpr size_t kAliasesPerGranule = 8;

  const int device_;
  const DriverApi& api_;
  const size_t granularity_;
  const size_t arena_bytes_;

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Arena>> arenas_;
  std::map<uintptr_t, SegmentRecord> segments_;  // by address
  std::map<uint64_t, Granule*> free_granules_;   // not owned, by id (orphans too)
  uint64_t next_granule_id_ = 1;
  size_t granules_ = 0;
  size_t mapped_slots_ = 0;
  size_t retiring_slots_ = 0;
  size_t orphans_ = 0;
  bool unreleased_ = false;  // an orphan without mappings whose release failed
  std::vector<cudaEvent_t> kept_events_;
  // Written under mutex_; read without it by Usage.
  std::atomic<size_t> physical_bytes_{0};
  std::atomic<size_t> segment_bytes_{0};
};

VmmMemoryResource::Impl::~Impl() {
  ScopedDevice scoped(device_);
  ReportCudaError(scoped.status());
  // Teardown may wait: every fence still referenced.
  std::set<Fence*> waited;
  auto wait = [&](const FenceRef& fence) {
    if (fence == nullptr || fence->complete || !waited.insert(fence.get()).second) return;
    ReportCudaError(ACTPACK_CUDA_STATUS(cudaEventSynchronize(fence->event)));
    fence->complete = true;
  };
  std::set<Granule*> granules;
  for (const auto& [id, granule] : free_granules_) granules.insert(granule);
  for (const auto& arena : arenas_) {
    for (const Slot& slot : arena->slots) {
      wait(slot.fence);
      if (slot.granule != nullptr) granules.insert(slot.granule);
    }
  }
  for (Granule* granule : granules) wait(granule->ready);
  // Teardown's driver calls are tried twice before an error is reported: nothing is left to
  // retry them later.
  auto twice = [this](const char* call, auto&& attempt) {
    absl::Status status = DriverStatus(api_, attempt(), call, device_);
    if (!status.ok()) status = DriverStatus(api_, attempt(), call, device_);
    ReportCudaError(status);
  };
  for (const auto& arena : arenas_) {
    for (size_t i = 0; i < arena->slots.size(); ++i) {
      Slot& slot = arena->slots[i];
      if (slot.granule == nullptr) continue;
      const CUdeviceptr address = arena->Address(i, granularity_);
      twice("cuMemUnmap", [&] { return api_.unmap(address, granularity_); });
      slot.fence.reset();
    }
    twice("cuMemAddressFree",
          [&] { return api_.address_free(arena->base, arena->slot_count * granularity_); });
  }
  for (Granule* granule : granules) {
    granule->ready.reset();
    twice("cuMemRelease", [&] { return api_.release(granule->handle); });
    delete granule;
  }
  arenas_.clear();
  for (cudaEvent_t event : kept_events_) {
    ReportCudaError(ACTPACK_CUDA_STATUS(cudaEventDestroy(event)));
  }
}

VmmMemoryResource::State VmmMemoryResource::Impl::GetState() const {
  std::lock_guard<std::mutex> lock(mutex_);
  State state;
  state.physical_bytes = physical_bytes_.load(std::memory_order_relaxed);
  state.segment_bytes = segment_bytes_.load(std::memory_order_relaxed);
  state.pending_release_bytes = orphans_ * granularity_;
  state.free_bytes = state.physical_bytes - state.segment_bytes - state.pending_release_bytes;
  state.mapped_bytes = mapped_slots_ * granularity_;
  state.retiring_mappings = retiring_slots_;
  state.arenas = arenas_.size();
  return state;
}

// ---- placement ----

// The first window of `count` usable slots with distinct granules in the smallest run of
// usable slots that has one: a segment there takes memory that is mapped already.
bool VmmMemoryResource::Impl::ReadyWindow(size_t count, Window* window) const {
  bool found = false;
  size_t best_run = 0;
  for (const auto& arena_ptr : arenas_) {
    const Arena& arena = *arena_ptr;
    const size_t end = arena.slots.size();
    for (size_t run = 0; run < end;) {
      if (!Usable(&arena.slots[run])) {
        ++run;
        continue;
      }
      size_t run_end = run;
      while (run_end < end && Usable(&arena.slots[run_end])) ++run_end;
      const size_t length = run_end - run;
      if (length >= count && (!found || length < best_run)) {
        // Slide a window without repeated granules (two addresses of one granule in one
        // segment would overlap).
        std::map<const Granule*, size_t> last_seen;
        size_t window_start = run;
        for (size_t i = run; i < run_end; ++i) {
          const Granule* g = arena.slots[i].granule;
          auto seen = last_seen.find(g);
          if (seen != last_seen.end() && seen->second >= window_start) {
            window_start = seen->second + 1;
          }
          last_seen[g] = i;
          if (i + 1 - window_start == count) {
            *window = {const_cast<Arena*>(&arena), window_start, count};
            best_run = length;
            found = true;
            break;
          }
        }
      }
      run = run_end;
    }
  }
  return found;
}

// The window of open slots (usable or unmapped) that holds the most usable ones with distinct
// granules (fewest to map), the lowest of those.
bool VmmMemoryResource::Impl::BestWindow(size_t count, Window* window) const {
  bool found = false;
  for (const auto& arena_ptr : arenas_) {
    const Arena& arena = *arena_ptr;
    for (size_t run = 0; run + count <= arena.slot_count;) {
      if (!Open(arena.Find(run))) {
        ++run;
        continue;
      }
      size_t run_end = run;
      while (run_end < arena.slot_count && Open(arena.Find(run_end))) {
        // Past the slots used so far everything is unmapped: the run goes to the end.
        if (run_end >= arena.slots.size()) {
          run_end = arena.slot_count;
          break;
        }
        ++run_end;
      }
      if (run_end - run >= count) {
        // Slide: usable slots in the window, and how many granules repeat in it.
        std::map<const Granule*, int> in_window;
        size_t usable = 0, repeats = 0;
        auto add = [&](size_t i, int sign) {
          const Slot* slot = arena.Find(i);
          if (slot == nullptr || slot->granule == nullptr) return;
          int& n = in_window[slot->granule];
          if (sign > 0) {
            if (n++ > 0) ++repeats;
            ++usable;
          } else {
            if (--n > 0) --repeats;
            --usable;
          }
        };
        const size_t scan_end = std::min(run_end, std::max(arena.slots.size(), run) + count);
        for (size_t i = run; i < run + count; ++i) add(i, +1);
        for (size_t start = run;; ++start) {
          if (repeats == 0 && (!found || usable > window->usable)) {
            *window = {const_cast<Arena*>(&arena), start, usable};
            found = true;
          }
          if (start + count >= scan_end) break;
          add(start, -1);
          add(start + count, +1);
        }
      }
      run = run_end;
    }
  }
  return found;
}

absl::Status VmmMemoryResource::Impl::AddArena(size_t count) {
  const size_t bytes = std::max(arena_bytes_, count * granularity_);
  CUdeviceptr base = 0;
  absl::Status status = DriverStatus(
      api_, api_.address_reserve(&base, bytes, granularity_, 0, 0), "cuMemAddressReserve", device_);
  if (!status.ok()) return status;
  auto arena = std::make_unique<Arena>();
  arena->base = base;
  arena->slot_count = bytes / granularity_;
  arenas_.push_back(std::move(arena));
  return absl::OkStatus();
}

void VmmMemoryResource::Impl::FreeEmptyArenas() {
  for (auto it = arenas_.begin(); it != arenas_.end();) {
    Arena& arena = **it;
    if (arena.segments > 0 || arena.mapped > 0) {
      ++it;
      continue;
    }
    const absl::Status status =
        DriverStatus(api_, api_.address_free(arena.base, arena.slot_count * granularity_),
                     "cuMemAddressFree", device_);
    if (!status.ok()) {
      ReportCudaError(status);  // kept; freed on a later EmptyCache or at destruction
      ++it;
      continue;
    }
    it = arenas_.erase(it);
  }
}

// ---- fences ----

absl::StatusOr<VmmMemoryResource::Impl::FenceRef> VmmMemoryResource::Impl::RecordFence(
    Stream stream) {
  cudaEvent_t event = nullptr;
  if (!kept_events_.empty()) {
    event = kept_events_.back();
    kept_events_.pop_back();
  } else {
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  const absl::Status status =
      ACTPACK_CUDA_STATUS(cudaEventRecord(event, static_cast<cudaStream_t>(stream)));
  if (!status.ok()) {
    (void)cudaEventDestroy(event);
    return status;
  }
  // The event goes back to kept_events_ with the last reference, which is always dropped
  // under mutex_ (or in the destructor).
  return FenceRef(new Fence{event, stream, false}, [this](Fence* fence) {
    if (kept_events_.size() < 1024) {
      kept_events_.push_back(fence->event);
    } else {
      (void)cudaEventDestroy(fence->event);
    }
    delete fence;
  });
}

bool VmmMemoryResource::Impl::IsComplete(const FenceRef& fence) {
  if (fence == nullptr || fence->complete) return true;
  const cudaError_t error = cudaEventQuery(fence->event);
  if (error == cudaErrorNotReady) return false;
  if (error != cudaSuccess) {
    // A real error: waiting is the only answer that never unmaps memory in use.
    ReportCudaError(ACTPACK_CUDA_STATUS(error));
    ReportCudaError(ACTPACK_CUDA_STATUS(cudaEventSynchronize(fence->event)));
  }
  fence->complete = true;
  return true;
}

absl::Status VmmMemoryResource::Impl::OrderAfter(Stream stream, const FenceRef& fence) {
  if (fence == nullptr || fence->complete || fence->stream == stream) return absl::OkStatus();
  const absl::Status ordered = ACTPACK_CUDA_STATUS(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), fence->event, 0));
  if (ordered.ok()) return ordered;
  // The device cannot order it: the host waits instead (an error path, never steady state).
  const absl::Status waited = ACTPACK_CUDA_STATUS(cudaEventSynchronize(fence->event));
  if (!waited.ok()) {
    return absl::InternalError(absl::StrCat("actpack: cannot order new work after the last work "
                                            "on reused device memory: ",
                                            ordered.message(), "; ", waited.message()));
  }
  fence->complete = true;
  return absl::OkStatus();
}

// ---- granules and mappings ----

absl::StatusOr<VmmMemoryResource::Impl::Granule*> VmmMemoryResource::Impl::CreateGranule() {
  const CUmemAllocationProp prop = PropFor(device_);
  CUmemGenericAllocationHandle handle = 0;
  absl::Status status =
      DriverStatus(api_, api_.create(&handle, granularity_, &prop, 0), "cuMemCreate", device_);
  if (!status.ok()) return status;
  physical_bytes_.fetch_add(granularity_, std::memory_order_relaxed);
  auto* granule = new Granule;
  granule->id = next_granule_id_++;
  granule->handle = handle;
  granule->owned = true;  // for the segment being made; freed with it on a failure
  ++granules_;
  return granule;
}

bool VmmMemoryResource::Impl::ReleaseGranule(Granule* granule) {
  const absl::Status status =
      DriverStatus(api_, api_.release(granule->handle), "cuMemRelease", device_);
  if (!status.ok()) {
    // Still ours: an orphan without mappings, free for a segment and released again later.
    ReportCudaError(status);
    if (!granule->orphan) {
      granule->orphan = true;
      ++orphans_;
    }
    granule->owned = false;
    free_granules_[granule->id] = granule;
    unreleased_ = true;
    return false;
  }
  physical_bytes_.fetch_sub(granularity_, std::memory_order_relaxed);
  if (granule->orphan) --orphans_;
  free_granules_.erase(granule->id);
  --granules_;
  delete granule;
  return true;
}

void VmmMemoryResource::Impl::Retire(Arena& arena, size_t slot) {
  Slot& s = arena.slots[slot];
  if (s.retiring || s.granule == nullptr) return;
  s.retiring = true;
  ++retiring_slots_;
}

void VmmMemoryResource::Impl::PollRetiring() {
  if (unreleased_) {
    unreleased_ = false;
    std::vector<Granule*> unmapped;
    for (const auto& [id, granule] : free_granules_) {
      if (granule->orphan && granule->mappings == 0) unmapped.push_back(granule);
    }
    for (Granule* granule : unmapped) ReleaseGranule(granule);
  }
  if (retiring_slots_ == 0) return;
  std::set<const Fence*> pending;  // each fence asked once per call
  for (const auto& arena_ptr : arenas_) {
    Arena& arena = *arena_ptr;
    for (size_t i = 0; i < arena.slots.size() && retiring_slots_ > 0; ++i) {
      Slot& slot = arena.slots[i];
      if (!slot.retiring) continue;
      if (pending.count(slot.fence.get()) > 0 || !IsComplete(slot.fence)) {
        pending.insert(slot.fence.get());
        continue;
      }
      // Its last work is done: nothing queued uses this address any more.
      const absl::Status status =
          DriverStatus(api_, api_.unmap(arena.Address(i, granularity_), granularity_),
                       "cuMemUnmap", device_);
      if (!status.ok()) {
        ReportCudaError(status);  // still mapped: tried again on a later call
        continue;
      }
      Granule* granule = slot.granule;
      slot = Slot{};
      --retiring_slots_;
      --arena.mapped;
      --mapped_slots_;
      if (--granule->mappings == 0 && granule->orphan && !granule->owned) {
        ReleaseGranule(granule);
      }
    }
  }
}

void VmmMemoryResource::Impl::LimitAliases() {
  const size_t limit = kAliasesPerGranule * std::max<size_t>(granules_, 1);
  if (mapped_slots_ - retiring_slots_ <= limit) return;
  // Addresses of granules mapped elsewhere too go first, from the highest.
  for (auto a = arenas_.rbegin(); a != arenas_.rend(); ++a) {
    Arena& arena = **a;
    for (size_t i = arena.slots.size(); i-- > 0;) {
      if (mapped_slots_ - retiring_slots_ <= limit) return;
      Slot& slot = arena.slots[i];
      if (Usable(&slot) && slot.granule->mappings > 1) Retire(arena, i);
    }
  }
}

// ---- the resource's operations ----

absl::StatusOr<void*> VmmMemoryResource::Impl::Allocate(size_t bytes, Stream stream,
                                                         size_t reserve_limit) {
  const size_t count = RoundUp(bytes, granularity_) / granularity_;
  ScopedDevice scoped(device_);
  if (!scoped.status().ok()) return scoped.status();
  std::lock_guard<std::mutex> lock(mutex_);
  PollRetiring();

  // Mapped already where it is to go (no driver call), else the window needing the fewest
  // new mappings.
  Window window;
  if (!ReadyWindow(count, &window) && !BestWindow(count, &window)) {
    absl::Status status = AddArena(count);
    if (!status.ok()) return status;
    if (!BestWindow(count, &window)) return absl::InternalError("actpack: VMM placement failed");
  }
  Arena& arena = *window.arena;
  const size_t start = window.start;

  // Granules for the window's unmapped slots: free ones not in the window (given-back ones
  // first), mapped here too; then new ones.
  std::set<const Granule*> in_window;
  for (size_t i = start; i < start + count; ++i) {
    if (const Slot* slot = arena.Find(i); slot != nullptr && slot->granule != nullptr) {
      in_window.insert(slot->granule);
    }
  }
  const size_t unmapped = count - window.usable;
  std::vector<Granule*> taken;
  taken.reserve(unmapped);
  for (const bool orphans : {true, false}) {
    for (const auto& [id, granule] : free_granules_) {
      if (taken.size() == unmapped) break;
      if (granule->orphan == orphans && in_window.count(granule) == 0) taken.push_back(granule);
    }
  }
  const size_t to_create = unmapped - taken.size();
  const size_t physical = physical_bytes_.load(std::memory_order_relaxed);
  if (to_create > 0 && reserve_limit != kNoCap &&
      physical + to_create * granularity_ > reserve_limit) {
    return ReserveLimitExceeded(absl::StrCat(
        "actpack: CUDA virtual memory on device ", device_, " cannot map ",
        FormatBytes(count * granularity_), " within the reserve limit of ",
        FormatBytes(reserve_limit), " (", FormatBytes(physical), " held)"));
  }

  // Undoes what this call did to the driver; nothing else has changed until the commit. The
  // new mappings carry no work yet: unmapping them at once is safe.
  std::vector<Granule*> created;
  std::vector<std::pair<size_t, Granule*>> mapped;  // slots of the window this call mapped
  auto roll_back = [&](absl::Status status) -> absl::Status {
    for (const auto& [slot, granule] : mapped) {
      ReportCudaError(DriverStatus(api_,
                                   api_.unmap(arena.Address(slot, granularity_), granularity_),
                                   "cuMemUnmap", device_));
      --granule->mappings;
    }
    for (Granule* granule : created) ReleaseGranule(granule);
    return status;
  };

  for (size_t i = 0; i < to_create; ++i) {
    absl::StatusOr<Granule*> granule = CreateGranule();
    if (!granule.ok()) return roll_back(granule.status());
    created.push_back(*granule);
    taken.push_back(*granule);
  }

  // Order this stream after the last work on every granule it takes.
  std::set<const Fence*> ordered;
  auto order = [&](const Granule* granule) -> absl::Status {
    const FenceRef& fence = granule->ready;
    if (fence == nullptr || !ordered.insert(fence.get()).second) return absl::OkStatus();
    return OrderAfter(stream, fence);
  };
  for (const Granule* granule : in_window) {
    if (absl::Status status = order(granule); !status.ok()) return roll_back(status);
  }
  for (const Granule* granule : taken) {
    if (absl::Status status = order(granule); !status.ok()) return roll_back(status);
  }

  // Map the unmapped slots, then make each new run accessible.
  {
    size_t k = 0;
    for (size_t slot = start; slot < start + count; ++slot) {
      const Slot* s = arena.Find(slot);
      if (s != nullptr && s->granule != nullptr) continue;
      Granule* granule = taken[k++];
      absl::Status status = DriverStatus(
          api_, api_.map(arena.Address(slot, granularity_), granularity_, 0, granule->handle, 0),
          "cuMemMap", device_);
      if (!status.ok()) return roll_back(status);
      ++granule->mappings;
      mapped.emplace_back(slot, granule);
    }
  }
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (size_t i = 0; i < mapped.size();) {
    size_t j = i + 1;
    while (j < mapped.size() && mapped[j].first == mapped[j - 1].first + 1) ++j;
    absl::Status status = DriverStatus(
        api_,
        api_.set_access(arena.Address(mapped[i].first, granularity_), (j - i) * granularity_,
                        &access, 1),
        "cuMemSetAccess", device_);
    if (!status.ok()) return roll_back(status);
    i = j;
  }

  // Commit.
  for (const auto& [slot, granule] : mapped) {
    arena.At(slot).granule = granule;
    ++arena.mapped;
    ++mapped_slots_;
  }
  for (size_t slot = start; slot < start + count; ++slot) {
    Slot& s = arena.At(slot);
    Granule* granule = s.granule;
    s.in_segment = true;
    s.fence.reset();
    if (granule->orphan) {
      granule->orphan = false;
      --orphans_;
    }
    granule->owned = true;
    granule->ready.reset();
    free_granules_.erase(granule->id);
  }
  ++arena.segments;
  const uintptr_t address = arena.Address(start, granularity_);
  segments_[address] = SegmentRecord{&arena, start, count};
  segment_bytes_.fetch_add(count * granularity_, std::memory_order_relaxed);
  LimitAliases();
  return reinterpret_cast<void*>(address);
}

void VmmMemoryResource::Impl::Deallocate(void* ptr, size_t bytes, Stream stream) {
  ScopedDevice scoped(device_);
  ReportCudaError(scoped.status());
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = segments_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == segments_.end()) {
    std::fprintf(stderr, "actpack: VMM: Deallocate of %p, which is not a segment\n", ptr);
    std::abort();
  }
  const SegmentRecord record = it->second;
  segments_.erase(it);
  // Everything queued on this memory is on `stream` (the pool's contract): its last work is
  // done once an event recorded there now is.
  FenceRef fence;
  absl::StatusOr<FenceRef> recorded = RecordFence(stream);
  if (recorded.ok()) {
    fence = *std::move(recorded);
  } else {
    // Without an event the host waits for the stream (an error path, never steady state).
    ReportCudaError(recorded.status());
    absl::Status waited =
        ACTPACK_CUDA_STATUS(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    if (!waited.ok()) {
      ReportCudaError(waited);
      ReportCudaError(ACTPACK_CUDA_STATUS(cudaDeviceSynchronize()));
    }
  }
  Arena& arena = *record.arena;
  for (size_t slot = record.start; slot < record.start + record.count; ++slot) {
    Slot& s = arena.slots[slot];
    s.in_segment = false;
    s.fence = fence;
    s.granule->owned = false;
    s.granule->ready = fence;
    free_granules_[s.granule->id] = s.granule;
  }
  --arena.segments;
  segment_bytes_.fetch_sub(record.count * granularity_, std::memory_order_relaxed);
  PollRetiring();
}

size_t VmmMemoryResource::Impl::EmptyCache() {
  ScopedDevice scoped(device_);
  ReportCudaError(scoped.status());
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t before = physical_bytes_.load(std::memory_order_relaxed);
  // Every free granule is given back: each of its addresses retires (unmapped once its last
  // work is done), and with its last mapping gone it is released.
  std::vector<Granule*> unmapped;
  for (const auto& [id, granule] : free_granules_) {
    if (!granule->orphan) {
      granule->orphan = true;
      ++orphans_;
    }
    if (granule->mappings == 0) unmapped.push_back(granule);
  }
  for (const auto& arena_ptr : arenas_) {
    Arena& arena = *arena_ptr;
    for (size_t i = 0; i < arena.slots.size(); ++i) {
      const Slot& slot = arena.slots[i];
      if (slot.granule != nullptr && !slot.in_segment && !slot.granule->owned) Retire(arena, i);
    }
  }
  for (Granule* granule : unmapped) ReleaseGranule(granule);
  PollRetiring();
  FreeEmptyArenas();
  return before - physical_bytes_.load(std::memory_order_relaxed);
}

// ---- VmmMemoryResource ----

absl::StatusOr<std::unique_ptr<VmmMemoryResource>> VmmMemoryResource::Create(int device,
                                                                             size_t arena_bytes) {
  absl::StatusOr<const DriverApi*> api = Driver();
  if (!api.ok()) return api.status();
  ScopedDevice scoped(device);
  if (!scoped.status().ok()) return scoped.status();
  // The driver's calls act in the device's primary context: have the runtime make it.
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaFree(nullptr));
  absl::StatusOr<CUdevice> cu_device = SupportedDevice(**api, device);
  if (!cu_device.ok()) return cu_device.status();
  const CUmemAllocationProp prop = PropFor(device);
  size_t granularity = 0;
  absl::Status status = DriverStatus(
      **api, (*api)->get_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
      "cuMemGetAllocationGranularity", device);
  if (!status.ok()) return status;
  if (granularity == 0 || (granularity & (granularity - 1)) != 0) {
    return absl::UnavailableError(absl::StrCat("actpack: device ", device,
                                               " reports a VMM granularity of ", granularity));
  }
  if (arena_bytes == 0) {
    absl::StatusOr<size_t> total = CudaDeviceTotalMemory(device);
    if (!total.ok()) return total.status();
    arena_bytes = 2 * *total;
  }
  arena_bytes = std::max(RoundUp(arena_bytes, granularity), granularity);
  return std::unique_ptr<VmmMemoryResource>(new VmmMemoryResource(
      std::make_unique<Impl>(device, *api, granularity, arena_bytes)));
}

VmmMemoryResource::VmmMemoryResource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

VmmMemoryResource::~VmmMemoryResource() = default;

int VmmMemoryResource::device() const { return impl_->device(); }

VmmMemoryResource::State VmmMemoryResource::GetState() const { return impl_->GetState(); }

absl::StatusOr<void*> VmmMemoryResource::DoAllocate(size_t bytes, Stream stream,
                                                    size_t reserve_limit) {
  absl::StatusOr<void*> ptr = impl_->Allocate(bytes, stream, reserve_limit);
  if (ptr.ok()) NotifySegmentAllocated(*ptr, RoundUp(bytes, impl_->granularity()), bytes, stream);
  return ptr;
}

void VmmMemoryResource::DoDeallocate(void* ptr, size_t bytes, Stream stream) {
  NotifySegmentFreed(ptr, RoundUp(bytes, impl_->granularity()), bytes, stream);
  impl_->Deallocate(ptr, bytes, stream);
}

size_t VmmMemoryResource::DoEmptyCache() { return impl_->EmptyCache(); }

MemoryUsage VmmMemoryResource::DoGetUsage() const { return impl_->Usage(); }

size_t VmmMemoryResource::DoAllocationGranularity() const { return impl_->granularity(); }

#else  // !ACTPACK_WITH_CUDA

absl::Status VirtualMemorySupport(int device) {
  return absl::UnimplementedError("actpack: CUDA support not compiled in");
}

class VmmMemoryResource::Impl {};

absl::StatusOr<std::unique_ptr<VmmMemoryResource>> VmmMemoryResource::Create(int device,
                                                                             size_t arena_bytes) {
  return VirtualMemorySupport(device);
}

VmmMemoryResource::VmmMemoryResource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
VmmMemoryResource::~VmmMemoryResource() = default;
int VmmMemoryResource::device() const { return -1; }
VmmMemoryResource::State VmmMemoryResource::GetState() const { return {}; }
absl::StatusOr<void*> VmmMemoryResource::DoAllocate(size_t, Stream, size_t) {
  return VirtualMemorySupport(-1);
}
void VmmMemoryResource::DoDeallocate(void*, size_t, Stream) {}
size_t VmmMemoryResource::DoEmptyCache() { return 0; }
MemoryUsage VmmMemoryResource::DoGetUsage() const { return {}; }
size_t VmmMemoryResource::DoAllocationGranularity() const { return 1; }

#endif  // ACTPACK_WITH_CUDA

}  // namespace actpack::allocator
