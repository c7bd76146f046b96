"""The memory-budget context: saved_tensors_hooks backed by the C++ session."""
import functools
import math
import os
import platform
import sys
import threading
import time
import warnings

import torch

from actpack import _C, _args, _checkpoint, _recompute
from actpack._gradient_guard import GradientGuard as _GradientGuard
from actpack._units import format_bytes, parse_budget, parse_size

_HOST = _C._HOST_DEVICE


class Run:
    """What a budget context knows about the run; `report` is set when the context exits."""

    def __init__(self, budget_spec, session):
        self.budget = budget_spec
        self._session = session
        self._final_totals = None
        self.report = None
        self.regions = False  # whether a region marked with actpack.recompute ran

    def totals(self):
        """Byte counts of the session (packed raw/stored bytes, peaks, fallbacks): live inside
        the context, as they were at its exit after it."""
        if self._session is None:
            return dict(self._final_totals)
        return dict(self._session.totals())

    def _close(self):
        # The run outlives the context; the session need not live as long.
        self._final_totals = dict(self._session.totals())
        self._session = None


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
        gradient_guard: under a lossy codec, a gradient norm over 100x its recent median for
            two steps in a row raises actpack.GradientRunaway from that backward, before the
            optimizer steps on it (2-bit attention inputs make a small GPT's gradients run
            away to inf: benchmarks/diverging_lm.py). False trains on regardless.

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
                 max_rel_rms=_C.DEFAULT_MAX_REL_RMS):
        self._budget = parse_budget(limit)
        if not (isinstance(recompute, bool) or isinstance(recompute, str) and recompute == "auto"):
            raise ValueError(f"actpack.budget: recompute must be True, False or \"auto\", "
                             f"got {_args.show(recompute)}")
        # Checked before the session's binding sees them: a wrong value is one line naming it.
        where = "actpack.budget"
        enabled = _args.flag(enabled, "enabled", where)
        snapshot = _args.flag(snapshot, "snapshot", where)
        seed = _args.integer(seed, "seed", where, 0, _args.UINT64_MAX)  # the session's uint64
        given, headroom = headroom, _args.real(headroom, "headroom", where,
                                               "a share of the budget in [0, 0.5)")
        if not 0 <= headroom < 0.5:  # the session's range (saved_tensors.cc), the value as given
            raise ValueError(f"actpack.budget: headroom={_args.show(given)} is out of range; "
                             "expected a share of the budget in [0, 0.5)")
        profile_every = _args.integer(profile_every, "profile_every", where, 1)
        report = None if report is None else _args.path(report, "report", where)
        self._recompute_mode = recompute
        self.recomputing = recompute is True  # "auto": from the first step codecs cannot fit
        self._regions_seen = False
        self._recompute_from_step = 0
        self._plans_before_recompute = 0
        default, rules = _codec_rules(codec)
        if codec == NONE:
            enabled = False  # what the planner's "none" measures: plain training
        self._loss_bound = _check_loss_bound(allowed_loss_increase)
        self._max_rel_rms = _check_max_rel_rms(max_rel_rms)
        # 0 packs every saved tensor, however small.
        if not (_args.is_int(min_bytes) and min_bytes == 0):
            min_bytes = parse_size(min_bytes, "min_bytes")
        self._memory = _PeakMeter(self._budget)
        self._session = _C.Session(codec=default, rules=rules, min_bytes=int(min_bytes), seed=seed,
                                   enabled=enabled, budget_bytes=self._memory.budget_bytes,
                                   headroom=headroom, profile_every=profile_every,
                                   allowed_loss_increase=self._loss_bound,
                                   outside_allowance_bytes=self._memory.outside_allowance,
                                   max_rel_rms=self._max_rel_rms)
        self._codec = codec if isinstance(codec, str) else dict(codec)
        self._enabled = enabled
        # Lossless packing cannot make the gradients run away.
        lossy = not (isinstance(codec, str) and codec.split(":")[0] in (NONE, "identity"))
        self._guard = _GradientGuard(codec) if _args.flag(
            gradient_guard, "gradient_guard", "actpack.budget") and lossy else None
        self._headroom = headroom
        self._snapshot = snapshot
        self._report_path = report
        self._modules = _ModuleTracker()
        self._pack, self._unpack = self._make_hooks(*self._session.hooks())
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._end_of_backward_queued = False
        self._steps = 0
        self._planned = False  # the policy has made its first plan
        self._profile_every = int(profile_every)
        self._hooks_traced = False
        self._warnings = []
        self.run = Run(self._budget, self._session)
        self._started = None
        self._entered = False  # a budget is entered once
        self._thread = self._thread_name = None  # the thread that entered it
        self._inner_open = False  # a budget opened inside this one is open: it governs

    def _make_hooks(self, session_pack, session_unpack):
        """The saved-tensor hooks, over the session's pack and unpack (Session.hooks()). They
        run for every saved tensor: what they call is looked up here, once."""
        is_compiling = torch.compiler.is_compiling
        graph_task_id = torch._C._current_graph_task_id
        is_grad_enabled = torch.is_grad_enabled
        queue_callback = torch.autograd.Variable._execution_engine.queue_callback
        modules = self._modules

        def pack(tensor):
            if is_compiling():
                # torch.compile is tracing this hook into a graph, where the session cannot
                # run: that graph keeps the tensor as it is.
                self._hooks_traced = True
                return tensor
            if self._end_of_backward_queued and graph_task_id() == -1:
                # No backward is running: one that raised never ran its queued end of step.
                self._end_of_backward_queued = False
            return session_pack(tensor, modules.name)

        def unpack(handle):
            # The first unpack of a backward pass queues the end of the step for when that pass
            # finishes (the engine runs queued callbacks once all of its work is done). A
            # backward with create_graph=True runs with grad mode on and builds a graph that a
            # later backward differentiates: the step goes on until that one. A backward after
            # the context exited still unpacks, but its steps are no longer the run's.
            if (not self._end_of_backward_queued and self._started is not None
                    and not is_grad_enabled() and graph_task_id() != -1):
                queue_callback(self._end_step)
                self._end_of_backward_queued = True
            return session_unpack(handle)

        return pack, unpack

    def _recompute_hint(self):
        """What recomputation would do for a step no plan fits, said after the policy's error."""
        if self.recomputing:
            return ""
        if self._regions_seen:
            return ("; the regions this model marks with actpack.recompute would recompute "
                    "instead under budget(recompute=\"auto\")")
        return ("; or recompute: blocks marked with actpack.recompute, under "
                "budget(recompute=\"auto\"), recompute their activations instead of holding them")

    def _end_step(self):
        # The guard's norms are queued before the end of step's status read, which waits for
        # the device once: read after it, they cost no wait of their own (a GPU profile counted
        # one more cudaStreamSynchronize per step when they were read on their own).
        pending = self._modules.gradient_norms() if self._guard is not None and self._enabled \
            else None
        self._close_step()
        if pending is not None:
            norms = pending()
            if norms:
                total = math.sqrt(sum(n * n for n in norms.values()))
                self._guard.observe(self._steps, total, norms)

    def _close_step(self):
        self._end_of_backward_queued = False
        self._check_compiled()
        # Gradient statistics weigh each module's codec error (the policy's sensitivity) and set
        # the error caps, on the steps whose end may re-plan from new measurements.
        if self._statistics_step(self._steps):
            self._session.set_module_gradients(self._modules.gradient_statistics())
        self._steps += 1
        # The next step's output gradients, for the error caps.
        self._modules.watch_outputs = self._loss_bound > 0 and self._statistics_step(self._steps)
        plans = self._session.policy()["plans"]
        peaks = self._memory.step_peaks()
        overflowed = self._memory.restore_cap()  # after the peaks: it releases the cache
        can_switch = self._regions_seen and self._recompute_mode == "auto" and \
            not self.recomputing
        try:
            self._session.end_step(*peaks)  # raises when no plan fits the budget
            no_plan_fits = False
        except torch.OutOfMemoryError as e:
            if not can_switch:
                raise torch.OutOfMemoryError(str(e) + self._recompute_hint()) from None
            no_plan_fits = True
        policy = self._session.policy()
        replanned = policy["plans"] != plans
        self._planned = policy["plans"] > self._plans_before_recompute
        # Over the cap with nothing (more) to plan: the same step will not fit the next time.
        overflowed_unplanned = (overflowed and not self._planned and
                                self._steps >= self._unplanned_steps())
        # Not a plan that only eats into the headroom: that runs, and a region that cannot
        # micro-batch (a convolutional block) can need more memory recomputed than packed.
        if can_switch and (no_plan_fits or overflowed_unplanned):
            # Codecs alone do not fit: the regions recompute from the next step on, which
            # plans afresh (its first steps may lift the cap again to measure).
            self.recomputing = True
            self._recompute_from_step = self._steps
            self._plans_before_recompute = policy["plans"]
            self._planned = False
            self._warn(f"the budget does not hold step {self._steps} with codecs alone: the "
                       f"regions marked with actpack.recompute recompute from step "
                       f"{self._steps + 1} on")
            self._memory.release_cache()
            return
        self._regions_seen = False
        if overflowed_unplanned:
            allocator, system = peaks[1], peaks[2] - self._memory.outside_allowance
            measured = max(allocator, system)
            # As the policy sizes a budget: the peak is what it may use, less the headroom.
            needed = _C.budget_for(measured, self._headroom)
            what = "plain training (enabled=False)" if not self._enabled else \
                f"codec {self._codec!r}"
            raise torch.OutOfMemoryError(
                f"actpack: a budget of {format_bytes(self._memory.budget_bytes)} cannot hold "
                f"this training step with {what}: step {self._steps} went over it and peaked "
                f"at {format_bytes(measured)}; the smallest budget that would work is "
                f"{format_bytes(needed)} (with {round(self._headroom * 100)}% headroom), or "
                f"use another codec or a smaller batch")
        if replanned:
            # The next step's peak must show the new plan's footprint, not this plan's cache.
            self._memory.release_cache()

    def _unplanned_steps(self):
        # The policy plans at the end of the second step (of the run, or since the regions
        # began to recompute); a fixed codec has nothing to plan.
        return self._recompute_from_step + (2 if _automatic(self._codec) and self._enabled
                                            else 1)

    def _recomputes(self):
        """Whether a region (actpack.recompute) recomputes now; notes that one ran."""
        self._regions_seen = True
        self.run.regions = True
        return self.recomputing

    def _relieve(self, needed):
        """The allocator's pressure callback: bytes freed (or made room for) toward `needed`."""
        if self._inner_open:
            return 0  # a budget opened inside this one governs the allocator until it exits
        if _automatic(self._codec) and self._enabled:
            freed = self._session.relieve(needed)
            if freed:
                return freed
        if self._steps < self._unplanned_steps() and not self._planned:
            # A step before the first plan does not fit even packed at the harshest: let it
            # finish over the cap so that its end measures it and says what budget it needs.
            return self._memory.lift_cap(needed)
        return 0

    def _statistics_step(self, step):
        wanted = _automatic(self._codec) or self._loss_bound > 0
        return wanted and _C.is_profile_step(step, self._profile_every)

    @_eager
    def __enter__(self):
        _register(self)  # a second entry, or another thread's budget open: an error, nothing done
        try:
            self._started = time.perf_counter()
            self._memory.start()
            # Out of budget mid-step: re-pack what the plan kept exact rather than fail.
            self._memory.watch_pressure(self._relieve)
            self._modules.start()
            self._modules.watch_outputs = self._loss_bound > 0
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
                    allocator = self._memory.stop(self._snapshot)
                finally:
                    _unregister(self)
        self._check_compiled()
        error = None
        if (exc_type is not None and issubclass(exc_type, torch.OutOfMemoryError)
                and self._memory.lifted):
            error = torch.OutOfMemoryError(
                f"actpack: a budget of {format_bytes(self._memory.budget_bytes)} cannot hold "
                f"this training step: step {self._steps + 1} ran out even at "
                f"{format_bytes(self._memory.lifted_cap())}, the most a step before the first "
                f"plan may take to measure what it needs ({exc}); use a smaller batch")
            self._warnings.append(f"the run stopped on an exception: {error}")
        elif exc_type is not None:
            self._warnings.append(f"the run stopped on an exception: {_error_text(exc_type, exc)}")
        wall = time.perf_counter() - self._started
        self._started = None
        self.run.report = _C.build_report(self._run_metadata(wall), self._session)
        self.run.report["allocator"] = allocator
        self.run._close()
        if self._report_path is not None:
            _C.write_report(self.run.report, _rank_path(self._report_path))
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
        message = f"actpack.budget: {message}"
        if message not in self._warnings:
            self._warnings.append(message)
            warnings.warn(message, stacklevel=3)

    def _run_metadata(self, wall_seconds):
        peak = self._memory.run_peak
        budget_bytes = self._memory.budget_bytes or None
        warnings = list(self._memory.warnings) + self._warnings
        rank, world_size = _distributed()
        if peak is not None and budget_bytes is not None and peak > budget_bytes:
            warnings.append(f"peak memory {format_bytes(peak)} exceeded the budget "
                            f"{format_bytes(budget_bytes)}")
        system = self._memory.run_system_peak
        allowance = self._memory.outside_allowance
        if system is not None and budget_bytes is not None and system > budget_bytes + allowance:
            warnings.append(f"the system counted {format_bytes(system)} at the peak "
                            f"({self._memory.system_memory}), over the budget "
                            f"{format_bytes(budget_bytes)} and the "
                            f"{format_bytes(allowance)} allowed outside it")
        return {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "device": self._memory.device_name,
            "budget": self._budget["text"],
            "budget_bytes": budget_bytes,
            "codec": self._codec,
            "allowed_loss_increase": self._loss_bound or None,
            "max_rel_rms": self._max_rel_rms or None,
            "peak_allocated_bytes": self._memory.run_allocated_peak,
            "peak_reserved_bytes": peak,
            "peak_system_bytes": self._memory.run_system_peak,
            "system_memory": self._memory.system_memory,
            "wall_seconds": wall_seconds,
            "rank": rank,
            "world_size": world_size,
            "warnings": warnings,
        }


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


def _check_max_rel_rms(value):
    """max_rel_rms as a float (0.0: no floor)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise ValueError("actpack.budget: max_rel_rms is the relative RMS error a saved tensor "
                         "may carry, a number >= 0 such as 0.2 (None or 0: no floor), got "
                         f"{_args.show(value)}")
    return float(value)


def _check_loss_bound(value):
    """allowed_loss_increase as a float (0.0: off). The session checks that the codecs it
    applies to are 'eb' or 'auto'."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError("actpack.budget: allowed_loss_increase is the fraction the loss may rise "
                         f"over an exact step, in (0, 1) (e.g. 0.01), got {_args.show(value)}")
    return float(value)


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


def _automatic(codec):
    return not isinstance(codec, str) or codec == "auto"


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


class _ModuleTracker:
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


# How far over the budget the steps before the first plan may go to measure themselves:
# the larger of 4x the budget and the budget plus 1 GiB.
LIFTED_CAP_FACTOR = 4
LIFTED_CAP_EXTRA = 1 << 30
LIFT_GRANULE = 2 << 20  # a small segment: what a lift adds beyond the bytes a request lacks


def outside_allowance():
    """What the system may count outside the allocator before it takes from the budget: on the
    host, torch's one-time initialization of its CPU kernels; on CUDA nothing."""
    return 0 if torch.cuda.is_available() else _C._HOST_OUTSIDE_ALLOWANCE_BYTES


class _PeakMeter:
    """The memory side of a budget: installs and reads the allocator, enforces the cap."""

    def __init__(self, parsed_budget):
        from actpack import memory
        self._mem = memory
        self.warnings = []
        self.run_peak = None  # reserved
        self.run_allocated_peak = None
        self._cuda = torch.cuda.is_available()
        self.outside_allowance = outside_allowance()
        self.device_name = "cpu"  # the GPU's name at start(): asking it here would start CUDA
        self.budget_bytes = memory._resolve_budget(parsed_budget, memory._budget_device())
        self._installed_here = False
        self._previous_cap = None
        self._capped = False
        self._pressure_id = None
        self._actpack_cuda = False
        # The system's count: the resident set (CPU) or the driver's (CUDA), above its value
        # at start; None where it cannot be read.
        self._resident = None
        self._driver_start = None
        self._pool_start = 0
        self._counting = None  # the device whose pool counts the system's memory
        self._lifted = False  # the cap lifted for the rest of a step (lift_cap)
        self.lifted = False  # whether it was when the run stopped
        self.run_system_peak = None
        self.system_memory = None

    def start(self):
        if self._cuda:
            self.device_name = torch.cuda.get_device_name()
            self._actpack_cuda = self._mem.cuda_allocator_installed()
            if not self._actpack_cuda:
                self.warnings.append(
                    "the budget is a target, not a cap: actpack's CUDA allocator is not "
                    "installed (call actpack.install_allocator(budget=...) before any CUDA work, "
                    "or set ACTPACK_CONF); the peak comes from torch.cuda.max_memory_allocated")
                self._reset()
        elif not self._mem.cpu_allocator_installed():
            self._mem.install_cpu_allocator()
            self._installed_here = True
        if self._ours():
            # Capped from the first step, on the CPU and on the GPU alike: what the system
            # counts must hold then too. (Until 2026-11-27 a CUDA budget set no cap at all: the
            # first GPU run of the planner's test found every batch it tried "fits".)
            self._previous_cap = self._cap()
            self._capped = True
            self._set_cap(self.budget_bytes)
            self.release_cache()
        self._start_system_count()
        # What ran before the budget is not the run's.
        self.run_peak = self.run_allocated_peak = self.run_system_peak = None

    def _start_system_count(self):
        # The allocator counts against its cap what the system holds outside it (checked when
        # it reserves memory), and each step's peak as the system counts it is measured.
        if not self._cuda:
            self._counting = _HOST
            _C._count_system_memory(_HOST, self.outside_allowance)
            self._resident = _C.ResidentPeakMeter()
            self._resident.start()
            self.system_memory = "resident set above its size at enter (VmHWM)"
            return
        try:
            device = torch.cuda.current_device()
            self._driver_start = _C._device_used_bytes(device)
            # The driver's count is taken above its value at enter; so is the pool's, which
            # the driver's count holds (weights, optimizer state reserved before the run).
            self._pool_start = self._reserved_now()
            self.system_memory = "CUDA driver's used memory above its value at enter " \
                                 "(cudaMemGetInfo, at step ends)"
            if self._actpack_cuda:
                self._counting = device
                _C._count_system_memory(device)
        except (RuntimeError, NotImplementedError):
            self._driver_start = None  # this build has no CUDA of its own

    def resume_counting(self):
        """Counts the system's memory against the cap again, from now, after a budget nested
        inside this one stopped that count (there is one per device)."""
        if self._counting is not None:
            try:
                _C._count_system_memory(self._counting, self.outside_allowance)
            except (RuntimeError, NotImplementedError):
                self._counting = None  # the system's count cannot be read now: the pool's alone

    def _system_peak(self, reserved_peak):
        """The step's peak as the system counts it, above its value at start (0: unknown)."""
        if self._resident is not None:
            return self._resident.take_peak()
        if self._driver_start is None:
            return 0
        # The driver only says what is in use now: the pool's peak plus what is in use outside
        # the pool at the step's end (the context, workspaces, other allocators).
        used = _C._device_used_bytes(torch.cuda.current_device()) - self._driver_start
        outside = used - (self._reserved_now() - self._pool_start)
        return reserved_peak + max(0, outside)

    def _reserved_now(self):
        return (self._mem.memory_reserved(self._device()) if self._actpack_cuda
                else torch.cuda.memory_reserved())

    def _device(self):
        return "cuda" if self._cuda else "cpu"

    def _ours(self):
        """Whether actpack's allocator serves the budget's device (so the budget is a cap)."""
        return not self._cuda or self._actpack_cuda

    def _cap(self):
        return self._mem.memory_budget(self._device())

    def _set_cap(self, budget_bytes):
        """The cap of the pool the budget is on (None: none): the host's, or actpack's CUDA
        allocator's for the current device."""
        if self._cuda:
            _C._set_device_budget(torch.cuda.current_device(), budget_bytes)
        else:
            self._mem.set_cpu_budget(budget_bytes)

    def _reset(self):
        # The allocator has one peak counter, restarted per step; the run's peaks are the
        # maxima over every window, so fold the closing window in first.
        self.run_peak = max(self.run_peak or 0, self._peak())
        self.run_allocated_peak = max(self.run_allocated_peak or 0, self._allocated_peak())
        if self._cuda and not self._actpack_cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            self._mem.reset_peak_memory_stats(self._device())

    def _peak(self):
        # Reserved bytes: the budget caps what the allocator holds, fragmentation included.
        # The cache is released whenever the plan changes, so this is the plan's footprint.
        if self._cuda and not self._actpack_cuda:
            return torch.cuda.max_memory_reserved()
        return self._mem.max_memory_reserved(self._device())

    def release_cache(self):
        if self._cuda and not self._actpack_cuda:
            torch.cuda.empty_cache()
        else:
            self._mem.empty_cache(self._device())
        self._reset()

    def _allocated_peak(self):
        if self._cuda and not self._actpack_cuda:
            return torch.cuda.max_memory_allocated()
        return self._mem.max_memory_allocated(self._device())

    def step_peaks(self):
        """(allocated, reserved, system) peaks since the last call (or start); restarts
        measuring. `system` is the operating system's or the driver's count (0: unknown)."""
        allocated, reserved = self._allocated_peak(), self._peak()
        system = self._system_peak(reserved)
        self._reset()
        if system:
            self.run_system_peak = max(self.run_system_peak or 0, system)
        return allocated, reserved, system

    def watch_pressure(self, relieve):
        """Calls relieve(needed_bytes) when an allocation would cross the budget (actpack's
        allocator only: torch's has no such hook)."""
        if self._ours():
            device = self._device() if not self._cuda else torch.cuda.current_device()
            self._pressure_id = self._mem.add_pressure_callback(relieve, device)

    def lift_cap(self, needed):
        """Lets the current step go over the budget (the first steps, to measure what they
        need); returns the room made. restore_cap() puts the cap back."""
        if not self._capped:
            return 0
        # By what this request lacks, not at once to the bound: the pool still gives back its
        # cache before it grows, so the step's segments lie as they would under a cap. Not
        # without bound: a batch far too large fails fast instead of taking the machine.
        cap = self._cap() or self.budget_bytes
        # A quarter more at least: what the system counts outside the pool takes from the cap
        # too, and the request's shortfall does not show it.
        lifted = min(self.lifted_cap(), max(cap + int(needed) + LIFT_GRANULE, cap * 5 // 4))
        if lifted <= cap:
            return 0
        self._lifted = True
        self._set_cap(lifted)
        return lifted - cap

    def lifted_cap(self):
        return max(LIFTED_CAP_FACTOR * self.budget_bytes, self.budget_bytes + LIFTED_CAP_EXTRA)

    def restore_cap(self):
        """Puts back a cap lift_cap() lifted; True when it had been lifted."""
        if not self._lifted:
            return False
        self._lifted = False
        self._set_cap(self.budget_bytes)
        self.release_cache()
        return True

    def stop(self, snapshot):
        """The report's allocator section; the allocator and its cap are left as start() found
        them."""
        if self._pressure_id is not None:
            self._mem.remove_pressure_callback(self._pressure_id)
            self._pressure_id = None
        if self._counting is not None:
            _C._stop_counting_system_memory(self._counting)
            self._counting = None
        try:
            self._reset()
            device = self._device()
            # backend: the device; allocator: whose allocator served it (the CLI's schema).
            ours = self._ours()
            stats = self._mem.memory_stats(device) if ours else dict(torch.cuda.memory_stats())
            section = _C.allocator_section(
                device, ours, self.budget_bytes, stats, self.run_allocated_peak, self.run_peak,
                self._mem.memory_snapshot(device) if snapshot and ours else None)
        finally:
            if self._capped:
                self._set_cap(self._previous_cap)
                self.lifted = self._lifted  # when the run stopped
                self._capped = self._lifted = False
            if self._installed_here:
                self._mem.uninstall_cpu_allocator()
                self._installed_here = False
        return section
