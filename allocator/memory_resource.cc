#include "allocator/memory_resource.h"

#include <algorithm>

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace actpack::allocator {
namespace {

constexpr absl::string_view kReserveLimitPayloadUrl = "actpack.allocator/reserve_limit_exceeded";
constexpr absl::string_view kReserveNeededPayloadUrl = "actpack.allocator/reserve_limit_needed";

}  // namespace

absl::string_view MemoryActionName(MemoryAction action) {
  switch (action) {
    case MemoryAction::kAlloc:
      return "alloc";
    case MemoryAction::kFreeRequested:
      return "free_requested";
    case MemoryAction::kFreeCompleted:
      return "free_completed";
    case MemoryAction::kSegmentAlloc:
      return "segment_alloc";
    case MemoryAction::kSegmentFree:
      return "segment_free";
    case MemoryAction::kOom:
      return "oom";
    case MemoryAction::kAllocRetry:
      return "alloc_retry";
  }
  return "unknown";
}

absl::StatusOr<void*> MemoryResource::DoRemap(void*, size_t, size_t, Stream) {
  return absl::UnimplementedError("actpack: this memory resource cannot remap an allocation");
}

void MemoryResource::DoAddObserver(MemoryObserver* observer) { observers_.push_back(observer); }

void MemoryResource::DoRemoveObserver(MemoryObserver* observer) {
  observers_.erase(std::remove(observers_.begin(), observers_.end(), observer), observers_.end());
}

void ResourceAdaptor::DoAddObserver(MemoryObserver* observer) {
  MemoryResource::DoAddObserver(observer);
  upstream_->AddObserver(observer);
}

void ResourceAdaptor::DoRemoveObserver(MemoryObserver* observer) {
  upstream_->RemoveObserver(observer);
  MemoryResource::DoRemoveObserver(observer);
}

absl::Status ReserveLimitExceeded(absl::string_view message) {
  absl::Status status = absl::ResourceExhaustedError(message);
  status.SetPayload(kReserveLimitPayloadUrl, absl::Cord("1"));
  return status;
}

absl::Status ReserveLimitExceeded(absl::string_view message, size_t needed_bytes) {
  absl::Status status = ReserveLimitExceeded(message);
  status.SetPayload(kReserveNeededPayloadUrl, absl::Cord(absl::StrCat(needed_bytes)));
  return status;
}

bool IsReserveLimitExceeded(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted &&
         status.GetPayload(kReserveLimitPayloadUrl).has_value();
}

std::optional<size_t> ReserveLimitNeeded(const absl::Status& status) {
  if (!IsReserveLimitExceeded(status)) return std::nullopt;
  auto payload = status.GetPayload(kReserveNeededPayloadUrl);
  size_t bytes = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

}  // namespace actpack::allocator
