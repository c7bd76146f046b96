"""actpack.budget's gradient guard (actpack/_gradient_guard.py): under a lossy codec, a gradient
norm that runs away from its recent median for two steps stops the run from that backward, with
the weights still finite; a single spike, lossless packing, non-finite steps (GradScaler's) and
gradient_guard=False do not. The runaway is made here by scaling the loss; the real one (2-bit
attention inputs in a small GPT) is benchmarks/diverging_lm.py."""
import pytest
import torch
from torch import nn

import actpack


def train(scales, codec="quant2", **options):
    """Steps of a small MLP whose i-th loss is scaled by scales(i); returns the steps run."""
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
    assert "at step 14" in message and "2 steps in a row" in message, message
    assert "largest in " in message
    # The context exited through the error: no saved-tensor hooks are left behind.
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


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
