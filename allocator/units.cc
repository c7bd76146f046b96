#include "allocator/units.h"

#include "absl/strings/str_format.h"

namespace actpack::allocator {

std::string FormatBytes(size_t bytes) {
  if (bytes < kKiB) return absl::StrFormat("%d B", bytes);
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / kKiB;
  int unit = 0;
  // Move up while the value would still print as >= 1 in the next unit; "1024.00 KiB" would be
  // an odd way to write 1 MiB, so round before comparing.
  while (unit + 1 < 5 && value >= 1024.0 - 0.005) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

}  // namespace actpack::allocator
