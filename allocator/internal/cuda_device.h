// cuda_device.h — what the allocator's CUDA sources share: a scoped current device, and how
// errors that cannot be returned are reported. Include only where ACTPACK_WITH_CUDA is set.
#ifndef ACTPACK_ALLOCATOR_INTERNAL_CUDA_DEVICE_H_
#define ACTPACK_ALLOCATOR_INTERNAL_CUDA_DEVICE_H_

#include <cuda_runtime_api.h>

#include <cstdio>

#include "absl/status/status.h"
#include "common/cuda_check.h"

namespace actpack::allocator::internal {

// ScopedDevice
//
// Makes `device` current for a scope and restores the previous device, so that allocating for
// one device never changes the caller's current device.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) status_ = ACTPACK_CUDA_STATUS(cudaSetDevice(device));
  }
  ~ScopedDevice() {
    if (status_.ok() && previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

// Errors in the void paths (free, event release) cannot be returned; they are reported and
// otherwise ignored, as PyTorch does for errors during teardown.
inline void ReportCudaError(const absl::Status& status) {
  if (!status.ok()) std::fprintf(stderr, "actpack: %s\n", status.ToString().c_str());
}

}  // namespace actpack::allocator::internal

#endif  // ACTPACK_ALLOCATOR_INTERNAL_CUDA_DEVICE_H_
