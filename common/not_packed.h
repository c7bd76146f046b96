// The one name of "not packed": a saved tensor kept as it is (no copy, no codec). It is the
// user's codec setting ("none"), the planner's choice, a saved tensor's codec in the run report
// (format version 2; version 1 wrote "kept", which the reader reads as this) and the docs'.
#ifndef ACTPACK_COMMON_NOT_PACKED_H_
#define ACTPACK_COMMON_NOT_PACKED_H_

#include "absl/strings/string_view.h"

namespace actpack {

inline constexpr absl::string_view kNotPacked = "none";

}  // namespace actpack

#endif  // ACTPACK_COMMON_NOT_PACKED_H_
