"""The scenarios both budget front ends run with the same expectations: here actpack.budget,
in torch_plugin/csrc/budget_test.cc (BudgetScenarioTest) actpack::Budget, from one file,
torch_plugin/testdata/budget_scenarios.json. Both drive the C++ budget run
(runtime/budget_run.h): the cap from the first step, the lift that lets a step before the
first plan say what budget it needs, the errors, and the report's run section."""
import json
import os

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


def train(budget):
    """The scenario file's model and loop (budget_test.cc's Net and Train), from a fresh pool."""
    fresh_pool()
    torch.manual_seed(0)
    width = MODEL["width"]
    net = nn.Sequential(nn.Linear(MODEL["inputs"], width), nn.Tanh(), nn.Linear(width, width),
                        nn.Tanh(), nn.ReLU(), nn.Linear(width, MODEL["classes"]))
    optimizer = torch.optim.Adam(net.parameters(), lr=MODEL["lr"])
    teacher = torch.randn(MODEL["inputs"], MODEL["classes"])
    with budget as run:
        for _ in range(MODEL["steps"]):
            x = torch.randn(MODEL["batch"], MODEL["inputs"])
            loss = F.cross_entropy(net(x), (x @ teacher).argmax(1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
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
