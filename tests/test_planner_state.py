"""actpack.plan leaves the user's training as it found it, and says how many steps it ran.

The planner's trial steps are real training steps (AdamW with amsgrad, batch norm, dropout, an
LR scheduler): they move every part of the state compared here. plan() must put all of it back
bit for bit: when it returns, when a step raises and when a step is interrupted.
"""
import copy
import os
import random
import signal

import numpy
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack
from actpack import _snapshot

pytestmark = pytest.mark.usefixtures("cpu_allocator")

BUDGET = "16MiB"


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Dropout(0.1))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def training(warm=True):
    """A model, optimizer and scheduler two real steps into training, gradients held from a
    third backward (one of them None), and step(batch) for the planner; warm=False: before
    any step (no optimizer state, no gradients)."""
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, amsgrad=True)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)

    def step(batch):
        optimizer.zero_grad()
        x = torch.randn(batch, 3, 16, 16)  # from the global generators, as dropout
        y = torch.tensor([random.randrange(10) for _ in range(batch)])
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        scheduler.step()

    if not warm:
        return model, optimizer, scheduler, step
    step(4)
    step(4)
    F.cross_entropy(model(torch.randn(4, 3, 16, 16)), torch.arange(4)).backward()
    model.head.bias.grad = None
    return model, optimizer, scheduler, step


def state_of(model, optimizer, scheduler):
    return copy.deepcopy({
        "model": model.state_dict(),
        "training": [m.training for m in model.modules()],
        "grads": {name: p.grad for name, p in model.named_parameters()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": (torch.get_rng_state(), random.getstate(), numpy.random.get_state()),
    })


def differences(before, after, path="state"):
    """Where two states differ (tensors: dtype, device, shape and bits)."""
    if isinstance(before, torch.Tensor) or isinstance(after, torch.Tensor):
        same = (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)
                and before.dtype == after.dtype and before.device == after.device
                and before.shape == after.shape and torch.equal(before, after))
        return [] if same else [path]
    if isinstance(before, dict) and isinstance(after, dict):
        if before.keys() != after.keys():
            return [f"{path} keys"]
        return [d for k in before for d in differences(before[k], after[k], f"{path}.{k}")]
    if isinstance(before, (list, tuple)) and isinstance(after, (list, tuple)):
        if len(before) != len(after):
            return [f"{path} length"]
        return [d for i, (b, a) in enumerate(zip(before, after))
                for d in differences(b, a, f"{path}[{i}]")]
    if isinstance(before, numpy.ndarray):
        return [] if numpy.array_equal(before, after) else [path]
    return [] if before == after else [path]


@pytest.mark.parametrize("warm", [True, False])
def test_plan_restores_the_training_state_bit_for_bit(warm):
    model, optimizer, scheduler, step = training(warm)
    before = state_of(model, optimizer, scheduler)
    if warm:
        assert before["grads"]["head.bias"] is None
        assert before["grads"]["head.weight"] is not None
        assert before["optimizer"]["state"][0]["max_exp_avg_sq"].abs().sum() > 0
    else:  # what the plan's steps create goes again
        assert before["optimizer"]["state"] == {}

    plan = actpack.plan(step, BUDGET, batch_sizes=(4, 8), codecs=("none", "quant2"),
                        progress=False)
    assert plan.steps_run > 10
    assert differences(before, state_of(model, optimizer, scheduler)) == []
    # The restored model trains on as before: a step changes it again.
    step(4)
    assert differences(before["model"], model.state_dict())


def test_without_restore_the_plan_trains():
    """restore=False leaves what the steps did: the comparison above sees it."""
    model, optimizer, scheduler, step = training()
    before = state_of(model, optimizer, scheduler)
    actpack.plan(step, BUDGET, batch_sizes=(4, 8), codecs=("quant2",), progress=False,
                 restore=False)
    changed = differences(before, state_of(model, optimizer, scheduler))
    for part in ("model", "grads", "optimizer", "scheduler", "rng"):
        assert any(d.startswith(f"state.{part}") for d in changed), (part, changed)
    assert "state.model.features.1.num_batches_tracked" in changed


class Stop(Exception):
    pass


@pytest.mark.parametrize("error", [Stop, KeyboardInterrupt])
def test_plan_restores_when_a_step_raises(error):
    model, optimizer, scheduler, step = training()
    before = state_of(model, optimizer, scheduler)
    calls = [0]

    def failing(batch):
        calls[0] += 1
        if calls[0] == 6:  # inside a capped try, after steps have trained
            raise error("stop")
        step(batch)

    with pytest.raises(error):
        actpack.plan(failing, BUDGET, batch_sizes=(4, 8), codecs=("quant2",), progress=False)
    assert calls[0] == 6
    assert differences(before, state_of(model, optimizer, scheduler)) == []


def test_plan_counts_the_steps_it_ran():
    model, optimizer, scheduler, step = training()
    calls = [0]

    def counted(batch):
        calls[0] += 1
        step(batch)

    plan = actpack.plan(counted, BUDGET, batch_sizes=(4, 8), progress=False)
    print(f"default plan ({len(plan.choices)} choices): {plan.steps_run} steps\n{plan.table()}")
    assert plan.steps_run == calls[0] > 0
    assert plan.report["planner"]["steps_run"] == calls[0]
    assert f"{calls[0]} steps run" in plan.table()
    assert f"steps_run={calls[0]}" in repr(plan)


def test_a_sigint_during_the_restore_waits_until_it_is_done():
    """The signal reaches the handler that was there before, once the block is done: Python's
    default raises KeyboardInterrupt, another handler is called. (Set here: an earlier test in
    the process may have left its own.)"""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        done = []
        with pytest.raises(KeyboardInterrupt):
            with _snapshot.sigint_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                done.append(True)
        assert done == [True]
        called = []
        signal.signal(signal.SIGINT, lambda signum, frame: called.append(len(done)))
        with _snapshot.sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            done.append(True)
        assert called == [2]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_planning_a_step_far_over_the_budget_does_not_run_out(monkeypatch):
    """The profiled batches may need many times the budget: their steps are not capped. (auto's
    were capped at a one-byte budget, which a step before the first plan may lift to
    LIFTED_CAP_EXTRA beyond the budget at most: 1 GiB, scaled down here to 16 MiB.)"""
    from actpack import _budget_memory
    monkeypatch.setattr(_budget_memory, "LIFTED_CAP_EXTRA", 16 << 20)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
    optimizer = torch.optim.AdamW(model.parameters())

    def step(batch):  # about 5 MiB a sample
        model(torch.randn(batch, 512, 256)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    budget = 24 << 20
    plan = actpack.plan(step, budget, batch_sizes=(8, 16), codecs=("auto",), progress=False)
    profile = plan.choices["auto"]["measured"]
    assert profile[-1]["allocated_bytes"] > budget + _budget_memory.LIFTED_CAP_EXTRA, profile
    answer = plan.max_batch_size["auto"]
    assert answer >= 1, plan.table()
    assert actpack.search.trains_under_cap(step, budget, answer, codec="auto") is not None


def test_a_verification_where_no_batch_fits_says_so_and_writes_a_valid_report(tmp_path):
    """verify=True where no batch trains under the cap (the first GPU run: the planner's test
    at 40 MiB on an H100): the plan answers 0 for that choice, its table says so, and its report
    is written and valid (it had been refused for a null peak)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    budget = 16 << 20
    steps_in = {}  # steps per budget the planner opened

    def step(batch):
        model(torch.randn(batch, 64)).square().mean().backward()
        # The verification's tries run 4 steps in a budget, the profiles 1 and the calibration's
        # tries of `none` 2: from a budget's third step on, a step needs more than the budget.
        innermost = actpack.budget.open_budgets()[-1]
        steps_in[id(innermost)] = steps_in.get(id(innermost), 0) + 1
        if steps_in[id(innermost)] >= 3:
            torch.empty(2 * budget, dtype=torch.uint8)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    plan = actpack.plan(step, budget, batch_sizes=(8, 16), codecs=("none",), verify=True,
                        report=tmp_path / "plan.json", progress=False)
    assert plan.verified["batch_size"] == 0 and plan.verified["peak_bytes"] is None
    tries = plan.verified["tries"]  # every batch the search tried, none trained
    assert len(tries) == 9 and not any(t["fits"] for t in tries), tries  # from the start, 8 more
    assert plan.verified["smallest_tried"] == min(t["batch"] for t in tries)
    assert plan.max_batch_size["none"] == 0
    assert "verified: none did not fit the cap at batch" in plan.table(), plan.table()
    import json
    saved = json.loads((tmp_path / "plan.json").read_text())  # the C++ writer checked it
    assert saved["planner"]["verified"]["peak_bytes"] is None
