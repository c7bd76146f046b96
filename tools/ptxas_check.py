#!/usr/bin/env python3
"""Registers, shared memory and spills of every CUDA kernel, checked against a table.

Builds the kernels with `bazel build --config=cuda` (nvcc with `-Xptxas -v`; the build keeps
ptxas's report beside each object; with --built, the reports the last build or test left), reads what
ptxas reports per kernel and machine-code architecture there, and compares it with
codecs/cuda/ptxas.tsv. Any difference fails: a new spill, a kernel that needs
more registers or shared memory, a kernel added or gone. When the change is intended, rerun
with --update and commit the table with the code, so that the review sees it.

Usage (from the repository root): python3 tools/ptxas_check.py [--update] [--built]
"""
import argparse
import glob
import os
import re
import subprocess
import sys

NVCC = "/usr/local/cuda/bin/nvcc"
TABLE = "codecs/cuda/ptxas.tsv"
COLUMNS = ["arch", "kernel", "registers", "shared_bytes", "stack_bytes", "spill_stores",
           "spill_loads", "barriers"]


def kernel_name(mangled):
    """`actpack::...::QuantDecodeKernel<1>(...)` -> `QuantDecodeKernel<1>` (stable across builds:
    the anonymous namespace's mangled id depends on the path)."""
    demangled = subprocess.run(["c++filt", mangled], text=True, capture_output=True).stdout.strip()
    name = demangled.replace("(anonymous namespace)", "anonymous").split("(")[0]
    depth, cut = 0, 0
    for i, ch in enumerate(name):  # the last `::` outside template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == ":" and depth == 0 and name[i:i + 2] == "::":
            cut = i + 2
    return name[cut:]


def ptxas_logs(root, build):
    """ptxas's reports of the Bazel build's nvcc objects (third_party/actpack.bzl): built here
    with `build`, else those the last --config=cuda build or test left (a `bazel build` after a
    `bazel test` compiles again: the test command's configuration of libraries differs)."""
    if build:
        built = subprocess.run(["bazel", "build", "--config=cuda", "//codecs:cuda_kernels"],
                               cwd=root)
        if built.returncode != 0:
            raise SystemExit("ptxas_check: bazel build --config=cuda //codecs:cuda_kernels failed")
    bin_dir = subprocess.run(["bazel", "info", "--config=cuda", "bazel-bin"], cwd=root, text=True,
                             capture_output=True, check=True).stdout.strip()
    paths = sorted(glob.glob(os.path.join(bin_dir, "codecs", "*.ptxas.log")))
    sources = glob.glob(os.path.join(root, "codecs", "cuda", "*.cu"))
    if len(paths) != len(sources):
        raise SystemExit(f"ptxas_check: {len(paths)} ptxas reports under {bin_dir}/codecs for "
                         f"{len(sources)} sources in codecs/cuda")
    logs = []
    for path in paths:
        with open(path) as f:
            logs.append(f.read())
    return logs


def parse(log):
    rows = {}
    current = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)' for '(sm_\d+)'", line)
        if m:
            current = (m.group(2), kernel_name(m.group(1)))
            rows[current] = {"shared_bytes": 0, "stack_bytes": 0, "spill_stores": 0,
                             "spill_loads": 0, "registers": 0, "barriers": 0}
            continue
        if current is None:
            continue
        row = rows[current]
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m:
            row["stack_bytes"], row["spill_stores"], row["spill_loads"] = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            row["registers"] = int(m.group(1))
            b = re.search(r"used (\d+) barriers", line)
            row["barriers"] = int(b.group(1)) if b else 0
            s = re.search(r"(\d+) bytes smem", line)
            row["shared_bytes"] = int(s.group(1)) if s else 0
    return rows


def render(rows):
    lines = ["\t".join(COLUMNS)]
    for (arch, kernel) in sorted(rows):
        r = rows[(arch, kernel)]
        lines.append("\t".join([arch, kernel] + [str(r[c]) for c in COLUMNS[2:]]))
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite the table")
    parser.add_argument("--built", action="store_true",
                        help="read the reports the last `bazel test --config=cuda` or build left "
                             "(the test command's), without building")
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.access(NVCC, os.X_OK):
        print(f"ptxas_check: skipped: no nvcc at {NVCC}")
        return 0
    rows = {}
    for log in ptxas_logs(root, build=not args.built):
        rows.update(parse(log))
    table = render(rows)
    path = os.path.join(root, TABLE)
    if args.update:
        with open(path, "w") as f:
            f.write(table)
        print(f"ptxas_check: wrote {TABLE} ({len(rows)} kernels x architectures)")
        return 0
    with open(path) as f:
        expected = f.read()
    spills = [k for k, r in rows.items() if r["spill_stores"] or r["spill_loads"]]
    if table == expected:
        print(f"ptxas_check: {len(rows)} kernel builds match {TABLE}"
              f" ({len(spills)} with spills)")
        return 0
    old = {tuple(l.split("\t")[:2]): l for l in expected.splitlines()[1:]}
    new = {tuple(l.split("\t")[:2]): l for l in table.splitlines()[1:]}
    print(f"ptxas_check: FAILED: ptxas reports differ from {TABLE}:")
    print("  " + "\t".join(COLUMNS))
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            print(f"  table: {old.get(key, '(none)')}")
            print(f"  now:   {new.get(key, '(none)')}")
    print("Rerun with --update and commit the table if the change is intended.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
