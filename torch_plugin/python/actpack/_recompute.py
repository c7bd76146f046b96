"""Recompute regions: packing and recomputation under one budget.

    # in the model's forward:
    for block in self.blocks:
        h = actpack.recompute(block, h, micro_batch=8)
    # in the training loop:
    with actpack.budget("192MiB", recompute="auto"):
        ...

Inside a budget that recomputes (recompute=True; "auto" from the first step the codecs alone
cannot hold), a region keeps only its inputs, and those go through the
budget's saved-tensor hooks like any saved tensor: the policy packs them, within a tenth of
its fidelity floor (their error runs through the whole recomputed region). Its forward runs
without saving anything; its backward runs it again with the same random state and autocast
settings, then backpropagates through it. With `micro_batch=n` (for a region whose samples
are independent: a transformer block, not one with batch norm in training) both passes run
n samples at a time along the first dimension, so what the region holds at its peak is
n samples' worth instead of the batch's: a transformer block's MLP holds its 4x-wide hidden
layer twice while it runs, about 11 activations a sample at its peak. That is the
mini-sequence idea (MsT) applied to the batch, combined with the budget's codecs on what
crosses the region's boundary.

Outside such a budget, or with gradients off, `recompute(fn, *args)` is `fn(*args)`: the
budget decides, so one model runs either way. The tensors the recomputation saves are not
packed: they live for one micro-batch's backward.
"""
import torch
import torch.nn as nn

from actpack._args import kind, show
from actpack._checkpoint import saving_region_inputs

_active = []  # the budgets entered, innermost last: the innermost decides


def recompute(fn, *args, micro_batch=None):
    """fn(*args), recomputed in backward inside a budget that recomputes (recompute=True, or
    "auto" once codecs alone cannot hold the step).

    Args:
        fn: a function or module of tensors returning a tensor or a tuple of tensors.
        args: its arguments; tensors among them are the region's inputs.
        micro_batch: samples per pass along the first dimension (every tensor argument and
            output share it), for regions whose samples are independent; None runs the whole
            batch at once.
    """
    if not callable(fn):
        raise TypeError(f"actpack.recompute: fn must be a function or module of tensors, got "
                        f"{kind(fn)}")
    if micro_batch is not None and (isinstance(micro_batch, bool) or
                                    not isinstance(micro_batch, int) or micro_batch < 1):
        raise ValueError(f"actpack.recompute: micro_batch must be a positive int or None, got "
                         f"{show(micro_batch)}")
    if not (_active and torch.is_grad_enabled() and _active[-1]._recomputes()):
        return fn(*args)
    if micro_batch is not None:
        _check_independent(fn)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if micro_batch is not None:
        sizes = {t.shape[0] if t.dim() else None for t in tensors}
        if len(sizes) != 1 or None in sizes:
            raise ValueError(f"actpack.recompute: micro_batch needs every tensor argument to "
                             f"share its first dimension, got shapes "
                             f"{[tuple(t.shape) for t in tensors]}")
    # The inputs the region saves (its only saves: its forward runs without grad) are flagged:
    # the policy packs them within a tenth of its fidelity floor, since their error runs
    # through the whole recomputed region (runtime::RegionInput).
    with saving_region_inputs("recompute"):
        return _Region.apply(fn, args, micro_batch, *tensors)


def _check_independent(fn):
    """Micro-batches change what batch statistics see: refuse a region that computes them."""
    if not isinstance(fn, nn.Module):
        return
    for name, module in fn.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training:
            raise ValueError(f"actpack.recompute: micro_batch needs a region whose samples are "
                             f"independent, but {name or type(fn).__name__} is a "
                             f"{type(module).__name__} in training mode (its statistics are the "
                             f"batch's); leave micro_batch=None for this region")


def _chunks(args, micro_batch):
    """(first row, the arguments) per micro-batch; all at once when micro_batch is None. A
    None among them (a gradient autograd did not compute) stays None."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    total = tensors[0].shape[0] if tensors else 0
    if micro_batch is None:
        return [(0, args)]
    return [(start, tuple(a[start:start + micro_batch] if isinstance(a, torch.Tensor) else a
                          for a in args)) for start in range(0, max(total, 1), micro_batch)]


def _as_tuple(out):
    if isinstance(out, torch.Tensor):
        return (out,), True
    if isinstance(out, tuple) and all(isinstance(o, torch.Tensor) for o in out):
        return out, False
    raise TypeError(f"actpack.recompute: the region must return a tensor or a tuple of tensors, "
                    f"got {type(out).__name__}")


class _Region(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, args, micro_batch, *tensors):
        ctx.fn, ctx.micro_batch = fn, micro_batch
        # The tensors go through save_for_backward; holding them here too would keep them raw.
        ctx.args = tuple(_TENSOR if isinstance(a, torch.Tensor) else a for a in args)
        devices = list({t.device for t in tensors if t.device.type == "cuda"})
        ctx.cuda_devices = devices
        ctx.cpu_rng = torch.get_rng_state()
        ctx.cuda_rng = [torch.cuda.get_rng_state(d) for d in devices]
        device_type = tensors[0].device.type if tensors else "cpu"
        ctx.autocast = (device_type, torch.is_autocast_enabled(device_type),
                        torch.get_autocast_dtype(device_type))
        outputs = None
        with torch.no_grad():
            for start, chunk in _chunks(args, micro_batch):
                part, ctx.single = _as_tuple(fn(*chunk))
                if micro_batch is None:
                    outputs = part
                    break
                if outputs is None:  # the whole batch's outputs, filled a micro-batch at a time
                    total = tensors[0].shape[0]
                    outputs = tuple(p.new_empty((total, *p.shape[1:])) for p in part)
                for whole, p in zip(outputs, part):
                    whole[start:start + p.shape[0]] = p
        # The inputs through the budget's hooks: the policy packs them like any saved tensor.
        ctx.save_for_backward(*tensors)
        return outputs[0] if ctx.single else outputs

    @staticmethod
    def backward(ctx, *grads):
        tensors = ctx.saved_tensors  # decodes: once
        saved = iter(tensors)
        args = tuple(next(saved) if a is _TENSOR else a for a in ctx.args)
        wants = [a.requires_grad for a in args if isinstance(a, torch.Tensor)]
        input_grads = None
        device_type, autocast_on, autocast_dtype = ctx.autocast
        with torch.random.fork_rng(devices=ctx.cuda_devices):
            # The forward's random state: dropout draws the same masks, micro-batch by
            # micro-batch in the same order.
            torch.set_rng_state(ctx.cpu_rng)
            for device, state in zip(ctx.cuda_devices, ctx.cuda_rng):
                torch.cuda.set_rng_state(state, device)
            grad_chunks = [g for _, g in _chunks(grads, ctx.micro_batch)]
            for (start, chunk), grad in zip(_chunks(args, ctx.micro_batch), grad_chunks):
                inputs = tuple(a.detach().requires_grad_(a.requires_grad)
                               if isinstance(a, torch.Tensor) else a for a in chunk)
                # What the recomputation saves lives for this micro-batch's backward only: kept
                # as it is, out of the session's count of the step's saved tensors.
                with torch.enable_grad(), \
                        torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_on), \
                        torch.autograd.graph.saved_tensors_hooks(_keep, _kept):
                    outputs, _ = _as_tuple(ctx.fn(*inputs))
                pairs = [(o, g) for o, g in zip(outputs, grad)
                         if g is not None and o.requires_grad]
                if pairs:
                    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
                parts = [a.grad for a in inputs if isinstance(a, torch.Tensor)]
                if ctx.micro_batch is None:
                    input_grads = parts
                    break
                if input_grads is None:
                    input_grads = [torch.zeros_like(a) if want else None
                                   for a, want in zip(tensors, wants)]
                for whole, part in zip(input_grads, parts):
                    if whole is not None and part is not None:
                        whole[start:start + part.shape[0]] = part
        ctx.fn = ctx.args = None
        return (None, None, None, *input_grads)


_TENSOR = object()  # where a tensor argument sits among the region's arguments


def _keep(tensor):
    # An alias, not the tensor: a saved output held as itself would make a cycle through its
    # graph (node -> saved tensor -> its grad_fn, the node) that Python's collector cannot see
    # and only a finished backward breaks, so a replay that raised (out of memory) leaked its
    # micro-batch's graph (5 MiB a failed try on the benchmark's ViT at a third of its width).
    return tensor.detach()


def _kept(tensor):
    return tensor
