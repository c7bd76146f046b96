// units.h — byte-size literals and human-readable byte counts.
//
// Sizes in the allocator are plain `size_t` byte counts. Tests and configuration read better with
// binary-unit literals, and error messages read better with "4.00 MiB" than "4194304".
//
// Example:
//   using namespace actpack::allocator::literals;
//   size_t budget = 6_GiB;
//   std::string text = FormatBytes(budget);  // "6.00 GiB"
#ifndef ACTPACK_ALLOCATOR_UNITS_H_
#define ACTPACK_ALLOCATOR_UNITS_H_

#include <cstddef>
#include <string>

namespace actpack::allocator {

inline constexpr size_t kKiB = size_t{1} << 10;
inline constexpr size_t kMiB = size_t{1} << 20;
inline constexpr size_t kGiB = size_t{1} << 30;

namespace literals {
constexpr size_t operator""_KiB(unsigned long long n) { return static_cast<size_t>(n) * kKiB; }
constexpr size_t operator""_MiB(unsigned long long n) { return static_cast<size_t>(n) * kMiB; }
constexpr size_t operator""_GiB(unsigned long long n) { return static_cast<size_t>(n) * kGiB; }
}  // namespace literals

// RoundUp
//
// The smallest multiple of `multiple` (> 0) that is >= `bytes`.
constexpr size_t RoundUp(size_t bytes, size_t multiple) {
  return (bytes + multiple - 1) / multiple * multiple;
}

// ShareOf
//
// `fraction` (in (0, 1]) of `total` bytes, rounded down: a budget of "80%" and torch's
// set_per_process_memory_fraction on actpack's allocator come to the same bytes.
constexpr size_t ShareOf(double fraction, size_t total) {
  return static_cast<size_t>(fraction * static_cast<double>(total));
}

// FormatBytes
//
// Below 1 KiB the exact count ("0 B", "512 B"); above, two decimals in the largest binary unit
// that keeps the number >= 1 ("1.50 KiB", "4.00 MiB", "5.98 GiB", "1.00 TiB").
std::string FormatBytes(size_t bytes);

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_UNITS_H_
