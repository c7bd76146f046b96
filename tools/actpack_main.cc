// The `actpack` command line as a Bazel binary; everything it does is report/cli.h's RunCli.
//
//   bazel run //tools:actpack -- report run.json
//   bazel run //tools:actpack -- plot run.json -o memory.svg
#include <cstdio>
#include <string>
#include <vector>

#include "report/cli.h"

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  std::string out;
  std::string err;
  const int exit_code = actpack::report::RunCli(args, &out, &err);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  std::fwrite(err.data(), 1, err.size(), stderr);
  return exit_code;
}
