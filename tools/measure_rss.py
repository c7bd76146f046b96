#!/usr/bin/env python3
"""The memory the operating system sees while a model trains, plain or under actpack.budget.

Runs one case in this process (use --case; `--all` runs each case in a fresh subprocess) and
prints a JSON line: the resident set size (VmRSS) when the budget is entered, and per step the
peak (VmHWM, reset every step through /proc/self/clear_refs) and the size after the step, all
relative to that start, next to actpack's own peak counts.

Usage:
  python3 tools/measure_rss.py --all --budget 256MiB --codec division
  python3 tools/measure_rss.py --case actpack --budget 256MiB --no-mkldnn
"""
import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys

import torch
import torch.nn as nn

MiB = 1 << 20


def vgg(width=32, classes=10):
    """Conv-BN-ReLU stacks on 64 x 64 images: the shape of model the budget issue measured."""
    layers, channels = [], 3
    for out, pool in [(width, False), (width, True), (2 * width, False), (2 * width, True),
                      (4 * width, False), (4 * width, True)]:
        layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
        if pool:
            layers.append(nn.MaxPool2d(2))
        channels = out
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels * 8 * 8, classes))


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak():
    """Restarts VmHWM at the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def run_case(args):
    torch.manual_seed(0)
    torch.set_num_threads(2)
    torch.backends.mkldnn.enabled = not args.no_mkldnn
    model = vgg()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, 3, 64, 64)
    y = torch.randint(0, 10, (args.batch,))
    gc.collect()
    reset_peak()
    start = status("VmRSS")
    steps = []
    context = contextlib.nullcontext()
    if args.case == "actpack":
        import actpack
        context = actpack.budget(args.budget, codec=args.codec)
    with context as run:
        for _ in range(args.steps):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps.append({"peak": status("VmHWM") - start, "after": status("VmRSS") - start})
            reset_peak()
    result = {"case": args.case, "budget": args.budget, "codec": args.codec, "batch": args.batch,
              "mkldnn": not args.no_mkldnn, "start_rss": start,
              "peak": max(s["peak"] for s in steps), "steps": steps}
    if args.case == "actpack":
        result["pool_peak_reserved"] = run.report["run"].get("peak_reserved_bytes")
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["plain", "actpack"])
    parser.add_argument("--all", action="store_true", help="plain and actpack, each in its own process")
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--codec", default="division")
    parser.add_argument("--batch", type=int, default=80)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--no-mkldnn", action="store_true")
    args = parser.parse_args()
    if not args.all:
        run_case(args)
        return
    for case in ["plain", "actpack"]:
        argv = [sys.executable, __file__, "--case", case, "--budget", args.budget, "--codec",
                args.codec, "--batch", str(args.batch), "--steps", str(args.steps)]
        if args.no_mkldnn:
            argv.append("--no-mkldnn")
        out = subprocess.run(argv, text=True, capture_output=True)
        if out.returncode != 0:
            sys.exit(out.stderr)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{case:8} peak {r['peak'] / MiB:7.1f} MiB above start; after each step "
              f"{min(s['after'] for s in r['steps']) / MiB:6.1f}..{max(s['after'] for s in r['steps']) / MiB:6.1f} MiB"
              + (f"; pool peak {r['pool_peak_reserved'] / MiB:.1f} MiB" if r.get("pool_peak_reserved") else ""))


if __name__ == "__main__":
    main()
