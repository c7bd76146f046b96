#!/usr/bin/env python3
"""Registers, shared memory and spills of every CUDA kernel, checked against a table.

Compiles codecs/cuda/*.cu with nvcc and the build's flags (NVCC_FLAGS in third_party/actpack.bzl)
plus `-Xptxas -v`, reads what ptxas reports per kernel and machine-code architecture there, and
compares it with codecs/cuda/ptxas.tsv. Any difference fails: a new spill, a kernel that needs
more registers or shared memory, a kernel added or gone. When the change is intended, rerun
with --update and commit the table with the code, so that the review sees it.

Usage (from the repository root): python3 tools/ptxas_check.py [--update]
"""
import argparse
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

NVCC = "/usr/local/cuda/bin/nvcc"
TABLE = "codecs/cuda/ptxas.tsv"
COLUMNS = ["arch", "kernel", "registers", "shared_bytes", "stack_bytes", "spill_stores",
           "spill_loads", "barriers"]


def build_flags(root):
    """The -std/-O/-gencode flags the Bazel build gives nvcc (one list, in actpack.bzl)."""
    with open(os.path.join(root, "third_party", "actpack.bzl")) as f:
        text = f.read()
    block = re.search(r"NVCC_FLAGS = \" \"\.join\(\[(.*?)\]\)", text, re.S).group(1)
    return re.findall(r'"([^"]+)"', block)


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


def compile_one(root, flags, source, scratch):
    out = os.path.join(scratch, os.path.basename(source) + ".o")
    result = subprocess.run([NVCC, *flags, "-Xptxas=-v", f"-I{root}", "-c", source, "-o", out],
                            cwd=root, text=True, capture_output=True)
    if result.returncode != 0:
        raise SystemExit(f"ptxas_check: nvcc failed on {source}:\n{result.stderr[-4000:]}")
    return result.stderr


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
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.access(NVCC, os.X_OK):
        print(f"ptxas_check: skipped: no nvcc at {NVCC}")
        return 0
    flags = build_flags(root)
    sources = sorted(glob.glob(os.path.join(root, "codecs", "cuda", "*.cu")))
    scratch = tempfile.mkdtemp(prefix="ptxas_check.")
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            logs = list(pool.map(lambda s: compile_one(root, flags, s, scratch), sources))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows = {}
    for log in logs:
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
