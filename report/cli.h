// The `actpack` command line: read a run report (report/FORMAT.md) and tell a person where
// the memory went, as text (`report`), as a comparison of two runs (`diff`), as a picture
// (`plot`, an SVG written by hand), as a batch-size plan for another budget (`plan`), or as the
// allocator's memory snapshot for pytorch.org/memory_viz (`snapshot`, a pickle written here).
//
// One implementation, two doors: the Bazel binary //tools:actpack (tools/actpack_main.cc) and
// the `actpack` console command of the pip package (actpack.cli -> actpack._C.run_cli, bound in
// torch_plugin/csrc/cli_bindings.cc). Both call RunCli.
//
// The parts, each its own target: reader.h reads and checks a report (the rules for what a
// report must hold are there), text.h is `report` and `diff`, plan.h `plan`, svg.h `plot` and
// snapshot.h `snapshot`; this file parses the arguments (CLI11) and runs them.
//
// Usage:
//   std::string out, err;
//   int exit_code = RunCli({"plan", "run.json", "--budget", "12GiB"}, &out, &err);
#ifndef ACTPACK_REPORT_CLI_H_
#define ACTPACK_REPORT_CLI_H_

#include <string>
#include <vector>

namespace actpack::report {

// Exit codes of RunCli: 0 done, 2 a usage error, a file that cannot be read as a report, or a
// request the report cannot answer.
inline constexpr int kExitOk = 0;
inline constexpr int kExitBadInput = 2;

// RunCli
//
// The whole command line, without the program name: {"report", "run.json"}, ... (CLI11 parses
// it). Writes what a terminal shows to `out` and `err` (files such as the SVG or the pickle are
// written directly) and returns the exit code: kExitOk (also for -h/--help, the usage on `out`,
// and --version), or kExitBadInput with one line on `err` for a usage error (followed by the
// usage), an unreadable or foreign report, or a request the report cannot answer.
int RunCli(const std::vector<std::string>& args, std::string* out, std::string* err);

}  // namespace actpack::report

#endif  // ACTPACK_REPORT_CLI_H_
