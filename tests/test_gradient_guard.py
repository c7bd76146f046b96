"""actpack.budget's gradient guard (actpack/_gradient_guard.py): under a lossy codec, a gradient
norm that runs away from its recent median for two steps stops the run from that backward, with
the weights still finite (the decision's own cases, a runaway whose norms dip between two high
steps among them, are runtime/budget_run_test.cc's GradientGuardTest); a single spike, lossless
packing, non-finite steps (GradScaler's) and gradient_guard=False do not; under auto it tightens
the fidelity floor and drops the step before it stops the run. The runaway is made here by
scaling the loss; the real one (2-bit attention inputs in a small GPT, benchmarks/diverging_lm.py)
is the last test here."""
import json
import os
import sys
import warnings

import pytest
import torch
from torch import nn

import actpack


def train(scales, codec="quant2", dropped=None, **options):
    """Steps of a small MLP whose i-th loss is scaled by scales(i); returns the steps run.
    `dropped` (a list) gets the steps whose gradients the budget dropped."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))  # 128 KiB saved per Linear
    done = []
    try:
        with actpack.budget("1GiB", codec=codec, **options):
            for i in range(24):
                loss = nn.functional.cross_entropy(model(x), y) * scales(i)
                loss.backward()
                if dropped is not None and all(p.grad is None for p in model.parameters()):
                    dropped.append(i)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                done.append(i)
    finally:
        assert all(torch.isfinite(p).all() for p in model.parameters())
    return done


def test_a_runaway_gradient_stops_the_run_before_the_optimizer_step():
    with pytest.raises(actpack.GradientRunaway) as error:
        train(lambda i: 1.0 if i < 12 else 1e4)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("actpack: the gradient norm ran away under codec 'quant2'")
    assert "at step 14" in message and "in 2 of the last 3 steps" in message, message
    assert "largest in " in message
    # The context exited through the error: no saved-tensor hooks are left behind.
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_under_auto_a_runaway_tightens_the_floor_and_drops_the_step(tmp_path):
    """Where auto chooses, a runaway is the runtime's to correct: each one halves the fidelity
    floor (0.2 where there was none) and drops that step's gradients, warned and in the report.
    This runaway is the loss's own, so no floor holds it: after three tightenings it stops."""
    report = tmp_path / "run.json"
    dropped = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(actpack.GradientRunaway) as error:
            train(lambda i: 1.0 if i < 12 else 1e4, "auto", dropped=dropped,
                  max_rel_rms=None, report=str(report))
    # Runaways at steps 13, 15, 17 (the second high step of three each time), stopped at 19.
    assert dropped == [13, 15, 17]
    assert "after auto had tightened its fidelity floor 3 times" in str(error.value)
    said = [str(w.message) for w in caught if "falls back to finer codecs" in str(w.message)]
    assert len(said) == 3, said
    for n, (message, floor) in enumerate(zip(said, ("0.2", "0.1", "0.05")), start=1):
        assert f"max_rel_rms={floor} (tightening {n} of 3)" in message, message
        assert "this step's gradients were dropped" in message
    run = json.loads(report.read_text())
    policy = run["activations"]["policy"]
    assert policy["max_rel_rms"] == 0.05 and policy["floor_tightenings"] == 3
    assert sum("falls back to finer codecs" in w for w in run["run"]["warnings"]) == 3


def test_under_a_fixed_codec_in_a_mapping_without_auto_a_runaway_stops_at_once():
    with pytest.raises(actpack.GradientRunaway, match="use a finer codec"):
        train(lambda i: 1.0 if i < 12 else 1e4, {"*": "quant2"})


def test_a_single_spike_is_not_a_runaway():
    assert len(train(lambda i: 1e4 if i == 12 else 1.0)) == 24


@pytest.mark.parametrize("codec, options", [("none", {}), ("identity", {}),
                                            ("quant2", {"gradient_guard": False}),
                                            ("quant2", {"enabled": False})])
def test_lossless_packing_or_the_guard_off_trains_on(codec, options):
    assert len(train(lambda i: 1.0 if i < 12 else 1e4, codec, **options)) == 24


def test_non_finite_steps_are_skipped_not_judged():
    """A GradScaler's overflow steps: inf gradients, skipped by the scaler, not a runaway."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
    with actpack.budget("1GiB", codec="quant2"):
        for i in range(16):
            loss = nn.functional.cross_entropy(model(x), y)
            (loss * (float("inf") if i in (8, 9, 10) else 1.0)).backward()
            model.zero_grad(set_to_none=True)


def test_gradient_guard_takes_a_flag():
    with pytest.raises(TypeError, match="gradient_guard"):
        actpack.budget("1GiB", gradient_guard="yes")


def test_auto_without_a_floor_runs_away_falls_back_and_trains_on():
    """The real runaway (benchmarks/diverging_lm.py): at 72 MiB, where plain training peaks at
    122 MiB, auto with max_rel_rms=None takes 2 bits on attention's inputs and the gradient norm
    runs away (quant2 alone, with one thread as here: 2.8e17 and a loss of 3.34 without the
    guard, 19% above plain's 2.80; 3.12 with two threads). The guard tightens the floor to 0.2
    and drops that step; the run trains on and ends nearer plain's loss than half the
    runaway's cost. Where it ends depends on when the runaway starts, which is chaotic: it
    moves with the thread count and with small changes to the packing. Measured with the guard:
    2.90-2.96 (3.6-5.5% above plain; 2.956 at this test's one thread); with the floor from the
    start 2.806."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import diverging_lm
    plain = diverging_lm.run(None, 60)
    unguarded = diverging_lm.run(diverging_lm.RUNS["quant2, gradient_guard=False"], 60)
    name = f"auto at {diverging_lm.TIGHT}, max_rel_rms=None"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        auto = diverging_lm.run(diverging_lm.RUNS[name], 60)
    assert auto["ended"] == "trained" and auto["weights_finite"], auto
    assert auto["floor_tightenings"] >= 1, auto
    assert auto["steps_dropped"] == auto["floor_tightenings"], auto
    assert any("falls back to finer codecs" in str(w.message) for w in caught)
    runaway_cost = unguarded["last_loss"] - plain["last_loss"]
    assert runaway_cost > 0.2, (unguarded, plain)  # the runaway is real: 0.54 measured
    assert auto["last_loss"] - plain["last_loss"] < 0.5 * runaway_cost, (auto, plain, unguarded)
