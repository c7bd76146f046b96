"""torch.utils.checkpoint's inputs, told apart from the other tensors autograd saves.

A checkpointed region keeps its inputs and, in backward, runs its forward again from them. They
go through actpack's saved-tensor hooks like any saved tensor, but a codec's error on them would
run through every op of the recomputed region (batch norm's batch statistics among them) instead
of reaching one backward: ResNet-50 with its bottlenecks checkpointed and their inputs packed
within the fidelity floor had its worst parameter group at gradient cosine 0.31. So they are kept
exact (the report says why): what checkpointing keeps, it keeps whole.

torch has no public hook that says a save is checkpoint's, so install() wraps the two places
that save them (non-reentrant: _CheckpointFrame.save_inputs; reentrant: CheckpointFunction.apply,
whose forward runs without grad and saves nothing else) to flag the saves made inside. Where a
torch version has neither, nothing is wrapped and the inputs are packed like other tensors.
"""
import contextlib
import functools

import torch.utils.checkpoint as _checkpoint

from actpack import _C

_installed = False


@contextlib.contextmanager
def saving_region_inputs(kind):
    """Flags the saves this thread makes inside as `kind`'s region inputs ("checkpoint" here,
    "recompute" for actpack.recompute): runtime::RegionInput."""
    previous = _C._saving_region_inputs(kind)
    try:
        yield
    finally:
        _C._saving_region_inputs(previous)


def _flagging(save):
    @functools.wraps(save)
    def saving_inputs(*args, **kwargs):
        with saving_region_inputs("checkpoint"):
            return save(*args, **kwargs)
    return saving_inputs


def install():
    """Wrap torch.utils.checkpoint's input saving, once per process (idempotent)."""
    global _installed
    if _installed:
        return
    frame = getattr(_checkpoint, "_CheckpointFrame", None)
    if frame is not None and callable(getattr(frame, "save_inputs", None)):
        frame.save_inputs = _flagging(frame.save_inputs)
    function = getattr(_checkpoint, "CheckpointFunction", None)
    if function is not None and callable(getattr(function, "apply", None)):
        # A plain function on the class: CheckpointFunction.apply(...) calls it unbound, and it
        # calls the original classmethod.
        function.apply = _flagging(function.apply)
    _installed = True
