"""A budget holds as the operating system counts memory, not only by actpack's own count.

Each case trains in a fresh process (tools/budget_check.py probe) and reads the resident set
from /proc/self/status: its size when the budget is entered, and per step its peak (VmHWM,
restarted every step). The budgets are below what plain training of the same model needs, which
the plain run of each case shows.
"""
import json
import os
import subprocess
import sys

import pytest
from actpack import _C

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20

# What a peak may pass the budget by: the resident set may grow outside the allocator by
# actpack's stated allowance (torch's one-time initialization of its CPU kernels, which the
# first step pays in a fresh process) before that counts against the budget; and it is checked
# when the allocator reserves memory, so what other code touches in between (a few pages of
# the interpreter, oneDNN's scratch) is seen at the next check, and the kernel batches its
# per-thread counts: 4 MiB for those.
SLACK = _C._HOST_OUTSIDE_ALLOWANCE_BYTES + 4 * MiB

CASES = [  # model, batch, budget: plain training of each peaks well above its budget
    ("cnn", 80, "256MiB"),
    ("transformer", 32, "128MiB"),
    ("mixer", 128, "256MiB"),
]


def probe(model, codec, batch, budget, steps=5):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "budget_check.py"), "probe", "--model", model,
         "--codec", codec, "--batch", str(batch), "--budget", budget, "--steps", str(steps),
         # One intra-op thread, as each pytest worker has (tools/test.sh): two beside another
         # worker oversubscribe a 2-core machine.
         "--threads", "1"],
        capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def budget_bytes(text):
    return int(text[:-3]) * MiB


@pytest.mark.parametrize("model,batch,budget", CASES)
def test_the_resident_set_stays_within_the_budget(model, batch, budget):
    plain = probe(model, "plain", batch, budget)
    assert plain["peak"] > 1.3 * budget_bytes(budget), "the budget must be below plain training"
    run = probe(model, "auto", batch, budget)
    assert run["oom"] is None, run["oom"]
    peaks = [step["peak"] for step in run["steps"]]
    assert max(peaks) <= budget_bytes(budget) + SLACK, (
        f"{model}: per-step resident peaks {[round(p / MiB, 1) for p in peaks]} MiB above the "
        f"start, budget {budget}")
    # The report carries the system's count (measured from the budget's own start) beside the
    # allocator's, which holds less than it.
    assert run["system_peak"] <= budget_bytes(budget) + SLACK
    assert run["pool_peak"] < run["system_peak"]
