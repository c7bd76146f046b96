#include "torch_plugin/bindings/cli_bindings.h"

#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "report/cli.h"
#include "report/plan.h"
#include "runtime/policy.h"

namespace actpack::torch_plugin {

void BindCli(pybind11::module& m) {
  m.attr("PLAN_DEFAULT_HEADROOM_NOTE") = std::string(report::kDefaultHeadroomNote);
  m.def(
      "run_cli",
      [](const std::vector<std::string>& args) {
        std::string out;
        std::string err;
        int exit_code = 0;
        {
          // Reading and rendering reports touches no Python object.
          pybind11::gil_scoped_release release;
          exit_code = report::RunCli(args, &out, &err);
        }
        return pybind11::make_tuple(exit_code, out, err);
      },
      pybind11::arg("args"),
      "Runs the actpack command line (report, diff, plot, plan, snapshot) on `args` (without "
      "the program name); returns (exit_code, stdout text, stderr text).");
  // The planner's formula, once (runtime/policy.h): actpack.plan answers with what
  // `actpack plan` computes.
  m.def(
      "_max_batch_size",
      [](uint64_t budget_bytes, uint64_t fixed_bytes, uint64_t per_sample_bytes,
         double headroom) -> std::optional<uint64_t> {
        return runtime::MaxBatchSize(runtime::UsableBytes(budget_bytes, headroom), fixed_bytes,
                                     per_sample_bytes);
      },
      pybind11::arg("budget_bytes"), pybind11::arg("fixed_bytes"),
      pybind11::arg("per_sample_bytes"), pybind11::arg("headroom"),
      "The largest batch the planner's model fits in the budget less the headroom (None: any).");
}

}  // namespace actpack::torch_plugin
