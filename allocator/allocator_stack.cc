#include "allocator/allocator_stack.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/cuda_memory_resource.h"
#include "allocator/host_memory_resource.h"
#include "allocator/units.h"
#include "allocator/vmm_memory_resource.h"

namespace actpack::allocator {

absl::string_view BackendName(Backend backend) {
  return backend == Backend::kCuda ? "cuda" : "host";
}

namespace {

std::unique_ptr<MemoryResource> MakeBackend(Backend backend, int device, CudaMemory cuda_memory,
                                            std::string* description) {
  if (backend == Backend::kHost) {
    *description = "host (mmap)";
    return std::make_unique<HostMemoryResource>();
  }
  if (cuda_memory == CudaMemory::kMalloc) {
    *description = "cudaMalloc (configured)";
    return std::make_unique<CudaMemoryResource>(device);
  }
  absl::StatusOr<std::unique_ptr<VmmMemoryResource>> vmm = VmmMemoryResource::Create(device);
  if (vmm.ok()) {
    *description = absl::StrCat("CUDA virtual memory (cuMemCreate/cuMemMap, ",
                                FormatBytes((*vmm)->AllocationGranularity()), " granules)");
    return *std::move(vmm);
  }
  *description = absl::StrCat("cudaMalloc (virtual memory management ",
                              cuda_memory == CudaMemory::kVirtual ? "was asked for but is " : "",
                              "unavailable: ", vmm.status().message(), ")");
  return std::make_unique<CudaMemoryResource>(device);
}

std::unique_ptr<StreamEvents> MakeEvents(Backend backend, int device) {
  if (backend == Backend::kCuda) return std::make_unique<CudaStreamEvents>(device);
  return std::make_unique<HostStreamEvents>();
}

}  // namespace

AllocatorStack::AllocatorStack(Backend backend, int device, const AllocatorConfig& config)
    : backend_(backend),
      device_(device),
      events_(MakeEvents(backend, device)),
      backend_resource_(MakeBackend(backend, device, config.cuda_memory, &backend_description_)),
      pool_(backend_resource_.get(), events_.get()),
      budget_(&pool_, config.budget_bytes),
      faults_(&budget_),
      stats_(&faults_),
      trace_(&stats_, config.trace_capacity) {
  trace_.SetEnabled(config.record_trace);
}

AllocatorStack::~AllocatorStack() = default;

void AllocatorStack::Free(void* ptr) {
  if (ptr == nullptr) return;
  absl::StatusOr<AllocationInfo> info = pool_.Lookup(ptr);
  if (!info.ok()) {
    std::fprintf(stderr, "actpack: Free: %s\n", info.status().ToString().c_str());
    std::abort();
  }
  top().Deallocate(ptr, info->requested_size, info->stream);
}

MemorySnapshot AllocatorStack::Snapshot() const {
  MemorySnapshot snapshot;
  AddToSnapshot(device_, pool_, &trace_, snapshot);
  snapshot.allocator_settings = {
      {"backend", std::string(BackendName(backend_))},
      {"memory", backend_description_},
      {"budget_bytes", budget_.budget() == kNoCap ? std::string("none")
                                                           : absl::StrCat(budget_.budget())},
  };
  return snapshot;
}

}  // namespace actpack::allocator
