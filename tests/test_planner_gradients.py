"""actpack.plan measures what each choice does to the gradients (issue 27, item 2): from the state
after its warm-up, exact training's gradients and each fixed codec's first profile step's,
compared per parameter group (actpack/_gradient_fidelity.py).

Measured on the MLP below (8 blocks of batch norm, ReLU and Linear, width 256, batch 64; the
first test prints its table): under quant2 and division the worst group's cosine against exact
training is 0.66 and below (0.122 and 0.080 while ReLU's outputs were packed by value, which
dropped the gradients of small positive ones), under eb 0.998.
"""
import json
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack
from actpack import _gradient_fidelity

BUDGET = "32MiB"


def deep_mlp(depth=8, width=128):
    torch.manual_seed(0)
    layers = [nn.Linear(64, width)]
    for _ in range(depth):
        layers += [nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, width)]
    model = nn.Sequential(*layers, nn.ReLU(), nn.Linear(width, 10))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def plan_with_warnings(step, batch_sizes=(32, 64), budget=BUDGET, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = actpack.plan(step, budget, batch_sizes=batch_sizes, progress=False, **options)
    return plan, [str(w.message) for w in caught if "gradients" in str(w.message)]


def test_a_codec_that_turns_the_gradients_is_named_and_a_faithful_one_is_not(tmp_path):
    # Batch 64 at width 256: every Linear's input is 64 KiB, packed (smaller ones stay exact).
    model, optimizer = deep_mlp(width=256)
    bystander = nn.Sequential(nn.Linear(3, 3))  # another model in the process, not trained

    def step(batch):  # its data from torch's random stream, which the plan restores
        x, y = torch.randn(batch, 64), torch.randint(0, 10, (batch,))
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # 12 MiB: the tries under the cap run batches of hundreds, not thousands (the test's time).
    plan, warned = plan_with_warnings(step, batch_sizes=(64, 128), budget="12MiB",
                                      codecs=("none", "quant2", "division", "eb"),
                                      report=tmp_path / "plan.json")
    print(plan.table())
    quant2, eb, none = (plan.choices[c]["gradients"] for c in ("quant2", "eb", "none"))
    # Every Linear is a group, each batch norm too, named as in model.named_modules() (the
    # model that trained is the only one, so no class name in front).
    assert set(quant2["groups"]) == {str(i) for i in range(len(model)) if list(model[i].parameters())}
    assert len(quant2["groups"]) == 8 + 8 + 2 and bystander is not None
    assert quant2["min_cosine"] < 0.8 and quant2["below_bound"], quant2
    assert quant2["worst_group"] == quant2["below_bound"][0]
    division = plan.choices["division"]["gradients"]
    assert division["min_cosine"] < 0.9 and division["below_bound"], division
    assert eb["min_cosine"] >= _gradient_fidelity.COSINE_BOUND and not eb["below_bound"], eb
    # No packing: the same gradients as the exact run.
    assert none["min_cosine"] > 1 - 1e-9 and max(
        g["relative_error"] for g in none["groups"].values()) < 1e-9
    assert len(warned) == 1 and "quant2: " in warned[0] and "division: " in warned[0], warned
    assert "eb: " not in warned[0], warned
    table = plan.table()
    assert f"{quant2['min_cosine']:.3f}!" in table and "  quant2: " in table
    saved = json.loads((tmp_path / "plan.json").read_text())["planner"]
    assert saved["gradients"] == {"bound": _gradient_fidelity.COSINE_BOUND, "batch_size": 64,
                                  "repeatable": True}
    assert saved["choices"]["quant2"]["gradients"]["below_bound"] == quant2["below_bound"]


def test_a_step_that_draws_new_data_each_call_is_not_measured():
    model, optimizer = deep_mlp(depth=2)
    torch.manual_seed(1)
    data = iter([(torch.randn(64, 64), torch.randint(0, 10, (64,))) for _ in range(200)])

    def step(batch):  # an iterator the plan cannot rewind
        x, y = next(data)
        F.cross_entropy(model(x[:batch]), y[:batch]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    plan, warned = plan_with_warnings(step, codecs=("none", "quant2"))
    assert plan.report["planner"]["gradients"]["repeatable"] is False
    assert all(c["gradients"] is None for c in plan.choices.values())
    assert "grad cos: not measured" in plan.table() and not warned


def small_step():
    """A step of a 2-block MLP on data from torch's random stream (which the plan restores)."""
    model, optimizer = deep_mlp(depth=2)

    def step(batch):
        F.cross_entropy(model(torch.randn(batch, 64)), torch.randint(0, 10, (batch,))).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def test_the_measurement_costs_one_step_and_can_be_left_out():
    step = small_step()
    measured, _ = plan_with_warnings(step, codecs=("none", "quant2"))
    skipped, warned = plan_with_warnings(step, codecs=("none", "quant2"), gradients=False)
    assert measured.steps_run == skipped.steps_run + 1
    assert "gradients" not in skipped.report["planner"] and not warned
    assert all("gradients" not in c for c in skipped.choices.values())


def test_auto_is_not_judged_by_its_harshest_profile_step():
    plan, _ = plan_with_warnings(small_step(), codecs=("none", "auto"))
    assert plan.choices["auto"]["gradients"] is None
    assert plan.choices["none"]["gradients"]["min_cosine"] > 1 - 1e-9


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_are_read_by_numpy_without_torch_allocations(dtype):
    """The copy to float64 is numpy's (a bfloat16's bits widened by hand): on the CPU a profile
    step's peak is actpack's allocator's, and a torch copy of every gradient would join it."""
    g = torch.randn(1000).to(dtype)
    out = _gradient_fidelity.host_float64(g)
    assert out.dtype.name == "float64" and (out == g.double().numpy()).all()
