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

The logic is C++ (report/cli.h, shared with the Bazel binary //tools:actpack); this module
only hands it the arguments and prints what it returns.
"""
import os
import sys

from actpack import _C


def _argument(arg):
    """`arg` as the str the C++ command line takes; ValueError when it is neither a str nor a
    path, or not valid UTF-8 (a file name in another encoding arrives as surrogate escapes,
    which the C++ side cannot take)."""
    try:
        text = os.fspath(arg)
    except TypeError:
        raise ValueError(f"actpack: argument {arg!r} ({type(arg).__name__}) is not a str or a "
                         "path") from None
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"actpack: argument {text!r} is not valid UTF-8; the command line takes "
                         "UTF-8 text and file names") from None
    return text


def main(argv=None):
    """Runs the command line on `argv` (default: sys.argv[1:]) and exits with its code."""
    try:
        args = [_argument(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    except ValueError as error:
        sys.stderr.write(f"{error}\n")
        sys.stderr.flush()
        sys.exit(2)
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
