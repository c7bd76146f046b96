"""actpack.plan for a model with recompute regions: the auto+recompute choice (budget(codec="auto",
recompute="auto")), its answer tried in fresh processes, as the benchmark suite tries batches.

Run as a script, a fresh process with the model built after actpack's CPU allocator:
`python3 test_planner_recompute.py plan` plans auto and auto+recompute;
`python3 test_planner_recompute.py truth CHOICE BATCH` is one try of the truth: steps as a user
trains from a fresh model and optimizer (auto+recompute with recompute="auto", which switches
recomputation on after two steps) up to two held to the cap, under the full budget.
"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import models  # noqa: E402  (the benchmark's GPT, its blocks marked with actpack.recompute)
from conftest import HANG_GUARD_S

BUDGET = 16 << 20


def gpt_step():
    """step(batch) of a small GPT-like model: the suite's, its blocks recomputed in
    micro-batches of 8 samples once codecs alone cannot hold the step."""
    task = models.Task("gpt", "gpt", {"context": 32, "dim": 32, "depth": 4, "heads": 2},
                       "adamw", context=32)
    model = task.model("cpu", 0)
    optimizer = task.make_optimizer(model)

    def step(batch):
        x, y = task.batch(batch, 0, "cpu")
        task.loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def in_a_fresh_process(*args):
    """This file run as a script with `args`: its last line, as JSON."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), *map(str, args)],
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr[-3000:]
    print(out.stdout)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.usefixtures("cpu_allocator")
def test_the_warm_up_sees_regions_and_the_default_plans_recomputation():
    """A step that runs an actpack.recompute region is seen to (Run.regions), and the default
    plan then has the auto+recompute choice; a model without regions gets none. The plans run
    at a budget no batch fits, so they profile and try nothing under the cap."""
    gpt = gpt_step()
    with actpack.budget("100%", codec="none") as run:
        gpt(4)
    assert run.regions
    plain = nn.Linear(8, 8)

    def linear_step(b):
        F.mse_loss(plain(torch.randn(b, 8)), torch.zeros(b, 8)).backward()

    with actpack.budget("100%", codec="none") as run:
        linear_step(4)
    assert not run.regions
    small = dict(batch_sizes=(1, 2), progress=False, gradients=False)
    assert list(actpack.plan(gpt, "1MiB", **small).choices)[-1] == "auto+recompute"
    assert "auto+recompute" not in actpack.plan(linear_step, "1MiB", **small).choices


def test_auto_recompute_s_answer_trains_in_a_fresh_process_and_5_percent_more_does_not():
    """The plan (in a fresh process, as a user's would run before training: in this one,
    hundreds of tests have laid out the pool's segments) answers at least auto's batch, its
    estimate counting the regions recomputed (fewer bytes a sample than auto's); its answer
    trains under the cap in a fresh process, and the batch 5% larger (and a sample) runs out.
    That bounds the answer against the next batch that runs out above it, not against the
    largest batch that trains: at a budget of eight of the pool's 2 MiB segments, which batch
    fits is not monotone in the batch (tools/budget_check.py scans the whole range for the
    largest batch that trains)."""
    plan = in_a_fresh_process("plan")
    answer = plan["max_batch_size"]["auto+recompute"]
    assert answer >= plan["max_batch_size"]["auto"], plan
    per_sample = plan["per_sample_bytes"]
    assert per_sample["auto+recompute"] < 0.9 * per_sample["auto"], plan
    assert in_a_fresh_process("truth", "auto+recompute", answer)["fits"]
    assert not in_a_fresh_process("truth", "auto+recompute", math.floor(answer / 0.95) + 1)["fits"]


if __name__ == "__main__":
    import warnings
    warnings.simplefilter("ignore")
    actpack.install_cpu_allocator()
    if sys.argv[1] == "plan":
        plan = actpack.plan(gpt_step(), BUDGET, batch_sizes=(4, 8),
                            codecs=("auto", "auto+recompute"), progress=False)
        print(plan.table())
        print(json.dumps({"max_batch_size": plan.max_batch_size,
                          "per_sample_bytes": {name: choice["per_sample_bytes"]
                                               for name, choice in plan.choices.items()}}))
        sys.exit(0)
    choice, batch = sys.argv[2], int(sys.argv[3])
    step = gpt_step()
    codec, recompute = ("auto", "auto") if choice == "auto+recompute" else (choice, False)
    report = actpack.search.trains_under_cap(
        step, BUDGET, batch, codec=codec, recompute=recompute,
        steps=actpack.search.capped_from(codec, recompute) + 2)
    print(json.dumps({"fits": report is not None}))
