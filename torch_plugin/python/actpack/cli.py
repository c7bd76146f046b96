"""The `actpack` console command: report, diff, plot, plan and snapshot over run reports.

    actpack report run.json                  # where the memory went, by module
    actpack report run.json --json           # the same for machines
    actpack diff before.json after.json
    actpack plot run.json -o memory.svg
    actpack plan run.json --budget 12GiB     # the largest batch per choice at another budget
    actpack snapshot run.json -o snap.pickle # the allocator snapshot, for pytorch.org/memory_viz

Exit code 0, or 2 with one line on stderr for a usage error, a file that is not an actpack run
report, or a request the report cannot answer (plan without a planner profile, snapshot
without a snapshot).

The logic is C++ (report/report.h, shared with the Bazel binary //tools:actpack); this module
only hands it the arguments and prints what it returns.
"""
import sys

from actpack import _C


def main(argv=None):
    """Runs the command line on `argv` (default: sys.argv[1:]) and exits with its code."""
    args = list(sys.argv[1:] if argv is None else argv)
    exit_code, out, err = _C.run_cli(args)
    if out:
        sys.stdout.write(out)
        sys.stdout.flush()
    if err:
        sys.stderr.write(err)
        sys.stderr.flush()
    sys.exit(exit_code)


if __name__ == "__main__":
    main()
