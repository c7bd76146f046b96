// Parsing what users write: byte sizes ("6GiB", "512 MiB", "1.5GB", "4096") and budgets
// (a byte size, or a share of the device such as "80%").
//
// Usage:
//   absl::StatusOr<uint64_t> bytes = ParseByteSize("6GiB");             // 6 << 30
//   absl::StatusOr<MemoryLimit> limit = ParseMemoryLimit("80%");        // fraction 0.8
//   uint64_t cap = limit->Resolve(device_total_bytes);
#ifndef ACTPACK_RUNTIME_CONFIG_H_
#define ACTPACK_RUNTIME_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace actpack::runtime {

// The largest size a byte count is read as (a little under 2^63: it fits an int64 with room).
// The Python front end holds int sizes to it too (actpack._C.MAX_SIZE_BYTES).
inline constexpr uint64_t kMaxSizeBytes = 9'200'000'000'000'000'000ull;

// Binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB) units, or plain bytes ("B" optional).
// kInvalidArgument naming the text and what was expected for anything else, negative or zero
// sizes included; `what` names the value in it ("invalid min_bytes '-5': ...").
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text,
                                       absl::string_view what = "memory size");

// A memory budget as a user writes it ("6GiB", "80%"), before it meets a device.
struct MemoryLimit {
  uint64_t bytes = 0;     // an absolute budget, or 0
  double fraction = 0.0;  // a share of the device's memory in (0, 1], or 0

  // The budget in bytes for a device with `device_total` bytes.
  uint64_t Resolve(uint64_t device_total) const;
  std::string ToString() const;
};

absl::StatusOr<MemoryLimit> ParseMemoryLimit(absl::string_view text);

// Parses "key=value,key=value" (the ACTPACK_CONF environment variable) into ordered pairs.
// Every key must be one of `allowed`; kInvalidArgument names the bad key or item, the
// allowed keys, and where the text came from (`source`, e.g. "ACTPACK_CONF").
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseKeyValues(
    absl::string_view text, const std::vector<std::string>& allowed, absl::string_view source);

}  // namespace actpack::runtime

#endif  // ACTPACK_RUNTIME_CONFIG_H_
