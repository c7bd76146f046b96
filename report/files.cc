#include "report/files.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace actpack::report {
namespace {

absl::Status ReadError(absl::string_view file, int error_number) {
  const std::string message = absl::StrCat(file, ": cannot read: ", std::strerror(error_number));
  if (error_number == ENOENT) return absl::NotFoundError(message);
  if (error_number == EACCES) return absl::PermissionDeniedError(message);
  return absl::InvalidArgumentError(message);
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return ReadError(path, errno);
  std::string text;
  char chunk[1 << 16];
  size_t got = 0;
  while ((got = std::fread(chunk, 1, sizeof(chunk), file)) > 0) text.append(chunk, got);
  const int read_errno = std::ferror(file) ? errno : 0;
  std::fclose(file);
  if (read_errno != 0) return ReadError(path, read_errno);
  return text;
}

absl::Status WriteFile(const std::string& path, absl::string_view contents) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot write: ", std::strerror(errno)));
  }
  const size_t written = std::fwrite(contents.data(), 1, contents.size(), file);
  const bool closed = std::fclose(file) == 0;
  if (written != contents.size() || !closed) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot write: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace actpack::report
