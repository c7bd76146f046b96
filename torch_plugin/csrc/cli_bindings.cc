#include "torch_plugin/csrc/cli_bindings.h"

#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "tools/report.h"

namespace actpack::torch_plugin {

void BindCli(pybind11::module& m) {
  m.def(
      "run_cli",
      [](const std::vector<std::string>& args) {
        std::string out;
        std::string err;
        int exit_code = 0;
        {
          // Reading and rendering reports touches no Python object.
          pybind11::gil_scoped_release release;
          exit_code = tools::RunCli(args, &out, &err);
        }
        return pybind11::make_tuple(exit_code, out, err);
      },
      pybind11::arg("args"),
      "Runs the actpack command line (report, diff, plot, plan, snapshot) on `args` (without "
      "the program name); returns (exit_code, stdout text, stderr text).");
}

}  // namespace actpack::torch_plugin
