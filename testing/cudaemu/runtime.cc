// The runtime half of cudaemu: devices, memory, streams, events and errors, with CUDA's
// semantics where actpack depends on them.
//
// - Devices: CUDAEMU_DEVICES of them, each with CUDAEMU_DEVICE_MEMORY bytes. cudaMalloc charges
//   whole 2 MiB pages and fails with cudaErrorMemoryAllocation past the device's memory, so an
//   allocator's out-of-memory -> free cache -> retry path runs; cudaMemGetInfo reports the same
//   count (plus what SetContextMemory says the context holds).
// - Memory: every allocation is its own host block of exactly the requested size (AddressSanitizer
//   sees a write one past the end), filled with a pseudo-random pattern (a kernel that reads
//   memory nobody wrote gives different bytes than the CPU reference).
// - Streams: work is queued, not run. It runs when the host waits for it (cudaStreamSynchronize,
//   cudaEventSynchronize, cudaDeviceSynchronize, cudaFree, a copy into pageable host memory) or
//   when a query nudges it (cudaEventQuery / cudaStreamQuery run one operation and answer
//   cudaErrorNotReady). So a buffer reused before another stream is done with it holds the new
//   data when the late stream finally reads it: stream-ordering bugs change results. The legacy
//   default stream synchronises with blocking streams, as CUDA's does. Under the random schedule
//   queued work of other streams also runs at random moments.
// - Errors: CUDA's codes and strings; a failed call is also what cudaGetLastError returns next.
#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cudaemu/control.h"
#include "testing/cudaemu/internal.h"

namespace cudaemu {
namespace internal {

std::recursive_mutex& DeviceLock() {
  static auto* lock = new std::recursive_mutex;
  return *lock;
}

void Fatal(const std::string& message) {
  std::fprintf(stderr, "cudaemu: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

namespace {

RaceObserver* race_observer = nullptr;

size_t ParseBytes(const char* text, size_t fallback) {
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  size_t scale = 1;
  switch (*end) {
    case 'k': case 'K': scale = size_t{1} << 10; break;
    case 'm': case 'M': scale = size_t{1} << 20; break;
    case 'g': case 'G': scale = size_t{1} << 30; break;
    case '\0': break;
    default: Fatal(std::string("cannot read the byte count '") + text + "'");
  }
  return static_cast<size_t>(value) * scale;
}

Schedule ParseSchedule(const std::string& text) {
  Schedule schedule;
  if (text.empty() || text == "forward") return schedule;
  if (text == "reverse") {
    schedule.kind = ScheduleKind::kReverse;
    return schedule;
  }
  if (text.rfind("random", 0) == 0) {
    schedule.kind = ScheduleKind::kRandom;
    schedule.seed = text.size() > 7 ? std::strtoull(text.c_str() + 7, nullptr, 10) : 1;
    return schedule;
  }
  if (text.rfind("concurrent:", 0) == 0) {
    char* end = nullptr;
    const unsigned long blocks = std::strtoul(text.c_str() + 11, &end, 10);
    if (end != text.c_str() + 11 && *end == '\0' && blocks >= 2 && blocks <= 64) {
      schedule.kind = ScheduleKind::kConcurrent;
      schedule.blocks = static_cast<uint32_t>(blocks);
      return schedule;
    }
  }
  Fatal("CUDAEMU_SCHEDULE is '" + text +
        "'; expected forward, reverse, random:SEED or concurrent:BLOCKS (2 to 64)");
}

struct StreamState;

// One queued piece of work. It runs after the positions in `after` (other streams' work it
// was ordered behind) and then does `run` (nothing for an event wait).
struct Operation {
  std::function<void()> run;
  std::vector<std::pair<StreamState*, uint64_t>> after;
};

struct StreamState {
  int device = 0;
  unsigned flags = cudaStreamDefault;
  bool legacy = false;
  bool live = true;
  std::deque<Operation> queue;
  uint64_t enqueued = 0;   // operations ever queued
  uint64_t completed = 0;  // operations run
};

struct EventState {
  int device = 0;
  StreamState* stream = nullptr;  // null: never recorded (complete)
  uint64_t position = 0;          // complete once stream->completed reaches it
  bool timing = true;             // cudaEventDisableTiming not given
  bool stamped = false;           // the stream reached it; `stamp` is when
  std::chrono::steady_clock::time_point stamp;
};

struct DeviceState {
  size_t memory = 0;
  size_t context = 0;
  size_t other_processes = 0;  // SetOtherProcessMemory: used, but not by this process
  size_t charged = 0;
  StreamState* legacy = nullptr;
};

struct Machine {
  std::vector<DeviceState> devices;
  std::map<uintptr_t, Allocation> allocations;  // by base: device and pinned host memory
  std::vector<std::unique_ptr<StreamState>> streams;  // every stream ever made (kept: events
                                                      // and queued waits may point at them)
  std::set<EventState*> events;
  Schedule schedule;
  bool eager = false;
  std::mt19937_64 progress{0};
  uint64_t kernels_launched = 0;
  uint64_t device_operations = 0;  // kernels, memsets and copies queued
  uint64_t launches_this_schedule = 0;
  uint64_t kernels_executed = 0;
  // Failures armed by FailCall: per API, the call counts at which to fail and with what.
  std::map<std::string, std::map<uint64_t, int>> failures;
  std::map<std::string, uint64_t> calls;  // per API, since the process started
  bool nvml_lists_this_process = true;
};

Machine& TheMachine() {
  static Machine* machine = [] {
    auto* m = new Machine;
    const char* devices = std::getenv("CUDAEMU_DEVICES");
    const int count = devices != nullptr ? std::atoi(devices) : 2;
    if (count < 0 || count > 64) Fatal("CUDAEMU_DEVICES must be 0..64");
    const size_t memory = ParseBytes(std::getenv("CUDAEMU_DEVICE_MEMORY"), size_t{8} << 30);
    m->devices.resize(static_cast<size_t>(count));
    for (int d = 0; d < count; ++d) {
      m->devices[d].memory = memory;
      auto legacy = std::make_unique<StreamState>();
      legacy->device = d;
      legacy->legacy = true;
      m->devices[d].legacy = legacy.get();
      m->streams.push_back(std::move(legacy));
    }
    const char* schedule = std::getenv("CUDAEMU_SCHEDULE");
    m->schedule = ParseSchedule(schedule != nullptr ? schedule : "");
    m->progress.seed(m->schedule.seed);
    const char* streams = std::getenv("CUDAEMU_STREAMS");
    const std::string mode = streams != nullptr ? streams : "deferred";
    if (mode != "deferred" && mode != "eager") {
      Fatal("CUDAEMU_STREAMS is '" + mode + "'; expected deferred or eager");
    }
    m->eager = mode == "eager";
    return m;
  }();
  return *machine;
}

thread_local int current_device = 0;
thread_local std::string current_region;

// The host calls recorded (control.h's HostCalls), under the device lock.
std::vector<HostCall>& Recorded() {
  static auto* calls = new std::vector<HostCall>;
  return *calls;
}

}  // namespace

void Record(const char* api, void* caller, bool waits) {
  std::lock_guard<std::recursive_mutex> lock(DeviceLock());
  Recorded().push_back(HostCall{api, current_region, caller, waits});
}

int InjectedFailure(const char* api) {
  std::lock_guard<std::recursive_mutex> lock(DeviceLock());
  Machine& m = TheMachine();
  const uint64_t call = ++m.calls[api];
  auto armed = m.failures.find(api);
  if (armed == m.failures.end()) return 0;
  auto at = armed->second.find(call);
  if (at == armed->second.end()) return 0;
  const int error = at->second;
  armed->second.erase(at);
  if (armed->second.empty()) m.failures.erase(armed);
  return error;
}

namespace {

thread_local cudaError_t last_error = cudaSuccess;
thread_local std::map<int, StreamState*> per_thread_streams;

cudaError_t Fail(cudaError_t error) {
  last_error = error;
  return error;
}

size_t Charge(size_t bytes) {
  return (bytes + kAllocationGranularity - 1) / kAllocationGranularity * kAllocationGranularity;
}

bool LiveStream(const StreamState* s) {
  for (const auto& stream : TheMachine().streams) {
    if (stream.get() == s) return s->live;
  }
  return false;
}

// The stream a handle names, or nullptr (an invalid handle).
StreamState* Resolve(cudaStream_t handle) {
  Machine& m = TheMachine();
  if (current_device >= static_cast<int>(m.devices.size())) return nullptr;
  if (handle == nullptr || handle == cudaStreamLegacy) return m.devices[current_device].legacy;
  if (handle == cudaStreamPerThread) {
    StreamState*& s = per_thread_streams[current_device];
    if (s == nullptr) {
      auto stream = std::make_unique<StreamState>();
      stream->device = current_device;
      s = stream.get();
      m.streams.push_back(std::move(stream));
    }
    return s;
  }
  auto* s = reinterpret_cast<StreamState*>(handle);
  return LiveStream(s) ? s : nullptr;
}

bool RunOne(StreamState* s);

void RunUntil(StreamState* s, uint64_t position) {
  while (s->completed < position) {
    if (!RunOne(s)) Fatal("a stream waits for work that was never queued (emulator bug)");
  }
}

bool RunOne(StreamState* s) {
  if (s->queue.empty()) return false;
  // What it was queued behind runs first; those positions were queued earlier, so this
  // recursion cannot cycle.
  for (const auto& [other, position] : s->queue.front().after) RunUntil(other, position);
  Operation op = std::move(s->queue.front());
  s->queue.pop_front();
  if (op.run) op.run();
  ++s->completed;
  // Timing events the stream just reached (cudaEventElapsedTime): when the work before them
  // finished, as the host's clock saw it.
  for (EventState* e : TheMachine().events) {
    if (e->timing && !e->stamped && e->stream == s && e->position == s->completed) {
      e->stamped = true;
      e->stamp = std::chrono::steady_clock::now();
    }
  }
  return true;
}

void RunDevice(int device) {
  for (const auto& s : TheMachine().streams) {
    if (s->device == device) RunUntil(s.get(), s->enqueued);
  }
}

void RunEverything() {
  for (size_t d = 0; d < TheMachine().devices.size(); ++d) RunDevice(static_cast<int>(d));
}

// Under the random schedule, work queued on some stream runs now and then while the host goes
// on: any such moment is one a GPU could have chosen.
void MaybeProgress() {
  Machine& m = TheMachine();
  if (m.schedule.kind != ScheduleKind::kRandom || (m.progress() & 1) == 0) return;
  std::vector<StreamState*> busy;
  for (const auto& s : m.streams) {
    if (!s->queue.empty()) busy.push_back(s.get());
  }
  if (!busy.empty()) RunOne(busy[m.progress() % busy.size()]);
}

// Queues `run` on `s` with CUDA's implicit ordering against the legacy default stream;
// returns the position that completes it.
uint64_t Enqueue(StreamState* s, std::function<void()> run) {
  Machine& m = TheMachine();
  Operation op;
  op.run = std::move(run);
  if (s->legacy) {
    for (const auto& other : m.streams) {
      if (other.get() != s && other->device == s->device && other->live &&
          (other->flags & cudaStreamNonBlocking) == 0) {
        op.after.emplace_back(other.get(), other->enqueued);
      }
    }
  } else if ((s->flags & cudaStreamNonBlocking) == 0) {
    StreamState* legacy = m.devices[s->device].legacy;
    op.after.emplace_back(legacy, legacy->enqueued);
  }
  s->queue.push_back(std::move(op));
  const uint64_t position = ++s->enqueued;
  if (m.eager) {
    RunUntil(s, position);
  } else {
    MaybeProgress();
  }
  return position;
}

}  // namespace

// A pseudo-random fill, different for every allocation.
void FillGarbage(void* p, size_t bytes) {
  uint64_t x = reinterpret_cast<uintptr_t>(p) * 0x9e3779b97f4a7c15ull + bytes;
  auto* out = static_cast<unsigned char*>(p);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    std::memcpy(out + i, &x, 8);
  }
  for (; i < bytes; ++i) out[i] = static_cast<unsigned char>(x >> (8 * (i % 8)));
}

namespace {

enum class Memory { kPageable, kPinned, kDevice, kOutOfRange };

// What [p, p + bytes) is: inside one device or pinned allocation, pageable host memory, or
// a range that starts in an allocation and runs past its end.
Memory Classify(const void* p, size_t bytes, Allocation* found) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  Allocation a;
  if (FindAllocation(address, bytes, &a)) {
    if (found != nullptr) *found = a;
    return a.device >= 0 ? Memory::kDevice : Memory::kPinned;
  }
  if (FindAllocation(address, 1, &a)) return Memory::kOutOfRange;
  return Memory::kPageable;
}

bool HostSide(Memory memory) { return memory == Memory::kPageable || memory == Memory::kPinned; }

}  // namespace

bool IsPageable(const void* p, size_t bytes) {
  return p != nullptr && Classify(p, bytes, nullptr) == Memory::kPageable;
}

namespace {

cudaError_t Copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                 cudaStream_t stream, bool synchronous) {
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return Fail(cudaErrorInvalidValue);
  const Memory to = Classify(dst, count, nullptr);
  const Memory from = Classify(src, count, nullptr);
  if (to == Memory::kOutOfRange || from == Memory::kOutOfRange) return Fail(cudaErrorInvalidValue);
  bool kind_ok = true;
  switch (kind) {
    case cudaMemcpyHostToHost: kind_ok = HostSide(from) && HostSide(to); break;
    case cudaMemcpyHostToDevice: kind_ok = HostSide(from) && to == Memory::kDevice; break;
    case cudaMemcpyDeviceToHost: kind_ok = from == Memory::kDevice && HostSide(to); break;
    case cudaMemcpyDeviceToDevice: kind_ok = from == Memory::kDevice && to == Memory::kDevice; break;
    case cudaMemcpyDefault: break;
    default: return Fail(cudaErrorInvalidMemcpyDirection);
  }
  if (!kind_ok) return Fail(cudaErrorInvalidValue);
  StreamState* s = Resolve(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  std::function<void()> run;
  if (from == Memory::kPageable) {
    // CUDA stages pageable sources before the call returns: the caller may reuse them at once.
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + count);
    run = [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); };
  } else {
    run = [dst, src, count] { std::memmove(dst, src, count); };
  }
  if (to == Memory::kDevice && from == Memory::kDevice) {
    run = [run, count] {
      if (TrafficRecorder* traffic = GetTrafficRecorder()) {
        traffic->Transfer("cudaMemcpyAsync (device to device)", count, count);
      }
      run();
    };
  }
  ++TheMachine().device_operations;
  const uint64_t position = Enqueue(s, std::move(run));
  // A copy into pageable host memory returns once it is done.
  if (synchronous || to == Memory::kPageable) RunUntil(s, position);
  return cudaSuccess;
}

cudaError_t Set(void* p, int value, size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const Memory memory = Classify(p, count, nullptr);
  if (memory != Memory::kDevice && memory != Memory::kPinned) return Fail(cudaErrorInvalidValue);
  StreamState* s = Resolve(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  ++TheMachine().device_operations;
  Enqueue(s, [p, value, count] {
    if (TrafficRecorder* traffic = GetTrafficRecorder()) {
      traffic->Transfer("cudaMemsetAsync", 0, count);
    }
    std::memset(p, value, count);
  });
  return cudaSuccess;
}

}  // namespace

bool FindAllocation(uintptr_t address, size_t bytes, Allocation* found) {
  const auto& allocations = TheMachine().allocations;
  auto it = allocations.upper_bound(address);
  if (it == allocations.begin()) return FindMapping(address, bytes, found);
  --it;
  if (address - it->second.base >= it->second.size + (bytes == 0 ? 1 : 0)) {
    return FindMapping(address, bytes, found);
  }
  const Allocation& a = it->second;
  if (address < a.base || address - a.base > a.size || a.size - (address - a.base) < bytes) {
    return false;
  }
  if (bytes > 0 && address - a.base == a.size) return false;
  if (found != nullptr) *found = a;
  return true;
}

bool NearestAllocationBelow(uintptr_t address, Allocation* found) {
  const auto& allocations = TheMachine().allocations;
  auto it = allocations.upper_bound(address);
  if (it == allocations.begin()) return false;
  *found = std::prev(it)->second;
  return true;
}

const Schedule& CurrentSchedule() { return TheMachine().schedule; }

bool ChargeDevice(int device, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(DeviceLock());
  DeviceState& d = TheMachine().devices.at(static_cast<size_t>(device));
  const size_t used = d.charged + d.context + d.other_processes;
  if (bytes > d.memory || used > d.memory - bytes) return false;
  d.charged += bytes;
  return true;
}

void UnchargeDevice(int device, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(DeviceLock());
  DeviceState& d = TheMachine().devices.at(static_cast<size_t>(device));
  if (bytes > d.charged) Fatal("device memory uncharged twice (emulator bug)");
  d.charged -= bytes;
}

int DeviceCount() { return static_cast<int>(TheMachine().devices.size()); }

int CurrentDevice() { return current_device; }

DeviceMemoryCounts MemoryCounts(int device) {
  std::lock_guard<std::recursive_mutex> lock(DeviceLock());
  const DeviceState& d = TheMachine().devices.at(static_cast<size_t>(device));
  return {d.memory, d.charged + d.context, d.other_processes};
}

bool NvmlListsThisProcess() {
  std::lock_guard<std::recursive_mutex> lock(DeviceLock());
  return TheMachine().nvml_lists_this_process;
}

void SetRaceObserver(RaceObserver* observer) { race_observer = observer; }

namespace {
TrafficRecorder* traffic_recorder = nullptr;
}  // namespace
void SetTrafficRecorder(TrafficRecorder* recorder) { traffic_recorder = recorder; }
TrafficRecorder* GetTrafficRecorder() { return traffic_recorder; }
RaceObserver* GetRaceObserver() { return race_observer; }

}  // namespace internal

// ---- the device side's entry points ----

void EnqueueKernel(const char* name, dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, ThreadBody body, std::shared_ptr<const void> closure) {
  using namespace internal;
  std::lock_guard<std::recursive_mutex> lock(DeviceLock());
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535 || shared_bytes > 48 * 1024) {
    Fail(cudaErrorInvalidConfiguration);
    return;
  }
  StreamState* s = Resolve(stream);
  if (s == nullptr || s->device != current_device) {
    Fail(cudaErrorInvalidResourceHandle);
    return;
  }
  Machine& m = TheMachine();
  auto launch = std::make_shared<KernelLaunch>();
  launch->name = name;
  launch->grid = grid;
  launch->block = block;
  launch->body = body;
  launch->closure = std::move(closure);
  launch->id = ++m.kernels_launched;
  ++m.device_operations;
  launch->schedule_index = m.launches_this_schedule++;
  Enqueue(s, [launch, &m] {
    RunKernel(*launch);
    ++m.kernels_executed;
  });
}

void CheckKernelPointer(const char* kernel, int argument, const void* pointer) {
  using namespace internal;
  if (pointer == nullptr) return;
  std::lock_guard<std::recursive_mutex> lock(DeviceLock());
  Allocation a;
  // A pointer one past the end is fine (an empty range).
  if (FindAllocation(reinterpret_cast<uintptr_t>(pointer), 0, &a)) {
    if (a.device < 0 || a.device == current_device) return;
    Fatal(std::string("kernel ") + kernel + " argument " + std::to_string(argument) +
          " points into memory of device " + std::to_string(a.device) +
          ", launched on device " + std::to_string(current_device));
  }
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "kernel %s argument %d is %p, which is not device memory (cudaMalloc) or pinned "
                "host memory (cudaMallocHost)",
                kernel, argument, pointer);
  Fatal(buf);
}

// ---- control.h ----

void SetDeviceMemory(int device, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  auto& devices = internal::TheMachine().devices;
  if (device < 0 || device >= static_cast<int>(devices.size())) internal::Fatal("no such device");
  devices[device].memory = bytes;
}

void SetContextMemory(int device, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  auto& devices = internal::TheMachine().devices;
  if (device < 0 || device >= static_cast<int>(devices.size())) internal::Fatal("no such device");
  devices[device].context = bytes;
}

void SetOtherProcessMemory(int device, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  auto& devices = internal::TheMachine().devices;
  if (device < 0 || device >= static_cast<int>(devices.size())) internal::Fatal("no such device");
  devices[device].other_processes = bytes;
}

void SetNvmlListsThisProcess(bool listed) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  internal::TheMachine().nvml_lists_this_process = listed;
}

void FailCall(const std::string& api, uint64_t k, int error) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  if (k == 0) internal::Fatal("FailCall: k counts from 1 (the next call)");
  internal::Machine& m = internal::TheMachine();
  int code = error;
  if (code == 0) code = api.rfind("nvml", 0) == 0 ? 999 : 2;  // NVML_ERROR_UNKNOWN; out of memory
  m.failures[api][m.calls[api] + k] = code;
}

void ClearFailures() {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  internal::TheMachine().failures.clear();
}

uint64_t CallCount(const std::string& api) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  auto& calls = internal::TheMachine().calls;
  auto it = calls.find(api);
  return it == calls.end() ? 0 : it->second;
}

size_t DeviceAllocatedBytes(int device) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  auto& devices = internal::TheMachine().devices;
  if (device < 0 || device >= static_cast<int>(devices.size())) internal::Fatal("no such device");
  return devices[device].charged;
}

size_t PendingOperations(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  internal::StreamState* s = internal::Resolve(stream);
  if (s == nullptr) internal::Fatal("PendingOperations: not a live stream");
  return s->queue.size();
}

bool RunOne(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  internal::StreamState* s = internal::Resolve(stream);
  if (s == nullptr) internal::Fatal("RunOne: not a live stream");
  return internal::RunOne(s);
}

uint64_t KernelsLaunched() {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  return internal::TheMachine().kernels_launched;
}

uint64_t DeviceOperationsQueued() {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  return internal::TheMachine().device_operations;
}

uint64_t KernelsExecuted() {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  return internal::TheMachine().kernels_executed;
}

std::string ScheduleName() {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  const internal::Schedule& s = internal::TheMachine().schedule;
  switch (s.kind) {
    case internal::ScheduleKind::kForward: return "forward";
    case internal::ScheduleKind::kReverse: return "reverse";
    case internal::ScheduleKind::kRandom: return "random:" + std::to_string(s.seed);
    case internal::ScheduleKind::kConcurrent: return "concurrent:" + std::to_string(s.blocks);
  }
  return "?";
}

void SetSchedule(const std::string& spelling) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  internal::Machine& m = internal::TheMachine();
  m.schedule = internal::ParseSchedule(spelling);
  m.launches_this_schedule = 0;
  m.progress.seed(m.schedule.seed);
}

bool RaceCheckerActive() { return internal::GetRaceObserver() != nullptr; }

bool StartTrafficRecording(bool check_races) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  internal::TrafficRecorder* recorder = internal::GetTrafficRecorder();
  if (recorder == nullptr) return false;
  recorder->Start(check_races);
  return true;
}

std::map<std::string, KernelTraffic> StopTrafficRecording() {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  internal::TrafficRecorder* recorder = internal::GetTrafficRecorder();
  return recorder == nullptr ? std::map<std::string, KernelTraffic>{} : recorder->Stop();
}

void SetTrafficInput(const void* data, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  internal::TrafficRecorder* recorder = internal::GetTrafficRecorder();
  const uintptr_t lo = reinterpret_cast<uintptr_t>(data);
  if (recorder != nullptr) recorder->SetInput(lo, lo + bytes);
}

std::vector<HostCall> HostCalls() {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  return internal::Recorded();
}

void ResetHostCalls() {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  internal::Recorded().clear();
}

uint64_t CountHostWaits(const std::string& region) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  uint64_t n = 0;
  for (const HostCall& call : internal::Recorded()) n += call.waits && call.region == region;
  return n;
}

uint64_t CountCalls(const std::string& api, const std::string& region) {
  std::lock_guard<std::recursive_mutex> lock(internal::DeviceLock());
  uint64_t n = 0;
  for (const HostCall& call : internal::Recorded()) n += call.api == api && call.region == region;
  return n;
}

std::string DescribeCaller(void* address) {
  Dl_info info;
  if (dladdr(address, &info) != 0 && info.dli_sname != nullptr) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    std::string name = status == 0 && demangled != nullptr ? demangled : info.dli_sname;
    std::free(demangled);
    return name;
  }
  char hex[32];
  std::snprintf(hex, sizeof(hex), "%p", address);
  return hex;
}

RegionScope::RegionScope(std::string name) : previous_(internal::current_region) {
  internal::current_region = std::move(name);
}

RegionScope::~RegionScope() { internal::current_region = previous_; }

}  // namespace cudaemu

// ---- the CUDA runtime API ----

using cudaemu::internal::DeviceLock;
using cudaemu::internal::Fail;
using cudaemu::internal::TheMachine;
using Lock = std::lock_guard<std::recursive_mutex>;

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorSymbolNotFound: return "cudaErrorSymbolNotFound";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorUnknown: return "cudaErrorUnknown";
  }
  return "unrecognized error code";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorSymbolNotFound: return "named symbol not found";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorUnknown: return "unknown error";
  }
  return "unrecognized error code";
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t error = cudaemu::internal::last_error;
  cudaemu::internal::last_error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError(void) { return cudaemu::internal::last_error; }

cudaError_t cudaGetDeviceCount(int* count) {
  Lock lock(DeviceLock());
  if (count == nullptr) return Fail(cudaErrorInvalidValue);
  *count = static_cast<int>(TheMachine().devices.size());
  if (*count == 0) return Fail(cudaErrorNoDevice);
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return Fail(cudaErrorInvalidValue);
  *device = cudaemu::internal::current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  Lock lock(DeviceLock());
  if (device < 0 || device >= static_cast<int>(TheMachine().devices.size())) {
    return Fail(cudaErrorInvalidDevice);
  }
  cudaemu::internal::current_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  cudaemu::internal::Record("cudaDeviceSynchronize", __builtin_return_address(0), true);
  Lock lock(DeviceLock());
  cudaemu::internal::RunDevice(cudaemu::internal::current_device);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Lock lock(DeviceLock());
  if (const int e = cudaemu::internal::InjectedFailure("cudaMemGetInfo")) {
    return Fail(static_cast<cudaError_t>(e));
  }
  if (free_bytes == nullptr || total_bytes == nullptr) return Fail(cudaErrorInvalidValue);
  auto& devices = TheMachine().devices;
  const int d = cudaemu::internal::current_device;
  if (d >= static_cast<int>(devices.size())) return Fail(cudaErrorInvalidDevice);
  const auto& device = devices[d];
  const size_t used = device.charged + device.context + device.other_processes;
  *total_bytes = device.memory;
  *free_bytes = used < device.memory ? device.memory - used : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* pci_bus_id, int len, int device) {
  Lock lock(DeviceLock());
  if (const int e = cudaemu::internal::InjectedFailure("cudaDeviceGetPCIBusId")) {
    return Fail(static_cast<cudaError_t>(e));
  }
  if (pci_bus_id == nullptr || len <= 0) return Fail(cudaErrorInvalidValue);
  if (device < 0 || device >= cudaemu::internal::DeviceCount()) return Fail(cudaErrorInvalidDevice);
  char id[32];
  std::snprintf(id, sizeof id, "0000:%02X:00.0", 0x10 + device);
  if (static_cast<int>(std::strlen(id)) >= len) return Fail(cudaErrorInvalidValue);
  std::memcpy(pci_bus_id, id, std::strlen(id) + 1);
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** function, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult* status) {
  Lock lock(DeviceLock());
  if (const int e = cudaemu::internal::InjectedFailure("cudaGetDriverEntryPoint")) {
    return Fail(static_cast<cudaError_t>(e));
  }
  if (symbol == nullptr || function == nullptr || flags > cudaEnablePerThreadDefaultStream) {
    return Fail(cudaErrorInvalidValue);
  }
  *function = cudaemu::internal::DriverEntryPoint(symbol);
  if (status != nullptr) {
    *status = *function != nullptr ? cudaDriverEntryPointSuccess
                                   : cudaDriverEntryPointSymbolNotFound;
  }
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function,
                                             unsigned int cuda_version, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult* status) {
  Lock lock(DeviceLock());
  if (const int e = cudaemu::internal::InjectedFailure("cudaGetDriverEntryPointByVersion")) {
    return Fail(static_cast<cudaError_t>(e));
  }
  // The emulated driver is CUDA 13.0's; asking for a later version is CUDA's invalid value.
  if (symbol == nullptr || function == nullptr || flags > cudaEnablePerThreadDefaultStream ||
      cuda_version > CUDART_VERSION) {
    return Fail(cudaErrorInvalidValue);
  }
  *function = cudaemu::internal::DriverEntryPoint(symbol);
  if (status != nullptr) {
    *status = *function != nullptr ? cudaDriverEntryPointSuccess
                                   : cudaDriverEntryPointSymbolNotFound;
  }
  return cudaSuccess;
}

namespace cudaemu::internal {
cudaError_t DeviceMalloc(void** ptr, size_t size);
}  // namespace cudaemu::internal

cudaError_t cudaMalloc(void** ptr, size_t size) {
  cudaemu::internal::Record("cudaMalloc", __builtin_return_address(0), false);
  if (const int e = cudaemu::internal::InjectedFailure("cudaMalloc")) {
    if (ptr != nullptr) *ptr = nullptr;
    return Fail(static_cast<cudaError_t>(e));
  }
  return cudaemu::internal::DeviceMalloc(ptr, size);
}

cudaError_t cudaemu::internal::DeviceMalloc(void** ptr, size_t size) {
  Lock lock(DeviceLock());
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  auto& m = TheMachine();
  const int d = cudaemu::internal::current_device;
  if (d >= static_cast<int>(m.devices.size())) return Fail(cudaErrorInvalidDevice);
  if (size == 0) return cudaSuccess;
  const size_t charge = cudaemu::internal::Charge(size);
  if (charge < size || !cudaemu::internal::ChargeDevice(d, charge)) {
    return Fail(cudaErrorMemoryAllocation);
  }
  void* p = nullptr;
  if (posix_memalign(&p, 256, size) != 0) {
    cudaemu::internal::UnchargeDevice(d, charge);
    return Fail(cudaErrorMemoryAllocation);
  }
  cudaemu::internal::FillGarbage(p, size);
  m.allocations[reinterpret_cast<uintptr_t>(p)] = {reinterpret_cast<uintptr_t>(p), size, d};
  *ptr = p;
  return cudaSuccess;
}

namespace cudaemu::internal {
namespace {
void Release(std::map<uintptr_t, Allocation>::iterator it) {
  Machine& m = TheMachine();
  void* ptr = reinterpret_cast<void*>(it->first);
  m.devices[it->second.device].charged -= Charge(it->second.size);
  m.allocations.erase(it);
  std::free(ptr);
}
}  // namespace
}  // namespace cudaemu::internal

cudaError_t cudaFree(void* ptr) {
  if (ptr != nullptr) cudaemu::internal::Record("cudaFree", __builtin_return_address(0), true);
  Lock lock(DeviceLock());
  if (ptr == nullptr) return cudaSuccess;
  if (const int e = cudaemu::internal::InjectedFailure("cudaFree")) {
    return Fail(static_cast<cudaError_t>(e));
  }
  auto& m = TheMachine();
  auto it = m.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == m.allocations.end() || it->second.device < 0) return Fail(cudaErrorInvalidValue);
  // cudaFree waits for the device, so no queued work still uses the memory.
  cudaemu::internal::RunDevice(it->second.device);
  cudaemu::internal::Release(m.allocations.find(reinterpret_cast<uintptr_t>(ptr)));
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  Lock lock(DeviceLock());
  if (cudaemu::internal::Resolve(stream) == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  return cudaemu::internal::DeviceMalloc(ptr, size);
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  Lock lock(DeviceLock());
  if (ptr == nullptr) return cudaSuccess;
  auto* s = cudaemu::internal::Resolve(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  auto& m = TheMachine();
  auto it = m.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == m.allocations.end() || it->second.device < 0) return Fail(cudaErrorInvalidValue);
  // Freed in stream order: once the work queued before it has run.
  cudaemu::internal::Enqueue(s, [ptr] {
    auto& allocations = TheMachine().allocations;
    auto freed = allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (freed == allocations.end()) cudaemu::internal::Fatal("cudaFreeAsync: freed twice");
    cudaemu::internal::Release(freed);
  });
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  cudaemu::internal::Record("cudaHostAlloc", __builtin_return_address(0), false);
  Lock lock(DeviceLock());
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = nullptr;
  if (posix_memalign(&p, 4096, size) != 0) return Fail(cudaErrorMemoryAllocation);
  TheMachine().allocations[reinterpret_cast<uintptr_t>(p)] = {reinterpret_cast<uintptr_t>(p),
                                                              size, -1};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr != nullptr) cudaemu::internal::Record("cudaFreeHost", __builtin_return_address(0), true);
  Lock lock(DeviceLock());
  if (ptr == nullptr) return cudaSuccess;
  auto& m = TheMachine();
  auto it = m.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == m.allocations.end() || it->second.device >= 0) return Fail(cudaErrorInvalidValue);
  cudaemu::internal::RunEverything();
  m.allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
  Lock lock(DeviceLock());
  if (attributes == nullptr) return Fail(cudaErrorInvalidValue);
  cudaemu::internal::Allocation a;
  *attributes = {};
  attributes->device = -2;
  if (cudaemu::internal::FindAllocation(reinterpret_cast<uintptr_t>(ptr), 1, &a)) {
    attributes->type = a.device >= 0 ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    attributes->device = a.device >= 0 ? a.device : cudaemu::internal::current_device;
    attributes->devicePointer = const_cast<void*>(ptr);
    attributes->hostPointer = a.device >= 0 ? nullptr : const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  cudaemu::internal::Record("cudaMemcpy", __builtin_return_address(0), true);
  Lock lock(DeviceLock());
  return cudaemu::internal::Copy(dst, src, count, kind, nullptr, /*synchronous=*/true);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  Lock lock(DeviceLock());
  if (count > 0 && (cudaemu::internal::IsPageable(dst, count) ||
                    cudaemu::internal::IsPageable(src, count))) {
    cudaemu::internal::Record("cudaMemcpyAsync (pageable)", __builtin_return_address(0), true);
  }
  return cudaemu::internal::Copy(dst, src, count, kind, stream, /*synchronous=*/false);
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  Lock lock(DeviceLock());
  return cudaemu::internal::Set(ptr, value, count, nullptr);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  Lock lock(DeviceLock());
  return cudaemu::internal::Set(ptr, value, count, stream);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  Lock lock(DeviceLock());
  if (stream == nullptr || (flags & ~unsigned{cudaStreamNonBlocking}) != 0) {
    return Fail(cudaErrorInvalidValue);
  }
  auto& m = TheMachine();
  if (cudaemu::internal::current_device >= static_cast<int>(m.devices.size())) {
    return Fail(cudaErrorInvalidDevice);
  }
  auto s = std::make_unique<cudaemu::internal::StreamState>();
  s->device = cudaemu::internal::current_device;
  s->flags = flags;
  *stream = reinterpret_cast<cudaStream_t>(s.get());
  m.streams.push_back(std::move(s));
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Lock lock(DeviceLock());
  auto* s = reinterpret_cast<cudaemu::internal::StreamState*>(stream);
  if (stream == nullptr || !cudaemu::internal::LiveStream(s) || s->legacy) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  // Queued work still completes; running it now is one order a GPU could choose.
  cudaemu::internal::RunUntil(s, s->enqueued);
  s->live = false;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cudaemu::internal::Record("cudaStreamSynchronize", __builtin_return_address(0), true);
  Lock lock(DeviceLock());
  if (const int e = cudaemu::internal::InjectedFailure("cudaStreamSynchronize")) {
    return Fail(static_cast<cudaError_t>(e));
  }
  auto* s = cudaemu::internal::Resolve(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  cudaemu::internal::RunUntil(s, s->enqueued);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Lock lock(DeviceLock());
  auto* s = cudaemu::internal::Resolve(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (s->completed == s->enqueued) return cudaSuccess;
  cudaemu::internal::RunOne(s);  // polling makes progress, one operation a query
  return cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  Lock lock(DeviceLock());
  if (const int e = cudaemu::internal::InjectedFailure("cudaStreamWaitEvent")) {
    return Fail(static_cast<cudaError_t>(e));
  }
  auto* s = cudaemu::internal::Resolve(stream);
  if (s == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  auto* e = reinterpret_cast<cudaemu::internal::EventState*>(event);
  if (!TheMachine().events.count(e) || flags != 0) return Fail(cudaErrorInvalidResourceHandle);
  if (e->stream == nullptr) return cudaSuccess;
  cudaemu::internal::StreamState* target = e->stream;
  const uint64_t position = e->position;
  // An empty operation ordered behind the event's position.
  cudaemu::internal::Operation wait;
  wait.after.emplace_back(target, position);
  s->queue.push_back(std::move(wait));
  ++s->enqueued;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  Lock lock(DeviceLock());
  if (const int e = cudaemu::internal::InjectedFailure("cudaEventCreateWithFlags")) {
    return Fail(static_cast<cudaError_t>(e));
  }
  if (event == nullptr) return Fail(cudaErrorInvalidValue);
  auto* e = new cudaemu::internal::EventState;
  e->device = cudaemu::internal::current_device;
  e->timing = (flags & cudaEventDisableTiming) == 0;
  TheMachine().events.insert(e);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Lock lock(DeviceLock());
  if (const int e = cudaemu::internal::InjectedFailure("cudaEventRecord")) {
    return Fail(static_cast<cudaError_t>(e));
  }
  auto* e = reinterpret_cast<cudaemu::internal::EventState*>(event);
  if (!TheMachine().events.count(e)) return Fail(cudaErrorInvalidResourceHandle);
  auto* s = cudaemu::internal::Resolve(stream);
  if (s == nullptr || s->device != e->device) return Fail(cudaErrorInvalidResourceHandle);
  e->stream = s;
  e->position = s->enqueued;
  e->stamped = s->completed >= e->position;
  if (e->stamped) e->stamp = std::chrono::steady_clock::now();
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Lock lock(DeviceLock());
  auto* a = reinterpret_cast<cudaemu::internal::EventState*>(start);
  auto* b = reinterpret_cast<cudaemu::internal::EventState*>(end);
  auto& events = TheMachine().events;
  if (ms == nullptr) return Fail(cudaErrorInvalidValue);
  if (!events.count(a) || !events.count(b) || !a->timing || !b->timing ||
      a->stream == nullptr || b->stream == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  if (!a->stamped || !b->stamped) return Fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->stamp - a->stamp).count();
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  Lock lock(DeviceLock());
  if (const int e = cudaemu::internal::InjectedFailure("cudaEventQuery")) {
    return Fail(static_cast<cudaError_t>(e));
  }
  auto* e = reinterpret_cast<cudaemu::internal::EventState*>(event);
  if (!TheMachine().events.count(e)) return Fail(cudaErrorInvalidResourceHandle);
  if (e->stream == nullptr || e->stream->completed >= e->position) return cudaSuccess;
  cudaemu::internal::RunOne(e->stream);  // polling makes progress, one operation a query
  return cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  cudaemu::internal::Record("cudaEventSynchronize", __builtin_return_address(0), true);
  Lock lock(DeviceLock());
  if (const int e = cudaemu::internal::InjectedFailure("cudaEventSynchronize")) {
    return Fail(static_cast<cudaError_t>(e));
  }
  auto* e = reinterpret_cast<cudaemu::internal::EventState*>(event);
  if (!TheMachine().events.count(e)) return Fail(cudaErrorInvalidResourceHandle);
  if (e->stream != nullptr) cudaemu::internal::RunUntil(e->stream, e->position);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Lock lock(DeviceLock());
  if (const int e = cudaemu::internal::InjectedFailure("cudaEventDestroy")) {
    return Fail(static_cast<cudaError_t>(e));
  }
  auto* e = reinterpret_cast<cudaemu::internal::EventState*>(event);
  if (!TheMachine().events.erase(e)) return Fail(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}
