#include "allocator/fault_injection_adaptor.h"

#include "absl/strings/str_cat.h"

namespace actpack::allocator {

void FaultInjectionAdaptor::FailAt(uint64_t k) {
  std::lock_guard<std::mutex> lock(mutex_);
  fail_at_ = k;
  allocations_ = 0;
  failed_ = false;
}

uint64_t FaultInjectionAdaptor::allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocations_;
}

bool FaultInjectionAdaptor::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

absl::StatusOr<void*> FaultInjectionAdaptor::DoAllocate(size_t bytes, Stream stream,
                                                        size_t reserve_limit) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (++allocations_ == fail_at_) {
      failed_ = true;
      return absl::ResourceExhaustedError(absl::StrCat(
          "actpack: injected failure of allocation #", allocations_, " (", bytes, " bytes)"));
    }
  }
  return upstream()->AllocateWithin(bytes, stream, reserve_limit);
}

void FaultInjectionAdaptor::DoDeallocate(void* ptr, size_t bytes, Stream stream) {
  upstream()->Deallocate(ptr, bytes, stream);
}

}  // namespace actpack::allocator
