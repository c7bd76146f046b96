#!/usr/bin/env python3
"""The emulated CUDA tests under the race checker, and the kernels' coverage from that run.

Runs every test that links the CUDA emulator with `--config=cudaemu_race`, whose kernel
sources are instrumented both for cudaemu's race checker and for gcov, then reads gcov's JSON.
Prints, per kernel file, the executable lines run and the lines never run; fails (exit 1) when a
test fails, when the kernels' lines are covered below --min-lines percent, or when a line marked
`// coverage: every branch` (the lines that choose a mode: a predictor, an element type, a bit
width) has a branch the tests never took.

Usage (from the repository root): python3 tools/cudaemu_coverage.py [--min-lines 95]
"""
import argparse
import collections
import glob
import gzip
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "testing", "cudaemu"))
from race_config import CONFIG, bazel, execution_root, gcov_test_env  # noqa: E402

# Every test that runs kernels (the codec and session tests with CUDA cases) and the race
# checker's own test. The allocator's and the emulator's other tests launch no kernel: the race
# checker has nothing to see there, and --config=cudaemu_asan runs them; a test tagged
# no_race_stage runs only kernels other tests run here. //torch_plugin builds against the
# wheel's CPU LibTorch and stays out of emulated builds.
EMULATED = ('kind(".*_test", rdeps(//... except //torch_plugin/..., //codecs:cuda_kernels))'
            ' + //testing/cudaemu:race_checker_test'
            ' except attr(tags, "no_race_stage", //...)')
MARKER = "coverage: every branch"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-lines", type=float, default=95.0)
    parser.add_argument("--skip-run", action="store_true",
                        help="read the .gcda files of an earlier run")
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(root)

    execroot = execution_root()
    bin_dir = bazel("info", f"--config={CONFIG}", "bazel-bin").stdout.strip()
    objects = os.path.join(bin_dir, "codecs", "_objs", "cuda_kernels_emulated")
    if not args.skip_run:
        for stale in glob.glob(os.path.join(objects, "*.gcda")):
            os.remove(stale)
        targets = [line.split()[0] for line in
                   bazel("cquery", f"--config={CONFIG}", EMULATED).stdout.splitlines() if line]
        run = subprocess.run(["bazel", "test", f"--config={CONFIG}", "--nocache_test_results",
                              *gcov_test_env(execroot), *targets], text=True)
        if run.returncode != 0:
            print("cudaemu coverage: the emulated tests failed under the race checker",
                  file=sys.stderr)
            return 1

    counts = collections.defaultdict(lambda: collections.defaultdict(int))
    branches = collections.defaultdict(dict)  # file -> line -> [taken per branch]
    notes = sorted(glob.glob(os.path.join(objects, "*.gcno")))
    if not notes:
        print(f"cudaemu coverage: no .gcno files under {objects}", file=sys.stderr)
        return 1
    for note in notes:
        result = subprocess.run(["gcov", "--json-format", "--stdout", "--branch-probabilities",
                                 note], cwd=execroot, text=False, capture_output=True)
        if result.returncode != 0:
            print(result.stderr.decode(), file=sys.stderr)
            return 1
        for chunk in result.stdout.splitlines():
            if not chunk.strip():
                continue
            data = json.loads(gzip.decompress(chunk) if chunk[:2] == b"\x1f\x8b" else chunk)
            for f in data["files"]:
                name = os.path.normpath(f["file"])
                if not name.startswith("codecs/"):
                    continue
                for line in f["lines"]:
                    n = line["line_number"]
                    counts[name][n] += line["count"]
                    taken = [b["count"] > 0 for b in line.get("branches", [])]
                    if taken:
                        previous = branches[name].get(n, [False] * len(taken))
                        if len(previous) != len(taken):
                            previous = previous + [False] * (len(taken) - len(previous))
                        branches[name][n] = [a or b for a, b in zip(previous, taken)]

    failures = []
    total_lines = total_run = 0
    print(f"{'kernel source':36} {'lines run':>14}   never run")
    for name in sorted(n for n in counts if n.startswith("codecs/cuda/") and n.endswith(".cu")):
        lines = counts[name]
        run_lines = sum(1 for c in lines.values() if c > 0)
        total_lines += len(lines)
        total_run += run_lines
        missed = sorted(n for n, c in lines.items() if c == 0)
        print(f"{name:36} {run_lines:5}/{len(lines):<5} {100.0 * run_lines / len(lines):5.1f}%   "
              f"{compress(missed)}")
    percent = 100.0 * total_run / max(1, total_lines)
    print(f"{'all kernels':36} {total_run:5}/{total_lines:<5} {percent:5.1f}%")
    if percent < args.min_lines:
        failures.append(f"kernel lines covered {percent:.1f}% < {args.min_lines}%")

    # Marked lines: every branch taken, in the kernels and in the shared headers' device copies.
    marked = 0
    for name in sorted(counts):
        source = os.path.join(root, name)
        if not os.path.exists(source):
            continue
        with open(source) as f:
            text = f.read().splitlines()
        for n, line in enumerate(text, start=1):
            if MARKER not in line:
                continue
            marked += 1
            taken = branches[name].get(n)
            if counts[name].get(n, 0) == 0:
                failures.append(f"{name}:{n} (marked) never ran")
            elif taken is not None and not all(taken):
                failures.append(f"{name}:{n} (marked) took {sum(taken)} of {len(taken)} branches")
    print(f"lines marked '{MARKER}': {marked}, every branch taken on "
          f"{marked - sum(1 for f in failures if '(marked)' in f)}")
    for failure in failures:
        print(f"cudaemu coverage: FAILED: {failure}")
    if not failures:
        print("cudaemu coverage: passed")
    return 1 if failures else 0


def compress(numbers):
    """[3, 4, 5, 9] -> '3-5 9'"""
    out, start, prev = [], None, None
    for n in numbers + [None]:
        if start is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = n
    return " ".join(out)


if __name__ == "__main__":
    sys.exit(main())
