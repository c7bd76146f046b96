"""The scenarios both budget front ends run with the same expectations: here actpack.budget,
in torch_plugin/csrc/budget_test.cc (BudgetScenarioTest) actpack::Budget, from one file,
torch_plugin/testdata/budget_scenarios.json. Both drive the C++ budget run
(runtime/budget_run.h): the cap from the first step, the lift that lets a step before the
first plan say what budget it needs, the errors, and the report's run section; the options
each refuses, with the message runtime::BudgetConfig makes; and the gradient guard's reaction to
a runaway (runtime::GradientGuard)."""
import json
import os
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack
from conftest import fresh_pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "torch_plugin", "testdata", "budget_scenarios.json")) as f:
    SCENARIOS = json.load(f)
MODEL = SCENARIOS["model"]


def model():
    """The scenario file's model, optimizer and teacher (budget_test.cc's Net), from a fresh
    pool."""
    fresh_pool()
    torch.manual_seed(0)
    width = MODEL["width"]
    net = nn.Sequential(nn.Linear(MODEL["inputs"], width), nn.Tanh(), nn.Linear(width, width),
                        nn.Tanh(), nn.ReLU(), nn.Linear(width, MODEL["classes"]))
    optimizer = torch.optim.Adam(net.parameters(), lr=MODEL["lr"])
    teacher = torch.randn(MODEL["inputs"], MODEL["classes"])
    return net, optimizer, teacher


def step(net, optimizer, teacher, scale=1.0):
    """One training step (budget_test.cc's Train); the loss scaled by `scale`."""
    x = torch.randn(MODEL["batch"], MODEL["inputs"])
    loss = F.cross_entropy(net(x), (x @ teacher).argmax(1)) * scale
    optimizer.zero_grad()
    loss.backward()
    dropped = all(p.grad is None for p in net.parameters())
    optimizer.step()
    return dropped


def train(budget):
    """The scenario file's loop under `budget`."""
    net, optimizer, teacher = model()
    with budget as run:
        for _ in range(MODEL["steps"]):
            step(net, optimizer, teacher)
    return run.report


@pytest.mark.parametrize("scenario", SCENARIOS["scenarios"], ids=lambda s: s["name"])
def test_the_python_budget_runs_the_shared_scenario(scenario):
    min_bytes = 0 if scenario["min_bytes"] == "0" else scenario["min_bytes"]
    budget = actpack.budget(scenario["limit"], codec=scenario["codec"], min_bytes=min_bytes)
    expect = scenario["expect"]
    if "error" in expect:
        with pytest.raises(torch.OutOfMemoryError) as error:
            train(budget)
        for text in expect["error"]:
            assert text in str(error.value)
        assert not actpack.memory.cpu_allocator_installed()
        return
    report = train(budget)
    run = report["run"]
    assert list(run) == SCENARIOS["run_keys"]
    assert run["budget_bytes"] == expect["budget_bytes"]
    assert run["peak_reserved_bytes"] <= expect["budget_bytes"]
    assert run["warnings"] == []
    assert report["activations"]["totals"]["steps"] == MODEL["steps"]


@pytest.mark.parametrize("case", SCENARIOS["bad_options"], ids=lambda c: "-".join(c["options"]))
def test_the_python_budget_refuses_a_bad_option_with_the_runtimes_message(case):
    options = dict(case["options"])
    limit = options.pop("limit", "1GiB")
    with pytest.raises(ValueError) as error:
        actpack.budget(limit, **options)
    assert str(error.value) == case["error"]


@pytest.mark.parametrize("scenario", SCENARIOS["runaways"], ids=lambda s: s["name"])
def test_the_python_guard_reacts_to_the_shared_runaway(scenario):
    net, optimizer, teacher = model()
    until = scenario.get("scaled_until", scenario["steps"])
    dropped, stopped_in, message = [], None, ""
    budget = actpack.budget("1GiB", codec=scenario["codec"],
                            max_rel_rms=scenario["max_rel_rms"] or None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # auto's tightenings warn
        try:
            with budget:
                for n in range(1, scenario["steps"] + 1):
                    stopped_in = n
                    scale = scenario["scale"] if scenario["scaled_from"] <= n <= until else 1.0
                    if step(net, optimizer, teacher, scale):
                        dropped.append(n)
                    stopped_in = None
        except actpack.GradientRunaway as error:
            message = str(error)
    expect = scenario["expect"]
    assert (dropped, stopped_in) == (expect["dropped"], expect["stopped_in"]), message
    for text in expect["error"]:
        assert text in message, message
    assert all(torch.isfinite(p).all() for p in net.parameters())
