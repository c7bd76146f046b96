#include "allocator/system_memory.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
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

// The VmFlags line of the mapping that holds `address` (/proc/self/smaps), or "" if none does.
std::string MappingFlags(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto target = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= target && target < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// Segments of 2 MiB and more start on a huge-page boundary and are advised for transparent huge
// pages, so a fresh segment costs a page fault per 2 MiB, not per 4 KiB (host_memory_resource.cc).
// Whether the kernel then backs them with huge pages depends on its setting and its free memory,
// so the test checks the request: the alignment, and the advice in the mapping's flags ("hg").
TEST(SystemMemoryTest, SegmentsFromTwoMiBUpStartOnAHugePageAndAskForHugePages) {
  HostMemoryResource host;
  const bool kernel_has_thp =
      std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
  for (size_t bytes : {2_MiB, 4_MiB, 6_MiB + 256, 25_MiB}) {
    void* p = *host.Allocate(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 2_MiB, 0u) << bytes;
    std::memset(p, 3, bytes);
    if (kernel_has_thp) EXPECT_NE(MappingFlags(p).find(" hg"), std::string::npos) << bytes;
    host.Deallocate(p, bytes);
  }
  void* small = *host.Allocate(1_MiB);  // below a huge page: plain pages, no advice
  EXPECT_EQ(MappingFlags(small).find(" hg"), std::string::npos);
  host.Deallocate(small, 1_MiB);
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

// Remap keeps a mapping's pages instead of handing them back and faulting fresh ones in: a
// shrink stays where it is, a growth lands on a huge-page boundary from 2 MiB up with its
// pages moved (their bytes are the old ones), and the resident size grows by what is new only.
TEST(SystemMemoryTest, RemapKeepsTheMappingsPages) {
  HostMemoryResource host;
  auto* p = static_cast<unsigned char*>(*host.Allocate(4_MiB));
  std::memset(p, 5, 4_MiB);
  absl::StatusOr<void*> shrunk = host.Remap(p, 4_MiB, 3_MiB);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status();
  EXPECT_EQ(*shrunk, p);
  EXPECT_EQ(host.GetUsage().reserved_bytes, 3_MiB);
  EXPECT_EQ(p[3_MiB - 1], 5);

  auto* q = static_cast<unsigned char*>(*host.Allocate(768_KiB));
  std::memset(q, 9, 768_KiB);
  const size_t before = *ResidentBytes();
  absl::StatusOr<void*> grown = host.Remap(q, 768_KiB, 6_MiB);
  ASSERT_TRUE(grown.ok()) << grown.status();
  auto* g = static_cast<unsigned char*>(*grown);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(g) % 2_MiB, 0u);
  EXPECT_EQ(g[0], 9);
  EXPECT_EQ(g[768_KiB - 1], 9);
  EXPECT_EQ(g[768_KiB], 0);  // fresh pages after the moved ones
  EXPECT_LE(*ResidentBytes(), before + 2_MiB);  // the moved pages were not copied
  EXPECT_EQ(host.GetUsage().reserved_bytes, 3_MiB + 6_MiB);

  // Below the mapping threshold an allocation comes from the C library: no remap.
  void* small = *host.Allocate(64_KiB);
  EXPECT_TRUE(absl::IsUnimplemented(host.Remap(small, 64_KiB, 1_MiB).status()));
  host.Deallocate(small, 64_KiB);
  host.Deallocate(p, 3_MiB);
  host.Deallocate(g, 6_MiB);
  EXPECT_EQ(host.GetUsage().reserved_bytes, 0u);
}

}  // namespace
}  // namespace actpack::allocator
