#include "allocator/testing/alloc_trace.h"

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace actpack::allocator {
namespace {

using ::testing::HasSubstr;

TEST(ParseAllocationTraceTest, ReadsOpsSlotsAndPeak) {
  const absl::StatusOr<AllocationTrace> trace = ParseAllocationTrace(
      "# actpack allocation trace v1\n"
      "\n"
      "alloc 7 1000 0   # a comment after an op\n"
      "alloc 3 5000 2\n"
      "free 7\n"
      "alloc 7 100 0\r\n"  // an ID reused after its free; CRLF
      "free 3\n"
      "\tfree   7\n",
      "t.trace");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->name, "t.trace");
  ASSERT_EQ(trace->ops.size(), 6u);
  EXPECT_EQ(trace->slots, 3u);  // one per allocation
  EXPECT_EQ(trace->allocations, 3u);
  EXPECT_EQ(trace->peak_live_bytes, 6000u);
  EXPECT_EQ(trace->peak_op, 1u);
  const TraceOp& second_free = trace->ops[4];  // free 3: size and stream of its alloc
  EXPECT_FALSE(second_free.is_alloc);
  EXPECT_EQ(second_free.slot, 1u);
  EXPECT_EQ(second_free.bytes, 5000u);
  EXPECT_EQ(second_free.stream, 2u);
  EXPECT_EQ(trace->ops[3].slot, 2u);  // the reused ID gets a fresh slot
  EXPECT_EQ(trace->ops[5].slot, 2u);
}

struct BadTrace {
  const char* text;
  const char* message;
};

class MalformedTraceTest : public ::testing::TestWithParam<BadTrace> {};

TEST_P(MalformedTraceTest, NamesTheLineAndTheProblem) {
  const absl::StatusOr<AllocationTrace> trace = ParseAllocationTrace(GetParam().text, "bad.trace");
  ASSERT_FALSE(trace.ok());
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(trace.status().message()), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Lines, MalformedTraceTest,
    ::testing::Values(
        BadTrace{"alloc 0 8 0\nallc 1 8 0\n",
                 "actpack: bad.trace:2: expected 'alloc ID SIZE STREAM' or 'free ID', got "
                 "'allc 1 8 0'"},
        BadTrace{"alloc 0 8\n",
                 "actpack: bad.trace:1: expected 'alloc ID SIZE STREAM' or 'free ID', got "
                 "'alloc 0 8'"},
        BadTrace{"free 0 8\n",
                 "actpack: bad.trace:1: expected 'alloc ID SIZE STREAM' or 'free ID', got "
                 "'free 0 8'"},
        BadTrace{"alloc x 8 0\n",
                 "actpack: bad.trace:1: ID 'x' is not an unsigned integer (expected 'alloc ID "
                 "SIZE STREAM' or 'free ID')"},
        BadTrace{"alloc 0 -8 0\n",
                 "actpack: bad.trace:1: SIZE '-8' is not a byte count (expected 'alloc ID SIZE "
                 "STREAM' or 'free ID')"},
        BadTrace{"alloc 0 8 s\n",
                 "actpack: bad.trace:1: STREAM 's' is not an unsigned integer (expected 'alloc "
                 "ID SIZE STREAM' or 'free ID')"},
        BadTrace{"alloc 0 99999999999999999 0\n",
                 "actpack: bad.trace:1: SIZE 99999999999999999 is over 256 TiB"},
        BadTrace{"alloc 0 8 0\nalloc 0 8 0\n",
                 "actpack: bad.trace:2: alloc of ID 0, which is still live (allocated at "
                 "line 1)"},
        BadTrace{"alloc 0 8 0\nfree 0\nfree 0\n",
                 "actpack: bad.trace:3: free of ID 0, which is not live"},
        BadTrace{"alloc 0 8 0\nalloc 1 8 0\nalloc 2 8 0\nfree 1\n",
                 "actpack: bad.trace: 2 allocation(s) never freed (first: ID 0 at line 1); a "
                 "trace must free everything"},
        BadTrace{"# only a comment\n\n",
                 "actpack: bad.trace: no operations (expected 'alloc ID SIZE STREAM' or "
                 "'free ID')"}));

TEST(AllocationTraceTest, FormatReadsBack) {
  TraceBuilder builder("built");
  const uint32_t a = builder.Alloc(1000, 3);
  builder.Temporary(64);
  builder.Free(a);
  const AllocationTrace built = builder.Take();
  EXPECT_EQ(built.peak_live_bytes, 1064u);
  EXPECT_EQ(built.peak_op, 1u);

  const std::string text = FormatAllocationTrace(built);
  EXPECT_EQ(text, "# actpack allocation trace v1\nalloc 0 1000 3\nalloc 1 64 0\nfree 1\nfree 0\n");
  const absl::StatusOr<AllocationTrace> parsed = ParseAllocationTrace(text, "built");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->ops.size(), built.ops.size());
  for (size_t i = 0; i < built.ops.size(); ++i) {
    EXPECT_EQ(parsed->ops[i].is_alloc, built.ops[i].is_alloc) << i;
    EXPECT_EQ(parsed->ops[i].slot, built.ops[i].slot) << i;
    EXPECT_EQ(parsed->ops[i].bytes, built.ops[i].bytes) << i;
    EXPECT_EQ(parsed->ops[i].stream, built.ops[i].stream) << i;
  }
  EXPECT_EQ(parsed->peak_live_bytes, built.peak_live_bytes);
  EXPECT_EQ(parsed->peak_op, built.peak_op);
}

TEST(AllocationTraceTest, MissingFileIsNotFound) {
  const absl::StatusOr<AllocationTrace> trace = ReadAllocationTrace("/nonexistent/x.trace");
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(trace.status().message()), HasSubstr("'/nonexistent/x.trace'"));
}

// The recorded traces in testdata/ (tools/record_trace.py) parse and are real steps: thousands
// of operations, a peak of megabytes.
TEST(AllocationTraceTest, RecordedTracesParse) {
  for (const char* file : {"cnn_step.trace", "transformer_step.trace"}) {
    const absl::StatusOr<AllocationTrace> trace =
        ReadAllocationTrace(std::string("allocator/testdata/") + file);
    ASSERT_TRUE(trace.ok()) << trace.status();
    EXPECT_GT(trace->allocations, 100u) << file;
    EXPECT_GT(trace->peak_live_bytes, size_t{1} << 20) << file;
  }
}

}  // namespace
}  // namespace actpack::allocator
