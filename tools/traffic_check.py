#!/usr/bin/env python3
"""Memory traffic of every CUDA kernel, checked against a table.

Builds //codecs:traffic_report under the CUDA emulator's race checker (--config=cudaemu_race),
which sees every load and store a kernel makes, and runs it: per codec, dtype, phase and kernel,
the warp requests, 32-byte sectors per request against the ideal for the bytes each asked for,
the bytes asked for and the bytes DRAM must move per input byte, the passes over the input, the
shared-memory wavefronts per request; per codec, dtype and phase, a roofline estimate on an H100
and an A100 as a fraction of a device-to-device copy of the input (codecs/testing/traffic_report.cc).

The output is compared with codecs/cuda/traffic.tsv: any change fails (a kernel that moves more,
or less, or a kernel added or gone). A kernel whose sectors per request exceed the ideal by more
than 5% must say why in the table's `note` column. When a change is intended, rerun with
--update (notes are kept) and commit the table with the code.

Usage (from the repository root):
  python3 tools/traffic_check.py [--update] [--bytes N]
  python3 tools/traffic_check.py --markdown FILE    (a table's roofline rows as markdown)
--bytes (default 1 MiB) sizes every input; the committed table is at the default, and
ACTPACK_FULL=1 runs (tools/test.sh) also print the table at 16 MiB (codecs/cuda/traffic_16MiB.tsv,
which docs/gpu.md's roofline table is made from).
"""
import argparse
import os
import subprocess
import sys

TABLE = "codecs/cuda/traffic.tsv"
KEY = ["codec", "dtype", "phase", "kernel"]


def measure(root, size):
    build = ["bazel", "build", "--config=cudaemu_race", "//codecs:traffic_report"]
    subprocess.run(build, cwd=root, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    bin_dir = subprocess.run(["bazel", "info", "--config=cudaemu_race", "bazel-bin"], cwd=root,
                             check=True, text=True, capture_output=True).stdout.strip()
    result = subprocess.run([os.path.join(bin_dir, "codecs", "traffic_report"), "--bytes",
                             str(size)], cwd=root, text=True, capture_output=True)
    if result.returncode != 0:
        raise SystemExit(f"traffic_check: traffic_report failed:\n{result.stderr[-4000:]}")
    lines = [l for l in result.stdout.splitlines() if l.strip()]
    header = lines[0].split("\t")
    rows = [dict(zip(header, l.split("\t"))) for l in lines[1:]]
    return header, rows


def read_table(path):
    if not os.path.exists(path):
        return None, []
    with open(path) as f:
        lines = [l.rstrip("\n") for l in f if not l.startswith("#") and l.strip()]
    header = lines[0].split("\t")
    return header, [dict(zip(header, l.split("\t"))) for l in lines[1:]]


def markdown(path):
    """The roofline summary rows of a table as a markdown table."""
    _, rows = read_table(path)
    summary = {}
    for r in rows:
        if r["kernel"] != "(all)":
            continue
        summary[(r["codec"], r["dtype"], r["phase"])] = (
            r["launches"], r["dram_per_input_byte"], r["h100_fraction_of_copy"],
            r["a100_fraction_of_copy"])
    lines = ["| codec | dtype | encode: launches, DRAM bytes per input byte | H100 | A100 | "
             "decode: launches, DRAM bytes per input byte | H100 | A100 |",
             "|---|---|---|---|---|---|---|---|"]
    for (codec, dtype, phase) in summary:
        if phase != "encode":
            continue
        e = summary[(codec, dtype, "encode")]
        d = summary[(codec, dtype, "decode")]
        lines.append(f"| {codec} | {dtype} | {e[0]}, {float(e[1]):.2f} | {e[2]} | {e[3]} | "
                     f"{d[0]}, {float(d[1]):.2f} | {d[2]} | {d[3]} |")
    return "\n".join(lines)


def over_ideal(row):
    try:
        return float(row["sectors_per_request"]) > 1.05 * float(row["ideal_per_request"])
    except (KeyError, ValueError):
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--update", action="store_true", help="rewrite the table")
    parser.add_argument("--bytes", type=int, default=1 << 20, help="input size in bytes")
    parser.add_argument("--markdown", help="print the roofline table of this table file")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(args.markdown))
        return 0
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
    header, rows = measure(root, args.bytes)
    if args.bytes != 1 << 20:
        print("\n".join(["\t".join(header)] + ["\t".join(r[h] for h in header) for r in rows]))
        return 0
    path = os.path.join(root, TABLE)
    _, table = read_table(path)
    notes = {tuple(r[k] for k in KEY): r.get("note", "") for r in table}
    columns = header + ["note"]
    for r in rows:
        r["note"] = notes.get(tuple(r[k] for k in KEY), "")
    if args.update:
        with open(path, "w") as f:
            f.write("# Memory traffic per kernel at 1 MiB inputs, measured on the CUDA emulator by "
                    "tools/traffic_check.py\n")
            f.write("\t".join(columns) + "\n")
            for r in rows:
                f.write("\t".join(r[c] for c in columns) + "\n")
        print(f"traffic_check: wrote {TABLE} ({len(rows)} rows)")
        table = rows
    problems = []
    measured = {tuple(r[k] for k in KEY): r for r in rows}
    committed = {tuple(r[k] for k in KEY): r for r in table}
    for key in sorted(set(measured) | set(committed)):
        m, c = measured.get(key), committed.get(key)
        if m is None:
            problems.append(f"{' '.join(key)}: in the table, not measured")
        elif c is None:
            problems.append(f"{' '.join(key)}: measured, not in the table")
        else:
            changed = [h for h in header if m[h] != c.get(h)]
            if changed:
                problems.append(f"{' '.join(key)}: " + ", ".join(
                    f"{h} {c.get(h)} -> {m[h]}" for h in changed))
        if m is not None and over_ideal(m) and not notes.get(key):
            problems.append(f"{' '.join(key)}: {m['sectors_per_request']} sectors per request "
                            f"against an ideal of {m['ideal_per_request']}, and no note says why")
    if problems:
        print("traffic_check: the kernels' traffic differs from " + TABLE + ":")
        for p in problems:
            print("  " + p)
        print("If the change is intended, run python3 tools/traffic_check.py --update (and give "
              "each kernel above its ideal a note).")
        return 1
    print(f"traffic_check: {len(rows)} rows match {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
