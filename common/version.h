// actpack's version, written once: setup.py reads it from this file for the package's metadata,
// and the compiled code gives it to actpack.__version__, `actpack --version` and every report.
#ifndef ACTPACK_COMMON_VERSION_H_
#define ACTPACK_COMMON_VERSION_H_

#define ACTPACK_VERSION "0.1.0"

namespace actpack {

inline constexpr char kVersion[] = ACTPACK_VERSION;

}  // namespace actpack

#endif  // ACTPACK_COMMON_VERSION_H_
