// The emulated driver's virtual memory management, failures on demand and the NVML shim.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "cudaemu/control.h"
#include "gtest/gtest.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGranule = 2 * kMiB;

using ReserveFn = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
using AddressFreeFn = CUresult (*)(CUdeviceptr, size_t);
using CreateFn = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                              unsigned long long);
using ReleaseFn = CUresult (*)(CUmemGenericAllocationHandle);
using MapFn = CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                           unsigned long long);
using SetAccessFn = CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
using UnmapFn = CUresult (*)(CUdeviceptr, size_t);
using AttributeFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);
using GranularityFn = CUresult (*)(size_t*, const CUmemAllocationProp*,
                                   CUmemAllocationGranularity_flags);

template <typename Fn>
Fn Entry(const char* symbol) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  EXPECT_EQ(cudaGetDriverEntryPointByVersion(symbol, &function, 12000, cudaEnableDefault, &status),
            cudaSuccess);
  EXPECT_EQ(status, cudaDriverEntryPointSuccess) << symbol;
  return reinterpret_cast<Fn>(function);
}

struct Driver {
  ReserveFn reserve = Entry<ReserveFn>("cuMemAddressReserve");
  AddressFreeFn address_free = Entry<AddressFreeFn>("cuMemAddressFree");
  CreateFn create = Entry<CreateFn>("cuMemCreate");
  ReleaseFn release = Entry<ReleaseFn>("cuMemRelease");
  MapFn map = Entry<MapFn>("cuMemMap");
  SetAccessFn set_access = Entry<SetAccessFn>("cuMemSetAccess");
  UnmapFn unmap = Entry<UnmapFn>("cuMemUnmap");
};

CUmemAllocationProp Prop(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

CUmemAccessDesc ReadWrite(int device) {
  CUmemAccessDesc desc = {};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return desc;
}

class Deferred : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = cudaemu::ScheduleName();
    cudaemu::SetSchedule("forward");
  }
  void TearDown() override {
    cudaemu::SetSchedule(saved_);
    cudaemu::ClearFailures();
  }

 private:
  std::string saved_;
};
using VmmTest = Deferred;
using VmmDeathTest = Deferred;

TEST(EntryPointTest, KnownSymbolsResolveAndUnknownOnesAreNull) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult status;
  ASSERT_EQ(cudaGetDriverEntryPoint("cuMemCreate", &function, cudaEnableDefault, &status),
            cudaSuccess);
  EXPECT_NE(function, nullptr);
  EXPECT_EQ(status, cudaDriverEntryPointSuccess);
  ASSERT_EQ(cudaGetDriverEntryPoint("cuNoSuchCall", &function, cudaEnableDefault, &status),
            cudaSuccess);
  EXPECT_EQ(function, nullptr);
  EXPECT_EQ(status, cudaDriverEntryPointSymbolNotFound);
  // A version past the driver's is CUDA's invalid value.
  EXPECT_EQ(cudaGetDriverEntryPointByVersion("cuMemCreate", &function, 99000, 0, nullptr),
            cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

TEST(EntryPointTest, DevicesSayWhetherTheySupportVirtualMemory) {
  auto attribute = Entry<AttributeFn>("cuDeviceGetAttribute");
  auto granularity = Entry<GranularityFn>("cuMemGetAllocationGranularity");
  int supported = 0;
  ASSERT_EQ(attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1),
            CUDA_SUCCESS);
  EXPECT_EQ(supported, 1);
  size_t g = 0;
  const CUmemAllocationProp prop = Prop(1);
  ASSERT_EQ(granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  EXPECT_EQ(g, kGranule);
  cudaemu::SetVirtualMemorySupported(1, false);
  ASSERT_EQ(attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1),
            CUDA_SUCCESS);
  EXPECT_EQ(supported, 0);
  cudaemu::SetVirtualMemorySupported(1, true);
}

// One physical allocation mapped at two addresses is the same memory at both; unmapped at one
// it stays at the other; released and unmapped everywhere it is gone and uncharged.
TEST_F(VmmTest, OneAllocationAtTwoAddressesIsOneMemory) {
  Driver d;
  const size_t charged = cudaemu::DeviceAllocatedBytes(0);
  CUdeviceptr va = 0;
  ASSERT_EQ(d.reserve(&va, 4 * kGranule, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(va % kGranule, 0u);
  CUmemGenericAllocationHandle h = 0;
  const CUmemAllocationProp prop = Prop(0);
  ASSERT_EQ(d.create(&h, kGranule, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(0), charged + kGranule);
  EXPECT_EQ(cudaemu::PhysicalAllocations(0), 1u);
  ASSERT_EQ(d.map(va, kGranule, 0, h, 0), CUDA_SUCCESS);
  ASSERT_EQ(d.map(va + 2 * kGranule, kGranule, 0, h, 0), CUDA_SUCCESS);
  EXPECT_EQ(d.map(va, kGranule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);  // already mapped there
  const CUmemAccessDesc rw = ReadWrite(0);
  // Not device memory before access is set.
  void* first = reinterpret_cast<void*>(va);
  void* second = reinterpret_cast<void*>(va + 2 * kGranule);
  EXPECT_EQ(cudaMemset(first, 1, 64), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  ASSERT_EQ(d.set_access(va, kGranule, &rw, 1), CUDA_SUCCESS);
  ASSERT_EQ(d.set_access(va + 2 * kGranule, kGranule, &rw, 1), CUDA_SUCCESS);
  EXPECT_EQ(cudaemu::MappedBytes(0), 2 * kGranule);

  ASSERT_EQ(cudaMemset(first, 0x5a, kGranule), cudaSuccess);
  std::vector<unsigned char> host(kGranule);
  ASSERT_EQ(cudaMemcpy(host.data(), second, kGranule, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host.front(), 0x5a);
  EXPECT_EQ(host.back(), 0x5a);
  // A copy may not run past the mapped run.
  EXPECT_EQ(cudaMemcpy(host.data(), first, kGranule + 1, cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  (void)cudaGetLastError();

  ASSERT_EQ(d.release(h), CUDA_SUCCESS);  // still mapped: still there
  ASSERT_EQ(d.unmap(va, kGranule), CUDA_SUCCESS);
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(0), charged + kGranule);
  ASSERT_EQ(cudaMemcpy(host.data(), second, 64, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host.front(), 0x5a);
  EXPECT_EQ(d.address_free(va, 4 * kGranule), CUDA_ERROR_INVALID_VALUE);  // still maps memory
  ASSERT_EQ(d.unmap(va + 2 * kGranule, kGranule), CUDA_SUCCESS);
  EXPECT_EQ(cudaemu::DeviceAllocatedBytes(0), charged);
  EXPECT_EQ(cudaemu::PhysicalAllocations(0), 0u);
  ASSERT_EQ(d.address_free(va, 4 * kGranule), CUDA_SUCCESS);
}

TEST_F(VmmTest, MappingsSpanTwoAllocationsAndUnmapOnlyWholeMappings) {
  Driver d;
  CUdeviceptr va = 0;
  ASSERT_EQ(d.reserve(&va, 2 * kGranule, 0, 0, 0), CUDA_SUCCESS);
  CUmemGenericAllocationHandle h[2];
  const CUmemAllocationProp prop = Prop(0);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(d.create(&h[i], kGranule, &prop, 0), CUDA_SUCCESS);
    ASSERT_EQ(d.map(va + i * kGranule, kGranule, 0, h[i], 0), CUDA_SUCCESS);
  }
  const CUmemAccessDesc rw = ReadWrite(0);
  ASSERT_EQ(d.set_access(va, 2 * kGranule, &rw, 1), CUDA_SUCCESS);
  // One copy across both allocations: one run of device memory.
  ASSERT_EQ(cudaMemset(reinterpret_cast<void*>(va + kGranule - 8), 3, 16), cudaSuccess);
  EXPECT_EQ(d.unmap(va, kGranule / 2), CUDA_ERROR_INVALID_VALUE);  // part of a mapping
  ASSERT_EQ(d.unmap(va, 2 * kGranule), CUDA_SUCCESS);                // both at once
  for (auto handle : h) ASSERT_EQ(d.release(handle), CUDA_SUCCESS);
  EXPECT_EQ(cudaemu::PhysicalAllocations(0), 0u);
  ASSERT_EQ(d.address_free(va, 2 * kGranule), CUDA_SUCCESS);
}

TEST_F(VmmTest, CreatingPastTheDevicesMemoryIsOutOfMemory) {
  Driver d;
  cudaemu::SetDeviceMemory(1, 8 * kMiB);
  const CUmemAllocationProp prop = Prop(1);
  CUmemGenericAllocationHandle a = 0, b = 0;
  ASSERT_EQ(d.create(&a, 6 * kMiB, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(d.create(&b, 4 * kMiB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  void* p = nullptr;
  EXPECT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, 4 * kMiB), cudaErrorMemoryAllocation);  // one memory for both
  (void)cudaGetLastError();
  ASSERT_EQ(d.release(a), CUDA_SUCCESS);
  ASSERT_EQ(d.create(&b, 8 * kMiB, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(d.release(b), CUDA_SUCCESS);
  cudaemu::SetDeviceMemory(1, size_t{8} << 30);
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
}

// Unmapping an address range while work queued on it has not run: the work faults when it
// runs, as it would on a GPU.
TEST_F(VmmDeathTest, WorkQueuedOnAnUnmappedRangeFaults) {
  EXPECT_DEATH(
      {
        Driver d;
        CUdeviceptr va = 0;
        CUmemGenericAllocationHandle h = 0;
        const CUmemAllocationProp prop = Prop(0);
        const CUmemAccessDesc rw = ReadWrite(0);
        d.reserve(&va, kGranule, 0, 0, 0);
        d.create(&h, kGranule, &prop, 0);
        d.map(va, kGranule, 0, h, 0);
        d.set_access(va, kGranule, &rw, 1);
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        cudaMemsetAsync(reinterpret_cast<void*>(va), 1, kGranule, s);  // queued
        d.unmap(va, kGranule);
        cudaStreamSynchronize(s);
      },
      "");
}

TEST_F(VmmTest, CallsAreRecordedAndSetAccessAndUnmapCountAsWaits) {
  Driver d;
  cudaemu::ResetHostCalls();
  cudaemu::RegionScope region("vmm");
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle h = 0;
  const CUmemAllocationProp prop = Prop(0);
  const CUmemAccessDesc rw = ReadWrite(0);
  ASSERT_EQ(d.reserve(&va, kGranule, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(d.create(&h, kGranule, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(d.map(va, kGranule, 0, h, 0), CUDA_SUCCESS);
  EXPECT_EQ(cudaemu::CountHostWaits("vmm"), 0u);
  ASSERT_EQ(d.set_access(va, kGranule, &rw, 1), CUDA_SUCCESS);
  ASSERT_EQ(d.unmap(va, kGranule), CUDA_SUCCESS);
  EXPECT_EQ(cudaemu::CountHostWaits("vmm"), 2u);
  ASSERT_EQ(d.release(h), CUDA_SUCCESS);
  ASSERT_EQ(d.address_free(va, kGranule), CUDA_SUCCESS);
  for (const char* api : {"cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                          "cuMemUnmap", "cuMemRelease", "cuMemAddressFree"}) {
    EXPECT_EQ(cudaemu::CountCalls(api, "vmm"), 1u) << api;
  }
}

TEST_F(VmmTest, FailCallFailsTheKthCallOnceAndChangesNothing) {
  Driver d;
  const CUmemAllocationProp prop = Prop(0);
  const uint64_t before = cudaemu::CallCount("cuMemCreate");
  cudaemu::FailCall("cuMemCreate", 2);
  CUmemGenericAllocationHandle a = 0, b = 0, c = 0;
  ASSERT_EQ(d.create(&a, kGranule, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(d.create(&b, kGranule, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(cudaemu::PhysicalAllocations(0), 1u);
  ASSERT_EQ(d.create(&c, kGranule, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(cudaemu::CallCount("cuMemCreate"), before + 3);
  ASSERT_EQ(d.release(a), CUDA_SUCCESS);
  ASSERT_EQ(d.release(c), CUDA_SUCCESS);

  void* p = nullptr;
  cudaemu::FailCall("cudaMalloc", 1);
  EXPECT_EQ(cudaMalloc(&p, 256), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  cudaEvent_t e;
  cudaemu::FailCall("cudaEventRecord", 1, cudaErrorInvalidResourceHandle);
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(e, nullptr), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventRecord(e, nullptr), cudaSuccess);
  (void)cudaGetLastError();
  ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
}

// ---- NVML ----

using NvmlInit = int (*)();
using NvmlByBusId = int (*)(const char*, void**);
struct ProcessInfo {
  unsigned pid;
  unsigned long long usedGpuMemory;
  unsigned gpuInstanceId;
  unsigned computeInstanceId;
};
using NvmlProcesses = int (*)(void*, unsigned*, ProcessInfo*);

TEST(NvmlTest, ListsThisProcessAndOthersByPciBusId) {
  auto init = reinterpret_cast<NvmlInit>(dlsym(RTLD_DEFAULT, "nvmlInit_v2"));
  auto by_bus = reinterpret_cast<NvmlByBusId>(dlsym(RTLD_DEFAULT, "nvmlDeviceGetHandleByPciBusId_v2"));
  auto processes = reinterpret_cast<NvmlProcesses>(
      dlsym(RTLD_DEFAULT, "nvmlDeviceGetComputeRunningProcesses_v3"));
  ASSERT_NE(init, nullptr) << "the shim's symbols are visible to dlsym";
  ASSERT_NE(by_bus, nullptr);
  ASSERT_NE(processes, nullptr);
  ASSERT_EQ(init(), 0);
  char bus_id[32];
  ASSERT_EQ(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, 1), cudaSuccess);
  EXPECT_STREQ(bus_id, "0000:11:00.0");
  void* device = nullptr;
  ASSERT_EQ(by_bus(bus_id, &device), 0);

  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4 * kMiB), cudaSuccess);
  cudaemu::SetOtherProcessMemory(1, 100 * kMiB);
  unsigned count = 0;
  EXPECT_EQ(processes(device, &count, nullptr), 7);  // NVML_ERROR_INSUFFICIENT_SIZE
  EXPECT_EQ(count, 2u);
  ProcessInfo infos[4];
  count = 4;
  ASSERT_EQ(processes(device, &count, infos), 0);
  ASSERT_EQ(count, 2u);
  EXPECT_EQ(infos[0].pid, static_cast<unsigned>(getpid()));
  EXPECT_EQ(infos[0].usedGpuMemory, 4 * kMiB);
  EXPECT_NE(infos[1].pid, static_cast<unsigned>(getpid()));
  EXPECT_EQ(infos[1].usedGpuMemory, 100 * kMiB);
  // cudaMemGetInfo counts every process.
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  EXPECT_EQ(total - free_bytes, 104 * kMiB);
  cudaemu::SetNvmlListsThisProcess(false);
  count = 4;
  ASSERT_EQ(processes(device, &count, infos), 0);
  EXPECT_NE(infos[0].pid, static_cast<unsigned>(getpid()));
  cudaemu::SetNvmlListsThisProcess(true);
  cudaemu::SetOtherProcessMemory(1, 0);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

}  // namespace
