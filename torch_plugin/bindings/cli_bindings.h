// actpack._C.run_cli: the `actpack` command line (report/cli.h's RunCli) for the pip
// package's console command, actpack.cli:main.
//
// Usage (inside PYBIND11_MODULE):
//   actpack::torch_plugin::BindCli(m);
// and from Python:
//   exit_code, out, err = actpack._C.run_cli(["report", "run.json"])
#ifndef ACTPACK_TORCH_PLUGIN_BINDINGS_CLI_BINDINGS_H_
#define ACTPACK_TORCH_PLUGIN_BINDINGS_CLI_BINDINGS_H_

#include <pybind11/pybind11.h>

namespace actpack::torch_plugin {

// Adds run_cli(args: list[str]) -> (exit_code: int, out: str, err: str) to `m`.
void BindCli(pybind11::module& m);

}  // namespace actpack::torch_plugin

#endif  // ACTPACK_TORCH_PLUGIN_BINDINGS_CLI_BINDINGS_H_
