"""The module running now and its gradients, for a budget: the dotted name of each saved
tensor's module (global forward hooks) and per-module gradient norms and statistics (the policy's
sensitivity, the error caps, the gradient guard)."""
import math
import sys

import torch


def _read_scalars(values):
    """0-d (or one-element) tensors as floats, in one read from the device."""
    return _stacked(values).tolist()


def _stacked(values):
    device = values[0].device
    return torch.stack([v.reshape(()).to(device, torch.float64) for v in values])


class _QueuedScalars:
    """0-d tensors' values, copied to pinned host memory behind the work queued so far on a
    CUDA device's current stream, read later: once a wait for that stream has happened anyway
    (the end of step's status read), read() costs none of its own; before, it waits."""

    def __init__(self, values):
        stacked = _stacked(values)
        self._done = None
        if stacked.device.type == "cuda":
            self._host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
            self._host.copy_(stacked, non_blocking=True)
            self._done = torch.cuda.Event()
            self._done.record(torch.cuda.current_stream(stacked.device))
        else:
            self._host = stacked

    def read(self):
        if self._done is not None and not self._done.query():
            self._done.synchronize()
        return self._host.tolist()


class ModuleTracker:
    """The dotted name of the module running now ("layer1.0.conv1"), from global forward hooks.

    A module's name is its attribute path from the outermost module running, as
    named_modules() gives it; the outermost module itself is "".
    """

    def __init__(self):
        self._stack = []
        self.name = ""  # the module running now, as current() gives it
        self._names = {}  # (id(parent), id(module)) -> module's name under parent
        self._walks = {}  # id(parent) -> {id(descendant): its name}, from one named_modules()
        self._handles = []
        self.modules = {}  # name -> module, as seen running
        self.compiled = False  # torch.compile'd code ran: modules inside it are not seen
        # Record ||g_y||^2 of Linear and convolution outputs in this step's backward.
        self.watch_outputs = False
        self._output_norms = []  # (name, 0-d tensor), filled by the output-gradient hooks

    def _own_gradients(self):
        """(name, module, parameter) for each module's own parameters with a dense gradient."""
        for name, module in self.modules.items():
            for p in module.parameters(recurse=False):
                if p.grad is not None and not p.grad.is_sparse:
                    yield name, module, p

    def gradient_norms(self):
        """A callable giving {module name: the norm of its own parameters' gradients}, for the
        modules that ran and have them: the norms are queued on the device now and read when
        called (see _QueuedScalars)."""
        names, grads, seen = [], [], set()
        for name, _, p in self._own_gradients():
            # A tied weight (GPT's embedding and head) counts once, for its first module.
            if id(p) not in seen:
                seen.add(id(p))
                names.append(name)
                grads.append(_local(p.grad.detach()))
        if not grads:
            return dict
        queued = _QueuedScalars(torch._foreach_norm(grads))

        def read():
            norms = {}
            for name, norm in zip(names, queued.read()):
                norms[name] = math.sqrt(norms.get(name, 0.0) ** 2 + norm ** 2)
            return norms
        return read

    def drop_gradients(self):
        """Sets the gradients of the modules that ran to None: the optimizer skips them."""
        for _, _, p in list(self._own_gradients()):
            p.grad = None

    def gradient_statistics(self):
        """{module name: (sum of its own parameters' squared gradient norms, ||g_W||^2 of its
        weight, ||g_y||^2 of its output, fan)} for modules with parameter gradients (runtime
        ModuleGradients); the output norm is 0 unless watched, the fan 0 unless a Linear or a
        convolution."""
        names, grads = [], []  # (name, is the weight) and the gradients
        for name, module, p in self._own_gradients():
            names.append((name, p is getattr(module, "weight", None)))
            grads.append(_local(p.grad.detach()))
        outputs, self._output_norms = self._output_norms, []
        if not grads:
            return {}
        values = _read_scalars([*torch._foreach_norm(grads), *(norm for _, norm in outputs)])
        stats = {}
        for (name, is_weight), norm in zip(names, values):
            entry = stats.setdefault(name, [0.0, 0.0, 0.0, _fan(self.modules[name])])
            entry[0] += norm ** 2
            if is_weight:
                entry[1] = norm ** 2
        for (name, _), norm in zip(outputs, values[len(names):]):
            if name in stats:
                stats[name][2] += norm ** 2
        return {name: tuple(entry) for name, entry in stats.items()}

    def start(self):
        hooks = torch.nn.modules.module
        self._handles = [hooks.register_module_forward_pre_hook(self._enter),
                         hooks.register_module_forward_hook(self._leave, always_call=True)]

    def stop(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._stack.clear()
        self.name = ""
        self.modules.clear()
        self._output_norms.clear()

    def _enter(self, module, args):
        # Under torch.compile the hooks are traced into the graph: keep them out of it (the
        # stack is Python state a graph cannot hold). A set attribute is replayed by the graph.
        if torch.compiler.is_compiling() or _is_compiled(module):
            self.compiled = True
            return
        name = ""
        if self._stack:
            parent, parent_name = self._stack[-1]
            key = (id(parent), id(module))
            child = self._names.get(key)
            if child is None:
                child = self._names[key] = self._descendant_name(parent, module)
            name = f"{parent_name}.{child}" if parent_name else child
        self._stack.append((module, name))
        self.modules[name] = module
        self.name = name

    def _descendant_name(self, parent, module):
        """module's name under parent. A descendant, not only a child: containers such as
        ModuleList are iterated, never called, so "blocks.0" runs straight under the model. One
        walk of parent names all its descendants (a walk per module would take time quadratic
        in the modules on a model's first step); it is walked again when it changed since."""
        walk = self._walks.get(id(parent))
        name = walk.get(id(module)) if walk is not None else None
        if name is None or _submodule(parent, name) is not module:
            walk = {}
            for n, m in parent.named_modules():
                if n:
                    walk.setdefault(id(m), n)
            self._walks[id(parent)] = walk
            name = walk.get(id(module))
        return name if name is not None else type(module).__name__

    def _leave(self, module, args, output):
        if torch.compiler.is_compiling() or _is_compiled(module):
            return
        # Pop down to this module (a forward that raised may have left children behind).
        while self._stack:
            top, name = self._stack.pop()
            if top is module:
                if self.watch_outputs and _fan(module) > 0:
                    self._watch_output(name, output)
                break
        self.name = self._stack[-1][1] if self._stack else ""

    def _watch_output(self, name, output):
        if isinstance(output, torch.Tensor) and output.requires_grad and torch.is_grad_enabled():
            def record(grad, name=name):
                # A norm, not a sum of squares: no gradient-sized temporary in backward.
                self._output_norms.append((name, torch.linalg.vector_norm(grad.detach(),
                                                                          dtype=torch.float32)))
            output.register_hook(record)


def _submodule(parent, name):
    """parent's descendant at the dotted path `name`, None when there is none."""
    try:
        return parent.get_submodule(name)
    except AttributeError:
        return None


def _fan(module):
    """Outputs each input element reaches per weight: 1 for Linear, kernel area over stride
    product for a convolution; 0 for other modules (no such bound)."""
    if isinstance(module, torch.nn.Linear):
        return 1.0
    if isinstance(module, torch.nn.modules.conv._ConvNd) and not module.transposed:
        return math.prod(module.kernel_size) / math.prod(module.stride)
    return 0.0


def _local(tensor):
    """What this rank holds of a gradient: the local shard of a DTensor (FSDP2's sharded
    parameters), else the tensor. Its norm is this rank's share of the full norm: a smaller
    weight-gradient norm only tightens the error caps, and the sensitivity is relative between
    modules sharded alike."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is not None and isinstance(tensor, dtensor.DTensor):
        return tensor.to_local()
    return tensor


def _is_compiled(module):
    """A module wrapped by torch.compile (there is none before torch._dynamo is imported)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return eval_frame is not None and isinstance(module, eval_frame.OptimizedModule)
