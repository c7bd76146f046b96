// Whole files in and out for the report's readers and writers, with the messages the CLI
// prints: "PATH: cannot read: <the system's reason>", "PATH: cannot write: ...".
//
// Usage:
//   absl::StatusOr<std::string> text = ReadFile("run.json");
//   absl::Status written = WriteFile("memory.svg", svg);
#ifndef ACTPACK_REPORT_FILES_H_
#define ACTPACK_REPORT_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace actpack::report {

// The contents of the file at `path`; kNotFound / kPermissionDenied / kInvalidArgument naming
// the file and the system's reason when it cannot be read.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `contents` to `path`; kInvalidArgument naming the file and the system's reason.
absl::Status WriteFile(const std::string& path, absl::string_view contents);

}  // namespace actpack::report

#endif  // ACTPACK_REPORT_FILES_H_
