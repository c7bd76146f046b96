#!/usr/bin/env python3
"""Codec kernels on the GPU as a fraction of a device-to-device copy of the same bytes: every
codec's encode and decode at 1, 16, 64 and 256 MiB, float32 and bfloat16 (mask on bool and
bitpack on int64 max-pool indices at the same sizes), in the device's own time (torch.profiler's
kernel, memcpy and memset activity), beside the predictions of the CUDA emulator's traffic table
(codecs/cuda/traffic.tsv: DRAM bytes per input byte and launches, at this copy's bandwidth and
2 us a launch) and, where it exists, the kernel performance model's (codecs/cuda/model.tsv,
tools/kernel_model.py: its whole-operation rows' fraction_of_copy).

Per size and dtype one profiler session: each call group (the copy, then each codec's encode,
then its decode, REPEATS calls each) runs inside a range of its own that ends with a device
synchronize, and the device activity whose start falls in a range is that group's. A session
whose ranges do not account for nearly all of its device time (or where a group shows none) is
measured again one session per group, which needs no attribution. "launches" is the device
activities per call (kernels, copies, memsets). The standalone actpack.encode and decode read
their status back after each call (a training step reads all of a step's at once): that wait is
host time, outside these figures.

    python3 tools/gpu_benchmark.py --json kernels.json --time-limit 90   # tools/gpu_check.sh
    python3 tools/gpu_benchmark.py --sizes 256 64 --dtypes float32
    python3 tools/gpu_benchmark.py --device cpu --sizes 1                # the plumbing, on a CPU

Largest sizes first: with --time-limit, the sizes that no longer fit are skipped and named.
"""
import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time

import torch

import actpack

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TRAFFIC = os.path.join(ROOT, "codecs", "cuda", "traffic.tsv")
MODEL = os.path.join(ROOT, "codecs", "cuda", "model.tsv")
PER_LAUNCH_SECONDS = 2e-6
MiB = 1 << 20
PREFIX = "gpu_benchmark::"

# The specs measured per float dtype: (spec, the traffic table's codec for it or None).
FLOAT_SPECS = [("identity", "identity"), ("quant2", "quant2"), ("quant4", "quant4"),
               ("quant8", "quant8"), ("pool4", "pool"), ("eb:rel=1e-2", "eb"),
               ("eb:rel=1e-3", None), ("division", "division"), ("division_dct", "division_dct")]
FLOAT32_ONLY = [("cast:bf16", "cast")]
# Codecs of other input types, measured once per size: (spec, dtype, traffic codec).
OTHER_SPECS = [("mask", "bool", "mask"), ("bitpack", "int64", "bitpack")]


def traffic_rows():
    """{(codec, dtype, phase): (DRAM bytes per input byte, launches)} of the "(all)" rows."""
    rows = {}
    if not os.path.exists(TRAFFIC):
        return rows
    with open(TRAFFIC) as f:
        for row in csv.DictReader((l for l in f if not l.startswith("#")), delimiter="\t"):
            if row.get("kernel") == "(all)":
                try:
                    rows[(row["codec"], row["dtype"], row["phase"])] = (
                        float(row["dram_per_input_byte"]), int(row["launches"]))
                except (KeyError, ValueError):
                    continue
    return rows


def model_rows():
    """{(spec, dtype, phase, MiB or None): fraction of a copy} from the kernel performance
    model's table, if there is one: its whole-operation rows (op "(all)" where it has an op
    column), the codec column either "spec dtype" or a spec beside a dtype column, the size
    column as "64MiB" where there is one, and the first column whose name holds "fraction"."""
    rows = {}
    if not os.path.exists(MODEL):
        return rows
    with open(MODEL) as f:
        reader = csv.DictReader((l for l in f if not l.startswith("#")), delimiter="\t")
        names = reader.fieldnames or []
        column = "fraction_of_copy" if "fraction_of_copy" in names else next(
            (c for c in names if "fraction" in c), None)
        if column is None or "codec" not in names or "phase" not in names:
            return rows
        for row in reader:
            if "op" in names and row.get("op") != "(all)":
                continue
            spec, _, dtype = (row.get("codec") or "").partition(" ")
            dtype = dtype or row.get("dtype", "")
            size = (row.get("size") or "").removesuffix("MiB")
            try:
                rows[(spec, dtype, row["phase"], int(size) if size.isdigit() else None)] = \
                    float(row[column])
            except (KeyError, ValueError, TypeError):
                continue
    return rows


def model_fraction(model, names, dtype, phase, mib):
    """The model's fraction for the first of `names` (the spec, then the traffic table's codec)
    it has, at this size or at no size."""
    for name in names:
        for size in (mib, None):
            if name and (name, dtype, phase, size) in model:
                return model[(name, dtype, phase, size)]
    return None


def predicted(traffic, codec, dtype, phase, nbytes, copy_seconds):
    """The traffic table's fraction of a copy: the copy's own time over the time to move the
    codec's DRAM bytes at the copy's bandwidth (it reads and writes every byte) plus launches."""
    row = traffic.get((codec, dtype, phase)) if codec else None
    if row is None or not copy_seconds:
        return None
    dram, launches = row
    bandwidth = 2 * nbytes / copy_seconds
    return copy_seconds / (dram * nbytes / bandwidth + launches * PER_LAUNCH_SECONDS)


def make_input(kind, nbytes, device, generator):
    """Activations as training saves them: a ReLU's output (half zeros) for the float codecs,
    a mask of {0, 1} for mask, max-pool indices for bitpack; NCHW maps of 64 x 64 x 64."""
    if kind == "bool":
        return torch.rand(nbytes, device=device, generator=generator) > 0.4
    if kind == "int64":
        return torch.randint(0, 1024, (nbytes // 8,), device=device, generator=generator)
    dtype = getattr(torch, kind)
    n = nbytes // torch.tensor([], dtype=dtype).element_size()
    x = torch.randn(n, device=device, generator=generator).relu_().to(dtype)
    return x.view(-1, 64, 64, 64) if n % (64 ** 3) == 0 else x


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def is_device_activity(event):
    """A kernel, memcpy or memset on the GPU (not a range's GPU-side annotation)."""
    if getattr(event, "is_user_annotation", False) or event.name.startswith(PREFIX):
        return False
    return event.device_type == torch.autograd.DeviceType.CUDA


def profile_groups(groups, repeats, device):
    """{label: (device microseconds per call, device activities per call)} of each group, in
    one profiler session, by the ranges; None where the ranges do not account for the
    session's device time."""
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for label, fn in groups:
            with record_function(PREFIX + label):
                for _ in range(repeats):
                    fn()
                sync(device)
            time.sleep(0.002)  # a gap between the ranges
    events = prof.events()
    windows = {e.name[len(PREFIX):]: (e.time_range.start, e.time_range.end) for e in events
               if e.name.startswith(PREFIX) and e.device_type == torch.autograd.DeviceType.CPU}
    activity = [(e.time_range.start, e.time_range.elapsed_us(), e.name) for e in events
                if is_device_activity(e)]
    total = sum(d for _, d, _ in activity)
    out, captured = {}, 0.0
    for label, _ in groups:
        if label not in windows:
            return None
        first, last = windows[label]
        inside = [(d, name) for start, d, name in activity if first <= start <= last]
        if not inside:
            return None
        spent = sum(d for d, _ in inside)
        captured += spent
        names = {}
        for d, name in inside:
            names[name] = names.get(name, 0.0) + d / repeats
        out[label] = (spent / repeats, len(inside) / repeats, names)
    if total <= 0 or captured < 0.95 * total:
        return None
    return out


def profile_each(groups, repeats, device):
    """The same figures, one profiler session per group: every device activity of the session
    is the group's."""
    from torch.profiler import ProfilerActivity, profile
    out = {}
    for label, fn in groups:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                fn()
            sync(device)
        activity = [(e.time_range.elapsed_us(), e.name) for e in prof.events()
                    if is_device_activity(e)]
        names = {}
        for d, name in activity:
            names[name] = names.get(name, 0.0) + d / repeats
        out[label] = (sum(d for d, _ in activity) / repeats, len(activity) / repeats, names)
    return out


def wall_each(groups, repeats, device):
    """On the CPU (a dry run): wall-clock microseconds per call."""
    out = {}
    for label, fn in groups:
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        out[label] = ((time.perf_counter() - start) * 1e6 / repeats, None, {})
    return out


def session(mib, dtype, device, repeats, traffic, model):
    """The rows of one size and float dtype (with mask and bitpack at float32)."""
    nbytes = mib * MiB
    generator = torch.Generator(device=device).manual_seed(mib)
    x = make_input(dtype, nbytes, device, generator)
    copy_out = torch.empty_like(x)
    groups = [("copy", lambda: copy_out.copy_(x))]
    cases = []  # (spec, input dtype, traffic codec, input)
    specs = FLOAT_SPECS + (FLOAT32_ONLY if dtype == "float32" else [])
    for spec, codec in specs:
        cases.append((spec, dtype, codec, x))
    if dtype == "float32":
        for spec, kind, codec in OTHER_SPECS:
            cases.append((spec, kind, codec, make_input(kind, nbytes, device, generator)))
    known = {"identity", "quant", "pool", "eb", "division", "cast", "mask", "bitpack"}
    for name in actpack.codec_names():
        if name not in known and dtype == "float32":
            cases.append((name, dtype, name, x))  # a codec this table does not know: its default
    rows, buffers = [], {}
    for spec, kind, codec, tensor in cases:
        row = {"codec": spec, "dtype": kind, "mib": mib, "bytes": nbytes}
        try:
            buffer = actpack.encode(tensor, spec)
            actpack.decode(buffer)  # both directions once: module loads, first allocations
            sync(device)
        except Exception as error:  # noqa: BLE001  a refusal is a row of its own
            text = str(error).splitlines()[0] if str(error) else type(error).__name__
            row["error"] = text[:300]
            rows.append(row)
            continue
        buffers[spec] = buffer
        row["ratio"] = nbytes / buffer.numel()
        groups.append((f"{spec} encode", lambda t=tensor, s=spec: actpack.encode(t, s)))
        groups.append((f"{spec} decode", lambda b=buffer: actpack.decode(b)))
        rows.append(row)
    for _, fn in groups[:1]:
        fn()
    sync(device)
    method = "wall clock (CPU)"
    if device == "cuda":
        figures = profile_groups(groups, repeats, device)
        method = "ranges in one profiler session"
        if figures is None:
            figures = profile_each(groups, repeats, device)
            method = "one profiler session per group"
    else:
        figures = wall_each(groups, repeats, device)
    copy_us = figures["copy"][0]
    copy_s = copy_us / 1e6
    for row in rows:
        if "error" in row:
            continue
        traffic_codec = next((c for s, _, c, _ in cases if s == row["codec"]), None)
        for phase in ("encode", "decode"):
            us, launches, names = figures[f"{row['codec']} {phase}"]
            row[f"{phase}_us"] = us
            row[f"{phase}_fraction"] = copy_us / us if us else None
            row[f"{phase}_launches"] = launches
            row[f"{phase}_kernels"] = {n: round(v, 2) for n, v in
                                       sorted(names.items(), key=lambda kv: -kv[1])[:8]}
            row[f"{phase}_predicted"] = predicted(traffic, traffic_codec, row["dtype"], phase,
                                                  nbytes, copy_s)
            row[f"{phase}_model"] = model_fraction(model, (row["codec"], traffic_codec),
                                                   row["dtype"], phase, mib)
        row["copy_us"] = copy_us
        row["copy_gbs"] = 2 * nbytes / copy_s / 1e9 if copy_s else None  # read + written
    return rows, method


def git_commit():
    """What tools/gpu_check.sh was told or computed (ACTPACK_GPU_COMMIT, and the sources'
    digest), which a lent GPU machine's copy of the tree needs (its .git, if any, need not be the
    tree's); else HEAD (+changes when tracked files differ from it)."""
    commit = os.environ.get("ACTPACK_GPU_COMMIT")
    digest = os.environ.get("ACTPACK_GPU_SOURCE_DIGEST")
    if commit:
        return " ".join(x for x in (commit, digest and f"sources {digest}") if x)
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = dirty = ""
    if head:
        return head + ("+changes" if dirty else "")
    return f"sources {digest}" if digest else None


def table(rows):
    def f(v, spec=".2f"):
        return "-" if v is None else format(v, spec)

    lines = [f"{'codec':<14}{'dtype':>9}{'size':>8}{'copy GB/s':>10}{'ratio':>7}"
             f"{'enc/copy':>9}{'dec/copy':>9}{'launch e':>9}{'launch d':>9}"
             f"{'pred enc':>9}{'pred dec':>9}{'model e':>8}{'model d':>8}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['codec']:<14}{r['dtype']:>9}{r['mib']:>5}MiB  "
                         f"refused: {r['error'][:70]}")
            continue
        lines.append(f"{r['codec']:<14}{r['dtype']:>9}{r['mib']:>5}MiB{f(r['copy_gbs'], '.0f'):>10}"
                     f"{f(r['ratio']):>7}{f(r['encode_fraction']):>9}{f(r['decode_fraction']):>9}"
                     f"{f(r['encode_launches'], '.1f'):>9}{f(r['decode_launches'], '.1f'):>9}"
                     f"{f(r['encode_predicted']):>9}{f(r['decode_predicted']):>9}"
                     f"{f(r['encode_model']):>8}{f(r['decode_model']):>8}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 64, 16, 1],
                        help="MiB, largest first (default 256 64 16 1)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                        choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--repeats", type=int, default=0,
                        help="calls per group (default: 5 from 64 MiB up, 10 below)")
    parser.add_argument("--time-limit", type=float, default=0,
                        help="seconds; what no longer fits is skipped and named (0: no limit)")
    parser.add_argument("--json", help="write the rows here (after every size and dtype)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_benchmark: no CUDA device (a dry run: --device cpu --sizes 1)")
    device_name = (torch.cuda.get_device_name() if args.device == "cuda"
                   else platform.processor() or platform.machine())
    result = {"command": "python3 tools/gpu_benchmark.py " + " ".join(sys.argv[1:]),
              "commit": git_commit(), "device": device_name, "torch": torch.__version__,
              "cuda": torch.version.cuda, "actpack": actpack.__version__,
              "time": "device time from torch.profiler (kernels, copies, memsets) per call"
                      if args.device == "cuda" else "wall clock per call (CPU dry run)",
              "rows": [], "sessions": [], "skipped": []}

    def save():
        if args.json:
            result["wall_seconds"] = time.monotonic() - started
            with open(args.json + ".tmp", "w") as f:
                json.dump(result, f, indent=1)
            os.replace(args.json + ".tmp", args.json)

    print(f"device: {device_name}, torch {torch.__version__}, actpack {actpack.__version__}")
    traffic, model = traffic_rows(), model_rows()
    if not model:
        print("gpu_benchmark: no codecs/cuda/model.tsv (the kernel model) yet: its columns "
              "show '-'")
    plan = [(mib, dtype) for mib in args.sizes for dtype in args.dtypes]
    last = None
    for k, (mib, dtype) in enumerate(plan):
        if args.time_limit:
            left = args.time_limit - (time.monotonic() - started)
            need = (last or 0) * (mib / max(1, plan[k - 1][0]) if k else 1)
            if left < max(3.0, 1.2 * need):
                result["skipped"] += [f"{m} MiB {d}" for m, d in plan[k:]]
                print(f"gpu_benchmark: {left:.0f} s left: skipped "
                      + ", ".join(result["skipped"]))
                break
        begun = time.monotonic()
        repeats = args.repeats or (5 if mib >= 64 else 10)
        rows, method = session(mib, dtype, args.device, repeats, traffic, model)
        last = time.monotonic() - begun
        result["rows"] += rows
        result["sessions"].append({"mib": mib, "dtype": dtype, "method": method,
                                   "repeats": repeats, "seconds": round(last, 2)})
        print(f"{mib} MiB {dtype}: {method}, {last:.1f} s", flush=True)
        save()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    print(table(result["rows"]))
    save()
    if args.json:
        print(f"gpu_benchmark: wrote {args.json}")


if __name__ == "__main__":
    main()
