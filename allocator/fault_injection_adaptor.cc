#include "allocator/fault_injection_adaptor.h"

#include "absl/strings/str_cat.h"

namespace actpack::allocator {

void FaultInjectionAdaptor::FailAt(uint64_t k) {
  fail_at_.store(0);
  allocations_.store(0);
  failed_.store(false);
  fail_at_.store(k);
}

uint64_t FaultInjectionAdaptor::allocations() const { return allocations_.load(); }

bool FaultInjectionAdaptor::failed() const { return failed_.load(); }

absl::StatusOr<void*> FaultInjectionAdaptor::DoAllocate(size_t bytes, Stream stream,
                                                        size_t reserve_limit) {
  const uint64_t number = allocations_.fetch_add(1) + 1;
  if (number == fail_at_.load(std::memory_order_relaxed)) {
    failed_.store(true);
    return absl::ResourceExhaustedError(absl::StrCat(
        "actpack: injected failure of allocation #", number, " (", bytes, " bytes)"));
  }
  return upstream()->AllocateWithin(bytes, stream, reserve_limit);
}

void FaultInjectionAdaptor::DoDeallocate(void* ptr, size_t bytes, Stream stream) {
  upstream()->Deallocate(ptr, bytes, stream);
}

}  // namespace actpack::allocator
