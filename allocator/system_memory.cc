#include "allocator/system_memory.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace actpack::allocator {
namespace {

// The value of a "Field:   1234 kB" line of /proc/self/status, in bytes.
absl::StatusOr<size_t> StatusField(const char* field) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) {
    return absl::UnavailableError("actpack: cannot read /proc/self/status (not Linux?)");
  }
  char line[256];
  const size_t length = std::strlen(field);
  size_t value = 0;
  bool found = false;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long kib = 0;
    if (std::strncmp(line, field, length) == 0 && line[length] == ':' &&
        std::sscanf(line + length + 1, "%llu", &kib) == 1) {
      value = static_cast<size_t>(kib) * 1024;
      found = true;
      break;
    }
  }
  std::fclose(f);
  if (!found) {
    return absl::UnavailableError(absl::StrCat("actpack: no ", field, " in /proc/self/status"));
  }
  return value;
}

}  // namespace

absl::StatusOr<size_t> ResidentBytes() { return StatusField("VmRSS"); }

absl::StatusOr<size_t> PeakResidentBytes() { return StatusField("VmHWM"); }

absl::Status ResetPeakResident() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) {
    return absl::UnavailableError("actpack: cannot open /proc/self/clear_refs to reset VmHWM");
  }
  const bool written = std::fputs("5", f) >= 0;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    return absl::UnavailableError("actpack: resetting VmHWM through /proc/self/clear_refs failed");
  }
  return absl::OkStatus();
}

void ResidentPeakMeter::Start() {
  absl::StatusOr<size_t> resident = ResidentBytes();
  available_ = resident.ok() && ResetPeakResident().ok();
  start_ = available_ ? *resident : 0;
}

size_t ResidentPeakMeter::TakePeak() {
  if (!available_) return 0;
  absl::StatusOr<size_t> peak = PeakResidentBytes();
  if (!peak.ok() || !ResetPeakResident().ok()) return 0;
  return *peak > start_ ? *peak - start_ : 0;
}

size_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<size_t>(pages) * page_size : 0;
}

}  // namespace actpack::allocator
