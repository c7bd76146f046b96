// vmm_memory_resource.h — a CUDA backend over the driver's virtual memory management: segments
// are address ranges mapped onto physical granules, and a segment a pool gives back becomes
// part of the next one without cudaFree, cudaMalloc or any call that waits for the device.
//
// A caching pool under a budget is at its cap every step: it gives a free segment back so that
// a segment of another size fits. Over cudaMalloc that is a cudaFree (which synchronizes the
// device) and a cudaMalloc per handover. Here:
//  * Physical memory is created in granules (cuMemCreate; 2 MiB on current GPUs) and kept: a
//    segment given back leaves its granules mapped where they are, free for the next segment.
//    They go back to the device only on EmptyCache and at destruction.
//  * Segments are address ranges of an arena (cuMemAddressReserve: twice the device's memory,
//    more arenas when that runs out). A new segment takes, in this order: the smallest run of
//    addresses mapped to free granules that fits it (no driver call at all; neighbours a pool
//    gave back separately have merged), else the window of free and unmapped address space
//    that holds the most such addresses, whose unmapped part gets free granules mapped there
//    too (cuMemMap, cuMemSetAccess), else new granules (cuMemCreate).
//  * A granule mapped at a new address stays mapped at its old ones (aliases), so the layouts a
//    periodic pattern needs are all mapped after warm-up and later handovers make no driver
//    call. Only one segment at a time holds a granule: an address is usable only while its
//    granule is free. Past 8 mappings per granule held, the surplus aliases are unmapped.
//  * Ordering, never a host wait: every granule carries the event recorded on its last
//    segment's stream when that segment was given back (the pool gives a segment back only
//    once all work on it is ordered on its own stream). A new segment waits for those events
//    (cudaStreamWaitEvent; nothing on the same stream) before the pointer is returned, so no
//    granule is used by new work before the old work is ordered before it.
//  * An address is unmapped (cuMemUnmap) only once the event of the last segment that covered
//    it is seen complete (cudaEventQuery, polled on later calls, never waited for), or when a
//    failing Allocate undoes a mapping it made, or at destruction after waiting for every
//    event: no address is unmapped while work queued on it may still run. A granule is
//    released (cuMemRelease) only with no mapping left and no segment holding it.
// Failing driver calls leave the resource as it was: what a failing Allocate mapped or created
// is undone, and the error is kResourceExhausted for out of memory (device full), kInternal
// otherwise.
//
// The granularity is AllocationGranularity(): a CachingPool above sizes segments in whole
// granules. GetUsage: reserved_bytes is the physical memory held, allocated_bytes the part the
// pool's segments map; the rest is cached here (the pool reports it as upstream_cached_bytes
// and counts it against a reserve limit).
//
// Memory is accessible from its own device only (cuMemSetAccess for `device`); peer access to
// it from other devices is not granted. Not exportable through CUDA IPC (no shareable handle
// type is requested).
//
// Example:
//   absl::StatusOr<std::unique_ptr<VmmMemoryResource>> vmm = VmmMemoryResource::Create(0);
//   if (!vmm.ok()) ... fall back to CudaMemoryResource (the status says why)
//   CudaStreamEvents events(0);
//   CachingPool pool(vmm->get(), &events);
#ifndef ACTPACK_ALLOCATOR_VMM_MEMORY_RESOURCE_H_
#define ACTPACK_ALLOCATOR_VMM_MEMORY_RESOURCE_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/memory_resource.h"

namespace actpack::allocator {

// VirtualMemorySupport
//
// OK when `device` can serve a VmmMemoryResource: the driver's virtual memory calls resolve
// through cudaGetDriverEntryPoint and the device reports
// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED. Otherwise why not: kUnimplemented
// without CUDA, kUnavailable where the driver or device lacks it, the CUDA error otherwise.
absl::Status VirtualMemorySupport(int device);

class VmmMemoryResource final : public MemoryResource {
 public:
  // What the resource holds now, for tests and reports.
  struct State {
    size_t physical_bytes = 0;  // granules held (cuMemCreate'd, not yet released)
    size_t segment_bytes = 0;   // mapped by live segments
    size_t free_bytes = 0;      // mapped, free for the next segment
    size_t pending_release_bytes = 0;  // given back (EmptyCache), waiting for their last work
    size_t mapped_bytes = 0;           // address space mapped, every alias of a granule counted
    size_t retiring_mappings = 0;      // granule mappings to unmap once their last work is done
    size_t arenas = 0;                 // address reservations
  };

  // Create
  //
  // A resource on `device`, or why there cannot be one (VirtualMemorySupport's answer, or the
  // failing call). `arena_bytes` sizes each address reservation (0: twice the device's memory).
  static absl::StatusOr<std::unique_ptr<VmmMemoryResource>> Create(int device,
                                                                   size_t arena_bytes = 0);
  // Waits for the work on every segment's memory (a host wait, at teardown only), then unmaps
  // and releases everything. Segments still allocated are released with it.
  ~VmmMemoryResource() override;

  int device() const;
  State GetState() const;

 private:
  class Impl;
  explicit VmmMemoryResource(std::unique_ptr<Impl> impl);

  absl::StatusOr<void*> DoAllocate(size_t bytes, Stream stream, size_t reserve_limit) override;
  void DoDeallocate(void* ptr, size_t bytes, Stream stream) override;
  // Gives every free granule back: at once where its last work is done, else once it is (a
  // later call sees it; nothing waits). Returns the bytes released now.
  size_t DoEmptyCache() override;
  MemoryUsage DoGetUsage() const override;
  size_t DoAllocationGranularity() const override;

  std::unique_ptr<Impl> impl_;
};

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_VMM_MEMORY_RESOURCE_H_
