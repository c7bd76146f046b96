// The driver API's virtual memory management on the emulator: address reservations, physical
// allocations, mappings and access, with CUDA's rules where an allocator depends on them.
//
// - A reservation (cuMemAddressReserve) is PROT_NONE address space of the host, aligned to the
//   granularity (2 MiB) or the alignment asked for.
// - A physical allocation (cuMemCreate) is a range of its device's memory file (a memfd, grown
//   as needed and sparse), charged against the device's memory as cudaMalloc is and filled with
//   garbage. Freed (released and unmapped) its pages go back to the host (a punched hole).
// - cuMemMap maps an allocation MAP_SHARED|MAP_FIXED at an address of a reservation, PROT_NONE;
//   cuMemSetAccess makes it readable and writable. The same allocation mapped at two addresses
//   is the same memory at both. A mapped, accessible run of address space is device memory to
//   the runtime's copies and to kernel argument checks (FindMapping).
// - cuMemUnmap replaces the mapping with PROT_NONE address space at once. CUDA documents it as
//   synchronous; the emulator deliberately does not run queued work for it, so work queued on a
//   range that an allocator unmapped too early faults when it runs.
// - Errors are CUDA's codes; a call that fails changes nothing.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cuda.h"
#include "cudaemu/control.h"
#include "testing/cudaemu/internal.h"

namespace cudaemu::internal {
namespace {

using Lock = std::lock_guard<std::recursive_mutex>;

constexpr size_t kGranularity = kAllocationGranularity;

struct Physical {
  int device = 0;
  size_t size = 0;
  size_t offset = 0;  // in the device's memory file
  int mappings = 0;
  bool released = false;
};

struct Mapping {
  size_t size = 0;
  Physical* physical = nullptr;
  bool accessible = false;
};

struct Reservation {
  size_t size = 0;
  std::map<uintptr_t, Mapping> mappings;  // by address
};

// A device's physical memory: one file, ranges handed out first fit.
struct DeviceFile {
  int fd = -1;
  size_t length = 0;                  // the file's size
  std::map<size_t, size_t> free_ranges;  // offset -> bytes, below `length`
};

struct Vmm {
  std::map<uintptr_t, Reservation> reservations;  // by base
  std::set<Physical*> physicals;
  std::vector<DeviceFile> files;
  std::vector<bool> supported;
};

Vmm& TheVmm() {
  static Vmm* vmm = [] {
    auto* v = new Vmm;
    const int devices = DeviceCount();
    v->files.resize(static_cast<size_t>(devices));
    const char* env = std::getenv("CUDAEMU_VMM");
    v->supported.assign(static_cast<size_t>(devices), env == nullptr || std::strcmp(env, "0") != 0);
    return v;
  }();
  return *vmm;
}

bool ValidDevice(int device) { return device >= 0 && device < DeviceCount(); }

// A range of `bytes` of `device`'s memory file, or false when the host cannot provide one.
bool TakeFileRange(int device, size_t bytes, size_t* offset) {
  DeviceFile& file = TheVmm().files[static_cast<size_t>(device)];
  if (file.fd < 0) {
    const std::string name = "cudaemu-device-" + std::to_string(device);
    file.fd = memfd_create(name.c_str(), MFD_CLOEXEC);
    if (file.fd < 0) Fatal("memfd_create failed: " + std::string(std::strerror(errno)));
  }
  for (auto it = file.free_ranges.begin(); it != file.free_ranges.end(); ++it) {
    if (it->second < bytes) continue;
    *offset = it->first;
    const size_t rest = it->second - bytes;
    file.free_ranges.erase(it);
    if (rest > 0) file.free_ranges[*offset + bytes] = rest;
    return true;
  }
  if (ftruncate(file.fd, static_cast<off_t>(file.length + bytes)) != 0) return false;
  *offset = file.length;
  file.length += bytes;
  return true;
}

void ReturnFileRange(int device, size_t offset, size_t bytes) {
  DeviceFile& file = TheVmm().files[static_cast<size_t>(device)];
  // The pages go back to the host; the next allocation of this range reads zeros until filled.
  (void)fallocate(file.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(bytes));
  auto next = file.free_ranges.lower_bound(offset);
  if (next != file.free_ranges.end() && offset + bytes == next->first) {
    bytes += next->second;
    file.free_ranges.erase(next);
  }
  auto it = file.free_ranges.lower_bound(offset);
  if (it != file.free_ranges.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  file.free_ranges[offset] = bytes;
}

void FreePhysical(Physical* p) {
  ReturnFileRange(p->device, p->offset, p->size);
  UnchargeDevice(p->device, p->size);
  TheVmm().physicals.erase(p);
  delete p;
}

Physical* FindPhysical(CUmemGenericAllocationHandle handle) {
  auto* p = reinterpret_cast<Physical*>(static_cast<uintptr_t>(handle));
  return TheVmm().physicals.count(p) ? p : nullptr;
}

// The reservation holding [address, address + bytes), or nullptr.
Reservation* FindReservation(uintptr_t address, size_t bytes, uintptr_t* base) {
  auto& reservations = TheVmm().reservations;
  auto it = reservations.upper_bound(address);
  if (it == reservations.begin()) return nullptr;
  --it;
  if (address - it->first > it->second.size || it->second.size - (address - it->first) < bytes) {
    return nullptr;
  }
  if (base != nullptr) *base = it->first;
  return &it->second;
}

// The mappings exactly covering [address, address + bytes), contiguous, in address order; empty
// when the range is not such a run (CUDA's rule for unmapping and setting access).
std::vector<std::map<uintptr_t, Mapping>::iterator> ExactRun(Reservation& r, uintptr_t address,
                                                              size_t bytes) {
  std::vector<std::map<uintptr_t, Mapping>::iterator> run;
  auto it = r.mappings.find(address);
  uintptr_t at = address;
  while (it != r.mappings.end() && it->first == at && at < address + bytes) {
    run.push_back(it);
    at += it->second.size;
    ++it;
  }
  if (at != address + bytes) run.clear();
  return run;
}

}  // namespace

namespace {

// The contiguous run of accessible mappings holding the byte at `address`: [*start, *end).
bool RunAround(uintptr_t address, uintptr_t* start, uintptr_t* end, int* device) {
  Reservation* r = FindReservation(address, 1, nullptr);
  if (r == nullptr) return false;
  auto it = r->mappings.upper_bound(address);
  if (it == r->mappings.begin()) return false;
  --it;
  if (address - it->first >= it->second.size || !it->second.accessible) return false;
  auto first = it;
  while (first != r->mappings.begin()) {
    auto prev = std::prev(first);
    if (prev->first + prev->second.size != first->first || !prev->second.accessible) break;
    first = prev;
  }
  uintptr_t last_end = it->first + it->second.size;
  for (auto next = std::next(it);
       next != r->mappings.end() && next->first == last_end && next->second.accessible; ++next) {
    last_end = next->first + next->second.size;
  }
  *start = first->first;
  *end = last_end;
  *device = it->second.physical->device;
  return true;
}

}  // namespace

bool FindMapping(uintptr_t address, size_t bytes, Allocation* found) {
  Lock lock(DeviceLock());
  uintptr_t start = 0, end = 0;
  int device = -1;
  bool inside = RunAround(address, &start, &end, &device);
  // A zero-byte range may sit one past the end of a run.
  if (!inside && bytes == 0 && address > 0) inside = RunAround(address - 1, &start, &end, &device);
  if (!inside || end - address < bytes) return false;
  if (found != nullptr) *found = Allocation{start, end - start, device};
  return true;
}

}  // namespace cudaemu::internal

// ---- the driver calls, reached through cudaGetDriverEntryPoint ----

namespace {

using cudaemu::internal::DeviceLock;
using cudaemu::internal::InjectedFailure;
using cudaemu::internal::Mapping;
using cudaemu::internal::Physical;
using cudaemu::internal::Record;
using cudaemu::internal::Reservation;
using cudaemu::internal::TheVmm;
using cudaemu::internal::ValidDevice;
using Lock = std::lock_guard<std::recursive_mutex>;

constexpr size_t kGranularity = cudaemu::kAllocationGranularity;

#define CUDAEMU_DRIVER_CALL(api)                                      \
  Lock lock(DeviceLock());                                            \
  if (const int injected = InjectedFailure(api)) {                    \
    return static_cast<CUresult>(injected);                           \
  }

CUresult DeviceGet(CUdevice* device, int ordinal) {
  CUDAEMU_DRIVER_CALL("cuDeviceGet");
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult DeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  CUDAEMU_DRIVER_CALL("cuDeviceGetAttribute");
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  if (attribute != CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) {
    return CUDA_ERROR_INVALID_VALUE;  // only what actpack asks is emulated
  }
  *value = TheVmm().supported[static_cast<size_t>(device)] ? 1 : 0;
  return CUDA_SUCCESS;
}

bool ValidProp(const CUmemAllocationProp* prop) {
  return prop != nullptr && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
         prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && ValidDevice(prop->location.id) &&
         (prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE ||
          prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

CUresult MemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                     CUmemAllocationGranularity_flags option) {
  CUDAEMU_DRIVER_CALL("cuMemGetAllocationGranularity");
  if (granularity == nullptr || !ValidProp(prop) ||
      (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
       option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!TheVmm().supported[static_cast<size_t>(prop->location.id)]) return CUDA_ERROR_NOT_SUPPORTED;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

CUresult MemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                           unsigned long long flags) {
  Record("cuMemAddressReserve", __builtin_return_address(0), false);
  CUDAEMU_DRIVER_CALL("cuMemAddressReserve");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (ptr == nullptr || size == 0 || size % page != 0 || flags != 0 ||
      (alignment & (alignment - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const size_t align = alignment > kGranularity ? alignment : kGranularity;
  void* raw = mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t base = (start + align - 1) / align * align;
  if (base > start) munmap(raw, base - start);
  if (start + size + align > base + size) {
    munmap(reinterpret_cast<void*>(base + size), start + size + align - (base + size));
  }
  TheVmm().reservations[base].size = size;
  *ptr = base;
  (void)addr;  // a hint CUDA may ignore; so does the emulator
  return CUDA_SUCCESS;
}

CUresult MemAddressFree(CUdeviceptr ptr, size_t size) {
  Record("cuMemAddressFree", __builtin_return_address(0), false);
  CUDAEMU_DRIVER_CALL("cuMemAddressFree");
  auto& reservations = TheVmm().reservations;
  auto it = reservations.find(static_cast<uintptr_t>(ptr));
  if (it == reservations.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  // Freeing address space that still maps memory is a caller's bug CUDA refuses.
  if (!it->second.mappings.empty()) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(it->first), size);
  reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult MemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                   const CUmemAllocationProp* prop, unsigned long long flags) {
  Record("cuMemCreate", __builtin_return_address(0), false);
  CUDAEMU_DRIVER_CALL("cuMemCreate");
  if (handle == nullptr || !ValidProp(prop) || flags != 0 || size == 0 ||
      size % kGranularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int device = prop->location.id;
  if (!TheVmm().supported[static_cast<size_t>(device)]) return CUDA_ERROR_NOT_SUPPORTED;
  if (!cudaemu::internal::ChargeDevice(device, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  auto* p = new Physical;
  p->device = device;
  p->size = size;
  if (!cudaemu::internal::TakeFileRange(device, size, &p->offset)) {
    cudaemu::internal::UnchargeDevice(device, size);
    delete p;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // Fresh device memory holds whatever was there: garbage, never zeros.
  const int fd = TheVmm().files[static_cast<size_t>(device)].fd;
  void* view = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                    static_cast<off_t>(p->offset));
  if (view == MAP_FAILED) cudaemu::internal::Fatal("cannot map a device memory file range");
  cudaemu::internal::FillGarbage(view, size);
  munmap(view, size);
  TheVmm().physicals.insert(p);
  *handle = reinterpret_cast<uintptr_t>(p);
  return CUDA_SUCCESS;
}

CUresult MemRelease(CUmemGenericAllocationHandle handle) {
  Record("cuMemRelease", __builtin_return_address(0), false);
  CUDAEMU_DRIVER_CALL("cuMemRelease");
  Physical* p = cudaemu::internal::FindPhysical(handle);
  if (p == nullptr || p->released) return CUDA_ERROR_INVALID_VALUE;
  p->released = true;
  // The memory stays while it is mapped.
  if (p->mappings == 0) cudaemu::internal::FreePhysical(p);
  return CUDA_SUCCESS;
}

CUresult MemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                unsigned long long flags) {
  Record("cuMemMap", __builtin_return_address(0), false);
  CUDAEMU_DRIVER_CALL("cuMemMap");
  Physical* p = cudaemu::internal::FindPhysical(handle);
  const uintptr_t address = static_cast<uintptr_t>(ptr);
  if (p == nullptr || p->released || offset != 0 || flags != 0 || size == 0 ||
      size % kGranularity != 0 || address % kGranularity != 0 || size > p->size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Reservation* r = cudaemu::internal::FindReservation(address, size, nullptr);
  if (r == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Only address space that maps nothing yet.
  auto next = r->mappings.lower_bound(address);
  if (next != r->mappings.end() && next->first < address + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != r->mappings.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > address) return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = TheVmm().files[static_cast<size_t>(p->device)].fd;
  if (mmap(reinterpret_cast<void*>(address), size, PROT_NONE, MAP_SHARED | MAP_FIXED, fd,
           static_cast<off_t>(p->offset)) == MAP_FAILED) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  r->mappings[address] = Mapping{size, p, false};
  ++p->mappings;
  return CUDA_SUCCESS;
}

CUresult MemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  Record("cuMemSetAccess", __builtin_return_address(0), true);
  CUDAEMU_DRIVER_CALL("cuMemSetAccess");
  const uintptr_t address = static_cast<uintptr_t>(ptr);
  if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  Reservation* r = cudaemu::internal::FindReservation(address, size, nullptr);
  if (r == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto run = cudaemu::internal::ExactRun(*r, address, size);
  if (run.empty()) return CUDA_ERROR_INVALID_VALUE;
  bool writable = false, readable = false;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (!ValidDevice(desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
    switch (desc[i].flags) {
      case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: writable = readable = true; break;
      case CU_MEM_ACCESS_FLAGS_PROT_READ: readable = true; break;
      case CU_MEM_ACCESS_FLAGS_PROT_NONE: break;
      default: return CUDA_ERROR_INVALID_VALUE;
    }
  }
  const int prot = writable ? PROT_READ | PROT_WRITE : readable ? PROT_READ : PROT_NONE;
  if (mprotect(reinterpret_cast<void*>(address), size, prot) != 0) return CUDA_ERROR_UNKNOWN;
  for (auto& it : run) it->second.accessible = readable;
  return CUDA_SUCCESS;
}

CUresult MemUnmap(CUdeviceptr ptr, size_t size) {
  Record("cuMemUnmap", __builtin_return_address(0), true);
  CUDAEMU_DRIVER_CALL("cuMemUnmap");
  const uintptr_t address = static_cast<uintptr_t>(ptr);
  Reservation* r = cudaemu::internal::FindReservation(address, size, nullptr);
  if (r == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  auto run = cudaemu::internal::ExactRun(*r, address, size);
  if (run.empty()) return CUDA_ERROR_INVALID_VALUE;
  // Address space again, at once: queued work that still uses it faults when it runs.
  if (mmap(reinterpret_cast<void*>(address), size, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
    cudaemu::internal::Fatal("cannot unmap device memory");
  }
  for (auto& it : run) {
    Physical* p = it->second.physical;
    r->mappings.erase(it);
    if (--p->mappings == 0 && p->released) cudaemu::internal::FreePhysical(p);
  }
  return CUDA_SUCCESS;
}

const char* ErrorName(CUresult error) {
  switch (error) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_PERMITTED: return "CUDA_ERROR_NOT_PERMITTED";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
  }
  return nullptr;
}

CUresult GetErrorName(CUresult error, const char** name) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *name = ErrorName(error);
  return *name != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult GetErrorString(CUresult error, const char** text) {
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case CUDA_SUCCESS: *text = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
    case CUDA_ERROR_INVALID_DEVICE: *text = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; break;
    case CUDA_ERROR_NOT_FOUND: *text = "named symbol not found"; break;
    case CUDA_ERROR_NOT_PERMITTED: *text = "operation not permitted"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *text = "operation not supported"; break;
    case CUDA_ERROR_UNKNOWN: *text = "unknown error"; break;
    default: *text = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

}  // namespace

namespace cudaemu::internal {

void* DriverEntryPoint(const char* symbol) {
  static const std::map<std::string, void*>* table = new std::map<std::string, void*>{
      {"cuDeviceGet", reinterpret_cast<void*>(&DeviceGet)},
      {"cuDeviceGetAttribute", reinterpret_cast<void*>(&DeviceGetAttribute)},
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&MemGetAllocationGranularity)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&MemAddressReserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&MemAddressFree)},
      {"cuMemCreate", reinterpret_cast<void*>(&MemCreate)},
      {"cuMemRelease", reinterpret_cast<void*>(&MemRelease)},
      {"cuMemMap", reinterpret_cast<void*>(&MemMap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&MemSetAccess)},
      {"cuMemUnmap", reinterpret_cast<void*>(&MemUnmap)},
      {"cuGetErrorName", reinterpret_cast<void*>(&GetErrorName)},
      {"cuGetErrorString", reinterpret_cast<void*>(&GetErrorString)},
  };
  auto it = table->find(symbol);
  return it == table->end() ? nullptr : it->second;
}

}  // namespace cudaemu::internal

// ---- control.h ----

namespace cudaemu {

void SetVirtualMemorySupported(int device, bool supported) {
  Lock lock(DeviceLock());
  if (!ValidDevice(device)) internal::Fatal("no such device");
  TheVmm().supported[static_cast<size_t>(device)] = supported;
}

size_t PhysicalAllocations(int device) {
  Lock lock(DeviceLock());
  size_t n = 0;
  for (const Physical* p : TheVmm().physicals) n += p->device == device;
  return n;
}

size_t MappedBytes(int device) {
  Lock lock(DeviceLock());
  size_t bytes = 0;
  for (const auto& [base, r] : TheVmm().reservations) {
    for (const auto& [address, m] : r.mappings) {
      if (m.physical->device == device) bytes += m.size;
    }
  }
  return bytes;
}

size_t ReservedAddressBytes() {
  Lock lock(DeviceLock());
  size_t bytes = 0;
  for (const auto& [base, r] : TheVmm().reservations) bytes += r.size;
  return bytes;
}

}  // namespace cudaemu
