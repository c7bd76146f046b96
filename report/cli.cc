#include "report/cli.h"

#include <algorithm>
#include <map>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/version.h"
#include "report/files.h"
#include "report/plan.h"
#include "report/reader.h"
#include "report/snapshot.h"
#include "report/svg.h"
#include "report/text.h"
#include "runtime/config.h"
#include "runtime/json.h"

namespace actpack::report {
namespace {

// ---------------------------------------------------------------------------------------------
// The command line, declared once with CLI11: the subcommands, their operands and options,
// bound to Args. CLI11 parses and refuses what does not fit; the usage text is read back from
// the same declarations.

// What the command line asked for.
struct Args {
  std::string run;     // RUN.json: report, plot, plan, snapshot
  std::string before;  // BEFORE.json and AFTER.json: diff
  std::string after;
  std::string output;  // -o/--output: plot, snapshot
  std::string budget;  // --budget: plan
  bool json = false;   // --json: report, plan
};

using Command = int (*)(const Args& args, std::string* out, std::string* err);

// The declarations, bound to `args`: one subcommand per command, in the usage text's order, and
// the command each runs. Parsing throws CLI::ParseError: CLI::CallForHelp for -h/--help,
// CLI::CallForVersion for --version, any other for a usage error.
struct Cli {
  explicit Cli(Args* args);

  CLI::App app;
  std::map<const CLI::App*, Command> commands;
};

// "plot RUN.json -o MEMORY.svg", "report RUN.json [--json]".
std::string Synopsis(const CLI::App& command) {
  std::string text = command.get_name();
  for (const CLI::Option* option : command.get_options()) {
    if (option == command.get_help_ptr()) continue;
    std::string usage = option->get_positional()         ? option->get_name()
                        : option->get_snames().empty() ? "--" + option->get_lnames().front()
                                                       : "-" + option->get_snames().front();
    if (!option->get_positional() && option->get_expected_max() > 0) {
      absl::StrAppend(&usage, " ", option->get_type_name());
    }
    absl::StrAppend(&text, " ", option->get_required() ? usage : absl::StrCat("[", usage, "]"));
  }
  return text;
}

std::string Usage() {
  Args unused;
  const Cli cli(&unused);
  std::string text = "usage: actpack <command> [options]\n";
  size_t width = 0;
  for (const CLI::App* command : cli.app.get_subcommands(nullptr)) {
    width = std::max(width, Synopsis(*command).size());
  }
  for (const CLI::App* command : cli.app.get_subcommands(nullptr)) {
    const std::string synopsis = Synopsis(*command);
    absl::StrAppend(&text, "  actpack ", synopsis, std::string(width - synopsis.size() + 3, ' '),
                    command->get_description(), "\n");
  }
  return text;
}

int UsageError(absl::string_view problem, std::string* err) {
  absl::StrAppend(err, "actpack: ", problem, "\n", Usage());
  return kExitBadInput;
}

int InputError(absl::string_view command, const absl::Status& status, std::string* err) {
  absl::StrAppend(err, "actpack ", command, ": ", status.message(), "\n");
  return kExitBadInput;
}

int ReportCommand(const Args& args, std::string* out, std::string* err) {
  absl::StatusOr<RunReport> report = LoadRunReport(args.run);
  if (!report.ok()) return InputError("report", report.status(), err);
  absl::StrAppend(out, args.json ? json::Serialize(SummarizeReport(*report)) + "\n"
                                 : FormatReportText(*report));
  return kExitOk;
}

int DiffCommand(const Args& args, std::string* out, std::string* err) {
  absl::StatusOr<RunReport> before = LoadRunReport(args.before);
  if (!before.ok()) return InputError("diff", before.status(), err);
  absl::StatusOr<RunReport> after = LoadRunReport(args.after);
  if (!after.ok()) return InputError("diff", after.status(), err);
  absl::StrAppend(out, FormatDiffText(*before, *after));
  return kExitOk;
}

int PlotCommand(const Args& args, std::string* out, std::string* err) {
  absl::StatusOr<RunReport> report = LoadRunReport(args.run);
  if (!report.ok()) return InputError("plot", report.status(), err);
  if (absl::Status written = WriteFile(args.output, RenderMemorySvg(*report)); !written.ok()) {
    return InputError("plot", written, err);
  }
  absl::StrAppend(out, "wrote ", args.output, "\n");
  return kExitOk;
}

int PlanCommand(const Args& args, std::string* out, std::string* err) {
  absl::StatusOr<runtime::MemoryLimit> budget = runtime::ParseMemoryLimit(args.budget);
  if (!budget.ok()) {
    absl::string_view problem = budget.status().message();
    absl::ConsumePrefix(&problem, "actpack: ");
    return UsageError(absl::StrCat("plan --budget: ", problem), err);
  }
  if (budget->bytes == 0) {
    // A share needs the device's size, which a report does not record (and this machine's
    // device need not be the run's).
    return UsageError(absl::StrCat("plan --budget ", args.budget, ": a share of the device "
                                   "needs the device's memory size, which a run report does not "
                                   "record; give a size such as 12GiB"),
                      err);
  }
  absl::StatusOr<RunReport> report = LoadRunReport(args.run);
  if (!report.ok()) return InputError("plan", report.status(), err);
  // Re-planning needs the planner's fixed and per-sample memory model; without it any batch
  // size printed here would be invented.
  if (!report->planner.has_value()) {
    absl::StrAppend(err, "actpack plan: ", report->file,
                    ": run report has no planner profile; write one with "
                    "actpack.plan(step, budget=..., report=\"run.json\")\n");
    return kExitBadInput;
  }
  absl::StrAppend(out, args.json
                           ? json::Serialize(SummarizePlan(*report, budget->bytes)) + "\n"
                           : FormatPlanText(*report, budget->bytes));
  return kExitOk;
}

int SnapshotCommand(const Args& args, std::string* out, std::string* err) {
  absl::StatusOr<RunReport> report = LoadRunReport(args.run);
  if (!report.ok()) return InputError("snapshot", report.status(), err);
  const json::Value* snapshot = report->Snapshot();
  if (snapshot == nullptr) {
    absl::StrAppend(err, "actpack snapshot: ", report->file, ": ",
                    report->allocator.has_value()
                        ? "the run report's allocator section has no snapshot (null or absent)"
                        : "run report has no allocator section, so no snapshot",
                    "; in the running process, actpack.dump_snapshot(\"snap.pickle\") writes "
                    "one\n");
    return kExitBadInput;
  }
  if (absl::Status written = WriteFile(args.output, PickleJson(*snapshot)); !written.ok()) {
    return InputError("snapshot", written, err);
  }
  absl::StrAppend(out, "wrote ", args.output, " (", report->allocator->snapshot_segments,
                  " segments, ", report->allocator->snapshot_trace_entries,
                  " trace entries); open it in https://pytorch.org/memory_viz\n");
  return kExitOk;
}

Cli::Cli(Args* args) : app("actpack") {
  // At most one command (a second command's name is an operand or an error). None is required
  // here: RunCli says "no command given" itself, after CLI11 has named any stray argument.
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", absl::StrCat("actpack ", kVersion));
  auto add = [&](const char* name, const char* summary, Command run) {
    CLI::App* command = app.add_subcommand(name, summary);
    commands[command] = run;
    return command;
  };
  // A flag given twice, or given a value ("--json=yes"), is refused as an option given twice is.
  auto add_json = [&](CLI::App* command) {
    command->add_flag("--json", args->json)
        ->multi_option_policy(CLI::MultiOptionPolicy::Throw)
        ->disable_flag_override();
  };
  auto add_output = [&](CLI::App* command, const char* value_name) {
    command->add_option("-o,--output", args->output)->required()->type_name(value_name);
  };

  CLI::App* report = add("report", "where the memory went (--json: for machines)", &ReportCommand);
  report->add_option("RUN.json", args->run)->required();
  add_json(report);
  CLI::App* diff = add("diff", "what changed between two runs", &DiffCommand);
  diff->add_option("BEFORE.json", args->before)->required();
  diff->add_option("AFTER.json", args->after)->required();
  CLI::App* plot = add("plot", "per-step and per-module bytes as an SVG", &PlotCommand);
  plot->add_option("RUN.json", args->run)->required();
  add_output(plot, "MEMORY.svg");
  CLI::App* plan = add("plan", "the largest batch per choice at another budget", &PlanCommand);
  plan->add_option("RUN.json", args->run)->required();
  plan->add_option("--budget", args->budget)->required()->type_name("SIZE");
  add_json(plan);
  CLI::App* snapshot =
      add("snapshot", "the allocator snapshot for pytorch.org/memory_viz", &SnapshotCommand);
  snapshot->add_option("RUN.json", args->run)->required();
  add_output(snapshot, "SNAP.pickle");

  // A word in a command's place that names none lands here, and the error names it and the
  // commands: "command: frobnicate not in {report,diff,plot,plan,snapshot}".
  std::vector<std::string> names;
  for (const CLI::App* command : app.get_subcommands(nullptr)) names.push_back(command->get_name());
  app.add_option("command")->check(CLI::IsMember(names));
}

}  // namespace

int RunCli(const std::vector<std::string>& args, std::string* out, std::string* err) {
  Args parsed;
  Cli cli(&parsed);
  // CLI11 takes the arguments last to first. It reads "-o=FILE" as -o with the value "=FILE"
  // (POSIX's "-oFILE"); this command line reads it as it reads "--output=FILE".
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  for (std::string& arg : reversed) {
    if (arg.size() > 2 && arg[0] == '-' && arg[1] != '-' && arg[2] == '=') arg.erase(2, 1);
  }
  try {
    cli.app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    absl::StrAppend(out, Usage());
    return kExitOk;
  } catch (const CLI::CallForVersion& version) {
    absl::StrAppend(out, version.what(), "\n");
    return kExitOk;
  } catch (const CLI::ParseError& error) {
    // Led by the synopsis of the command it is about, which says what that command expects.
    const std::vector<CLI::App*> chosen = cli.app.get_subcommands();
    return UsageError(chosen.empty() ? error.what()
                                     : absl::StrCat(Synopsis(*chosen.front()), ": ", error.what()),
                      err);
  }
  const std::vector<CLI::App*> chosen = cli.app.get_subcommands();
  if (chosen.empty()) return UsageError("no command given", err);
  return cli.commands.at(chosen.front())(parsed, out, err);
}

}  // namespace actpack::report
