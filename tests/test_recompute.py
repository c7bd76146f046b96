"""actpack.recompute: regions recomputed in backward inside a budget with recompute=True, their
inputs packed by the budget's policy, in micro-batches where the samples are independent."""
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import models  # noqa: E402  (the benchmark's transformer block)


class Net(nn.Module):
    """Transformer blocks (with dropout, so the recomputation must replay the random state)
    between an embedding and a head, each block a region."""

    def __init__(self, dim=32, depth=3, micro_batch=None, dropout=0.0):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(8, dim)
        self.blocks = nn.ModuleList(models.TransformerBlock(dim, 2, True) for _ in range(depth))
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(dim, 5)
        self.micro_batch = micro_batch

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = actpack.recompute(lambda t, b=block: self.drop(b(t)), h,
                                  micro_batch=self.micro_batch)
        return self.head(h)


def batch(n=20):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 16, 8, generator=g), torch.randint(0, 5, (n, 16), generator=g)


def step(model, budget=None):
    """One backward (under `budget`, a dict of actpack.budget's arguments, if given): the
    loss, the parameters' gradients and the run's totals."""
    x, y = batch()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)  # dropout's masks
    totals = None
    if budget is None:
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
    else:
        with actpack.budget("100%", **budget) as run:
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
        totals = run.totals()
    return loss.item(), [p.grad.clone() for p in model.parameters()], totals


def relative_errors(grads, exact):
    return [((g - e).norm() / e.norm()).item() for g, e in zip(grads, exact)]


@pytest.mark.parametrize("micro_batch", [None, 8, 1], ids=["whole", "micro8", "micro1"])
def test_exact_codec_gives_plain_gradients(micro_batch):
    """With nothing lossy (identity), recomputing gives plain training's loss and gradients,
    dropout included (the recomputation replays the forward's random state micro-batch by
    micro-batch). The whole batch at once computes the same ops on the same data: equal bit
    for bit. Micro-batches sum the parameters' gradients per micro-batch, in another order:
    within 1e-5 of their norm (measured: 5e-7)."""
    model = Net(micro_batch=micro_batch, dropout=0.2)
    loss, exact, _ = step(model)
    loss_r, grads, _ = step(model, {"codec": "identity", "recompute": True})
    assert loss_r == loss
    if micro_batch is None:
        assert all(torch.equal(g, e) for g, e in zip(grads, exact))
    else:
        assert max(relative_errors(grads, exact)) < 1e-5


def test_only_the_regions_inputs_are_saved():
    """Inside a region nothing is saved for the budget: the session sees each region's input
    once (three blocks of 20 x 16 x 32 floats) and what the same model without blocks saves.
    With recompute=False the model saves every block's activations."""
    model = Net(micro_batch=4)
    budget = {"codec": "quant8", "min_bytes": 0}
    _, _, plain_totals = step(model, budget)
    _, grads, totals = step(model, dict(budget, recompute=True))
    _, _, outside = step(Net(depth=0), dict(budget, recompute=True))
    block_input = 20 * 16 * 32 * 4
    assert totals["packed_raw_bytes"] == 3 * block_input + outside["packed_raw_bytes"]
    assert plain_totals["packed_raw_bytes"] > 10 * block_input
    # Packed at 8 bits, the inputs still give gradients near the exact ones.
    _, exact, _ = step(model)
    assert max(relative_errors(grads, exact)) < 0.05


def test_micro_batches_lower_the_peak():
    """A block's MLP holds its 4x-wide hidden layer twice while it runs: recomputing in
    micro-batches of 4 of 64 samples leaves the step's allocated peak, as the budget's report
    counts it, under half of the whole-batch recomputation's (measured 0.23) and of packing
    every block's activations at 2 bits without recomputing (measured 0.32)."""
    peaks = {}
    for micro_batch, recompute in ((None, True), (4, True), (4, False)):
        model = Net(dim=64, depth=4, micro_batch=micro_batch)
        x = torch.randn(64, 64, 8)
        with actpack.budget("100%", codec="quant2", recompute=recompute) as run:
            # What earlier tests left allocated counts in the peak too: the step's own rise.
            held = actpack.memory_allocated("cpu")
            model(x).sum().backward()
        peaks[micro_batch, recompute] = run.report["run"]["peak_allocated_bytes"] - held
    assert peaks[4, True] < 0.5 * peaks[None, True], peaks
    assert peaks[4, True] < 0.5 * peaks[4, False], peaks


def test_outside_a_recomputing_budget_a_region_is_a_call():
    calls = []

    def region(t):
        calls.append(torch.is_grad_enabled())
        return t * 2

    x = torch.ones(4, 3, requires_grad=True)
    out = actpack.recompute(region, x, micro_batch=2)
    assert out.grad_fn is not None and type(out.grad_fn).__name__ == "MulBackward0"
    with actpack.budget("100%", codec="quant2"):  # recompute=False
        assert type(actpack.recompute(region, x).grad_fn).__name__ == "MulBackward0"
    with actpack.budget("100%", codec="quant2", recompute=True):
        with torch.no_grad():
            actpack.recompute(region, x)
        out = actpack.recompute(region, x, micro_batch=2)
        assert "Region" in type(out.grad_fn).__name__
        out.sum().backward()
    assert torch.equal(x.grad, torch.full((4, 3), 2.0))
    # Plain, plain, no-grad, two micro-batches forward, two again in backward.
    assert calls == [True, True, False, False, False, True, True]


def test_several_inputs_and_outputs():
    """A region of two tensors (one not requiring a gradient) and a constant, returning two
    tensors, one of which the loss ignores: gradients as a plain call's, up to float32
    reassociation: the micro-batches' matrix products are blocked by rows differently from the
    whole batch's, so entries of order 10-100 differ in their last bits (~1e-6 relative)."""
    torch.manual_seed(0)
    w = torch.randn(6, 6, requires_grad=True)

    def region(a, scale, b):
        return (a @ w) * scale + b, a.relu()

    a = torch.randn(10, 6, requires_grad=True)
    b = torch.randn(10, 6)
    plain, _ = region(a, 3.0, b)
    plain.square().sum().backward()
    exact_a, exact_w = a.grad.clone(), w.grad.clone()
    a.grad = w.grad = None
    with actpack.budget("100%", codec="identity", recompute=True):
        out, _ = actpack.recompute(region, a, 3.0, b, micro_batch=3)
        out.square().sum().backward()
    assert torch.allclose(a.grad, exact_a, rtol=1e-5, atol=1e-5)
    assert torch.allclose(w.grad, exact_w, rtol=1e-5, atol=1e-5)


def test_bad_arguments_name_what_was_expected():
    x = torch.randn(4, 3, requires_grad=True)
    with pytest.raises(ValueError, match=r"micro_batch must be a positive int or None, got 0"):
        actpack.recompute(torch.relu, x, micro_batch=0)
    with pytest.raises(ValueError,
                       match=r"recompute must be True, False or \"auto\", got 'yes'"):
        actpack.budget("1GiB", recompute="yes")
    bn = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    with actpack.budget("100%", codec="quant2", recompute=True):
        with pytest.raises(ValueError, match=r"1 is a BatchNorm1d in training mode"):
            actpack.recompute(bn, x, micro_batch=2)
        with pytest.raises(ValueError, match=r"share its first dimension.*\(4, 3\), \(5, 3\)"):
            actpack.recompute(torch.add, x, torch.randn(5, 3), micro_batch=2)
        with pytest.raises(TypeError, match=r"a tensor or a tuple of tensors, got list"):
            actpack.recompute(lambda t: [t], x)
        bn.eval()  # running statistics: samples are independent
        actpack.recompute(bn, x, micro_batch=2).sum().backward()


def test_a_replay_that_raises_leaves_nothing_behind():
    """A replay that raises (runs out of memory, in the planner's tries) drops its graph: held
    as themselves, its saved outputs made a cycle with their graph that Python's collector
    cannot see, and the micro-batch's activations stayed allocated."""
    import gc
    import weakref

    lin = nn.Linear(64, 64)
    replays = []

    def region(t):
        h = torch.relu(lin(t))  # relu saves its output
        if torch.is_grad_enabled():
            replays.append(h)
            raise RuntimeError("out of memory in the replay")
        return h

    x = torch.randn(32, 16, 64, requires_grad=True)
    with actpack.budget("100%", codec="identity", recompute=True):
        loss = actpack.recompute(region, x, micro_batch=8).sum()
        with pytest.raises(RuntimeError, match="out of memory in the replay"):
            loss.backward()
    del loss
    gc.collect()
    alive = weakref.ref(replays.pop())
    gc.collect()
    assert alive() is None


def train(budget, recompute, steps=6):
    """`steps` SGD steps of a 4-block net (64 samples) under `budget`: the run's report."""
    model = Net(dim=64, depth=4, micro_batch=4)
    x = torch.randn(64, 64, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with actpack.budget(budget, codec="auto", recompute=recompute) as run:
        for _ in range(steps):
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    return run.report


@pytest.mark.filterwarnings("ignore:actpack.budget. the budget does not hold")
def test_auto_recomputes_once_codecs_alone_cannot_fit():
    """10 MiB: even 2-bit codecs leave a step over the budget (the policy's error names 22 MiB),
    so recompute=False fails, while "auto" switches the regions to recomputation at the end
    of the second step, says so, and the steps from the fourth (the third lifts the cap to
    measure the new step) stay under the budget."""
    with pytest.raises(torch.OutOfMemoryError, match="cannot hold this training step"):
        train("10MiB", False)
    report = train("10MiB", "auto")
    assert any("recompute from step 3 on" in w for w in report["run"]["warnings"])
    steps = report["activations"]["steps"]
    assert len(steps) == 6
    assert all(s["peak_reserved_bytes"] <= 10 << 20 for s in steps[3:]), steps
    # Before: every block's activations packed; after: the blocks' inputs.
    assert steps[5]["peak_live_raw_bytes"] < steps[0]["peak_live_raw_bytes"] / 4


def test_auto_does_not_recompute_while_codecs_fit():
    """80 MiB holds the step with codecs alone: "auto" runs the regions as plain calls, saving
    what recompute=False saves (recomputation would cost a forward for nothing)."""
    auto, plain = train("80MiB", "auto", steps=4), train("80MiB", False, steps=4)
    assert not any("recompute" in w for w in auto["run"]["warnings"])
    assert auto["activations"]["totals"]["packed_raw_bytes"] == \
        plain["activations"]["totals"]["packed_raw_bytes"]
