#!/usr/bin/env python3
"""The codec kernels' hardware counters on a GPU (Nsight Compute), so that a kernel that falls
short of a copy can be explained rather than only timed: for every codec's encode and decode at
one size (256 MiB float32 by default, with mask on bool and bitpack on int64), each kernel's
duration, DRAM bytes read and written, DRAM and SM throughput as a share of the chip's peak,
achieved occupancy, instructions issued and the warp stall reasons.

Two child processes of this script run the same calls in the same order: the first under
torch.profiler, which names the kernels of each call (the sequence); the second under `ncu`,
which profiles only what runs inside the NVTX range "gpu_counters" (the calls themselves, not
their warm-up). The ncu rows are matched to the calls by that sequence, and the names must agree.
One JSON holds the sequence, ncu's raw CSV and the matched rows, so a mismatch can be read
afterwards on any machine.

    python3 tools/gpu_counters.py --json counters.json --time-limit 80   # tools/gpu_check.sh
    python3 tools/gpu_counters.py --mib 64 --specs quant2 eb:rel=1e-2
"""
import argparse
import csv
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_benchmark  # noqa: E402  the inputs and the codec list are the kernel stage's

RANGE = "gpu_counters"
SECTIONS = ["SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats"]
METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum", "smsp__inst_executed.sum"]
# The raw columns the summary keeps (a column ncu does not print is left out of the row).
KEEP = {
    "gpu__time_duration.sum": "duration",
    "dram__bytes_read.sum": "dram_read",
    "dram__bytes_write.sum": "dram_write",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue_pct",
    "smsp__inst_executed.sum": "instructions",
    "launch__registers_per_thread": "registers",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
}
# Stall reasons: cycles a warp spent stalled per instruction issued, by reason (WarpStateStats);
# the sampled counts where a version of ncu prints only those.
STALL_FAMILIES = [("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"),
                  ("smsp__pcsamp_warps_issue_stalled_", "")]


def cases(mib, specs):
    """[(label, input kind, spec)] in the order the children run them."""
    chosen = [(s, k) for s, k in ([(s, "float32") for s, _ in gpu_benchmark.FLOAT_SPECS]
                                  + [(s, "float32") for s, _ in gpu_benchmark.FLOAT32_ONLY]
                                  + [(s, k) for s, k, _ in gpu_benchmark.OTHER_SPECS])
              if not specs or s in specs]
    return [(f"{s} {k} {mib}MiB", k, s) for s, k in chosen]


def child(args):
    """Runs every call once to warm up, then once inside the range; with --sequence, under
    torch.profiler, writing each call's kernel names in launch order."""
    generator = torch.Generator(device="cuda").manual_seed(args.mib)
    inputs, calls = {}, []
    for label, kind, spec in cases(args.mib, args.specs):
        if kind not in inputs:
            inputs[kind] = gpu_benchmark.make_input(kind, args.mib << 20, "cuda", generator)
        x = inputs[kind]
        try:
            buffer = gpu_benchmark.actpack.encode(x, spec)
            gpu_benchmark.actpack.decode(buffer)
        except Exception as error:  # noqa: BLE001  a refused spec is named, not fatal
            print(f"gpu_counters: {label}: {str(error).splitlines()[0][:200]}", flush=True)
            continue
        calls.append((f"{label} encode", lambda x=x, s=spec: gpu_benchmark.actpack.encode(x, s)))
        calls.append((f"{label} decode", lambda b=buffer: gpu_benchmark.actpack.decode(b)))
    torch.cuda.synchronize()
    sequence = []
    if args.sequence:
        from torch.profiler import ProfilerActivity, profile
        for label, fn in calls:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            # ncu profiles kernels only: the call's copies and memsets are left out.
            kernels = sorted((e.time_range.start, e.name) for e in prof.events()
                             if gpu_benchmark.is_device_activity(e)
                             and "memcpy" not in e.name.lower()
                             and "memset" not in e.name.lower())
            sequence.append({"call": label, "kernels": [name for _, name in kernels]})
        with open(args.sequence, "w") as f:
            json.dump(sequence, f)
        return
    torch.cuda.nvtx.range_push(RANGE)
    for label, fn in calls:
        torch.cuda.nvtx.range_push(label)
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_pop()


def find_ncu():
    found = shutil.which("ncu")
    if found:
        return found
    candidates = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu")
                        + glob.glob("/usr/local/cuda*/bin/ncu"))
    return candidates[-1] if candidates else None


def number(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def short(name):
    """A kernel's function name without namespaces, template arguments or parameters, so that
    the profiler's and ncu's spellings of one kernel compare equal."""
    depth, out = 0, []
    for ch in name.replace("(anonymous namespace)::", ""):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    words = "".join(out).split("(")[0].split()
    return words[-1].split("::")[-1] if words else name


def parse_csv(text):
    """ncu's raw page: [{column: value}] per kernel, the units row dropped."""
    lines = [l for l in text.splitlines() if l.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    return [r for r in rows if (r.get("ID") or "").strip().isdigit()]


def match(sequence, rows):
    """Each ncu row with the call it belongs to, by the sequence's launch order; a call whose
    kernel names disagree with ncu's is marked."""
    matched, k = [], 0
    for entry in sequence:
        for name in entry["kernels"]:
            if k >= len(rows):
                return matched, f"ncu profiled {len(rows)} kernels; the sequence has more"
            row = rows[k]
            k += 1
            summary = {"call": entry["call"], "kernel": short(row.get("Kernel Name", ""))}
            if summary["kernel"] != short(name):
                summary["name_mismatch"] = short(name)
            for column, key in KEEP.items():
                if column in row and number(row[column]) is not None:
                    summary[key] = number(row[column])
            stalls = {}
            for prefix, suffix in STALL_FAMILIES:
                stalls = {c[len(prefix):len(c) - len(suffix)]: number(v) for c, v in row.items()
                          if c.startswith(prefix) and c.endswith(suffix)
                          and "not_issued" not in c and number(v)}
                if stalls:
                    break
            if stalls:
                top = sorted(stalls.items(), key=lambda kv: -kv[1])[:3]
                summary["top_stalls"] = {name: round(v, 2) for name, v in top}
            matched.append(summary)
    extra = len(rows) - k
    return matched, (f"ncu profiled {extra} kernels beyond the sequence" if extra else None)


def table(rows, mib):
    def f(v, spec=".0f"):
        return "-" if v is None else format(v, spec)

    lines = [f"{'call':<34}{'kernel':<26}{'us':>8}{'DRAM B/in':>10}{'DRAM%':>7}{'SM%':>6}"
             f"{'occ%':>6}{'issue%':>7}  top stall"]
    for r in rows:
        dram = (r.get("dram_read", 0) + r.get("dram_write", 0)) / (mib << 20) \
            if "dram_read" in r else None
        stall = next(iter(r.get("top_stalls", {})), "-")
        lines.append(f"{r['call'][:33]:<34}{r['kernel'][:25]:<26}"
                     f"{f((r.get('duration') or 0) / 1e3, '.1f'):>8}{f(dram, '.2f'):>10}"
                     f"{f(r.get('dram_pct')):>7}{f(r.get('sm_pct')):>6}"
                     f"{f(r.get('occupancy_pct')):>6}{f(r.get('issue_pct')):>7}  {stall}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--specs", nargs="*", help="only these specs (default: every codec)")
    parser.add_argument("--json", default="counters.json")
    parser.add_argument("--time-limit", type=float, default=0, help="seconds (0: none)")
    parser.add_argument("--sequence", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    started = time.monotonic()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_counters: no CUDA device")
    ncu = find_ncu()
    result = {"command": "python3 tools/gpu_counters.py " + " ".join(sys.argv[1:]),
              "commit": gpu_benchmark.git_commit(), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "mib": args.mib, "ncu": ncu}

    def save():
        result["wall_seconds"] = round(time.monotonic() - started, 1)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)

    if ncu is None:
        result["error"] = "no ncu on this machine"
        save()
        raise SystemExit("gpu_counters: no ncu on this machine")
    result["ncu_version"] = subprocess.run([ncu, "--version"], capture_output=True,
                                           text=True).stdout.strip().splitlines()[-1:]
    me = [sys.executable, os.path.abspath(__file__), "--child", "--mib", str(args.mib)]
    if args.specs:
        me += ["--specs", *args.specs]
    sequence_file = args.json + ".sequence"
    subprocess.run(me + ["--sequence", sequence_file], check=True)
    with open(sequence_file) as f:
        result["sequence"] = json.load(f)
    os.remove(sequence_file)
    save()
    print(f"gpu_counters: sequence of {sum(len(e['kernels']) for e in result['sequence'])} "
          f"kernels in {len(result['sequence'])} calls ({time.monotonic() - started:.0f} s)",
          flush=True)
    csv_file = args.json + ".csv"
    command = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{RANGE}/",
               "--csv", "--page", "raw", "--log-file", csv_file, "--metrics", ",".join(METRICS)]
    for section in SECTIONS:
        command += ["--section", section]
    result["ncu_command"] = " ".join(command + me)
    left = args.time_limit - (time.monotonic() - started) - 3 if args.time_limit else None
    try:
        run = subprocess.run(command + me, capture_output=True, text=True, timeout=left)
        result["ncu_exit"] = run.returncode
        result["ncu_output_tail"] = (run.stdout + run.stderr)[-3000:]
    except subprocess.TimeoutExpired as stopped:
        result["ncu_exit"] = "stopped at the time limit"
        result["ncu_output_tail"] = str(stopped.stdout or "")[-3000:]
    text = open(csv_file).read() if os.path.exists(csv_file) else ""
    if os.path.exists(csv_file):
        os.remove(csv_file)
    result["ncu_csv"] = text
    rows = parse_csv(text)
    result["rows"], problem = match(result["sequence"], rows)
    if problem:
        result["problem"] = problem
        print(f"gpu_counters: {problem}")
    mismatches = [r for r in result["rows"] if "name_mismatch" in r]
    if mismatches:
        print(f"gpu_counters: {len(mismatches)} kernels' names differ from the sequence's")
    save()
    print(table(result["rows"], args.mib))
    print(f"gpu_counters: wrote {args.json} ({result['wall_seconds']} s; ncu exit "
          f"{result['ncu_exit']})")
    return 0 if rows and result["ncu_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
