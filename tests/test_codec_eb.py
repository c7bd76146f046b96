"""actpack.encode / actpack.decode for the error-bounded `eb` codec."""
import math
import struct

import pytest
import torch

import actpack

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _bound(x, spec):
    """The bound a spec promises for x: abs, or rel times the finite values' range."""
    mode, value = ("rel", 1e-2) if spec == "eb" else spec.split(":")[1].split("=")
    value = float(value)
    if mode == "abs":
        return value
    finite = x.float()[torch.isfinite(x.float())]
    return value * (finite.max() - finite.min()).double().item() if finite.numel() else 0.0


def _check(x, y, bound):
    """Finite values within the bound, signs kept, zeros zero, non-finite values bit for bit."""
    assert y.dtype == x.dtype and y.shape == x.shape
    xf, yf = x.double().flatten(), y.double().flatten()
    finite = torch.isfinite(xf)
    assert ((yf - xf)[finite].abs() <= bound).all(), ((yf - xf)[finite].abs().max().item(), bound)
    assert (torch.sign(yf[finite]) == torch.sign(xf[finite])).all()
    bits = torch.int32 if x.dtype == torch.float32 else torch.int16
    assert torch.equal(x.flatten()[~finite].view(bits), y.flatten()[~finite].view(bits))


def _smooth(rows, cols):
    r = torch.arange(rows, dtype=torch.float32)[:, None]
    c = torch.arange(cols, dtype=torch.float32)[None, :]
    return torch.sin(c / 37) * torch.cos(r / 23)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", ["eb", "eb:rel=1e-2", "eb:rel=1e-3", "eb:abs=0.01"])
@pytest.mark.parametrize("shape", [(1000,), (37, 45), (2, 3, 30, 70), (5, 3)])
def test_every_value_within_the_bound(dtype, spec, shape):
    torch.manual_seed(0)
    x = (torch.randn(shape) * 3).to(dtype)
    _check(x, actpack.decode(actpack.encode(x, spec)), _bound(x, spec))


def test_ratio_and_error_on_smooth_and_random_data():
    smooth, normal = _smooth(512, 512), torch.randn(1 << 18, generator=torch.Generator().manual_seed(1))
    for x, spec, floor in [(smooth, "eb:rel=1e-2", 14.0), (smooth, "eb:rel=1e-3", 7.0),
                           (normal, "eb:rel=1e-2", 5.5), (normal, "eb:rel=1e-3", 3.4)]:
        buffer = actpack.encode(x, spec)
        assert x.numel() * 4 / buffer.numel() >= floor, (spec, x.numel() * 4 / buffer.numel())
        _check(x, actpack.decode(buffer), _bound(x, spec))


def test_non_finite_values_zeros_and_tiny_values():
    x = _smooth(40, 64)
    x[0, 3], x[5, 5], x[7, 7] = float("nan"), float("inf"), -float("inf")
    x[1, :10] = 0.0
    x[2, :10] = 1e-4  # far below the bound, representable in every dtype
    x[3, :10] = -1e-4
    for dtype in DTYPES:
        xt = x.to(dtype)
        y = actpack.decode(actpack.encode(xt, "eb:rel=1e-3"))
        _check(xt, y, _bound(xt, "eb:rel=1e-3"))
        assert (y[1, :10] == 0).all() and (y[2, :10] > 0).all() and (y[3, :10] < 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_empty_and_scalar(dtype):
    for x in [torch.full((50, 100), 1.25), torch.zeros(0, 5), torch.tensor(-2.5), torch.zeros(300)]:
        x = x.to(dtype)
        y = actpack.decode(actpack.encode(x, "eb"))  # a zero range: exact
        assert y.shape == x.shape and torch.equal(y, x)


@pytest.mark.parametrize("spec, words", [("eb:rel=2", "rel must be in"),
                                          ("eb:abs=-1", "abs must be in"),
                                          ("eb:rel=x", "needs a number, got 'x'"),
                                          ("eb:rel=1e-3,abs=0.1", "one bound"),
                                          ("eb4", "takes no number suffix")])
def test_bad_specs_name_the_value(spec, words):
    with pytest.raises(ValueError, match=words):
        actpack.encode(torch.randn(10), spec)
    with pytest.raises(ValueError, match="int64"):
        actpack.encode(torch.arange(10), "eb")


# ---- a buffer whose checksum is repaired, so that the codec's own checks must catch an edit
# (format.h / FORMAT.md: SplitMix64 over words mixed with their index) ----

_MASK = (1 << 64) - 1


def _splitmix(x):
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _reseal(buffer):
    data = bytearray(buffer.cpu().numpy().tobytes())
    payload = data[128:]
    payload += bytes(-len(payload) % 4)
    total = 0
    for i, (word,) in enumerate(struct.iter_unpack("<I", payload)):
        total += _splitmix(((i << 32) ^ word ^ 0x5851F42D4C957F2D) & _MASK)
    for j, (word,) in enumerate(struct.iter_unpack("<I", bytes(data[:120]))):
        total += _splitmix((((2**31 + j) << 32) ^ word ^ 0x5851F42D4C957F2D) & _MASK)
    data[120:128] = struct.pack("<Q", _splitmix(total & _MASK))
    return torch.frombuffer(data, dtype=torch.uint8).clone().to(buffer.device)


def _resealed_edits(buffer):
    """(what, buffer) pairs, each with one field of an eb buffer broken and the checksum fixed."""
    blocks = 5 * 5  # [40, 70] in 8 x 16 tiles
    edits = {"block header width": (128, 31 << 2), "chunk index": (128 + 4 * blocks, 1),
             "bound mode": (80, 4)}
    for what, (position, bits) in edits.items():
        corrupt = buffer.clone()
        corrupt[position] ^= bits
        yield what, _reseal(corrupt)


def test_resealed_corruption_is_caught_by_the_codec():
    buffer = actpack.encode(_smooth(40, 70), "eb:rel=1e-3")
    assert torch.equal(_reseal(buffer), buffer)  # the helper computes the real checksum
    for what, corrupt in _resealed_edits(buffer):
        with pytest.raises(RuntimeError, match="corrupt eb buffer"):
            actpack.decode(corrupt)


@pytest.mark.gpu
def test_the_cuda_decoder_catches_resealed_corruption():
    buffer = actpack.encode(_smooth(40, 70).cuda(), "eb:rel=1e-3")
    for what, corrupt in _resealed_edits(buffer):
        with pytest.raises(RuntimeError, match="corrupt eb buffer"):
            actpack.decode(corrupt)
