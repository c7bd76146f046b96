"""Backward kernels that write their gradient into the activation actpack decoded for them
(torch_plugin/csrc/lean_backward.h): ATen's gradients, less memory at the step's peak, and no
tensor touched that actpack did not decode for that very op."""
import contextlib
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack
from actpack import _C

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import models  # noqa: E402  (the benchmark's ResNet-50 bottleneck)


def bottleneck_net(narrow=32, wide=64):
    """What the lean kernels cover, as a ResNet's bottlenecks have it: batch norm, in-place
    ReLU, 1x1 convolutions of stride 1 and 2 (and a 3x3 one, which they leave to oneDNN)."""
    torch.manual_seed(0)
    n, w = narrow, wide
    return nn.Sequential(
        nn.Conv2d(3, n, 3, padding=1, bias=False), nn.BatchNorm2d(n), nn.ReLU(inplace=True),
        nn.Conv2d(n, w, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
        nn.Conv2d(w, n, 1, stride=2, bias=True), nn.ReLU(inplace=True),
        nn.Conv2d(n, n, 3, padding=1, bias=False), nn.BatchNorm2d(n, affine=False),
        nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(n, 10))


@contextlib.contextmanager
def lean_budget(lean, codec="quant8"):
    """A budget packing every saved tensor with `codec`, the lean kernels on or off; the dict
    it yields holds, after the block, how many decoded tensors the kernels wrote over."""
    _C._set_lean_backward(lean)
    counts, before = {}, _C._lean_backward_taken()
    try:
        with actpack.budget("100%", codec=codec, min_bytes=1):
            yield counts
    finally:
        _C._set_lean_backward(True)
        counts["taken"] = _C._lean_backward_taken() - before


def gradients(model, lean, codec="quant8", train=True, inputs=(8, 3, 16, 16)):
    """One backward under `codec` over a random batch of shape `inputs`, with or without the
    lean kernels: the parameters' gradients and how many decoded tensors the kernels
    overwrote."""
    model.train(train)
    torch.manual_seed(1)
    x, y = torch.randn(inputs), torch.randint(0, 10, (inputs[0],))
    model.zero_grad(set_to_none=True)
    with lean_budget(lean, codec) as counts:
        F.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()], counts["taken"]


@pytest.mark.parametrize("mkldnn", [True, False], ids=["channels_last", "nchw"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("shape", [(32, 64, 8, 16), (13, 29, 7, 13)], ids=["x8", "odd"])
def test_lean_kernels_give_atens_gradients(mkldnn, train, shape):
    """The same decoded activations (the forward is untouched) give ATen's gradients, to
    float rounding: measured at most 4.4e-6 of a parameter's gradient norm. A kernel that left
    out a term of batch norm's gradient (its mean, the projection on x - mean), wrote a 1x1
    convolution's gradient to the wrong pixels, or kept a ReLU's gradient where the input was
    negative would be off by a sizable fraction of it. Odd channel counts, images and batches
    run the vector loops' tails (8 floats a vector on AVX2) in both layouts and the masks."""
    if mkldnn and not torch.backends.mkldnn.is_available():
        pytest.skip("needs oneDNN")
    narrow, wide, batch, size = shape
    model = bottleneck_net(narrow, wide)
    with torch.backends.mkldnn.flags(enabled=mkldnn):
        aten, none_taken = gradients(model, lean=False, train=train, inputs=(batch, 3, size, size))
        lean, taken = gradients(model, lean=True, train=train, inputs=(batch, 3, size, size))
    assert none_taken == 0
    # Channels_last: 3 batch norms, 3 ReLUs (not the last: the pooling's gradient comes back
    # NCHW), 2 1x1 convolutions. NCHW (oneDNN off): the batch norms and the 4 ReLUs.
    assert taken == (8 if mkldnn else 7)
    for a, b in zip(aten, lean):
        assert (a - b).norm() <= 1e-5 * a.norm()


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_lean_batch_norm_over_features_gives_atens_gradients(train):
    """BatchNorm1d over [N, C] features: one element a sample and channel, which the kernel
    sums as rows of C channels. A sum that skipped a row chunk or a channel would be off by a
    sizable fraction of the gradient."""
    torch.manual_seed(0)
    # No bias before the batch norm: its gradient is zero but for rounding.
    model = nn.Sequential(nn.Linear(24, 37, bias=False), nn.BatchNorm1d(37), nn.ReLU(),
                          nn.Linear(37, 10))
    aten, none_taken = gradients(model, lean=False, train=train, inputs=(53, 24))
    lean, taken = gradients(model, lean=True, train=train, inputs=(53, 24))
    assert none_taken == 0 and taken >= 1  # the batch norm at least
    for a, b in zip(aten, lean):
        assert (a - b).norm() <= 1e-5 * a.norm()


def test_lean_activations_are_atens_bit_for_bit():
    """GELU (exact and tanh), SiLU and ReLU run ATen's own kernels over the decoded input:
    the same gradients bit for bit, each of the four offers taken."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128),
                          nn.GELU(approximate="tanh"), nn.Linear(128, 64), nn.SiLU(),
                          nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    x, y = torch.randn(64, 32), torch.randint(0, 10, (64,))

    def grads(lean):
        model.zero_grad(set_to_none=True)
        with lean_budget(lean) as counts:
            F.cross_entropy(model(x), y).backward()
        return [p.grad.clone() for p in model.parameters()], counts["taken"]

    (aten, none_taken), (lean, taken) = grads(False), grads(True)
    assert (none_taken, taken) == (0, 4)
    assert all(torch.equal(a, b) for a, b in zip(aten, lean))


def test_identity_codec_offers_nothing():
    """`identity` is plain training bit for bit: its decoded tensors go to ATen's kernels."""
    model = bottleneck_net()
    _, taken = gradients(model, lean=True, codec="identity")
    assert taken == 0


class ReluThenSaved(torch.autograd.Function):
    """A custom backward that calls threshold_backward on its saved tensor and then returns
    that tensor: an op in user code must never overwrite what the user reads afterwards."""

    @staticmethod
    def forward(ctx, x):
        y = x.clamp_min(0)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        g = torch.ops.aten.threshold_backward(grad, y, 0)
        return y + 0 * g


def test_ops_in_custom_backward_leave_saved_tensors_alone():
    torch.manual_seed(0)
    x = torch.randn(4, 8, 8, 8, requires_grad=True)
    w = torch.randn_like(x)  # a dense gradient, strided as y: the op could take y
    with lean_budget(True) as counts:
        got = torch.autograd.grad((ReluThenSaved.apply(x) * w).sum(), x)[0]
    assert counts["taken"] == 0
    # y as quant8 decoded it: within a 255th of its group's range of the ReLU's output. Had
    # the op written its result over y, this would be the mask times w.
    assert (got - x.detach().clamp_min(0)).abs().max() <= x.abs().max() / 100


def test_direct_calls_compute_as_aten_and_modify_nothing():
    """Outside a backward node every call goes to ATen's kernel, inputs unchanged."""
    torch.manual_seed(0)
    x = torch.randn(4, 16, 8, 8).contiguous(memory_format=torch.channels_last)
    g = torch.randn_like(x)
    w, mean, invstd = torch.rand(16) + 0.5, x.mean((0, 2, 3)), torch.rand(16) + 0.5
    saved = x.clone(), g.clone()
    bn = torch.ops.aten.native_batch_norm_backward(g, x, w, None, None, mean, invstd, True,
                                                   1e-5, [True, True, True])
    relu = torch.ops.aten.threshold_backward(g, x, 0.0)
    conv = torch.ops.aten.convolution_backward(g, x, torch.randn(16, 16, 1, 1), [0], [1, 1],
                                               [0, 0], [1, 1], False, [0, 0], 1,
                                               [True, True, False])
    assert torch.equal(x, saved[0]) and torch.equal(g, saved[1])
    assert torch.equal(relu, torch.where(x > 0, g, torch.zeros_like(g)))
    assert relu.is_contiguous(memory_format=torch.channels_last)  # ATen's layout
    xh, gh = x.double(), g.double()
    inv = invstd.double().view(1, -1, 1, 1)
    xhat = (xh - mean.double().view(1, -1, 1, 1)) * inv
    ref = (gh - gh.mean((0, 2, 3), keepdim=True)
           - xhat * (gh * xhat).mean((0, 2, 3), keepdim=True)) * inv * w.double().view(1, -1, 1, 1)
    assert torch.allclose(bn[0].double(), ref, rtol=1e-4, atol=1e-5)
    assert conv[0].shape == x.shape and conv[2] is None


def bottleneck_backward_peak(lean):
    """The allocator's peak over a stage-1 ResNet-50 bottleneck's backward at batch 16,
    quant2-packed, above where the backward starts, in units of its 256-channel activation."""
    torch.manual_seed(0)
    block = models.Bottleneck(256, 64, 1)
    x = torch.randn(16, 256, 16, 16, requires_grad=True)
    unit = x.numel() * 4
    memory, peak = actpack.memory, []
    # Read when the input's gradient arrives: the backward's peak, before the step's end.
    x.register_hook(lambda g: peak.append(memory.max_memory_allocated("cpu")))
    with lean_budget(lean, "quant2"):
        y = block(x * 1.0)
        g = torch.randn_like(y).contiguous(memory_format=torch.channels_last)
        start = memory.memory_allocated("cpu")
        memory.reset_peak_memory_stats("cpu")
        y.backward(g)
    return (peak[0] - start) / unit


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_lean_kernels_lower_the_backward_peak(cpu_allocator):
    """Measured: ATen's kernels take the bottleneck's backward 3.93 activations above where it
    starts, the lean ones 2.16. In ATen batch norm allocates its input gradient twice beside
    its decoded input, ReLU its gradient beside its decoded output, a 1x1 convolution its
    input gradient beside its decoded input; lean, each writes over the decoded tensor."""
    aten, lean = bottleneck_backward_peak(False), bottleneck_backward_peak(True)
    assert lean <= aten - 1.5, (lean, aten)
    assert lean <= 2.5, lean
