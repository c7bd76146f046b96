#include "allocator/testing/alloc_trace.h"

#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace actpack::allocator {
namespace {

constexpr absl::string_view kExpected = "expected 'alloc ID SIZE STREAM' or 'free ID'";

// Live allocations while parsing: ID -> slot and line.
struct Live {
  uint32_t slot;
  size_t line;
};

void TrackPeak(AllocationTrace& trace, size_t live_bytes) {
  if (live_bytes > trace.peak_live_bytes) {
    trace.peak_live_bytes = live_bytes;
    trace.peak_op = trace.ops.size() - 1;
  }
}

}  // namespace

uint32_t TraceBuilder::Alloc(size_t bytes, uint64_t stream) {
  const auto slot = static_cast<uint32_t>(sizes_.size());
  sizes_.push_back(bytes);
  streams_.push_back(stream);
  trace_.ops.push_back({true, slot, bytes, stream});
  ++trace_.allocations;
  live_bytes_ += bytes;
  TrackPeak(trace_, live_bytes_);
  return slot;
}

void TraceBuilder::Free(uint32_t slot) {
  trace_.ops.push_back({false, slot, sizes_[slot], streams_[slot]});
  live_bytes_ -= sizes_[slot];
}

AllocationTrace TraceBuilder::Take() {
  trace_.slots = sizes_.size();
  return std::move(trace_);
}

absl::StatusOr<AllocationTrace> ParseAllocationTrace(absl::string_view text,
                                                     absl::string_view name) {
  AllocationTrace trace;
  trace.name = std::string(name);
  absl::flat_hash_map<uint64_t, Live> live;
  std::vector<size_t> slot_bytes;
  std::vector<uint64_t> slot_streams;
  size_t live_bytes = 0;
  size_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const absl::string_view content =
        absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (content.empty()) continue;
    auto error = [&](auto&&... parts) {
      return absl::InvalidArgumentError(
          absl::StrCat("actpack: ", name, ":", line_number, ": ", parts...));
    };
    const std::vector<absl::string_view> fields =
        absl::StrSplit(content, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const bool is_alloc = fields[0] == "alloc" && fields.size() == 4;
    const bool is_free = fields[0] == "free" && fields.size() == 2;
    if (!is_alloc && !is_free) return error(kExpected, ", got '", content, "'");
    uint64_t id = 0;
    if (!absl::SimpleAtoi(fields[1], &id)) {
      return error("ID '", fields[1], "' is not an unsigned integer (", kExpected, ")");
    }
    if (is_free) {
      auto it = live.find(id);
      if (it == live.end()) return error("free of ID ", id, ", which is not live");
      const uint32_t slot = it->second.slot;
      live.erase(it);
      trace.ops.push_back({false, slot, slot_bytes[slot], slot_streams[slot]});
      live_bytes -= slot_bytes[slot];
      continue;
    }
    uint64_t bytes = 0, stream = 0;
    if (!absl::SimpleAtoi(fields[2], &bytes)) {
      return error("SIZE '", fields[2], "' is not a byte count (", kExpected, ")");
    }
    if (!absl::SimpleAtoi(fields[3], &stream)) {
      return error("STREAM '", fields[3], "' is not an unsigned integer (", kExpected, ")");
    }
    // Bytes of one trace must add up without overflow, and a slot fits in 32 bits.
    if (bytes > (size_t{1} << 48)) return error("SIZE ", bytes, " is over 256 TiB");
    if (slot_bytes.size() == std::numeric_limits<uint32_t>::max()) {
      return error("more than 2^32 - 1 allocations");
    }
    const auto slot = static_cast<uint32_t>(slot_bytes.size());
    auto [it, inserted] = live.try_emplace(id, Live{slot, line_number});
    if (!inserted) {
      return error("alloc of ID ", id, ", which is still live (allocated at line ",
                   it->second.line, ")");
    }
    slot_bytes.push_back(bytes);
    slot_streams.push_back(stream);
    trace.ops.push_back({true, slot, bytes, stream});
    ++trace.allocations;
    live_bytes += bytes;
    TrackPeak(trace, live_bytes);
  }
  if (!live.empty()) {
    // Name the earliest, which is the one a reader looks for first.
    auto first = live.begin();
    for (auto it = live.begin(); it != live.end(); ++it) {
      if (it->second.line < first->second.line) first = it;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "actpack: ", name, ": ", live.size(), " allocation(s) never freed (first: ID ",
        first->first, " at line ", first->second.line, "); a trace must free everything"));
  }
  if (trace.ops.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("actpack: ", name, ": no operations (", kExpected, ")"));
  }
  trace.slots = slot_bytes.size();
  return trace;
}

absl::StatusOr<AllocationTrace> ReadAllocationTrace(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(absl::StrCat("actpack: cannot read the trace file '", path, "'"));
  }
  std::stringstream text;
  text << file.rdbuf();
  const size_t slash = path.find_last_of('/');
  return ParseAllocationTrace(text.str(),
                              slash == std::string::npos ? path : path.substr(slash + 1));
}

std::string FormatAllocationTrace(const AllocationTrace& trace) {
  std::string text = "# actpack allocation trace v1\n";
  for (const TraceOp& op : trace.ops) {
    if (op.is_alloc) {
      absl::StrAppend(&text, "alloc ", op.slot, " ", op.bytes, " ", op.stream, "\n");
    } else {
      absl::StrAppend(&text, "free ", op.slot, "\n");
    }
  }
  return text;
}

}  // namespace actpack::allocator
