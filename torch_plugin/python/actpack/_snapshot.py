"""The training state actpack.plan() puts back after its trial steps, bit for bit.

The planner's steps are the user's real training steps: they move the weights, the optimizer's
moments and step counts, batch norm's running statistics, the random streams, schedulers and
gradients. plan() snapshots that state before its first step and restores it when it returns,
raises or is interrupted.

Snapshot-and-restore rather than steps on copies: a copy of the model and optimizer would sit
in device memory beside the originals, inside the budget the planner measures, and copies would
not run the user's `step`, which names the originals. The snapshot lies in host memory that
numpy allocates, outside actpack's budgeted CPU allocator, taken before any budget context
starts counting the resident set: it costs host memory the size of the trained parameters,
their gradients, buffers and optimizer state, and no device memory.

The step names none of these objects, so they are found through the garbage collector: every
nn.Module, optimizer, LR scheduler and GradScaler alive, and every leaf tensor that requires
grad. Not restored: parameters that do not require grad (no backward or optimizer step writes
them, and a frozen base model would double the host memory), and Python state of other objects
(a data iterator the step advances, counters of the user's own).
"""
import contextlib
import copy
import gc
import random
import signal
import threading

import torch


class _Bytes:
    """A tensor's contents in numpy memory (outside torch's allocators), with what it takes to
    write them back or build the tensor anew."""

    def __init__(self, tensor):
        tensor = tensor.detach()
        self.dtype, self.shape, self.device = tensor.dtype, tensor.shape, tensor.device
        self.stride = tensor.stride() if tensor.layout == torch.strided else None
        try:
            flat = tensor.reshape(-1).contiguous().view(torch.uint8)
            self.data, self.tensor = flat.cpu().numpy().copy(), None
        except (RuntimeError, TypeError, NotImplementedError):
            # A layout or subclass without plain bytes (sparse, quantized, meta): a copy on its
            # device.
            self.data, self.tensor = None, tensor.clone()

    def _source(self):
        if self.tensor is not None:
            return self.tensor
        return torch.from_numpy(self.data).view(self.dtype).view(self.shape)

    def write_into(self, target):
        """Puts the contents back into `target` (same shape, dtype and device) in place."""
        with torch.no_grad():
            target.copy_(self._source())

    def put(self, current):
        """The saved tensor: `current` overwritten in place where it matches (no allocation),
        else a new one on the saved device with the saved strides."""
        if (current is not None and self.tensor is None and current.dtype == self.dtype
                and current.shape == self.shape and current.device == self.device
                and current.layout == torch.strided and current.stride() == self.stride):
            self.write_into(current)
            return current
        if self.tensor is not None:
            return self.tensor.clone()
        fresh = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device)
        self.write_into(fresh)
        return fresh


def _value(value):
    """A snapshot of an optimizer state entry: tensors as _Bytes, the rest deep-copied."""
    return _Bytes(value) if isinstance(value, torch.Tensor) else copy.deepcopy(value)


class TrainingState:
    """What the process's training steps can change, saved now; restore() puts it back."""

    def __init__(self):
        # Garbage in cycles would be found too and held for the plan's duration.
        gc.collect()
        modules, optimizers, stateful, leaves = [], [], [], []
        for obj in gc.get_objects():
            # type(), not isinstance(): the latter asks some objects for their __class__.
            kind = type(obj)
            if issubclass(kind, torch.nn.Module):
                modules.append(obj)
            elif issubclass(kind, torch.optim.Optimizer):
                optimizers.append(obj)
            elif issubclass(kind, (torch.optim.lr_scheduler.LRScheduler,
                                   torch.amp.GradScaler)):
                stateful.append(obj)
            elif issubclass(kind, torch.Tensor) and obj.is_leaf and obj.requires_grad:
                leaves.append(obj)

        # Trained tensors (values and gradients) and buffers, each once however often shared.
        self._tensors = {}  # id -> (tensor, its bytes)
        self._grads = {}  # id -> (tensor, its gradient's bytes or None)

        def add(tensor, trained):
            if tensor is None or id(tensor) in self._tensors:
                return
            self._tensors[id(tensor)] = (tensor, _Bytes(tensor))
            if trained:
                grad = tensor.grad
                self._grads[id(tensor)] = (tensor, None if grad is None else _Bytes(grad))

        for tensor in leaves:
            add(tensor, True)
        # The modules' bindings too: a step may assign a new tensor to a buffer.
        self._modules = []
        for module in modules:
            for buffer in module._buffers.values():
                add(buffer, False)
            self._modules.append((module, dict(module._parameters), dict(module._buffers),
                                  module.training))
        self._optimizers = []
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    add(p, p.requires_grad)
            state = [(p, {k: _value(v) for k, v in entries.items()})
                     for p, entries in optimizer.state.items()]
            groups = [copy.deepcopy({k: v for k, v in group.items() if k != "params"})
                      for group in optimizer.param_groups]
            self._optimizers.append((optimizer, state, groups))
        self._stateful = [(obj, copy.deepcopy(obj.state_dict())) for obj in stateful]
        self._rng = _rng_states()

    def modules(self):
        """The modules found when the state was saved."""
        return [entry[0] for entry in self._modules]

    def restore(self):
        """Puts everything saved back; a Ctrl-C meanwhile waits until it is done."""
        with sigint_deferred():
            _set_rng_states(self._rng)
            for tensor, saved in self._tensors.values():
                saved.write_into(tensor)
            for module, parameters, buffers, training in self._modules:
                module._parameters.update(parameters)
                module._buffers.update(buffers)
                module.training = training
            for tensor, saved in self._grads.values():
                # A new tensor where the step dropped it (zero_grad(set_to_none=True)).
                tensor.grad = None if saved is None else saved.put(tensor.grad)
            for optimizer, state, groups in self._optimizers:
                current = dict(optimizer.state)
                # State the steps created (an optimizer that had not stepped) goes.
                optimizer.state.clear()
                for p, entries in state:
                    now = current.get(p, {})
                    optimizer.state[p] = {
                        k: v.put(now.get(k)) if isinstance(v, _Bytes) else copy.deepcopy(v)
                        for k, v in entries.items()}
                for group, saved in zip(optimizer.param_groups, groups):
                    for key in [k for k in group if k != "params" and k not in saved]:
                        del group[key]
                    group.update(copy.deepcopy(saved))
            for obj, state in self._stateful:
                obj.load_state_dict(copy.deepcopy(state))


def _rng_states():
    import numpy
    states = {"cpu": torch.get_rng_state(), "python": random.getstate(),
              "numpy": numpy.random.get_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states):
    import numpy
    torch.set_rng_state(states["cpu"])
    random.setstate(states["python"])
    numpy.random.set_state(states["numpy"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


@contextlib.contextmanager
def sigint_deferred():
    """Holds back SIGINT (main thread only) and delivers it afterwards: a restore cut short
    would leave the training state half put back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            if callable(previous):
                previous(signal.SIGINT, received[0])
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt
