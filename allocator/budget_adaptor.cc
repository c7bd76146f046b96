#include "allocator/budget_adaptor.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "allocator/units.h"

namespace actpack::allocator {
namespace {

constexpr absl::string_view kSmallestBudgetPayloadUrl = "actpack.allocator/smallest_budget";

// Set while this thread runs pressure callbacks, so that a callback that allocates from the same
// stack and runs out does not start the callbacks over (and recurse without end).
thread_local bool in_pressure_callbacks = false;

}  // namespace

std::optional<size_t> SmallestFittingBudget(const absl::Status& status) {
  auto payload = status.GetPayload(kSmallestBudgetPayloadUrl);
  size_t bytes = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

BudgetAdaptor::BudgetAdaptor(MemoryResource* upstream, size_t budget_bytes)
    : ResourceAdaptor(upstream), budget_(budget_bytes) {}

BudgetAdaptor::CallbackId BudgetAdaptor::AddPressureCallback(PressureCallback callback) {
  std::lock_guard<std::mutex> lock(callbacks_mutex_);
  const CallbackId id = next_callback_id_++;
  callbacks_.emplace_back(id, std::make_shared<const PressureCallback>(std::move(callback)));
  return id;
}

void BudgetAdaptor::RemovePressureCallback(CallbackId id) {
  std::lock_guard<std::mutex> lock(callbacks_mutex_);
  callbacks_.erase(std::remove_if(callbacks_.begin(), callbacks_.end(),
                                  [id](const auto& entry) { return entry.first == id; }),
                   callbacks_.end());
}

absl::StatusOr<void*> BudgetAdaptor::DoAllocate(size_t bytes, Stream stream,
                                                size_t reserve_limit) {
  auto attempt = [&]() {
    return upstream()->AllocateWithin(bytes, stream, std::min(reserve_limit, budget()));
  };
  absl::StatusOr<void*> result = attempt();
  if (result.ok() || result.status().code() != absl::StatusCode::kResourceExhausted) {
    return result;
  }

  // 1. The pool has given back what the request lacks. Emptying the rest of the cache here
  //    would only make later requests go to the device again.
  // 2. Ask the runtime to free memory, retrying after each callback that freed some.
  if (!in_pressure_callbacks) {
    std::vector<std::shared_ptr<const PressureCallback>> callbacks;
    {
      std::lock_guard<std::mutex> lock(callbacks_mutex_);
      for (const auto& entry : callbacks_) callbacks.push_back(entry.second);
    }
    // Cleared on every way out, a throwing callback included.
    struct PressureScope {
      PressureScope() { in_pressure_callbacks = true; }
      ~PressureScope() { in_pressure_callbacks = false; }
    } scope;
    // Rounds until one frees nothing: what a callback frees may not be contiguous with what
    // the request needs (fragmentation), and a second round frees more.
    constexpr int kMaxRounds = 16;
    bool freed = true;
    for (int round = 0; freed && round < kMaxRounds; ++round) {
      freed = false;
      for (const auto& callback : callbacks) {
        const MemoryUsage usage = upstream()->GetUsage();
        const size_t wanted = usage.allocated_bytes + bytes;
        const size_t needed = wanted > budget() ? wanted - budget() : bytes;
        if ((*callback)(needed) == 0) continue;
        freed = true;
        Notify({MemoryAction::kAllocRetry, 0, bytes, bytes, stream});
        result = attempt();
        if (result.ok()) return result;
      }
    }
  }

  // 3. Fail with what a user needs to decide what to do. A tighter limit from an outer budget is
  //    that budget's failure to report: pass its error up unchanged.
  if (reserve_limit < budget() && IsReserveLimitExceeded(result.status())) return result;
  return OutOfBudget(bytes, result.status());
}

absl::Status BudgetAdaptor::OutOfBudget(size_t bytes, const absl::Status& last_error) const {
  const MemoryUsage usage = upstream()->GetUsage();
  const std::string state = absl::StrCat(
      "requested ", FormatBytes(bytes), " with ", FormatBytes(usage.allocated_bytes),
      " in use and ", FormatBytes(usage.cached_bytes() + usage.upstream_cached_bytes),
      " cached; budget ", FormatBytes(budget()));
  if (IsReserveLimitExceeded(last_error)) {
    // A resource that reserves says what it needed; a backend without a pool needs the request
    // on top of what it holds.
    const size_t smallest = ReserveLimitNeeded(last_error).value_or(
        usage.footprint_bytes() + RoundUp(bytes, kAllocationAlignment));
    absl::Status status = absl::ResourceExhaustedError(
        absl::StrCat("actpack: out of budget: ", state,
                     "; the smallest budget that would have fitted it: ", FormatBytes(smallest)));
    status.SetPayload(kSmallestBudgetPayloadUrl, absl::Cord(absl::StrCat(smallest)));
    return status;
  }
  // The device (or an outer limit) ran out before the budget did.
  return absl::ResourceExhaustedError(
      absl::StrCat("actpack: out of memory within the budget: ", state, ": ",
                   last_error.message()));
}

void BudgetAdaptor::DoDeallocate(void* ptr, size_t bytes, Stream stream) {
  upstream()->Deallocate(ptr, bytes, stream);
}

}  // namespace actpack::allocator
