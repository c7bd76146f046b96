"""actpack.encode / actpack.decode for the DIVISION codecs (division, division_dct)."""
import math

import pytest
import torch

import actpack

SPECS = ["division", "division:block=4,bits=4", "division:block=3,bits=1,group=32",
         "division_dct", "division_dct:keep=16,bits=8"]


def _smooth_maps(shape, noise=0.02, seed=0):
    """Waves with periods of 100+ pixels per [n, c] plane, plus a little noise."""
    torch.manual_seed(seed)
    n, c, h, w = shape
    ys = torch.arange(h, dtype=torch.float64)[:, None]
    xs = torch.arange(w, dtype=torch.float64)[None, :]
    planes = []
    for p in range(n * c):
        wave = 2 * torch.sin(2 * math.pi * ys / (100 + 30 * (p % 6)) + 0.7 * p) * \
            torch.cos(2 * math.pi * xs / (120 + 25 * (p % 5))) + 0.3 * (p % 3)
        planes.append(wave)
    return (torch.stack(planes).reshape(shape) + noise * torch.randn(shape, dtype=torch.float64)).float()


def _window_means(x, block):
    """Average pooling as FORMAT.md defines the view: NCHW over (H, W), 2-D/3-D along dim -2,
    1-D along its only dim; edge windows average what they hold."""
    if x.dim() >= 4:
        v = x.reshape(-1, 1, x.shape[-2], x.shape[-1])
        kernel = (min(block, x.shape[-2]), min(block, x.shape[-1]))
        means = torch.nn.functional.avg_pool2d(v.double(), kernel, ceil_mode=True)
        up = means.repeat_interleave(kernel[0], 2)[:, :, :x.shape[-2]]
        return up.repeat_interleave(kernel[1], 3)[:, :, :, :x.shape[-1]].reshape(x.shape)
    if x.dim() == 1:
        return _window_means(x.reshape(1, 1, 1, -1), block).reshape(x.shape)
    v = x.reshape(-1, x.shape[-2], x.shape[-1]).transpose(1, 2).unsqueeze(2)  # [P, D, 1, T]
    return _window_means(v, block).squeeze(2).transpose(1, 2).reshape(x.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 3, 13, 21), (1, 2, 5, 40), (4, 30, 16), (50, 9), (100,)])
def test_division_decodes_near_the_input_and_its_lfc_is_the_window_mean(dtype, shape):
    torch.manual_seed(1)
    x = (torch.randn(shape) * 0.3 + torch.linspace(-2, 2, math.prod(shape)).reshape(shape)).to(dtype)
    buffer = actpack.encode(x, "division:block=8,bits=8", seed=3)
    y = actpack.decode(buffer)
    assert y.dtype == dtype and y.shape == x.shape
    # 8 bits: the error is at most a 255th of the residual's range (x minus its window mean,
    # widened by the means' rounding to bfloat16), plus the output's rounding to its dtype.
    residual = x.double() - _window_means(x.double(), 8)
    largest = x.double().abs().max().item()
    bound = ((residual.max() - residual.min()).item() + 2 * largest / 256) / 255 * 1.02
    rounding = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype] * largest
    assert (y.double() - x.double()).abs().max().item() <= bound + rounding


def test_smooth_maps_decode_much_better_than_quant2_at_similar_bytes():
    x = _smooth_maps((4, 8, 64, 64))
    division = actpack.encode(x, "division", seed=1)
    quant = actpack.encode(x, "quant2", seed=1)
    assert division.numel() <= 1.2 * quant.numel()
    error = lambda b: ((actpack.decode(b) - x).norm() / x.norm()).item()
    assert error(division) < error(quant) / 4, (error(division), error(quant))


def test_float32_nchw_ratio_at_b8_2bits_is_at_least_12():
    x = torch.randn(8, 16, 32, 32)
    buffer = actpack.encode(x, "division")
    assert x.numel() * 4 / buffer.numel() >= 12.0  # 12.76x: 2 + 0.25 + 0.25 bits per value


def test_stochastic_rounding_is_unbiased():
    x = _smooth_maps((1, 2, 16, 16), noise=0.3, seed=2)
    draws = 300
    mean = sum(actpack.decode(actpack.encode(x, "division", seed=s)).double() for s in range(draws)) / draws
    one = (actpack.decode(actpack.encode(x, "division", seed=0)).double() - x).abs().max().item()
    # One draw errs by at most a step (sd <= step / 2); the mean of 300 far less.
    assert (mean - x).abs().max().item() < 5 * one / 2 / draws ** 0.5 * 1.5


@pytest.mark.parametrize("spec", SPECS)
def test_empty_scalar_and_one_element(spec):
    for x in [torch.zeros(0, 5), torch.zeros(2, 0, 3, 3), torch.tensor(1.5), torch.tensor([-2.25])]:
        y = actpack.decode(actpack.encode(x, spec))
        assert y.shape == x.shape and torch.equal(y, x)


@pytest.mark.parametrize("spec", ["division", "division_dct"])
def test_non_finite_values_are_refused(spec):
    x = torch.randn(2, 3, 9, 9)
    x[1, 2, 3, 4] = float("nan")
    with pytest.raises(RuntimeError, match="1 non-finite"):
        actpack.encode(x, spec)


@pytest.mark.parametrize("bad, words", [("division:block=1", "block must be 2..64, not 1"),
                                        ("division:bits=3", "bits must be 1, 2, 4 or 8, not 3"),
                                        ("division:group=100", "group size"),
                                        ("division_dct:keep=33", "keep must be 1..32, not 33")])
def test_bad_specs_name_the_value(bad, words):
    with pytest.raises(ValueError, match=words):
        actpack.encode(torch.randn(8), bad)


def test_unsupported_dtype_names_it():
    with pytest.raises(ValueError, match="int64"):
        actpack.encode(torch.arange(64), "division")
