"""auto's fidelity floor (budget(max_rel_rms=0.2) by default): the policy never takes a codec
whose measured relative RMS error on a tensor is above it, and says so when no plan within it
fits the budget; max_rel_rms=None lifts it."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack
from conftest import fresh_pool


def deep_mlp(depth=8, width=256):
    torch.manual_seed(0)
    layers = [nn.Linear(64, width)]
    for _ in range(depth):
        layers += [nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, width)]
    return nn.Sequential(*layers, nn.ReLU(), nn.Linear(width, 10))


def train(budget, steps=5, **options):
    """`steps` steps of the MLP at batch 512 under `budget`, from a fresh pool; the run."""
    fresh_pool()
    model = deep_mlp()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(512, 64, generator=g), torch.randint(0, 10, (512,), generator=g)
    with actpack.budget(budget, **options) as run:
        for _ in range(steps):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
    return run


def automatic(run):
    """The tensors the policy chose a lossy codec for (the ReLUs' masks are no choice)."""
    return [t for t in run.report["activations"]["saved_tensors"]
            if t["codec"] not in ("none", "mask", "reused")]


def test_the_policy_takes_no_codec_above_the_floor():
    # 4 MiB: the activations (512 x 256 floats, 512 KiB each) must be packed harshly.
    floored = train("4MiB")
    assert floored.report["run"]["max_rel_rms"] == actpack._C.DEFAULT_MAX_REL_RMS == 0.2
    assert floored.report["activations"]["policy"]["max_rel_rms"] == 0.2
    assert floored.report["activations"]["policy"]["capped_candidates"] > 0
    packed = automatic(floored)
    assert len(packed) >= 9  # every Linear's input, and batch norms' inputs
    for t in packed:
        assert t["error"]["rel_rms"] <= 0.2, t
    # Without the floor the same budget gets the harshest codec, at its error.
    free = train("4MiB", max_rel_rms=None)
    assert free.report["run"]["max_rel_rms"] is None
    packed = automatic(free)
    assert {t["codec"] for t in packed} == {"quant2"}
    assert min(t["error"]["rel_rms"] for t in packed) > 0.2


def test_the_first_step_packs_with_the_harshest_codec_its_measurement_allows():
    # Before the policy's first plan (the end of step 2) every tensor gets the safe default:
    # the harshest codec, chosen once the step measured the candidates on it, so not quant2
    # (rel_rms ~0.6 here) but a codec within the floor. A profile for actpack.plan is this step.
    run = train("4MiB", steps=1)
    assert run.report["activations"]["policy"]["plans"] == 0
    packed = automatic(run)
    assert len(packed) >= 9
    for t in packed:
        measured = {c["codec"]: c["rel_error"] for c in t["candidates"]}
        assert measured["quant2"] > 0.2 ** 2, t  # relative squared errors
        assert t["codec"] != "quant2" and measured[t["codec"]] <= 0.2 ** 2, t
    free = train("4MiB", steps=1, max_rel_rms=None)
    assert {t["codec"] for t in automatic(free)} == {"quant2"}


def test_a_budget_only_two_bits_fit_names_the_floor():
    with pytest.raises(torch.OutOfMemoryError, match=r"max_rel_rms=0\.2.*max_rel_rms=None") as e:
        train("3MiB")
    # ... and what recomputation would do instead (this model marks no regions).
    assert "or recompute: blocks marked with actpack.recompute" in str(e.value)
    assert "smallest budget that would work is" in str(e.value)


def test_a_budget_no_plan_fits_says_the_marked_regions_would_recompute():
    model = deep_mlp()
    blocks = list(model)
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(1))
    with pytest.raises(torch.OutOfMemoryError,
                       match=r"regions this model marks with actpack\.recompute would "
                             r"recompute instead under budget\(recompute=\"auto\"\)"):
        with actpack.budget("3MiB"):
            for _ in range(5):
                h = blocks[0](x)
                for i in range(1, len(blocks) - 2, 3):
                    h = actpack.recompute(nn.Sequential(*blocks[i:i + 3]), h)
                F.cross_entropy(blocks[-1](blocks[-2](h)), torch.zeros(512, dtype=torch.long)
                                ).backward()


@pytest.mark.parametrize("value,error", [(-0.1, ValueError), (float("nan"), ValueError),
                                         ("0.2", TypeError), (True, TypeError)])
def test_a_bad_floor_is_refused_naming_it(value, error):
    # The type is checked in Python, the range by the session (C++), once.
    with pytest.raises(error, match="max_rel_rms"):
        actpack.budget("1GiB", max_rel_rms=value)


def test_the_floor_from_the_environment(monkeypatch):
    from actpack import _env
    assert _env.parse("budget=1GiB,max_rel_rms=0.3")["max_rel_rms"] == 0.3
    assert _env.parse("budget=1GiB,max_rel_rms=none")["max_rel_rms"] is None
    with pytest.raises(ValueError, match="max_rel_rms"):
        _env.parse("budget=1GiB,max_rel_rms=high")
