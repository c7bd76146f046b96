"""torch.utils.checkpoint's inputs are kept exact under actpack's codecs: a checkpointed region
runs its forward again from them in backward, so a codec's error on them would run through every
op of the region, batch norm's batch statistics among them. Measured on the residual CNN below
under quant4 (worst parameter group's gradient cosine against exact training): 0.969 packed
without checkpointing, 0.847 checkpointed with the blocks' inputs packed, and the ResNet-50 of
the benchmark suite fell to 0.31 under auto + checkpointing.

actpack.recompute's regions keep only their inputs, so those are packed, but `auto` holds them
to a tenth of its fidelity floor: with the same blocks as regions, 0.847 at quant4, 0.940 at
eb:rel=1e-2 and 0.992 at quant8 (runtime::RegionInput)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import actpack


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class Net(nn.Module):
    def __init__(self, reentrant=None):
        super().__init__()
        self.reentrant = reentrant  # None: no checkpointing
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.blocks = nn.ModuleList([Block(32) for _ in range(4)])
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h) if self.reentrant is None else \
                checkpoint(block, h, use_reentrant=self.reentrant)
        return self.head(h.mean((2, 3)))


class RegionNet(Net):
    """The blocks as actpack.recompute regions."""

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = actpack.recompute(block, h)
        return self.head(h.mean((2, 3)))


def run(reentrant, codec, model_type=Net, recompute=False):
    """Parameter gradients of one step at batch 32 (and the run, under a codec)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)
    torch.manual_seed(1)
    model = model_type(reentrant)
    budget = None
    if codec is None:
        F.cross_entropy(model(x), y).backward()
    else:
        with actpack.budget("1GiB", codec=codec, min_bytes="4KiB",
                            recompute=recompute) as budget:
            F.cross_entropy(model(x), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, budget


def worst_cosine(grads, exact):
    # A convolution's bias before batch norm has no gradient (the norm takes out the mean): only
    # its rounding noise, whose direction means nothing.
    scale = max(g.norm() for g in exact.values())
    return min(F.cosine_similarity(grads[n].flatten(), exact[n].flatten(), dim=0).item()
               for n in exact if exact[n].norm() > 1e-4 * scale)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_inputs_are_kept_exact_and_the_gradients_hold(reentrant):
    exact, _ = run(None, None)
    grads, budget = run(reentrant, "quant4")
    tensors = budget.report["activations"]["saved_tensors"]
    inputs = [t for t in tensors if t.get("reason") == "checkpoint_input"]
    # The four blocks' inputs, whole (batch 32, 32 channels, 32x32).
    assert len(inputs) == 4 and all(t["codec"] == "none" for t in inputs), inputs
    assert all(t["shape"] == [32, 32, 32, 32] for t in inputs), inputs
    # The stem's saves are packed as before.
    assert any(t["codec"] == "quant4" for t in tensors)
    # Without checkpointing, quant4 on every saved tensor holds 0.969 here; the checkpointed
    # blocks' inputs packed at quant4 fell to 0.847.
    assert worst_cosine(grads, exact) > 0.96


def test_the_flag_covers_checkpoints_saves_only():
    # Outside checkpoint's input saving, the thread's flag is off (it is restored after each).
    assert actpack._C._saving_region_inputs("none") == "none"
    _, budget = run(None, "quant4")
    assert not any(t.get("reason") == "checkpoint_input"
                   for t in budget.report["activations"]["saved_tensors"])


def test_a_recompute_regions_inputs_are_packed_within_a_tenth_of_the_floor():
    exact, _ = run(None, None)
    # auto's first step packs every tensor with the harshest codec its measurement allows.
    grads, budget = run(None, "auto", RegionNet, recompute=True)
    tensors = budget.report["activations"]["saved_tensors"]
    # The regions' inputs: saved by the model itself, whole blocks' inputs.
    inputs = [t for t in tensors if not t.get("module") and t["shape"] == [32, 32, 32, 32]]
    assert len(inputs) == 4, tensors
    assert all(t["codec"] not in ("quant2", "quant4", "eb:rel=1e-2", "none")
               for t in inputs), inputs
    # The stem's saves hold the floor itself: quant4 is within it.
    assert any(t["codec"] == "quant4" for t in tensors if t.get("module", "").startswith("stem"))
    # At quant4, as the stem's, the regions' recomputation took the worst group to 0.847, at
    # eb:rel=1e-2 (within a quarter of the floor) to 0.940.
    assert worst_cosine(grads, exact) > 0.95
