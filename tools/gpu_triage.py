#!/usr/bin/env python3
"""Which codec kernel fails on a real GPU, and how: every codec's encode then decode, each
(codec, dtype, size) in a process of its own with CUDA_LAUNCH_BLOCKING=1 (so an error is the
call's own, not a neighbour's, and a fault cannot poison the next case), under a per-case
timeout (a kernel that never ends is named as a hang, with the phase it was in). Up to 1 MiB the
payload is also compared byte for byte with the CPU's, and the decoded tensor with the CPU's
decode. Then the smallest failing case of each codec runs again under compute-sanitizer
(memcheck), which names the kernel, the thread and the address.

    python3 tools/gpu_triage.py --json triage.json --time-limit 150   # tools/gpu_check.sh
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FLOAT = ["identity", "quant2", "quant4", "quant8", "pool4", "eb:rel=1e-2", "eb:rel=1e-3",
         "division", "division_dct"]
CASES = ([(s, "float32", m) for m in (1, 64, 256) for s in FLOAT + ["cast:bf16"]]
         + [(s, k, m) for m in (1, 64, 256) for s, k in (("mask", "bool"), ("bitpack", "int64"))]
         + [(s, "bfloat16", m) for m in (1, 256) for s in FLOAT])


def child(spec, kind, mib):
    """One case; prints a line per phase so that a hang shows where it stopped."""
    import torch

    import actpack
    import gpu_benchmark
    device = os.environ.get("ACTPACK_TRIAGE_DEVICE", "cuda")  # cpu: the plumbing
    generator = torch.Generator(device=device).manual_seed(mib)
    x = gpu_benchmark.make_input(kind, mib << 20, device, generator)
    gpu_benchmark.sync(device)
    print("phase encode", flush=True)
    buffer = actpack.encode(x, spec)
    gpu_benchmark.sync(device)
    print("phase decode", flush=True)
    y = actpack.decode(buffer)
    gpu_benchmark.sync(device)
    print(f"ratio {x.numel() * x.element_size() / buffer.numel():.3f}", flush=True)
    if mib <= 1:
        print("phase compare", flush=True)
        cpu = actpack.encode(x.cpu(), spec)
        same = cpu.numel() == buffer.numel() and torch.equal(cpu, buffer.cpu())
        print(f"payload {'same as the CPU' if same else 'DIFFERS from the CPU'}", flush=True)
        back = actpack.decode(cpu)
        decoded = torch.equal(back.view(torch.uint8), y.cpu().view(torch.uint8)) \
            if back.shape == y.shape else False
        print(f"decode {'same as the CPU' if decoded else 'DIFFERS from the CPU'}", flush=True)
    print("ok", flush=True)


def run_case(case, timeout, sanitizer=None):
    spec, kind, mib = case
    command = [sys.executable, os.path.abspath(__file__), "--child", spec, kind, str(mib)]
    if sanitizer:
        command = [sanitizer, "--tool", "memcheck", "--print-limit", "8",
                   "--show-backtrace", "device"] + command
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    begun = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        text, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as stopped:
        out = stopped.stdout or b""
        text = (out.decode() if isinstance(out, bytes) else out) + "\n(timed out)"
        code = "hang"
    phases = [l.split()[1] for l in text.splitlines() if l.startswith("phase ")]
    lines = [l for l in text.splitlines() if l.strip()]
    verdict = "ok" if code == 0 and "ok" in lines else (
        f"hang in {phases[-1] if phases else 'setup'}" if code == "hang"
        else f"failed in {phases[-1] if phases else 'setup'} (exit {code})")
    differs = [l for l in lines if "DIFFERS" in l]
    if differs and verdict == "ok":
        verdict = "ok but " + "; ".join(differs)
    return {"spec": spec, "dtype": kind, "mib": mib, "verdict": verdict,
            "seconds": round(time.monotonic() - begun, 1),
            "tail": "\n".join(lines[-40:])[-4000:]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="triage.json")
    parser.add_argument("--time-limit", type=float, default=150)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child[0], args.child[1], int(args.child[2]))
    started = time.monotonic()
    result = {"command": "python3 tools/gpu_triage.py " + " ".join(sys.argv[1:]),
              "commit": os.environ.get("ACTPACK_GPU_COMMIT"), "cases": [], "sanitizer": []}

    def save():
        result["wall_seconds"] = round(time.monotonic() - started, 1)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for row in pool.map(lambda c: run_case(c, 40), CASES):
            result["cases"].append(row)
            print(f"{row['spec']:<14}{row['dtype']:>9}{row['mib']:>5} MiB  {row['verdict']}"
                  f"  ({row['seconds']} s)", flush=True)
    save()
    sanitizer = shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",
                     "/usr/local/cuda/compute-sanitizer/compute-sanitizer") if os.path.exists(p)),
        None)
    failing = {}
    for row in sorted(result["cases"], key=lambda r: r["mib"]):
        if not row["verdict"].startswith("ok"):
            failing.setdefault(row["spec"], row)
    left = args.time_limit - (time.monotonic() - started) - 5
    if failing and sanitizer and left > 20:
        picks = list(failing.values())[:6]
        with concurrent.futures.ThreadPoolExecutor(len(picks)) as pool:
            for row in pool.map(lambda r: run_case((r["spec"], r["dtype"], r["mib"]),
                                                   left, sanitizer), picks):
                result["sanitizer"].append(row)
                print(f"\ncompute-sanitizer {row['spec']} {row['dtype']} {row['mib']} MiB: "
                      f"{row['verdict']}\n{row['tail'][-2500:]}", flush=True)
    elif failing:
        print(f"gpu_triage: no sanitizer run ({sanitizer or 'no compute-sanitizer'}, "
              f"{left:.0f} s left)")
    save()
    bad = sum(not r["verdict"].startswith("ok") for r in result["cases"])
    print(f"gpu_triage: {len(result['cases']) - bad} of {len(result['cases'])} cases ok; "
          f"wrote {args.json}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
