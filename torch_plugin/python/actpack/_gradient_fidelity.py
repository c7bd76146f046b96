"""What packing does to the gradients, measured by actpack.plan against exact training.

The planner owns the user's step and can put the training state back (actpack._snapshot), so it
measures rather than estimates: from one saved state (weights, optimizer, random streams) it
runs the step exactly, then once more exactly (is the step repeatable?), then each choice's
first profile step, and compares the gradients the optimizer would step on, per parameter group
(the module owning the parameters: weight and bias together). A step repeats when its data comes
from fixed tensors or from the random streams the snapshot restores; one that draws new data
each call (an iterator it advances) does not, and then nothing is claimed.

An estimate from each tensor's codec error would be cheaper and would miss what matters: the
error of a packed activation reaches the layers below through every backward in between (the
suite's ResNet-50 under 2 bits: cosine near 0 from its tenth bottleneck back, where each
tensor's own error was small).
"""
import math

import numpy
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

# A group whose gradient's cosine against exact training falls below this is reported (and the
# plan warns): ActNN's 2-bit ResNet-50 trains to within 0.2 points of exact training at gradient
# cosines well above it; the suite's collapsing groups sit near 0.
COSINE_BOUND = 0.95
# Two exact steps from the same state whose gradients differ by more than this did not see the
# same batch (or ran non-deterministic kernels beyond rounding): nothing is measured.
REPEATABLE_COSINE = 1.0 - 1e-6


def parameters_by_root(modules):
    """[(root, [(parameter, its dotted name)])] for the root modules among `modules` (those no
    other one holds), each parameter that requires grad once."""
    children = {id(c) for m in modules for c in m.children()}
    seen, roots = set(), []
    for root in (m for m in modules if id(m) not in children):
        named = [(p, name) for name, p in root.named_parameters()
                 if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p, _ in named)
        if named:
            roots.append((root, named))
    return roots


def by_group(gradients, roots):
    """{group: the gradients of its parameters, concatenated} from {id(parameter): gradient}.
    A group is the owning module's dotted name ("" for a root's own parameters); where the
    gradients come from several roots (the step trains two models) each name starts with its
    root's class name. Roots without gradients (other models in the process) are left out."""
    used = [(root, named) for root, named in roots if any(id(p) in gradients for p, _ in named)]
    parts = {}
    for root, named in used:
        prefix = f"{type(root).__name__}:" if len(used) > 1 else ""
        for p, name in named:
            if id(p) in gradients:
                group = prefix + (name.rsplit(".", 1)[0] if "." in name else "")
                parts.setdefault(group, []).append(gradients[id(p)])
    return {group: numpy.concatenate(v) for group, v in parts.items()}


class Capture:
    """The gradients of one run of `step`, {id(parameter): float64 vector}: those the first
    optimizer step of the run steps on (a global step pre-hook), or, when no optimizer steps,
    those left on `parameters`."""

    def __init__(self, parameters):
        self._parameters = parameters  # for a step with no optimizer
        self.gradients = None

    def __enter__(self):
        self._handle = register_optimizer_step_pre_hook(self._pre_step)
        return self

    def __exit__(self, *exc):
        self._handle.remove()
        if self.gradients is None and exc[0] is None:
            self._take(self._parameters)
        return False

    def _pre_step(self, optimizer, args, kwargs):
        if self.gradients is None:
            self._take(p for group in optimizer.param_groups for p in group["params"])

    def _take(self, parameters):
        taken = {id(p): host_float64(p.grad) for p in parameters
                 if p.grad is not None and not p.grad.is_sparse}
        if taken:
            self.gradients = taken


def host_float64(tensor):
    """A float64 numpy copy of `tensor`, made by numpy: on the CPU the copy does not go through
    torch's allocator (actpack's, whose peak the profile step is measuring)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits are a float32's top half
        bits = t.view(torch.int16).numpy().astype(numpy.uint32) << 16
        return bits.view(numpy.float32).astype(numpy.float64).ravel()
    return t.numpy().astype(numpy.float64).ravel()


def compare(exact, packed):
    """{group: {"cosine", "relative_error"}} of `packed` against `exact`, over the groups both
    have; a group with a zero or non-finite exact gradient is left out."""
    result = {}
    for name, e in exact.items():
        p = packed.get(name)
        if p is None or p.shape != e.shape:
            continue
        norm_e = float(numpy.linalg.norm(e))
        norm_p = float(numpy.linalg.norm(p))
        if not math.isfinite(norm_e) or norm_e == 0.0:
            continue
        if not math.isfinite(norm_p):
            result[name] = {"cosine": None, "relative_error": None}
            continue
        cosine = float(numpy.dot(e, p)) / (norm_e * norm_p) if norm_p else 0.0
        result[name] = {"cosine": max(-1.0, min(1.0, cosine)),
                        "relative_error": float(numpy.linalg.norm(p - e)) / norm_e}
    return result


def summary(groups, batch_size):
    """A choice's entry in the plan: the worst group, those below COSINE_BOUND, every group."""
    def cosine(item):
        c = item[1]["cosine"]
        return -2.0 if c is None else c  # non-finite first

    ranked = sorted(groups.items(), key=cosine)
    worst = ranked[0] if ranked else None
    return {"batch_size": batch_size,
            "min_cosine": None if worst is None else worst[1]["cosine"],
            "worst_group": None if worst is None else worst[0],
            "below_bound": [name for name, g in ranked
                            if g["cosine"] is None or g["cosine"] < COSINE_BOUND],
            "groups": groups}


def repeatable(first, second):
    """Whether two exact runs' gradients agree to REPEATABLE_COSINE in every group."""
    if first is None or second is None or first.keys() != second.keys():
        return False
    return all(g["cosine"] is not None and g["cosine"] >= REPEATABLE_COSINE
               for g in compare(first, second).values())
