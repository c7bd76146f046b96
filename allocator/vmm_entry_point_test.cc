// The VMM backend in a process whose driver entry points are not resolved yet: a failure to
// resolve them leaves the backend unavailable with the reason, the stack serves from cudaMalloc,
// and the next attempt resolves them. (Its own binary: the process resolves them once.)
#include <string>

#include "allocator/allocator_stack.h"
#include "allocator/units.h"
#include "allocator/vmm_memory_resource.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if defined(CUDAEMU)
#include "cudaemu/control.h"
#endif

namespace actpack::allocator {
namespace {

using ::testing::HasSubstr;
using namespace literals;

#if !defined(CUDAEMU)

TEST(VmmEntryPointTest, NeedsTheEmulator) {
  GTEST_SKIP() << "this test drives the CUDA emulator (--config=cudaemu)";
}

#else

TEST(VmmEntryPointTest, AFailedResolutionFallsBackToCudaMallocAndIsRetried) {
  cudaemu::FailCall("cudaGetDriverEntryPointByVersion", 1, cudaErrorNotSupported);
  {
    AllocatorStack stack(Backend::kCuda, 0, AllocatorConfig{});
    EXPECT_THAT(stack.backend_description(), HasSubstr("cudaMalloc (virtual memory management "
                                                       "unavailable"));
    EXPECT_THAT(stack.backend_description(), HasSubstr("cudaErrorNotSupported"));
    EXPECT_THAT(stack.backend_description(), HasSubstr("cudaGetDriverEntryPointByVersion"));
    void* p = *stack.Allocate(4_MiB);
    stack.Free(p);
  }
  (void)cudaGetLastError();
  EXPECT_TRUE(VirtualMemorySupport(0).ok());
  AllocatorStack stack(Backend::kCuda, 0, AllocatorConfig{});
  EXPECT_THAT(stack.backend_description(), HasSubstr("CUDA virtual memory"));
  void* p = *stack.Allocate(4_MiB);
  stack.Free(p);
}

#endif  // CUDAEMU

}  // namespace
}  // namespace actpack::allocator
