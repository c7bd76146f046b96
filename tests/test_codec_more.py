"""actpack.encode / actpack.decode for the cast, mask and pool codecs (and division in the shared
cases; tests/test_division.py has the rest)."""
import pytest
import torch

import actpack


@pytest.mark.parametrize("spec, dtype", [("cast:fp16", torch.float16), ("fp16", torch.float16),
                                         ("cast:bf16", torch.bfloat16), ("bf16", torch.bfloat16)])
def test_cast_round_trip_is_the_rounded_value(spec, dtype):
    torch.manual_seed(0)
    x = torch.randn(33, 17) * 100
    buffer = actpack.encode(x, spec)
    assert buffer.numel() == 128 + 4 * ((x.numel() + 1) // 2)
    y = actpack.decode(buffer)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert torch.equal(y, x.to(dtype).float())


def test_cast_keeps_non_finite_and_refuses_overflow():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0, 65504.0])
    y = actpack.decode(actpack.encode(x, "cast:fp16"))
    assert torch.isnan(y[0]) and y[1] == float("inf") and y[2] == -float("inf")
    assert torch.equal(y[3:], x[3:])
    with pytest.raises(RuntimeError, match="keep exact"):
        actpack.encode(torch.tensor([1.0, 70000.0]), "cast:fp16")
    assert actpack.decode(actpack.encode(torch.tensor([70000.0]), "bf16")).item() == 70144.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.uint8,
                                   torch.bool])
def test_mask_is_lossless_and_one_bit_per_element(dtype):
    torch.manual_seed(1)
    keep = torch.rand(1000, 3) > 0.3
    x = keep.to(dtype) if dtype in (torch.bool, torch.uint8) else keep.to(dtype) * (1 / 0.7)
    buffer = actpack.encode(x, "mask")
    assert buffer.numel() == 128 + 4 * ((x.numel() + 31) // 32)
    y = actpack.decode(buffer)
    assert y.dtype == dtype and torch.equal(y, x)


def test_mask_relu_output_and_refusals():
    x = torch.relu(torch.randn(77)).gt(0).float() * 2.5
    assert torch.equal(actpack.decode(actpack.encode(x, "mask")), x)
    with pytest.raises(RuntimeError, match="two"):
        actpack.encode(torch.tensor([0.0, 1.0, 2.0]), "mask")
    with pytest.raises(RuntimeError, match="NaN"):
        actpack.encode(torch.tensor([0.0, float("nan")]), "mask")


@pytest.mark.parametrize("spec, k", [("pool4", 4), ("pool:k=8", 8), ("pool2", 2), ("pool64", 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_pool_decodes_to_window_means(spec, k, dtype):
    torch.manual_seed(2)
    x = torch.randn(5, 3, 101).to(dtype)  # 101 is not a multiple of k
    buffer = actpack.encode(x, spec)
    y = actpack.decode(buffer)
    assert y.dtype == dtype and y.shape == x.shape
    pad = (-x.shape[-1]) % k
    windows = x.float().reshape(-1, x.shape[-1])
    means = []
    for start in range(0, x.shape[-1], k):
        means.append(windows[:, start:start + k].mean(1, keepdim=True)
                     .expand(-1, min(k, x.shape[-1] - start)))
    expected = torch.cat(means, 1).reshape(x.shape)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(y.float(), expected, atol=tolerance, rtol=tolerance)
    width = 4 if dtype == torch.float32 else 2
    means_bytes = 15 * ((x.shape[-1] + pad) // k) * width
    assert buffer.numel() == 128 + (means_bytes + 3) // 4 * 4


def test_pool_refuses_non_finite_and_bad_windows():
    x = torch.randn(4, 16)
    x[1, 3] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite"):
        actpack.encode(x, "pool4")
    for bad in ["pool1", "pool:k=65"]:
        with pytest.raises(ValueError):
            actpack.encode(torch.randn(8), bad)


@pytest.mark.parametrize("spec", ["cast:fp16", "cast:bf16", "mask", "pool4", "division",
                                  "division_fft"])
def test_empty_and_scalar(spec):
    for x in [torch.zeros(0, 5), torch.tensor(1.0)]:
        y = actpack.decode(actpack.encode(x, spec))
        assert y.shape == x.shape and torch.equal(y, x)
