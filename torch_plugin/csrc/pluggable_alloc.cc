#include "torch_plugin/csrc/pluggable_alloc.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "allocator/allocator_stack.h"
#include "allocator/device_allocator.h"
#include "torch_plugin/csrc/tensor_adapter.h"

namespace actpack::torch_plugin {
namespace {

// The last failure's reason, and whether one is recorded: a success reads the flags alone, so
// the allocation path takes the lock only after a failure.
struct LastError {
  std::mutex mutex;
  std::string message;
  std::atomic<bool> set{false};
  std::atomic<bool> called{false};  // actpack_torch_alloc ran in this process
};

LastError& Last() {
  static LastError* last = new LastError();  // never destroyed: frees may run at exit
  return *last;
}

void Record(const absl::Status& status) {
  LastError& last = Last();
  last.called.store(true, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(last.mutex);
  last.message = std::string(status.message());
  last.set.store(true, std::memory_order_release);
}

void ClearAfterSuccess() {
  LastError& last = Last();
  if (!last.called.load(std::memory_order_relaxed)) {
    last.called.store(true, std::memory_order_relaxed);
  }
  if (!last.set.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(last.mutex);
  last.message.clear();
  last.set.store(false, std::memory_order_release);
}

[[noreturn]] void Throw(const absl::Status& status, int device) {
  Record(status);
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    // "CUDA out of memory." first, as torch's own caching allocator words it: code that tells
    // an out-of-memory error by its text (Lightning's batch-size finder, accelerate's
    // find_executable_batch_size) recognizes it too.
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Device ", device, ": ",
                     std::string(status.message()));
  }
  ThrowIfError(status);
  TORCH_CHECK(false, "actpack: allocation failed with an OK status");  // unreachable
}

}  // namespace

std::optional<std::string> LastTorchAllocError() {
  LastError& last = Last();
  if (!last.called.load(std::memory_order_relaxed)) return std::nullopt;
  std::lock_guard<std::mutex> lock(last.mutex);
  return last.message;
}

}  // namespace actpack::torch_plugin

extern "C" void* actpack_torch_alloc(size_t size, int device, void* stream) {
  using actpack::torch_plugin::ClearAfterSuccess;
  using actpack::torch_plugin::Throw;
  absl::StatusOr<actpack::allocator::AllocatorStack*> stack =
      actpack::allocator::DeviceAllocator(device);
  if (!stack.ok()) Throw(stack.status(), device);
  absl::StatusOr<void*> ptr = (*stack)->Allocate(size, stream);
  if (!ptr.ok()) Throw(ptr.status(), device);
  ClearAfterSuccess();
  return *ptr;
}
