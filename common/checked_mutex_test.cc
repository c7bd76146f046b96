#include "common/checked_mutex.h"

#include <thread>

#include "gtest/gtest.h"

namespace actpack {
namespace {

TEST(CheckedMutexTest, LockingItAgainOnTheSameThreadStopsTheProgramNamingIt) {
  CheckedMutex mu("example::mu_");
  EXPECT_DEATH(
      {
        CheckedLock outer(&mu);
        CheckedLock inner(&mu);
      },
      "re-entered example::mu_");
}

TEST(CheckedMutexTest, AnAllocationWhileHoldingOneStopsTheProgramNamingIt) {
  CheckedMutex mu("example::mu_");
  EXPECT_DEATH(
      {
        CheckedLock lock(&mu);
        CheckNoneHeld("allocating a buffer");
      },
      "allocating a buffer while holding example::mu_");
}

TEST(CheckedMutexTest, EachThreadKnowsOnlyWhatItHolds) {
  CheckedMutex a("a"), b("b");
  {
    CheckedLock lock_a(&a);
    EXPECT_TRUE(a.HeldByThisThread());
    EXPECT_EQ(InnermostHeldByThisThread(), &a);
    {
      CheckedLock lock_b(&b);
      EXPECT_EQ(InnermostHeldByThisThread(), &b);
    }
    EXPECT_EQ(InnermostHeldByThisThread(), &a);
    bool other_thread_holds = true;
    std::thread([&] {
      other_thread_holds = a.HeldByThisThread();
      CheckNoneHeld("another thread allocating");  // returns: that thread holds nothing
    }).join();
    EXPECT_FALSE(other_thread_holds);
  }
  EXPECT_EQ(InnermostHeldByThisThread(), nullptr);
  CheckNoneHeld("allocating with nothing held");
  // Taken again after its release: no re-entry.
  CheckedLock again(&a);
}

}  // namespace
}  // namespace actpack
