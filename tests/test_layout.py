"""Decoded activations come back in the layout the CPU's convolution kernels compute in."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack


def conv_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32),
                         nn.ReLU(inplace=True), nn.Conv2d(32, 32, 3, padding=1, bias=False),
                         nn.BatchNorm2d(32), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 1, bias=False), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, 10))


def step(model, codec, seed=1):
    """One backward under `codec` (plain PyTorch for None); the gradients of the parameters
    and whether the gradient reaching the first convolution's output was channels_last."""
    torch.manual_seed(seed)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    model.zero_grad()
    seen = {}

    def run():
        h = model[0](x)
        h.register_hook(lambda g: seen.update(
            channels_last=g.is_contiguous(memory_format=torch.channels_last)))
        F.cross_entropy(model[1:](h), y).backward()

    if codec is None:
        run()
    else:
        with actpack.budget("100%", codec=codec, min_bytes=1):
            run()
    return [p.grad.clone() for p in model.parameters()], seen["channels_last"]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_lossy_codecs_decode_conv_activations_channels_last():
    model = conv_net()
    plain, plain_layout = step(model, None)
    quant8, quant8_layout = step(model, "quant8")
    identity, identity_layout = step(model, "identity")
    assert not plain_layout and quant8_layout  # batch norm's input came back channels_last
    assert not identity_layout  # identity is plain training, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(plain, identity))
    # Without oneDNN nothing changes layout (torch's own convolution would copy it back).
    with torch.backends.mkldnn.flags(enabled=False):
        nchw, nchw_layout = step(model, "quant8")
    assert not nchw_layout
    # The same quantized activations give the same gradients in either layout, up to the
    # two convolutions' rounding and the few stochastic roundings their forwards' last-bit
    # differences flip: measured at most 2.2e-4 of each parameter's gradient; a decode that
    # put a value in the wrong place would be off by the gradient's whole size.
    for a, b in zip(nchw, quant8):
        assert (a - b).norm() <= 1e-3 * a.norm() + 1e-7
