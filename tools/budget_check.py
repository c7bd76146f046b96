#!/usr/bin/env python3
"""Does a budget hold as the system sees it, and how close is the planner to the truth?

Three models in the shapes people train (a VGG-style CNN, a small causal transformer, an
MLP-Mixer), CPU-sized, and the benchmark suite's (resnet50, vit-b16, gpt2-small, unet). Every
measurement runs in a fresh process (`probe`), because a process's resident size only grows
with what it has done before.

  python3 tools/budget_check.py rss --model cnn --budget 256MiB
      the resident set (VmRSS; per step the peak VmHWM, reset every step) above its size when
      the budget is entered, plain and under actpack.budget
  python3 tools/budget_check.py truth --model cnn --budget 256MiB --codec quant2 [--high 1024]
      the largest batch that trains --steps steps under the budget's cap without running out:
      actpack.search's scan over [1, --high] (a geometric grid over the whole range, finer
      around the largest batch that fitted, then every batch up to the next that ran out; fits
      are not monotone in the batch, so no bisection), each try a fresh process, every try
      printed with its seconds
  python3 tools/budget_check.py plan --model cnn --budget 256MiB --codec quant2 [--verify]
          [--high 1024] [--record FILE]
      actpack.plan's answer (its model's estimate, and with --verify the batch its search under
      the cap found), the steps it ran and its measured headroom, next to that truth (the same
      scan, which knows nothing of the planner's answer); --record writes the row into FILE
      (JSON, one row per model, budget, codec and steps, with its command, commit and machine);
      --codec default plans the default choices in one plan and prints their table and the
      steps it ran (no truth)

The truth's cost: the scan tries about 17 batches on its grid over [1, 1024], up to 15 finer
ones and the last gap's; a try that runs out stops at that step. Minutes per row on two cores.

--codec auto+recompute is the planner's choice of that name: budget(codec="auto",
recompute="auto"), for the models whose blocks are actpack.recompute regions (the benchmark
suite's; gpt-d4w64 and vit-d4w64 are its GPT and ViT at depth 4 and width 64, small enough to
search on two cores).
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
import torch.nn.functional as F

MiB = 1 << 20


# ---- models ----

class ImageClassifier(nn.Module):
    """Random RGB images of `size` x `size` and ten class labels."""
    size = 32

    @classmethod
    def batch(cls, b, generator):
        return (torch.randn(b, 3, cls.size, cls.size, generator=generator),
                torch.randint(0, 10, (b,), generator=generator))

    @staticmethod
    def loss(out, y):
        return F.cross_entropy(out, y)


class VGG(ImageClassifier):
    """Conv-BN-ReLU stacks on 64 x 64 images."""
    size = 64

    def __init__(self, width=32, classes=10):
        super().__init__()
        layers, channels = [], 3
        for out, pool in [(width, False), (width, True), (2 * width, False), (2 * width, True),
                          (4 * width, False), (4 * width, True)]:
            layers += [nn.Conv2d(channels, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()]
            if pool:
                layers.append(nn.MaxPool2d(2))
            channels = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels * 8 * 8, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class Transformer(nn.Module):
    """A small causal decoder: embeddings, 4 pre-norm blocks (attention, GELU MLP), a head."""

    def __init__(self, vocab=256, dim=128, heads=4, blocks=4, context=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.zeros(context, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.context = context

    def forward(self, x):
        t = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        h = self.blocks(self.embed(x) + self.position[:t], mask=mask, is_causal=True)
        return self.head(self.norm(h))

    @staticmethod
    def batch(b, generator):
        tokens = torch.randint(0, 256, (b, 129), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]

    @staticmethod
    def loss(out, y):
        return F.cross_entropy(out.flatten(0, 1), y.flatten())


class Mixer(ImageClassifier):
    """MLP-Mixer on 32 x 32 images: 4 x 4 patches (64 tokens), 4 blocks of token and channel
    MLPs."""

    def __init__(self, dim=128, blocks=4, classes=10):
        super().__init__()
        self.patches = nn.Conv2d(3, dim, 4, stride=4)
        self.blocks = nn.ModuleList()
        for _ in range(blocks):
            self.blocks.append(nn.ModuleDict({
                "norm1": nn.LayerNorm(dim),
                "tokens": nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)),
                "norm2": nn.LayerNorm(dim),
                "channels": nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(),
                                          nn.Linear(4 * dim, dim)),
            }))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        h = self.patches(x).flatten(2).transpose(1, 2)  # [b, 64 tokens, dim]
        for block in self.blocks:
            h = h + block["tokens"](block["norm1"](h).transpose(1, 2)).transpose(1, 2)
            h = h + block["channels"](block["norm2"](h))
        return self.head(self.norm(h).mean(1))


MODELS = {"cnn": VGG, "transformer": Transformer, "mixer": Mixer}
# The benchmark suite's models at their CPU sizes (benchmarks/models.py), with their own data,
# loss and optimizer.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks import provenance  # noqa: E402
from benchmarks.models import Task as BenchmarkTask, tasks as benchmark_tasks  # noqa: E402

BENCHMARK_MODELS = {task.name: task for task in benchmark_tasks("cpu")}
# The suite's GPT and ViT at depth 4 and width 64 (2 heads): their blocks recompute in
# micro-batches of 8 under budget(recompute=...), as the suite's do.
BENCHMARK_MODELS["gpt-d4w64"] = BenchmarkTask(
    "gpt-d4w64", "gpt", {"context": 64, "dim": 64, "depth": 4, "heads": 2}, "adamw", context=64)
BENCHMARK_MODELS["vit-d4w64"] = BenchmarkTask(
    "vit-d4w64", "vit", {"image": 32, "patch": 4, "dim": 64, "depth": 4, "heads": 2,
                         "classes": 10}, "adamw", image=32, classes=10)


def training_step(model_name, seed=0):
    """step(batch): one optimizer step of a fresh model of `model_name` on a fixed batch."""
    if model_name in BENCHMARK_MODELS:
        task = BENCHMARK_MODELS[model_name]
        model = task.model("cpu", seed)
        optimizer = task.make_optimizer(model)

        def step(batch):
            x, y = task.batch(batch, seed, "cpu")
            loss = task.loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.item()

        return step
    torch.manual_seed(seed)
    cls = MODELS[model_name]
    model = cls()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(batch):
        x, y = cls.batch(batch, torch.Generator().manual_seed(seed))
        loss = cls.loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


# ---- one case, in this process ----

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def probe(args):
    """Trains `--steps` steps at `--batch`, plain or under the budget; prints one JSON line."""
    torch.set_num_threads(args.threads)
    step = training_step(args.model)
    gc.collect()
    reset_peak()
    start = status("VmRSS")
    steps, run, error = [], None, None
    context = contextlib.nullcontext()
    if args.codec != "plain":
        import actpack
        spec, recompute = budget_arguments(args.codec, args.recompute)
        context = actpack.budget(args.budget, codec=spec, enabled=args.codec != "none",
                                 recompute=recompute)
    try:
        with context as run:
            for _ in range(args.steps):
                step(args.batch)
                steps.append({"peak": status("VmHWM") - start, "after": status("VmRSS") - start})
                reset_peak()
    except torch.OutOfMemoryError as e:
        error = str(e).splitlines()[0]
    result = {"model": args.model, "codec": args.codec, "budget": args.budget,
              "batch": args.batch, "start_rss": start, "steps": steps, "oom": error,
              "peak": max((s["peak"] for s in steps), default=0)}
    if run is not None and getattr(run, "report", None):
        result["pool_peak"] = run.report["run"]["peak_reserved_bytes"]
        result["system_peak"] = run.report["run"].get("peak_system_bytes")
        result["outside"] = run.report["activations"]["policy"].get("outside_pool_bytes")
    print(json.dumps(result))


RECOMPUTE = {"false": False, "true": True, "auto": "auto"}
RECOMPUTE_CHOICE = "auto+recompute"  # the planner's choice: budget(codec="auto", recompute="auto")


def budget_arguments(codec, recompute):
    """(budget's codec, its recompute=) for --codec and --recompute."""
    if codec == RECOMPUTE_CHOICE:
        return "auto", "auto"
    return ("auto" if codec == "none" else codec), RECOMPUTE[recompute]


def run_probe(model, codec, budget, batch, steps, recompute="false"):
    argv = [sys.executable, os.path.abspath(__file__), "probe", "--model", model, "--codec", codec,
            "--budget", budget, "--batch", str(batch), "--steps", str(steps),
            "--recompute", recompute]
    out = subprocess.run(argv, text=True, capture_output=True)
    if out.returncode != 0:
        raise SystemExit(f"probe failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---- what the commands report ----

# The truth's scan: actpack.search's grid ratio and fine steps (see actpack/search.py).
SCAN_COARSE = 1.5
SCAN_FINE = 16


def truth_search(model, codec, budget, steps, high, low=1, recompute="false",
                 coarse=SCAN_COARSE, fine=SCAN_FINE):
    """The largest batch in [low, high] that trains `steps` steps under the budget without
    running out: actpack.search's scan (the whole range on a coarse grid, then finer around the
    largest batch that fitted, then every batch up to the next that ran out), each try a fresh
    process. It knows nothing of the planner's answer. Returns the BatchSearch; each try also
    says in which step a batch that did not fit ran out ("ran_out_in_step", 1-based)."""
    from actpack import search

    ran_out = {}

    def fits(batch):
        result = run_probe(model, codec, budget, batch, steps, recompute)
        if result["oom"] is not None:
            ran_out[batch] = len(result["steps"]) + 1
        return result["oom"] is None

    found = search.largest_batch(fits, low, high, coarse=coarse, fine=fine)
    for t in found.tries:
        t["seconds"] = round(t["seconds"], 1)
        if t["batch"] in ran_out:
            t["ran_out_in_step"] = ran_out[t["batch"]]
    return found


def truth_fields(found, coarse=SCAN_COARSE, fine=SCAN_FINE):
    """The truth's part of a row: the answer, how it was searched, every try and the cost."""
    return {"truth": found.batch,
            "truth_search": {"strategy": found.strategy, "low": found.low, "high": found.high,
                             "coarse": coarse, "fine": fine, "status": found.status,
                             "upper": found.upper, "fresh_processes": True},
            "truth_tries": found.tries, "truth_seconds": round(found.seconds, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["probe", "rss", "truth", "plan"])
    parser.add_argument("--model", choices=sorted(MODELS) + sorted(BENCHMARK_MODELS),
                        default="cnn")
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--codec", default="auto",
                        help="a codec spec, 'auto', 'none' (the budget with nothing packed) or "
                             "'plain' (no actpack)")
    parser.add_argument("--batch", type=int, default=80)
    parser.add_argument("--recompute", choices=sorted(RECOMPUTE), default="false",
                        help="the budget's recompute= (the benchmark models mark their blocks)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--high", type=int, default=1024,
                        help="truth, plan: the upper bound of the truth's scan, [1, HIGH]")
    parser.add_argument("--plan-batches", default="8,16")
    parser.add_argument("--threads", type=int, default=2,
                        help="probe: torch's intra-op threads (the tests run one per worker)")
    parser.add_argument("--verify", action="store_true",
                        help="plan: with actpack.plan(verify=True), real steps under the cap")
    parser.add_argument("--record", metavar="FILE",
                        help="plan: write the row into FILE (JSON), replacing the row of the "
                             "same model, budget, codec, steps and verify")
    args = parser.parse_args()
    if args.command == "probe":
        probe(args)
        return
    if args.command == "rss":
        for codec in ["plain", args.codec]:
            r = run_probe(args.model, codec, args.budget, args.batch, args.steps, args.recompute)
            line = (f"{codec:8} peak {r['peak'] / MiB:7.1f} MiB above the start; after each "
                    f"step {min((s['after'] for s in r['steps']), default=0) / MiB:.1f}.."
                    f"{max((s['after'] for s in r['steps']), default=0) / MiB:.1f} MiB")
            if r.get("pool_peak"):
                line += (f"; pool peak {r['pool_peak'] / MiB:.1f} MiB, outside the pool "
                         f"{(r.get('outside') or 0) / MiB:.1f} MiB")
            if r["oom"]:
                line += f"; OUT OF MEMORY: {r['oom']}"
            print(line)
        return
    if args.command == "truth":
        found = truth_search(args.model, args.codec, args.budget, args.steps, args.high,
                             recompute=args.recompute)
        row = {"model": args.model, "codec": args.codec, "budget": args.budget,
               "steps": args.steps, **truth_fields(found), **provenance.record()}
        print(json.dumps(row))
        return
    import time

    import actpack
    started = time.perf_counter()
    if args.codec == "default":
        # The default choices in one plan: what it costs (no truth searched).
        plan = actpack.plan(training_step(args.model), args.budget,
                            batch_sizes=[int(b) for b in args.plan_batches.split(",")],
                            progress=False, verify=args.verify)
        print(plan.table())
        row = {"model": args.model, "codec": "default", "budget": args.budget, "steps": None,
               "verify": args.verify, "plan_batches": plan.batch_sizes,
               "steps_run": plan.steps_run, "max_batch_size": plan.max_batch_size,
               # Per choice: the share of the budget its line leaves free at its answer, and
               # its tries under the cap (where the steps went).
               "headroom": {c: round(v["headroom"], 4) for c, v in plan.choices.items()},
               "calibration_tries": {c: (v["calibration"] or {}).get("tries")
                                     for c, v in plan.choices.items()},
               # The uncapped profile's reserved over allocated bytes at its largest batch.
               "fragmentation": {c: round(v["fragmentation"], 3)
                                 for c, v in plan.choices.items()},
               "plan_seconds": round(time.perf_counter() - started, 1)}
        print(json.dumps(row))
        if args.record:
            record(args.record, row)
        return
    plan = actpack.plan(training_step(args.model), args.budget,
                        batch_sizes=[int(b) for b in args.plan_batches.split(",")],
                        codecs=[args.codec], progress=False, verify=args.verify)
    plan_seconds = time.perf_counter() - started
    predicted = plan.max_batch_size[args.codec]
    choice = plan.choices[args.codec]
    calibration = choice["calibration"]
    # The truth, scanned over [1, --high] in fresh processes: none of the planner's state (it
    # ran in this one) and nothing of its answer.
    found = truth_search(args.model, args.codec, args.budget, args.steps, args.high,
                         recompute=args.recompute)
    row = {"model": args.model, "codec": args.codec, "budget": args.budget,
           "steps": args.steps, "verify": args.verify, "plan_batches": plan.batch_sizes,
           "estimate": choice["max_batch_size"], "predicted": predicted,
           "steps_run": plan.steps_run,
           "headroom": choice["headroom"] if calibration else None,
           "calibration_tries": calibration["tries"] if calibration else None,
           "plan_seconds": round(plan_seconds, 1),
           **truth_fields(found), "ratio": predicted / found.batch if found.batch else None}
    print(json.dumps(row))
    if args.record:
        record(args.record, row)


WHAT = ("actpack.plan's answer per model, budget and codec choice (no verify: the line through "
        "its profiled peaks held to real steps under the budget less 3%), the steps it ran, its "
        "measured headroom, and the truth: the largest batch that trains `steps` steps under "
        "the budget's cap, found independently of the planner's answer by actpack.search's "
        "scan over [truth_search.low, truth_search.high] (a geometric grid over the whole "
        "range, then finer around the largest batch that fitted, then every batch up to the "
        "next that ran out; no bisection), each try a fresh process, every try in "
        "truth_tries with its seconds (tools/budget_check.py plan). Each row records its "
        "command, commit and machine.")


def record(path, row):
    """Writes `row` into the JSON file at `path`, with the command, commit and machine that
    measured it, in place of the row of the same model, budget, codec, steps and verify."""
    row = dict(row)
    row.update(provenance.record())
    document = {"what": WHAT, "rows": []}
    if os.path.exists(path):
        with open(path) as f:
            document = json.load(f)
    document["what"] = WHAT
    key = ("model", "budget", "codec", "steps", "verify")
    same = [i for i, r in enumerate(document["rows"])
            if tuple(r.get(k) for k in key) == tuple(row[k] for k in key)]
    if same:
        document["rows"][same[0]] = row
        document["rows"] = [r for i, r in enumerate(document["rows"]) if i not in same[1:]]
    else:
        document["rows"].append(row)
    with open(path, "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
