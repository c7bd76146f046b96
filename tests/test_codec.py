"""actpack.encode / actpack.decode: round trips, properties and every bad input."""
import pytest
import torch

import actpack


def test_quant2_round_trip_ratio_and_error():
    torch.manual_seed(0)
    x = torch.randn(256, 1024)
    buffer = actpack.encode(x, "quant2", seed=1)
    assert buffer.dtype == torch.uint8 and buffer.dim() == 1
    assert x.numel() * 4 / buffer.numel() > 15.0  # 2 bits + a bf16 min/step pair per 256 values
    y = actpack.decode(buffer)
    assert y.shape == x.shape and y.dtype == x.dtype
    # Each value is within one quantization step of its group's range.
    groups = x.flatten().view(-1, 256)
    step = (groups.max(1).values - groups.min(1).values) / 3
    assert ((y.flatten().view(-1, 256) - groups).abs() <= step[:, None] * 1.02 + 1e-2).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_dtypes_and_bits(dtype, bits):
    x = torch.randn(3, 1000).to(dtype)
    y = actpack.decode(actpack.encode(x, f"quant{bits}"))
    assert y.dtype == dtype and y.shape == x.shape
    err = (y.float() - x.float()).abs().max().item()
    assert err < 8.0 / (2 ** bits - 1) + 0.05


def test_stochastic_rounding_is_unbiased():
    torch.manual_seed(1)
    x = torch.randn(4096)
    mean = torch.zeros_like(x)
    draws = 400
    for seed in range(draws):
        mean += actpack.decode(actpack.encode(x, "quant2", seed=seed))
    mean /= draws
    groups = x.view(-1, 256)
    step = ((groups.max(1).values - groups.min(1).values) / 3).max().item()
    # One draw errs by at most a step (sd <= step/2); 400 draws shrink it 20x. The mean error
    # over all values must be far below even that.
    assert (mean - x).abs().max().item() < 5 * step / 2 / draws ** 0.5
    assert abs((mean - x).mean().item()) < 5 * step / 2 / (draws * x.numel()) ** 0.5


def test_identity_is_exact_for_every_dtype():
    for x in [torch.randn(7, 9), torch.arange(100), torch.rand(50) > 0.5,
              torch.randn(4, 4, dtype=torch.float64), torch.empty(0, 3), torch.tensor(2.5)]:
        y = actpack.decode(actpack.encode(x, "identity"))
        assert y.dtype == x.dtype and torch.equal(y, x)


def test_non_contiguous_input():
    x = torch.randn(512, 300).t()[:, ::2]
    y = actpack.decode(actpack.encode(x, "quant8"))
    assert y.shape == x.shape
    assert (y - x).abs().max().item() < 0.05


def test_same_seed_same_bytes():
    x = torch.randn(10000)
    assert torch.equal(actpack.encode(x, "quant2", seed=5), actpack.encode(x, "quant2", seed=5))
    assert not torch.equal(actpack.encode(x, "quant2", seed=5), actpack.encode(x, "quant2", seed=6))


def test_codecs_run_on_torchs_threads_and_write_the_same_bytes_on_any_number():
    threads = torch.get_num_threads()
    x = torch.randn(4 << 20).clamp_(min=0)  # large enough for the codecs' parallel loops
    encoded = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert actpack._C._executor_team_size() == n
            encoded[n] = {codec: actpack.encode(x, codec, seed=3)
                          for codec in ("quant2", "cast:bf16", "identity", "eb:rel=1e-2")}
            assert all(torch.equal(actpack.decode(encoded[n][c]), actpack.decode(encoded[1][c]))
                       for c in encoded[n])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(encoded[1][c], encoded[2][c]) for c in encoded[1])


@pytest.mark.parametrize("codec, words", [("quant3", "bits must be 1, 2, 4 or 8, not 3"),
                                           ("zstd", "unknown codec 'zstd'"),
                                           ("quant:group=100", "group size"),
                                           ("quant:colour=2", "unknown option 'colour'")])
def test_bad_codec_names_the_value(codec, words):
    with pytest.raises(ValueError, match=words):
        actpack.encode(torch.randn(10), codec)


def test_unsupported_dtypes():
    with pytest.raises(ValueError, match="int64"):
        actpack.encode(torch.arange(10), "quant2")
    with pytest.raises(TypeError, match="unsupported dtype"):
        actpack.encode(torch.randn(4, dtype=torch.complex64), "identity")


def test_non_finite_values_are_refused_by_quant():
    x = torch.randn(1000)
    x[3] = float("inf")
    with pytest.raises(RuntimeError, match="1 non-finite"):
        actpack.encode(x, "quant2")


@pytest.mark.parametrize("text, words", [("6 gigs", "unknown unit 'gigs'"),
                                         ("-1GiB", "must be positive"),
                                         ("", "no number"),
                                         ("150%", "share of the device")])
def test_bad_budgets_name_the_value(text, words):
    with pytest.raises(ValueError, match=words):
        actpack.parse_budget(text)


def test_budgets_and_sizes():
    assert actpack.parse_size("6GiB") == 6 << 30
    assert actpack.parse_budget("80%")["fraction"] == pytest.approx(0.8)
    assert actpack.format_bytes(1536) == "1.50 KiB"


def test_a_buffer_slice_that_is_not_word_aligned_decodes():
    x = torch.randn(50, 70)
    buffer = actpack.encode(x, "quant4", seed=2)
    shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), buffer])[1:]
    assert shifted.data_ptr() % 4 != 0
    assert torch.equal(actpack.decode(shifted), actpack.decode(buffer))


def test_a_corrupt_shape_is_data_loss_not_a_huge_allocation():
    buffer = actpack.encode(torch.randn(64, 64), "quant2").clone()
    buffer[16:24] = torch.tensor([0, 0, 0, 0, 0, 0, 0, 1], dtype=torch.uint8)  # dim 0 = 2^56
    with pytest.raises(RuntimeError, match="actpack: corrupt"):
        actpack.decode(buffer)
