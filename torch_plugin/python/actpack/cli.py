"""The `actpack` console command: report, diff, plot and plan over run reports.

    actpack report run.json            # where the memory went
    actpack report run.json --json     # the same for machines
    actpack diff before.json after.json
    actpack plot run.json -o memory.svg
    actpack plan run.json --budget 12GiB

The logic is C++ (tools/report.h, shared with the Bazel binary //tools:actpack); this module
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
