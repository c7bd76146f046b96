#include "allocator/system_memory.h"

#include <cstring>
#include <fstream>
#include <string>

#include "allocator/host_memory_resource.h"
#include "allocator/units.h"
#include "gtest/gtest.h"

namespace actpack::allocator {
namespace {

using namespace literals;

TEST(SystemMemoryTest, ResidentSizeFollowsTouchedMemoryAndThePeakResets) {
  HostMemoryResource host;
  ASSERT_TRUE(ResetPeakResident().ok());
  const size_t before = *ResidentBytes();
  absl::StatusOr<void*> p = host.Allocate(64_MiB);
  ASSERT_TRUE(p.ok());
  std::memset(*p, 1, 64_MiB);  // resident once touched
  const size_t touched = *ResidentBytes();
  EXPECT_GE(touched, before + 60_MiB);
  // A mapped segment goes back to the operating system when freed: no heap keeps it.
  host.Deallocate(*p, 64_MiB);
  const size_t after = *ResidentBytes();
  EXPECT_LE(after, touched - 60_MiB);
  // The kernel batches its per-thread resident counts (up to 64 pages apart): allow 1 MiB.
  EXPECT_GE(*PeakResidentBytes() + 1_MiB, touched);
  ASSERT_TRUE(ResetPeakResident().ok());
  EXPECT_LT(*PeakResidentBytes(), touched - 60_MiB);
}

TEST(SystemMemoryTest, MeterReadsEachWindowsPeakAboveTheStart) {
  HostMemoryResource host;
  ResidentPeakMeter meter;
  meter.Start();
  void* a = *host.Allocate(48_MiB);
  std::memset(a, 1, 48_MiB);
  host.Deallocate(a, 48_MiB);
  const size_t first = meter.TakePeak();
  EXPECT_GE(first, 46_MiB);
  EXPECT_LE(first, 56_MiB);
  void* b = *host.Allocate(16_MiB);
  std::memset(b, 1, 16_MiB);
  host.Deallocate(b, 16_MiB);
  const size_t second = meter.TakePeak();  // its own window: not the first one's 48 MiB
  EXPECT_GE(second, 14_MiB);
  EXPECT_LE(second, 24_MiB);
}

// What "80%" of the host is taken of: the kernel's MemTotal (/proc/meminfo), to the byte.
TEST(SystemMemoryTest, PhysicalMemoryIsTheKernelsMemTotal) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  while (meminfo >> key >> kib && key != "MemTotal:") meminfo.ignore(1 << 10, '\n');
  ASSERT_EQ(key, "MemTotal:");
  EXPECT_EQ(PhysicalMemoryBytes(), kib * 1024);
}

// Freed segments of every pool size class leave the process: each is its own mapping.
TEST(SystemMemoryTest, EverySegmentSizeIsReturned) {
  HostMemoryResource host;
  for (size_t bytes : {1_MiB, 2_MiB, 4_MiB, 20_MiB, 25_MiB}) {
    const size_t before = *ResidentBytes();
    void* blocks[8];
    for (void*& b : blocks) {
      b = *host.Allocate(bytes);
      std::memset(b, 7, bytes);
    }
    for (void* b : blocks) host.Deallocate(b, bytes);
    EXPECT_LE(*ResidentBytes(), before + 1_MiB) << bytes;
  }
}

}  // namespace
}  // namespace actpack::allocator
