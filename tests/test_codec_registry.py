"""What every codec in the registry must do, written once over the registry: refuse a corrupt or
truncated buffer (on the CPU, and on CUDA exactly as on the CPU), and write the same bytes on
the CPU and on CUDA for the same input and seed. Each codec's own behaviour (bounds, ratios,
refusals of its parameters) is in its own test file; the C++ side checks the same contracts
in codecs/conformance_test.cc and, on the CUDA emulator, codecs/cuda_identity_test.cc.
"""
import pytest
import torch

import actpack

FLOATS = [torch.float32, torch.float16, torch.bfloat16]

# Every codec with the specs that select its different paths, and the dtypes each takes.
SPECS = {
    "identity": FLOATS,
    "quant1": FLOATS, "quant2": FLOATS, "quant4": FLOATS, "quant8": FLOATS,
    "quant:bits=2,group=64": FLOATS,
    "cast:fp16": [torch.float32], "cast:bf16": [torch.float32],
    "mask": FLOATS + [torch.uint8, torch.bool],
    "pool4": FLOATS, "pool:k=7": FLOATS, "pool64": [torch.float32, torch.bfloat16],
    "eb": FLOATS, "eb:rel=1e-3": FLOATS, "eb:rel=1e-5": FLOATS, "eb:abs=0.01": FLOATS,
    "eb:abs=1e-7": FLOATS,
    "division": FLOATS, "division:block=4,bits=4": FLOATS,
    "division:block=3,bits=1,group=32": FLOATS, "division:block=64,bits=8,group=64": FLOATS,
    "division_dct": FLOATS, "division_dct:keep=16,bits=8": FLOATS,
    "bitpack": [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8],
}
SHAPES = [(), (1,), (255,), (1000, 37), (64, 4097), (3, 40, 70), (4, 128, 96), (2, 3, 13, 21),
          (8, 16, 56, 56)]
CASES = [(spec, dtype) for spec, dtypes in SPECS.items() for dtype in dtypes]


def codec_of(spec):
    name = spec.split(":")[0]
    return name.rstrip("0123456789") if name.startswith(("quant", "pool")) else name


def smooth(shape):
    """A smooth field over the last two dimensions (where eb's and division's 2-D paths pay)."""
    rows, cols = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, shape[0] if shape else 1)
    r = torch.arange(rows, dtype=torch.float32)[:, None]
    c = torch.arange(cols, dtype=torch.float32)[None, :]
    field = torch.sin(c / 37) * torch.cos(r / 23)
    if len(shape) < 2:
        return field.reshape(shape)
    return field.expand(shape).contiguous()


def inputs(spec, dtype, shape, seed=3):
    """The data each codec is checked on: Gaussian values with zeros, smooth maps, and where
    the codec takes them (eb, identity) non-finite values and an outlier; {0, v} for mask;
    integers for bitpack."""
    torch.manual_seed(seed)
    if codec_of(spec) == "bitpack":
        # max_pool-like indices, and values across the dtype's range with both extremes.
        info = torch.iinfo(dtype)
        indices = torch.randint(0, min(1024, info.max + 1), shape).to(dtype)
        wide = torch.randint(max(info.min, -2**62), min(info.max, 2**62), shape).to(dtype)
        if wide.numel() >= 2:
            wide.view(-1)[0], wide.view(-1)[-1] = info.min, info.max
        return [indices, wide]
    if codec_of(spec) == "mask":
        keep = torch.rand(shape) > 0.4
        return [keep.to(dtype) if dtype in (torch.uint8, torch.bool) else keep.to(dtype) * 2]
    x = torch.randn(shape) * 3
    if x.numel() > 20:
        x.view(-1)[:5] = 0.0
        if codec_of(spec) in ("eb", "identity"):
            x.view(-1)[7] = float("nan")
            x.view(-1)[11] = -float("inf")
            x.view(-1)[13] = 3e4  # far outside the rest: an outlier under abs bounds
    return [x.to(dtype), smooth(shape).to(dtype)]


def test_every_registered_codec_is_covered():
    assert set(actpack.codec_names()) == {codec_of(spec) for spec in SPECS}


def flips(buffer):
    """Byte positions to corrupt: every header word, the payload's start, middle and end."""
    n = buffer.numel()
    return sorted({*range(0, 128, 4), 128, 129, n // 2, n - 1} & set(range(n)))


@pytest.mark.parametrize("spec", SPECS)
def test_corrupt_and_truncated_buffers_are_refused(spec):
    dtype = SPECS[spec][0]
    buffer = actpack.encode(inputs(spec, dtype, (40, 70))[0], spec, seed=11)
    for length in [0, 64, 127, 128, buffer.numel() - 4, buffer.numel() - 1]:
        with pytest.raises(RuntimeError, match="actpack: .*(truncated|not an actpack buffer)"):
            actpack.decode(buffer[:length])
    for position in flips(buffer):
        corrupt = buffer.clone()
        corrupt[position] ^= 0x10
        with pytest.raises(RuntimeError, match="actpack: "):
            actpack.decode(corrupt)
    # The buffer itself still decodes: nothing above was refused for a reason of its own.
    assert actpack.decode(buffer).shape == (40, 70)


def test_what_is_not_a_buffer_is_refused():
    with pytest.raises(ValueError, match="1-D uint8"):
        actpack.decode(torch.randn(10))
    with pytest.raises(RuntimeError, match="not an actpack buffer"):
        actpack.decode(torch.zeros(200, dtype=torch.uint8))


def same_values(a, b):
    """Bit for bit, NaN included."""
    if a.dtype.is_floating_point:
        bits = {4: torch.int32, 2: torch.int16}[a.element_size()]
        return torch.equal(a.view(bits), b.view(bits))
    return torch.equal(a, b)


def check_identical_bytes(spec, dtype, device):
    """`device` writes the CPU's bytes for every shape and input, and either side decodes the
    other's buffer to the same values. On the CPU against itself (a second encode with the same
    seed), it checks that encoding is deterministic, and runs this test's own code in CI."""
    for shape in SHAPES:
        for x in inputs(spec, dtype, shape):
            assert x.shape == shape and x.dtype == dtype
            cpu = actpack.encode(x, spec, seed=11)
            other = actpack.encode(x.to(device), spec, seed=11)
            assert torch.equal(cpu, other.cpu()), (spec, dtype, shape)
            decoded = actpack.decode(cpu)
            assert decoded.shape == shape and decoded.dtype == dtype
            assert same_values(actpack.decode(other.cpu()), actpack.decode(cpu.to(device)).cpu())


@pytest.mark.parametrize("spec, dtype", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_encoding_is_deterministic_for_every_shape(spec, dtype):
    check_identical_bytes(spec, dtype, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("spec, dtype", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_cpu_and_cuda_write_identical_bytes(spec, dtype):
    check_identical_bytes(spec, dtype, "cuda")


# Inputs each codec refuses to encode, with the CPU's words for it.
REFUSED = {
    "quant2": (torch.tensor([1.0, float("inf"), 2.0]), "1 non-finite"),
    "cast:fp16": (torch.tensor([1.0, 1e6]), "1 finite values into infinity"),
    "mask": (torch.tensor([0.0, 1.0, 2.0]), "mask"),
    "pool4": (torch.tensor([1.0, float("inf"), 0.0, 2.0]), "non-finite"),
    "division": (torch.tensor([[1.0, float("nan")], [0.0, 2.0]]), "1 non-finite"),
}


@pytest.mark.parametrize("spec", REFUSED)
def test_the_cpu_refuses_in_these_words(spec):
    bad, words = REFUSED[spec]
    with pytest.raises(RuntimeError, match=words):
        actpack.encode(bad, spec)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", list(SPECS))
def test_cuda_refuses_what_the_cpu_refuses(spec):
    if spec in REFUSED:
        bad, words = REFUSED[spec]
        with pytest.raises(RuntimeError, match=words):
            actpack.encode(bad, spec)
        with pytest.raises(RuntimeError, match=words):
            actpack.encode(bad.cuda(), spec)
    buffer = actpack.encode(inputs(spec, SPECS[spec][0], (40, 70))[0].cuda(), spec, seed=11)
    for position in flips(buffer):
        corrupt = buffer.clone()
        corrupt[position] ^= 0x10
        with pytest.raises(RuntimeError) as on_cuda:
            actpack.decode(corrupt)
        with pytest.raises(RuntimeError) as on_cpu:
            actpack.decode(corrupt.cpu())
        assert str(on_cuda.value) == str(on_cpu.value), position
    with pytest.raises(RuntimeError, match="truncated"):
        actpack.decode(buffer[:-4])

