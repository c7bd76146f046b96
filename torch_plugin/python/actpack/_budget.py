"""The memory-budget context: saved_tensors_hooks backed by the C++ session."""
import functools
import math
import os
import platform
import threading
import time
import warnings

import torch

from actpack import _C, _args, _checkpoint, _budget_memory, _recompute, _report_observers
from actpack._gradient_guard import GradientRunaway
from actpack._module_tracker import ModuleTracker
from actpack._budget_memory import BudgetMemory
from actpack._units import parse_budget


class Run:
    """What a budget context knows about the run; `report` is set when the context exits."""

    def __init__(self, budget_spec, session_hooks):
        self.budget = budget_spec
        self._session_hooks = session_hooks
        self._final_totals = None
        self._final_session_seconds = None
        self._timing = None  # budget.timed()'s clock
        self.report = None
        self.regions = False  # whether a region marked with actpack.recompute ran
        # The device the budget measures and caps: torch.device("cpu"), or a CUDA device (its
        # device= argument, or the device of the first CUDA tensor it packed); None while a
        # budget on a machine with CUDA has packed no CUDA tensor.
        self.device = None

    def totals(self):
        """Byte counts of the session (packed raw/stored bytes, peaks, fallbacks): live inside
        the context, as they were at its exit after it."""
        if self._session_hooks is None:
            return dict(self._final_totals)
        return dict(self._session_hooks.totals())

    def clock(self):
        """Seconds the budget's own work took so far: "session_seconds", inside the C++
        session's pack and unpack (the codecs included: totals()["codec_seconds"] is theirs);
        with budget.timed(), also "hooks_seconds" (the whole saved-tensor hooks, Python and
        C++), "hook_calls" (packs and unpacks) and "end_of_step_seconds" (the end of each
        step: gradient norms, the policy, the peaks); None where not timed. Live inside the
        context, as they were at its exit after it."""
        session = (self._final_session_seconds if self._session_hooks is None
                   else self._session_hooks.hook_seconds())
        timing = self._timing or {"hooks_seconds": None, "hook_calls": None,
                                  "end_of_step_seconds": None}
        return {"session_seconds": session, **timing}

    def _close(self):
        # The run outlives the context; the C++ session need not live as long.
        self._final_totals = dict(self._session_hooks.totals())
        self._final_session_seconds = self._session_hooks.hook_seconds()
        self._session_hooks = None


def _eager(method):
    """Runs `method` outside torch.compile's tracing (as a graph break there): entering and
    leaving a budget change process state (hooks, the allocator) that a graph cannot replay."""
    @functools.wraps(method)
    def run(*args):
        if torch.compiler.is_compiling():
            return torch._dynamo.disable(method)(*args)
        return method(*args)
    return run


class budget:
    """Keep the training step's peak memory under `limit` by packing what autograd saves.

    Args:
        limit: the memory budget, "6GiB", "1.5e9" (bytes; scientific notation is a number,
            "2e3MiB" too), "80%" (of the device; of physical memory on CPU) or an int of bytes,
            up to 9.2e18 (see actpack.parse_size).
        codec: "auto" (default: the policy picks a codec and strength per saved tensor so the
            step's peak fits the budget with the least error, and keeps tensors exact when
            there is room), a codec spec ("quant2", "quant:bits=4,group=128", "identity", ...),
            "none" (nothing packed: enabled=False), or a dict from module-name patterns
            ("layer1.*", "*attn*") to any of these, "none" keeping those modules' tensors as
            they are; the first matching pattern wins and unmatched tensors get "auto".
        report: a path; on exit the run report (JSON) is written there. Under
            torch.distributed, "{rank}" in it becomes the process's rank ("run-{rank}.json");
            a multi-process run without "{rank}" writes "<name>.rank<N><ext>" per rank.
        min_bytes: saved tensors smaller than this are kept as they are.
        seed: seed of the stochastic rounding.
        enabled: False keeps every saved tensor as it is: plain training, measured and capped
            the same way (the budget still caps actpack's allocator, so a step plain training
            cannot fit raises torch.OutOfMemoryError naming the budget it needs), with the
            same report. For parity runs, and for what plain training fits under a budget.
        headroom: share of the budget the policy leaves free for what its model misses.
        profile_every: steps between re-measurements of each codec's error and size.
        snapshot: put the allocator's snapshot (segments and trace) into the report, for
            `actpack snapshot run.json -o snap.pickle`.
        allowed_loss_increase: the error-bounded mode (AC-GC): a fraction such as 0.01, the
            most the loss may rise over an exact step. Each saved tensor gets an error cap
            from its module's gradients (a Linear's or convolution's input from the norms of
            its weight and output gradients, any other tensor a relative cap of
            allowed_loss_increase / 2), refreshed on the first steps and every profile_every.
            With codec="eb" every tensor is packed by eb at its bound (the first step exact,
            while the bounds are measured); with "auto" the policy never picks a codec whose
            measured error is over the cap and adds eb at the bound to its candidates. When no
            plan within the caps fits the budget, the error says so.
        max_rel_rms: the fidelity floor of "auto": the largest relative RMS error
            ||x - x_hat|| / ||x|| the policy lets a saved tensor carry, each codec's error
            measured on the tensor (profile steps); a codec over it is not taken for that
            tensor (the report's policy.capped_candidates counts them). The default, 0.2,
            admits quant4 (0.06-0.18 on the benchmark's models) and division where it is that
            precise, and rules out 2 bits (quant2: 0.28-0.91), under which the ResNet-50's
            first layers' gradients fell to cosine ~0.75 against exact training. None (or 0)
            lets the policy take any codec: larger batches, noisier gradients. When no plan
            within it fits the budget, the out-of-memory error says so. Fixed codecs ignore it.
        recompute: True makes the regions the model marks with actpack.recompute(fn, ...)
            recompute in backward: each keeps only its inputs, packed by the policy, and may
            run in micro-batches (see actpack.recompute). False runs them as plain calls.
            "auto" runs them as plain calls while the codecs fit the budget and recomputes
            them from the first step they do not (no plan fits the budget, or a step before
            the first plan could not finish under the cap): recomputation costs a forward, so
            it is taken only when packing alone cannot hold the step. The step after the
            switch plans afresh and, like a run's first steps, may lift the cap to measure.
        gradient_guard: under a lossy codec, a gradient norm over 100x its recent median in
            two of the last three steps is a runaway (2-bit attention inputs make a small GPT's
            gradients run away to inf: benchmarks/diverging_lm.py), caught in that backward,
            before the optimizer steps on it. Under a fixed codec it raises
            actpack.GradientRunaway. Where auto chooses, it warns, halves max_rel_rms (0.2
            where it was None), so the tensors it now rules out take finer codecs, and drops
            the step's gradients (the optimizer skips parameters whose .grad is None); the
            third tightening that does not hold raises. False trains on regardless.
        device: the CUDA device the budget is for ("cuda:1", 1, torch.device("cuda", 1)),
            keyword only. By default (None, or "cuda" without an index) it is the device of the
            first CUDA tensor the budget packs: the model's, whatever torch's current device
            is (a DDP rank that moved its model to cuda:3 without torch.cuda.set_device has
            budget cuda:3). Only that device is measured, capped and asked anything (its name,
            the driver's count); until the first CUDA tensor is packed none is, so the cap
            holds from the first saved activation of the first step on. Give it when the
            budget is a share ("80%") of a device's memory and several are visible, or to cap
            from the moment the context is entered. A tensor packed on another device is
            packed, but that device's memory is neither measured nor capped (a warning says
            so once). The budget's device is run.device.

    The arguments are checked when the context is made, before anything runs: a value of the
    wrong type (a float seed, a str for enabled) is a TypeError and one out of range (seed
    outside [0, 2**64-1], headroom outside [0, 0.5), profile_every below 1, a NaN) a
    ValueError, each one line naming the argument, the value and what is expected.

    The step's peak is measured by actpack's allocator: on CPU the context installs it (when
    it is not installed yet) and enforces the budget from the first step on, counting against
    it what the process's resident set holds outside the allocator (oneDNN's buffers, malloc's
    arenas), so that the operating system's count holds too; a first step that does not fit
    even with the harshest codecs finishes over the cap and raises torch.OutOfMemoryError
    naming the smallest budget that would work. On CUDA install
    it first (actpack.install_allocator or ACTPACK_CONF) to enforce the budget, otherwise the
    peak is read from torch.cuda and the budget is a target. Memory allocated before the
    allocator was installed (on CPU: before entering, unless installed earlier) is not counted.

    With other PyTorch features: a backward with create_graph=True (gradient penalties, double
    backward) continues the step, and what it saves for the next backward is kept exact;
    autocast's float16/bfloat16 activations are packed in their dtype; non-reentrant
    checkpointing keeps its own hooks inside checkpointed regions; a tensor is packed as it
    lies in memory (a transpose or a channels_last activation without a copy, an expanded one
    once) and comes back with its strides. Code compiled by torch.compile is packed as its
    graph saves tensors, but modules inside it are not seen (a warning says so). An exception
    inside the context (a KeyboardInterrupt too) still removes the hooks, restores the allocator
    and writes the report, with the error among its warnings, and reaches the caller as raised.

    A budget opened inside another, in the same thread, governs until it exits: its hooks pack,
    its cap holds, and the outer one's relief of memory pressure waits; then the outer one goes
    on as it was (its hooks, its cap), each report counting its own steps (the outer's step
    that spans the inner one measures its peak from the inner one's exit). Budgets do not run in
    two threads at once: the allocator's cap and the module hooks are the process's, so entering
    one while another thread's is open is a RuntimeError naming that thread, which changes
    nothing. A budget is one run: entering it a second time is a RuntimeError too.
    """

    def __init__(self, limit, codec="auto", report=None, min_bytes=_C.DEFAULT_MIN_BYTES, seed=0,
                 enabled=True, headroom=_C.DEFAULT_HEADROOM,
                 profile_every=_C.DEFAULT_PROFILE_EVERY, snapshot=False,
                 allowed_loss_increase=None, recompute=False, gradient_guard=True,
                 max_rel_rms=_C.DEFAULT_MAX_REL_RMS, *, device=None, _held_outside=0):
        self._budget = parse_budget(limit)
        device = _cuda_index(device)
        # Types here (a wrong one is one line naming it, before the binding sees the value);
        # every value's range and rule is runtime::BudgetConfig::Validate's (C++).
        where = "actpack.budget"
        if not isinstance(recompute, (bool, str)):
            raise ValueError(f"actpack.budget: recompute must be True, False or \"auto\", "
                             f"got {_args.show(recompute)}")
        if isinstance(recompute, str):
            recompute = _args.printable(recompute, "recompute", where, "'auto'")
        enabled = _args.flag(enabled, "enabled", where)
        snapshot = _args.flag(snapshot, "snapshot", where)
        seed = _args.integer(seed, "seed", where, 0, _args.UINT64_MAX)  # the session's uint64
        headroom = _args.real(headroom, "headroom", where, "a share of the budget in [0, 0.5)",
                              finite=False)
        profile_every = _args.integer(profile_every, "profile_every", where,
                                      -_args.INT64_MAX - 1)
        report = None if report is None else _args.path(report, "report", where)
        default, rules = _codec_rules(codec)
        self._loss_bound = _check_loss_bound(allowed_loss_increase)
        self._max_rel_rms = _check_max_rel_rms(max_rel_rms)
        self._config = _C.BudgetConfig(
            limit=limit if isinstance(limit, str) else str(int(limit)), codec=default,
            rules=rules, report=report or "", min_bytes=_min_bytes_text(min_bytes), seed=seed,
            enabled=enabled, headroom=headroom, profile_every=profile_every, snapshot=snapshot,
            allowed_loss_increase=self._loss_bound, max_rel_rms=self._max_rel_rms,
            recompute=recompute if isinstance(recompute, str) else str(recompute).lower(),
            gradient_guard=_args.flag(gradient_guard, "gradient_guard", where))
        self._config.validate()
        enabled = self._config.packs  # codec "none" is plain training
        self._memory = BudgetMemory(self._budget, device)
        self._memory.budget_bytes, self._memory.outside_allowance = _C.holding_outside(
            self._memory.budget_bytes, self._memory.outside_allowance, _held_outside)
        self._session_hooks = _C.SavedTensorHooks(
            self._config, budget_bytes=self._memory.budget_bytes,
            outside_allowance_bytes=self._memory.outside_allowance)
        self._codec = codec if isinstance(codec, str) else dict(codec)
        self._enabled = enabled
        self._run = None  # the C++ run (runtime/budget_run.h), from __enter__ on
        self._snapshot = snapshot
        self._report_path = report
        self._modules = ModuleTracker()
        self._pack, self._unpack = self._make_hooks(*self._session_hooks.hooks())
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._profile_every = int(profile_every)
        self._hooks_traced = False
        self.run = Run(self._budget, self._session_hooks)
        self._started = None
        # The index of the CUDA device the budget is on once bound (-1 before), while the pack
        # hook watches the devices of the tensors it packs (on a machine with CUDA).
        self._watch_devices = False
        self._bound_index = -1
        self._other_devices = set()  # CUDA devices of packed tensors, not the budget's
        self._entered = False  # a budget is entered once
        self._thread = self._thread_name = None  # the thread that entered it
        self._inner_open = False  # a budget opened inside this one is open: it governs

    def timed(self):
        """Times this budget's own work, for benchmarks (benchmarks/overhead.py): its
        saved-tensor hooks and its end of each step add their seconds to run.clock() from here
        on. Call before entering; returns the budget. A budget not timed pays nothing for it."""
        if self._entered:
            raise RuntimeError("actpack.budget.timed: call it before the budget is entered")
        clock = self.run._timing = {"hooks_seconds": 0.0, "hook_calls": 0,
                                    "end_of_step_seconds": 0.0}
        now = time.perf_counter

        def timed(hook, key, calls=None):
            def run(*args):
                start = now()
                try:
                    return hook(*args)
                finally:
                    clock[key] += now() - start
                    if calls:
                        clock[calls] += 1
            return run

        self._pack = timed(self._pack, "hooks_seconds", "hook_calls")
        self._unpack = timed(self._unpack, "hooks_seconds", "hook_calls")
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        # The engine's end-of-backward callback is looked up on the budget when it is queued.
        self._end_step = timed(self._end_step, "end_of_step_seconds")
        return self

    def relieve(self, needed):
        """Frees memory toward `needed` bytes as the allocator's pressure callback does at the
        cap (re-packs what the plan kept exact, or lets a step before the first plan go over
        to measure: runtime::BudgetRun::Relieve); returns the bytes freed or made room for.
        0 while a budget opened inside this one is open: that one governs the allocator."""
        return self._relieve(int(needed))

    @property
    def budget_bytes(self):
        """The budget in bytes on its device: a share ("80%") resolved against the device's
        memory when the budget was made."""
        return self._memory.budget_bytes

    @staticmethod
    def open_budgets():
        """The budgets open now, on every thread, outermost first (a budget is open from its
        __enter__ to its __exit__)."""
        with _open_lock:
            return list(_open)

    def _make_hooks(self, session_pack, session_unpack):
        """The saved-tensor hooks, over the session's pack and unpack (SavedTensorHooks.hooks()).
        They run for every saved tensor: what they call is looked up here, once."""
        is_compiling = torch.compiler.is_compiling
        queue_end_now = self._session_hooks.queue_end_now
        queue_callback = torch.autograd.Variable._execution_engine.queue_callback
        modules = self._modules

        def pack(tensor):
            if is_compiling():
                # torch.compile is tracing this hook into a graph, where the session cannot
                # run: that graph keeps the tensor as it is.
                self._hooks_traced = True
                return tensor
            if self._watch_devices and tensor.is_cuda and \
                    tensor.get_device() != self._bound_index:
                self._packed_on(tensor.get_device())
            return session_pack(tensor, modules.name)

        def unpack(handle):
            # When a step ends is the hooks' StepEndWatch's to say. A backward after the context
            # exited still unpacks, but its steps are not the run's.
            if self._started is not None and queue_end_now():
                queue_callback(self._end_step)
            return session_unpack(handle)

        return pack, unpack

    def _packed_on(self, index):
        """A tensor on CUDA device `index` is being packed, and it is not the budget's device:
        the first one binds it (what the budget measures and caps from now on); any other is
        warned of, once per device."""
        if self._memory.bind(index):
            self._bound(index)
        elif index not in self._other_devices:
            self._other_devices.add(index)
            self._warn(f"tensors on cuda:{index} are packed, but the budget measures and caps "
                       f"cuda:{self._bound_index} alone (its device= argument, or the device of "
                       f"the first tensor it packed): cuda:{index}'s memory is neither measured "
                       "nor capped")

    def _bound(self, index):
        """The budget's device is known: the run caps it from now on."""
        self._bound_index = index
        self.run.device = torch.device("cuda", index)
        self._start_capping()

    def _start_capping(self):
        self._run.start()  # capped from now on
        # Out of budget mid-step: re-pack what the plan kept exact, or let a step before
        # the first plan go over to measure what it needs (BudgetRun::Relieve).
        self._memory.relieve_pressure_with(self._relieve)

    def _end_step(self):
        # The guard's norms are queued before the end of step's status read, which waits for
        # the device once: read after it, they cost no wait of their own (a GPU profile counted
        # one more cudaStreamSynchronize per step when they were read on their own).
        pending = self._modules.gradient_norms() if self._config.guards_gradients else None
        self._close_step()
        if pending is not None:
            norms = pending()
            # The guard's decision is the run's (runtime::BudgetRun::ObserveGradients): train
            # on, drop this step's gradients (auto tightened its fidelity floor), or stop
            # before the optimizer steps on them.
            action, message = self._run.observe_gradients(list(norms.items()))
            if action == "drop_step":
                self._modules.drop_gradients()
                warnings.warn(message, stacklevel=3)
            elif action == "stop":
                raise GradientRunaway(message)

    def _close_step(self):
        self._session_hooks.step_ended()
        self._check_compiled()
        # Gradient statistics weigh each module's codec error (the policy's sensitivity) and set
        # the error caps, on the steps whose end may re-plan from new measurements.
        step = self._run.steps
        if self._statistics_step(step):
            self._session_hooks.set_module_gradients(self._modules.gradient_statistics())
        # The next step's output gradients, for the error caps.
        self._modules.watch_outputs = self._loss_bound is not None and self._statistics_step(step + 1)
        if not self._memory.bound:
            self._warn("a step ended before the budget packed a CUDA tensor, so its device is "
                       "not known and no device's memory was measured or capped (on a machine "
                       "with CUDA a budget is a CUDA device's: name it with device='cuda:N')")
        # The cap, the plan, the errors and the switch to recomputation: runtime::BudgetRun.
        switched = self._run.end_step()  # raises torch.OutOfMemoryError when it cannot fit
        if switched is not None:
            warnings.warn(f"actpack.budget: {switched}", stacklevel=3)

    def _recomputes(self):
        """Whether a region (actpack.recompute) recomputes now; notes that one ran."""
        self.run.regions = True
        return self._run.note_region()

    def _relieve(self, needed):
        """The allocator's pressure callback: bytes freed (or made room for) toward `needed`."""
        if self._inner_open:
            return 0  # a budget opened inside this one governs the allocator until it exits
        return self._run.relieve(needed)

    def _statistics_step(self, step):
        wanted = self._config.automatic or self._loss_bound is not None
        return wanted and _C.is_profile_step(step, self._profile_every)

    @_eager
    def __enter__(self):
        _register(self)  # a second entry, or another thread's budget open: an error, nothing done
        try:
            self._started = time.perf_counter()
            self._memory.start()
            self._run = _C.BudgetRun(
                self._session_hooks, self._memory.runtime_memory, self._config,
                self._memory.budget_bytes,
                capped=self._memory.capped,
                outside_allowance_bytes=self._memory.outside_allowance,
                lifted_cap_extra_bytes=_budget_memory.LIFTED_CAP_EXTRA)
            for warning in self._memory.warnings:
                self._run.warn(warning)
            if self._memory.device == _C._HOST_DEVICE:
                self.run.device = torch.device("cpu")
                self._start_capping()  # capped from the first step on
            else:
                self._watch_devices = True
                if self._memory.bound:  # device= was given
                    self._bound(self._memory.device)
            self._modules.start()
            self._modules.watch_outputs = self._loss_bound is not None
            _checkpoint.install()  # checkpoint's inputs are kept exact
            self._hooks.__enter__()
            _recompute._active.append(self)
        except BaseException:
            _unregister(self)  # not open: the next budget does not nest inside this one
            raise
        return self.run

    @_eager
    def __exit__(self, exc_type, exc, tb):
        # What the context changed is put back even when a step of the way out fails.
        try:
            if self in _recompute._active:
                _recompute._active.remove(self)
            self._hooks.__exit__(exc_type, exc, tb)
        finally:
            try:
                self._modules.stop()
            finally:
                try:
                    self._memory.stop_watching()
                    self._run.stop()  # the cap as the run found it
                    allocator = self._memory.stop(self._snapshot, self._run.run_peaks)
                finally:
                    _unregister(self)
        self._check_compiled()
        error = None
        if exc_type is not None and issubclass(exc_type, torch.OutOfMemoryError):
            measuring = self._run.out_of_memory_while_measuring(str(exc))
            error = torch.OutOfMemoryError(measuring) if measuring is not None else None
        if exc_type is not None:
            self._run.warn("the run stopped on an exception: " +
                           (str(error) if error is not None else _error_text(exc_type, exc)))
        wall = time.perf_counter() - self._started
        self._started = None
        self.run.report = _C.build_report(self._run_metadata(wall), self._session_hooks)
        self.run.report["allocator"] = allocator
        self.run._close()
        if self._report_path is not None:
            _C.write_report(self.run.report, _rank_path(self._report_path))
        _report_observers.notify(self.run.report)
        if error is not None:
            raise error from exc
        return False

    def _check_compiled(self):
        """Warns once when torch.compile'd code ran in the budget."""
        if self._hooks_traced:
            self._warn("torch.compile traced actpack's saved-tensor hooks into its graph (the "
                       "budget was entered inside compiled code): the tensors that graph saves "
                       "are kept as they are and save no memory; enter actpack.budget outside "
                       "compiled code")
        elif self._modules.compiled:
            self._warn("torch.compile'd code ran in the budget: the tensors its graphs save "
                       "are packed, but modules inside compiled code are not seen, so module "
                       "names in the report and per-module codec rules apply to eager modules "
                       "only")

    def _warn(self, message):
        """Warns once, and puts the warning into the report."""
        message = f"actpack.budget: {message}"
        if self._run.warn(message):
            warnings.warn(message, stacklevel=3)

    def _run_metadata(self, wall_seconds):
        """The report's run section: what only Python knows, with the configuration, the run's
        peaks and warnings (BudgetRun::RunSection)."""
        rank, world_size = _distributed()
        return self._run.run_section(
            torch=torch.__version__, python=platform.python_version(),
            device=self._memory.device_name, system_memory=self._memory.system_memory,
            wall_seconds=wall_seconds, rank=rank, world_size=world_size)


# The budgets entered and not yet exited, outermost first (all of one thread), and the lock that
# makes checking and joining them one step.
_open = []
_open_lock = threading.Lock()


def _register(budget):
    """Notes `budget` as open in this thread, inside the innermost one open (which then waits
    for it to exit). A RuntimeError, changing nothing, when it was entered before or another
    thread has a budget open."""
    with _open_lock:
        if budget._entered:
            state = "is open" if budget in _open else "has exited"
            raise RuntimeError(f"actpack.budget: a budget context is entered once, and this one "
                               f"({budget._budget['text']}) already was and {state}; open a new "
                               "actpack.budget(...) for another run")
        me = threading.get_ident()
        other = next((b for b in _open if b._thread != me), None)
        if other is not None:
            raise RuntimeError(
                f"actpack.budget: a budget ({other._budget['text']}) is open in thread "
                f"{other._thread_name!r}; budgets run in one thread at a time (the allocator's "
                "cap, its peak counters and the module hooks are the process's): exit that one "
                "first, or open this one in that thread, where it nests inside it")
        budget._entered = True
        budget._thread, budget._thread_name = me, threading.current_thread().name
        if _open:
            _open[-1]._inner_open = True
        _open.append(budget)


def _unregister(budget):
    """Notes that `budget` exited; the budget it was opened inside governs again, and counts
    the system's memory again (the count is one per device: the inner one stopped it)."""
    with _open_lock:
        if budget not in _open:
            return
        index = _open.index(budget)
        del _open[index]
        outer = _open[index - 1] if index == len(_open) and index > 0 else None
    if outer is not None and outer._inner_open:
        outer._inner_open = False
        outer._memory.resume_counting()


def _innermost():
    """The innermost budget open in this thread, or None."""
    me = threading.get_ident()
    with _open_lock:
        return next((b for b in reversed(_open) if b._thread == me), None)


def _cuda_index(device):
    """The CUDA device index of budget's `device` argument; None for None and "cuda" (the
    device of the first CUDA tensor packed), and for "cpu" where there is no CUDA (the host's
    budget, which the machine's budgets are)."""
    if device is None:
        return None
    where = "actpack.budget"
    expected = "a CUDA device such as 'cuda:1', 1 or torch.device('cuda', 1)"
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise TypeError(f"{where}: device is {expected}, got {_args.kind(device)}")
    if isinstance(device, int):
        if not 0 <= device <= _args.INT32_MAX:
            raise ValueError(f"{where}: device={device} is out of range; expected {expected}")
        index, shown = device, f"cuda:{device}"
    else:
        try:
            parsed = torch.device(device)
        except (RuntimeError, TypeError):
            raise ValueError(f"{where}: device={_args.show(device)}; expected {expected}") from None
        if parsed.type == "cpu" and not torch.cuda.is_available():
            return None
        if parsed.type != "cuda":
            raise ValueError(f"{where}: device={_args.show(device)}; expected {expected} (on a "
                             "machine with CUDA a budget is a CUDA device's)")
        index, shown = parsed.index, str(parsed)
    if not torch.cuda.is_available():
        raise ValueError(f"{where}: device={_args.show(device)}, but no CUDA device is available "
                         "(torch.cuda.is_available() is False)")
    if index is None:
        return None
    count = torch.cuda.device_count()
    if index >= count:
        raise ValueError(f"{where}: device={_args.show(device)}, but {shown} is not among the "
                         f"{count} CUDA devices visible")
    return index


def _error_text(exc_type, exc):
    """'RuntimeError: message', or the type alone when the message is empty (KeyboardInterrupt)."""
    text = "" if exc is None else str(exc)
    return f"{exc_type.__name__}: {text}" if text else exc_type.__name__


def _distributed():
    """(rank, world size) under torch.distributed, (0, 1) without it."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _rank_path(path):
    """This process's report path: "{rank}" substituted, or a name per rank when several
    processes would write the same file."""
    rank, world_size = _distributed()
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    if world_size > 1:
        root, ext = os.path.splitext(path)
        return f"{root}.rank{rank}{ext}"
    return path


def _min_bytes_text(value):
    """min_bytes as runtime::BudgetConfig takes it: the text of a size, "0" packing every saved
    tensor (an int is its decimal text; the size's parsing and range are C++'s)."""
    if _args.is_int(value):
        return str(int(value))
    if not isinstance(value, str):
        raise TypeError(f"actpack: a min_bytes is a str like '64KiB' or '1.5e9', or an int of "
                        f"bytes, got {_args.kind(value)}")
    return _args.printable(value, "min_bytes", "actpack.budget", "'64KiB'")


def _check_max_rel_rms(value):
    """max_rel_rms as a float (0.0: no floor); its range is runtime::BudgetConfig's."""
    if value is None:
        return 0.0
    return _args.real(value, "max_rel_rms", "actpack.budget",
                      "the relative RMS error a saved tensor may carry, such as 0.2 (None: no "
                      "floor)", finite=False)


def _check_loss_bound(value):
    """allowed_loss_increase as a float, or None (off); its range, and the codecs it applies
    to, are runtime::BudgetConfig's."""
    if value is None:
        return None
    number = None
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:
            pass
    # An int without an exact float would be named as that float by the range's check (C++).
    if number is None or (_args.is_int(value) and math.isfinite(number) and int(number) != value):
        raise ValueError("actpack.budget: allowed_loss_increase is the fraction the loss may rise "
                         f"over an exact step, in (0, 1) (e.g. 0.01), got {_args.show(value)}")
    return number


# The one name of packing nothing (runtime/codec_choice.h kNotPacked): tensors kept as they
# are. As budget's codec it is enabled=False (plain training under the cap); as a rule's codec,
# the matching modules' tensors are kept.
NONE = _C.NOT_PACKED


def _codec_rules(codec):
    """(default codec, [(pattern, codec), ...]) for budget's `codec` argument."""
    if isinstance(codec, str):
        _args.printable(codec, "codec", "actpack.budget", "'auto' or 'quant2'")
        return codec, []
    if isinstance(codec, dict):
        rules = []
        for pattern, spec in codec.items():
            if not isinstance(pattern, str) or not isinstance(spec, str):
                raise TypeError("actpack.budget: a codec mapping goes from module-name patterns "
                                f"to codec specs (str -> str), got {_args.show(pattern)}: "
                                f"{_args.show(spec)}")
            _args.printable(pattern, "codec pattern", "actpack.budget", "'layer1.*'")
            _args.printable(spec, "codec", "actpack.budget", "'auto' or 'quant2'")
            rules.append((pattern, spec))
        return "auto", rules
    raise TypeError("actpack.budget: codec must be 'auto', a codec spec such as 'quant2', or a "
                    f"dict of module-name patterns to codecs, got {_args.kind(codec)}")
