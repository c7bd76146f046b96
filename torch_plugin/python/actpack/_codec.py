"""Encode and decode single tensors with actpack's codecs (torch.ops.actpack.*)."""
import torch

from actpack import _C, _args  # noqa: F401  (_C registers torch.ops.actpack)


def encode(tensor, codec="quant2", seed=0):
    """A 1-D uint8 tensor on the tensor's device: the self-describing encoded buffer."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"actpack.encode: expected a tensor, got {type(tensor).__name__}")
    _args.printable(codec, "codec", "actpack.encode", "'quant2' or 'quant:bits=4,group=128'")
    seed = _args.integer(seed, "seed", "actpack.encode", -_args.INT64_MAX - 1)  # the op's int
    return torch.ops.actpack.encode(tensor, codec, seed)


def decode(buffer):
    """The tensor encoded in `buffer`; raises RuntimeError when the buffer is corrupt or truncated."""
    if not isinstance(buffer, torch.Tensor):
        raise TypeError(f"actpack.decode: expected a uint8 tensor, got {type(buffer).__name__}")
    return torch.ops.actpack.decode(buffer)


def codec_names():
    """The codecs compiled into this build."""
    return list(_C.codec_names())
