#!/usr/bin/env python3
"""Does training under actpack end where plain training ends? Whole training runs, on real data.

Two tasks, each trained from scratch on the CPU for a fixed schedule, for every method and
several seeds (the same batches and initial weights per seed across methods):

  digits-cnn   a CNN with batch norm (6 conv-BN-ReLU layers, 16x16 to 4x4 maps) on scikit-learn's
               handwritten digits (1,797 8x8 images shipped inside the package, upsampled
               2x), 1,437 for training and 360 held out: test accuracy
  stdlib-lm    a byte-level GPT (benchmarks/models.GPT: 4 pre-norm blocks, width 128, context
               64) on the Python standard library's source (3.5 MB to train on, the last
               0.5 MB held out): validation loss

Methods: plain PyTorch; actpack with quant2, division and eb under a budget they cannot run out
of; and auto under 50% and 30% of plain's peak (measured in the same run, with actpack's
allocator and packing off). A run the gradient guard stops (actpack.GradientRunaway) or that
does not fit its budget is reported as such, not averaged.

    python3 benchmarks/convergence.py                 # 3 seeds, full schedules (~30 min)
    python3 benchmarks/convergence.py --smoke         # 1 seed, a few steps (the test command)
    python3 benchmarks/convergence.py --render benchmarks/results/convergence.json  # its table
    ... --json benchmarks/results/convergence.json --svg benchmarks/results/convergence.svg
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import provenance  # noqa: E402

import actpack  # noqa: E402

METHODS = ["plain", "quant2", "division", "eb", "auto@50%", "auto@30%"]


# ---- digits-cnn ----

class DigitsCNN(nn.Module):
    """Three stages of two conv-BN-ReLU layers (16x16, 8x8, 4x4 maps), as a VGG-style net."""

    def __init__(self, width=32):
        super().__init__()
        def block(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
        self.features = nn.Sequential(
            *block(1, width), *block(width, width), nn.MaxPool2d(2),
            *block(width, 2 * width), *block(2 * width, 2 * width), nn.MaxPool2d(2),
            *block(2 * width, 4 * width), *block(4 * width, 4 * width))
        self.head = nn.Linear(4 * width * 4 * 4, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def digits():
    """(train x, train y, test x, test y): the digits at 16x16, a fixed split."""
    from sklearn.datasets import load_digits
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
    x = (x - x.mean()) / x.std()
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    train, test = order[:1437], order[1437:]
    return x[train], y[train], x[test], y[test]


class DigitsTask:
    name, metric, higher_is_better = "digits-cnn", "test accuracy", True

    def __init__(self, steps, batch=128):
        self.steps, self.batch = steps, batch
        self.data = digits()

    def model(self):
        return DigitsCNN()

    def optimizer(self, model):
        optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
        return optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, self.steps)

    def batches(self, seed):
        x, y = self.data[0], self.data[1]
        generator = torch.Generator().manual_seed(seed)
        while True:
            for index in torch.randperm(len(y), generator=generator).split(self.batch):
                if len(index) == self.batch:
                    yield x[index], y[index]

    def loss(self, model, x, y):
        return F.cross_entropy(model(x), y)

    @torch.no_grad()
    def evaluate(self, model):
        model.eval()
        correct = (model(self.data[2]).argmax(1) == self.data[3]).float().mean().item()
        model.train()
        return correct


# ---- stdlib-lm ----

class StdlibLMTask:
    name, metric, higher_is_better = "stdlib-lm", "validation loss", False
    CONTEXT = 64

    def __init__(self, steps, batch=32):
        self.steps, self.batch = steps, batch
        corpus = models.load_corpus(4 << 20)
        split = corpus.numel() - (512 << 10)
        self.train, self.held_out = corpus[:split], corpus[split:]

    def model(self):
        return models.GPT(context=self.CONTEXT, dim=128, depth=4, heads=4)

    def optimizer(self, model):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        return optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, self.steps)

    def windows(self, data, starts):
        x = torch.stack([data[s:s + self.CONTEXT] for s in starts]).long()
        y = torch.stack([data[s + 1:s + self.CONTEXT + 1] for s in starts]).long()
        return x, y

    def batches(self, seed):
        generator = torch.Generator().manual_seed(seed)
        while True:
            starts = torch.randint(0, self.train.numel() - self.CONTEXT - 1, (self.batch,),
                                   generator=generator)
            yield self.windows(self.train, starts)

    def loss(self, model, x, y):
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    @torch.no_grad()
    def evaluate(self, model):
        model.eval()
        starts = torch.arange(0, self.held_out.numel() - self.CONTEXT - 1,
                              (self.held_out.numel() - self.CONTEXT - 1) // 64)[:64]
        x, y = self.windows(self.held_out, starts)
        loss = self.loss(model, x, y).item()
        model.train()
        return loss


# ---- one run ----

def train(task, method, seed, budget_bytes=None, record_every=10):
    """One run from `seed`: {"ended", "metric", "curve" (loss every record_every steps),
    "seconds", "peak_reserved_bytes" (actpack runs)}."""
    torch.manual_seed(seed)
    model = task.model()
    optimizer, schedule = task.optimizer(model)
    data = task.batches(seed)
    if method == "plain":
        context = contextlib.nullcontext()
    elif method == "measure":  # plain's peak, through actpack's allocator with packing off
        context = actpack.budget("64GiB", enabled=False)
    elif method.startswith("auto@"):
        context = actpack.budget(budget_bytes, codec="auto")
    else:
        context = actpack.budget("64GiB", codec=method)
    curve, ended, run = [], "trained", None
    start = time.perf_counter()
    try:
        with context as run:
            for step in range(task.steps):
                x, y = next(data)
                loss = task.loss(model, x, y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                schedule.step()
                if step % record_every == 0 or step == task.steps - 1:
                    curve.append((step, loss.item()))
    except actpack.GradientRunaway:
        ended = f"stopped by the gradient guard at step {len(curve) and curve[-1][0] + 1}"
    except torch.OutOfMemoryError as error:
        ended = "did not fit: " + str(error).split(";")[0]
    seconds = time.perf_counter() - start
    metric = task.evaluate(model) if ended == "trained" else None
    if metric is not None and not math.isfinite(metric):
        ended, metric = "diverged (non-finite)", None
    result = {"ended": ended, "metric": metric, "curve": curve, "seconds": seconds}
    if run is not None and getattr(run, "report", None):
        result["peak_reserved_bytes"] = run.report["run"]["peak_reserved_bytes"]
    return result


def run_task(task, seeds, methods):
    peak = train(task, "measure", seeds[0])["peak_reserved_bytes"]
    rows = {}
    for method in methods:
        budget = int(peak * int(method[5:-1]) / 100) if method.startswith("auto@") else None
        runs = [train(task, method, seed, budget) for seed in seeds]
        values = [r["metric"] for r in runs if r["metric"] is not None]
        rows[method] = {
            "budget_bytes": budget, "runs": runs,
            "mean": statistics.mean(values) if values else None,
            "stdev": statistics.stdev(values) if len(values) > 1 else 0.0 if values else None,
            "completed": len(values), "seeds": len(seeds)}
        shown = (f"{rows[method]['mean']:.4f} ± {rows[method]['stdev']:.4f}"
                 if values else "-")
        notes = "; ".join(sorted({r["ended"] for r in runs if r["ended"] != "trained"}))
        print(f"  {task.name:<11} {method:<10} {task.metric} {shown:<18} "
              f"({len(values)}/{len(seeds)} trained{'; ' + notes if notes else ''})", flush=True)
    return {"metric": task.metric, "higher_is_better": task.higher_is_better,
            "steps": task.steps, "plain_peak_reserved_bytes": peak, "methods": rows}


def markdown(results):
    lines = ["| task | metric | " + " | ".join(METHODS) + " |",
             "|---|---|" + "---|" * len(METHODS)]
    for name, t in results["tasks"].items():
        cells = []
        for method in METHODS:
            m = t["methods"].get(method)
            if m is None or m["mean"] is None:
                endings = {r["ended"].split(":")[0] for r in m["runs"]} if m else set()
                cells.append("did not fit" if endings == {"did not fit"} else
                             "stopped by the guard" if m and all(
                                 e.startswith("stopped") for e in endings) else "-")
                continue
            cell = f"{m['mean']:.4f} ± {m['stdev']:.4f}"
            if m["completed"] < m["seeds"]:
                cell += f" ({m['completed']}/{m['seeds']})"
            cells.append(cell)
        lines.append(f"| {name} ({t['steps']} steps) | {t['metric']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def picture(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = results["tasks"]
    figure, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4))
    for ax, (name, t) in zip(axes if len(tasks) > 1 else [axes], tasks.items()):
        for method, m in t["methods"].items():
            runs = [r["curve"] for r in m["runs"] if r["curve"]]
            if not runs:
                continue
            length = min(len(c) for c in runs)
            steps = [runs[0][i][0] for i in range(length)]
            mean = [statistics.mean(c[i][1] for c in runs) for i in range(length)]
            ax.plot(steps, mean, label=method, linewidth=1.2)
        ax.set_title(f"{name}: training loss (mean of seeds)")
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, format="svg")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cnn-steps", type=int, default=400)
    parser.add_argument("--lm-steps", type=int, default=600)
    parser.add_argument("--smoke", action="store_true", help="1 seed, 12 steps each")
    parser.add_argument("--json", default=None)
    parser.add_argument("--svg", default=None)
    parser.add_argument("--render", metavar="JSON",
                        help="print the table of a results file (docs/results.md's) and exit")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            print(markdown(json.load(f)))
        return None
    if args.smoke:
        args.seeds, args.cnn_steps, args.lm_steps = 1, 12, 12
    torch.set_num_threads(max(1, torch.get_num_threads()))
    seeds = list(range(args.seeds))
    results = {**provenance.record(["benchmarks/convergence.py"] + list(argv or sys.argv[1:])),
               "torch": torch.__version__, "actpack": actpack.__version__,
               "threads": torch.get_num_threads(), "tasks": {}}
    for task in (DigitsTask(args.cnn_steps), StdlibLMTask(args.lm_steps)):
        results["tasks"][task.name] = run_task(task, seeds, METHODS)
    print(markdown(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.svg:
        picture(results, args.svg)
    return results


if __name__ == "__main__":
    main()
