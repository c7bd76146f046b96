"""actpack.encode / actpack.decode for the cast, mask, pool and bitpack codecs (and division in
the shared cases; tests/test_division.py has the rest)."""
import pytest
import torch
import torch.nn as nn

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


INTEGERS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


def bitpacked_size(x):
    """FORMAT.md: the header and ceil(numel * b / 32) words, b the bits of max - min."""
    bits = int(x.max()) - int(x.min()) if x.numel() else 0
    return 128 + 4 * ((x.numel() * bits.bit_length() + 31) // 32)


@pytest.mark.parametrize("dtype", INTEGERS)
def test_bitpack_is_lossless_at_the_bits_of_the_range(dtype):
    info = torch.iinfo(dtype)
    torch.manual_seed(3)
    for n in [0, 1, 31, 32, 33, 1000]:
        for low, high in [(0, 9), (max(info.min, -300), min(info.max, 300)),
                          (info.max - 20, info.max)]:
            x = (torch.randint(0, high - low + 1, (n,)) + low).to(dtype)
            buffer = actpack.encode(x, "bitpack")
            assert buffer.dtype == torch.uint8 and buffer.numel() == bitpacked_size(x)
            y = actpack.decode(buffer)
            assert y.dtype == dtype and torch.equal(y, x), (n, low, high)
    # Both extremes: every bit of the dtype (64 for int64).
    x = torch.tensor([info.min, 0, info.max, -1 if info.min < 0 else 1], dtype=dtype)
    buffer = actpack.encode(x, "bitpack")
    assert buffer.numel() == 128 + 4 * ((4 * info.bits + 31) // 32)
    assert torch.equal(actpack.decode(buffer), x)
    # All equal: no payload at all.
    x = torch.full((5, 7), info.max, dtype=dtype)
    assert actpack.encode(x, "bitpack").numel() == 128
    assert torch.equal(actpack.decode(actpack.encode(x, "bitpack")), x)


def test_bitpack_packs_max_pool_indices_in_ten_bits():
    torch.manual_seed(0)
    _, indices = nn.functional.max_pool2d(torch.randn(64, 32, 32), 3, 2, 1, return_indices=True)
    assert indices.dtype == torch.int64 and indices.shape == (64, 16, 16)
    assert 0 <= int(indices.min()) and 512 <= int(indices.max()) < 1024
    buffer = actpack.encode(indices, "bitpack")
    raw = indices.numel() * 8
    assert buffer.numel() == 128 + raw * 10 // 64  # 20608 bytes for 131072: 6.4x less
    assert torch.equal(actpack.decode(buffer), indices)


def test_bitpack_shapes_views_and_refusals():
    x = torch.arange(-50, 70, dtype=torch.int32).reshape(8, 15)
    for view in [x.t(), x[:, 3:9], x.reshape(2, 4, 15), x[0, 0]]:
        y = actpack.decode(actpack.encode(view, "bitpack"))
        assert y.shape == view.shape and torch.equal(y, view)
    for tensor in [torch.randn(4), torch.zeros(4, dtype=torch.bool), torch.zeros(4, dtype=torch.float64)]:
        with pytest.raises(ValueError, match=str(tensor.dtype).replace("torch.", "")):
            actpack.encode(tensor, "bitpack")
    with pytest.raises(ValueError, match="no options"):
        actpack.encode(x, "bitpack:bits=4")


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
                                  "division_dct"])
def test_empty_and_scalar(spec):
    for x in [torch.zeros(0, 5), torch.tensor(1.0)]:
        y = actpack.decode(actpack.encode(x, spec))
        assert y.shape == x.shape and torch.equal(y, x)
