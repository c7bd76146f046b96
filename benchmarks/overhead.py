"""Where actpack's time goes in a training step: a suite model at one batch, side by side.

Every row runs in actpack's host pool (installed once, uncapped outside a budget), so the
allocator is the same for all and plain PyTorch is the fair baseline (issue: glibc's malloc
against actpack's pool is not). In one process, on the same weights and batches:

  plain        plain PyTorch, no hooks
  none         actpack.budget(codec="none"): the hooks and the step's accounting, nothing packed
  auto         actpack.budget(budget, codec="auto"): what the suite's auto row runs
  accumulate   (--accumulate MICRO) plain PyTorch reaching the same batch the way it would
               under the budget without actpack: gradient accumulation over micro-batches of
               MICRO samples (the largest batch plain trains under the budget), one optimizer
               step (batch norm then normalizes over each micro-batch, not the batch)

The auto step is split by actpack's own clocks: the codecs (the session's clock of its encode
and decode calls), the rest of the saved-tensor hooks (Python and C++, the codecs taken off),
the end of the step (gradient norms, the policy, the peaks), and what is left, the
model's own forward, backward and optimizer step, whose difference from plain's is what packing
does to them (memory traffic, allocations). The rows take turns, --rounds times (plain, none,
auto, plain, none, auto, ...; each budget row a fresh budget), so that a machine whose speed
drifts (shared cores: 15-25% within minutes here) slows every row alike: the seconds are medians
over every round's steps, and each row's ratio to plain is taken per round, against that round's
plain (the median of its steps over the median of plain's), and reported with its spread over
the rounds: min, lower quartile, median, upper quartile, max. A claim "at most X times plain"
is made on the rounds' upper quartile (`q3`), not their median. The budget's first steps
(profiling, the first plan) are not timed.

    python3 benchmarks/overhead.py --model gpt2-small --batch 42 --budget 192MiB --rounds 3
    python3 benchmarks/overhead.py --model resnet50 --batch 47 --budget 320MiB --rounds 3

--json FILE writes the figures with the command, commit and machine
(benchmarks/results/overhead_<model>.json are this command's).
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import actpack  # noqa: E402
from benchmarks import models, provenance  # noqa: E402
from benchmarks.spread import spread  # noqa: E402

WARM_STEPS = 3  # under a budget: auto's two profiling steps and its first planned step


def minor_faults():
    """The process's minor page faults so far (first touches of memory the OS hands out)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def spread_text(s):
    """'1.10x (rounds 0.91-1.35x, upper quartile 1.31x)'."""
    return (f"{s['median']:.2f}x (rounds {s['min']:.2f}-{s['max']:.2f}x, upper quartile "
            f"{s['q3']:.2f}x)")


def timed_steps(step, steps, first_index):
    """(wall seconds, minor page faults) of `steps` steps on batches first_index, ..."""
    rows = []
    for i in range(steps):
        faults = minor_faults()
        start = time.perf_counter()
        step(first_index + i)
        rows.append((time.perf_counter() - start, minor_faults() - faults))
    return rows


def under_budget(step, budget, codec, steps):
    """Per timed step: (wall, codec, hooks without codecs, end of step) seconds and the minor
    page faults; the clocks are the budget's own (actpack.budget.timed, Run.clock)."""
    rows = []
    with actpack.budget(budget, codec=codec).timed() as run:
        for i in range(WARM_STEPS):
            step(i)
        for i in range(steps):
            clock, codec_before = run.clock(), run.totals()["codec_seconds"]
            faults = minor_faults()
            start = time.perf_counter()
            step(WARM_STEPS + i)
            wall = time.perf_counter() - start
            faults = minor_faults() - faults
            after = run.clock()
            codec = run.totals()["codec_seconds"] - codec_before
            rows.append((wall, codec, after["hooks_seconds"] - clock["hooks_seconds"] - codec,
                         after["end_of_step_seconds"] - clock["end_of_step_seconds"], faults))
    return rows, run.report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-small",
                        choices=[t.name for t in models.tasks("cpu")])
    parser.add_argument("--size", default="cpu", choices=["cpu", "smoke"],
                        help="the suite's model sizes (smoke: tiny, to try the tool)")
    parser.add_argument("--batch", type=int, default=42)
    parser.add_argument("--budget", default="192MiB")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per row and round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="turns of the three rows (each budget row a fresh budget)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--accumulate", type=int, metavar="MICRO",
                        help="add plain PyTorch reaching --batch by gradient accumulation over "
                             "micro-batches of MICRO samples")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = next(t for t in models.tasks(args.size) if t.name == args.model)
    model = task.model("cpu")
    optimizer = task.make_optimizer(model)
    # Every row in the same pool. As in the suite, the budget counts everything a step
    # allocates but the weights, built before it (gradients, optimizer state, activations).
    actpack.install_cpu_allocator()

    def step(index):
        x, y = task.batch(args.batch, index, "cpu")
        task.loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def accumulation_step(index):
        x, y = task.batch(args.batch, index, "cpu")
        for xs, ys in zip(x.split(args.accumulate), y.split(args.accumulate)):
            (task.loss(model(xs), ys) * (len(xs) / args.batch)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(0)  # the optimizer's state, oneDNN's caches
    median = statistics.median
    plain_rows, none_rows, auto_rows, accumulate_rows = [], [], [], []
    rounds = {"none": [], "auto": [], "accumulate": []}  # each row over plain, round by round
    for _ in range(args.rounds):
        if args.accumulate:
            accumulate_round = timed_steps(accumulation_step, args.steps, 1)
        plain_round = timed_steps(step, args.steps, 1)
        none_round, _ = under_budget(step, "100%", "none", args.steps)
        auto_round, report = under_budget(step, args.budget, "auto", args.steps)
        plain_median = median(r[0] for r in plain_round)
        rounds["none"].append(median(r[0] for r in none_round) / plain_median)
        rounds["auto"].append(median(r[0] for r in auto_round) / plain_median)
        if args.accumulate:
            rounds["accumulate"].append(median(r[0] for r in accumulate_round) / plain_median)
            accumulate_rows += accumulate_round
        plain_rows += plain_round
        none_rows += none_round
        auto_rows += auto_round
    ratios = {name: spread(values) for name, values in rounds.items() if values}
    plain = median(r[0] for r in plain_rows)
    plain_faults = median(r[1] for r in plain_rows)

    def split(rows):
        wall, codec, hooks, end, faults = (median(r[k] for r in rows) for k in range(5))
        return {"wall": wall, "codec": codec, "hooks": hooks, "end_of_step": end,
                "model": wall - codec - hooks - end, "minor_faults": faults}

    none, auto = split(none_rows), split(auto_rows)
    totals = report["activations"]["totals"]
    print(f"{args.model} at batch {args.batch}, budget {args.budget}, {args.threads} threads, "
          f"medians of {args.rounds} rounds of {args.steps} steps; every row in actpack's pool")
    print(f"plain PyTorch          {plain:7.3f} s; {plain_faults:.0f} minor page faults a step")
    for name, key, row in (("budget, codec none", "none", none),
                           ("budget, codec auto", "auto", auto)):
        print(f"{name:<22} {row['wall']:7.3f} s, {spread_text(ratios[key])} plain: model "
              f"{row['model']:.3f}, codecs {row['codec']:.3f}, hooks {row['hooks']:.3f}, "
              f"end of step {row['end_of_step']:.3f}; {row['minor_faults']:.0f} minor page "
              "faults a step")
    accumulate = None
    if args.accumulate:
        micro_steps = -(-args.batch // args.accumulate)
        accumulate = {"micro_batch": args.accumulate, "micro_steps": micro_steps,
                      "wall": median(r[0] for r in accumulate_rows),
                      "minor_faults": median(r[1] for r in accumulate_rows)}
        print(f"{'plain, accumulating':<22} {accumulate['wall']:7.3f} s, "
              f"{spread_text(ratios['accumulate'])} plain: {micro_steps} micro-batches of "
              f"{args.accumulate} a step")
    print("auto against plain, round by round: "
          + ", ".join(f"{r:.2f}x" for r in rounds["auto"]))
    packed = totals["packed_raw_bytes"]
    print(f"auto packed {packed / 2**20:.0f} MiB over its last run ({totals['packs']} tensors) "
          f"into {totals['packed_stored_bytes'] / 2**20:.0f} MiB, and kept "
          f"{totals['kept_bytes'] / 2**20:.0f} MiB as they were")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance.record(),
                       "model": args.model, "batch": args.batch, "budget": args.budget,
                       "steps": args.steps, "rounds": args.rounds, "threads": args.threads,
                       "plain_seconds": plain, "plain_minor_faults": plain_faults,
                       "none": none, "auto": auto, "accumulate": accumulate,
                       # Each row's step time over plain's, per round and its spread.
                       "per_round": rounds, "over_plain": ratios,
                       "auto_packed_raw_bytes": totals["packed_raw_bytes"],
                       "auto_packed_stored_bytes": totals["packed_stored_bytes"],
                       "auto_kept_bytes": totals["kept_bytes"]}, f, indent=1)


if __name__ == "__main__":
    main()
