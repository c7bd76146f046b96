"""The batch-size planner: the largest batch a memory budget supports, found by real training
steps: a few profiled, then tries under the budget's cap (a try that runs out of memory is
caught and the next one is smaller).

    plan = actpack.plan(step, budget="6GiB", batch_sizes=(8, 16))
    plan.max_batch_size      # {"none": 41, "quant2": 130, "auto": 128, ...}
    plan.steps_run           # how many times it called step()
    print(plan.table())

`step(batch_size)` runs one full training step (forward, backward, optimizer step). The planner
runs it once to warm up (optimizer state), then once per codec choice and profiled batch size
inside a budget context, measuring the allocator's peak. Memory is modelled per choice as
fixed + per_sample * batch in allocated bytes, which grow smoothly with the batch. An answer
more than 4x the largest profiled batch is profiled again nearer to it (the peak of a small
batch can sit in the optimizer step, where the batch does not matter), at most 3 times.
What the cap counts beyond those allocated bytes (the pool's segments, lumpy under a cap, and
what the system holds outside the pool) is measured, not assumed: a pool caches whatever its
cap allows, so its reserved bytes do not say what it needs, and whether a step fits does. Per
choice, real steps run under the cap at the batch whose modelled bytes leave 5% of the budget
free, then 6.5%, then 8% until one fits (a capped step needed 3-6% beyond the line on a CNN, a
transformer and an MLP-Mixer), then a tenth fewer samples at a time (the line is off, 4 tries
at most); from the first that fits they climb a twentieth at a time while they fit (twice at
most). The last batch that fitted is the answer, and the share of the budget its line leaves
free is the choice's measured headroom (what `actpack plan` keeps free at another budget). A
try runs 2 steps for a fixed codec, 3 for auto and 5 for auto+recompute (until one step has been
held to the cap from its start), and stops at the step that runs out. Each try starts as the
user's training in a fresh process does: the training state as plan() found it (restore=True),
the pool's free segments returned. The planner's steps run under the budget less 3%: a fresh
process can need that much more than this one, which has run the step's shapes before; and each
try counts what the plan's warm-up left outside the pool (torch's one-time setup of its CPU
kernels) as a fresh process's run counts it against the budget.
verify=True then searches from there with real steps under the same cap (4 a try; actpack.search's
bracket: down 5% at a time until a batch fits, then bisection up to where allocated bytes alone
fill the budget), and reports the measured peak and every batch it tried. It is not a scan:
where fits are not monotone in the batch its answer may be short of the largest batch that
trains (tools/budget_check.py's scan finds that, at several times the cost).

The cost, counted in `plan.steps_run`: one warm-up step, then per choice a step per profiled
batch size (and up to 3 more), then its tries. A default plan (five choices, batch sizes 8 and
16, no verify) ran 32 steps on tools/budget_check.py's CNN at 256 MiB and 38 on its transformer
at 128 MiB (39 and 34 on the demo models under the 2% share, 56 and 43 with 4 steps a try
before that), and 63 on a batch-norm CNN at 16 MiB profiled at 4 and 8 (two more profiles per
choice, its answers being 60x the profiled batches, and three tries per choice that ran out
before one fitted); with auto+recompute, 65 on the suite's GPT at depth 4, width 64 and 24 MiB.
Those counts are from before plan(gradients=True), which adds one step (an exact one, to compare
each fixed codec's gradients against). Those steps train; plan() puts the training state back
afterwards (see plan()).

A model that marks regions with actpack.recompute gets a sixth choice, auto+recompute: the
budget's recompute="auto", profiled with the regions recomputing (what a step does once codecs
alone cannot hold it) and tried under the cap as the user trains it (recompute="auto", which at
such a batch switches recomputation on after its second step: 5 steps a try). Against the
largest batch that trains in fresh processes (tools/budget_check.py plan; the README's planner
table), at 24 MiB the suite's GPT and ViT at depth 4 and width 64 answered 90 against 92 and
201 against 231 (auto: 60 against 62, 59 against 61); at 24 MiB the ViT's fits are not
monotone in the batch (221 ran out in fresh processes, 231 trained).
"""
import collections.abc
import math
import os
import sys
import warnings

from actpack import (_C, _args, _gradient_fidelity, _budget_memory, _report_observers, _snapshot,
                     memory, search)
from actpack._budget import NONE, _error_text, _innermost, budget as _budget_context
from actpack._units import format_bytes, parse_budget

# "none" packs nothing; "auto" is the policy at its harshest within its fidelity floor (its
# largest batch);
# "auto+recompute" is auto with budget(recompute="auto"): the regions the model marks with
# actpack.recompute recompute once codecs alone cannot hold the step. The default plans it
# when the warm-up step ran such a region.
CHOICES = (NONE, *_C.plan_codecs(), "auto")  # each codec's harshest spec auto may choose
RECOMPUTE_CHOICE = "auto+recompute"
ALL_CHOICES = CHOICES + (RECOMPUTE_CHOICE,)
# The budget's recompute= per choice as a user trains it: the calibration tries, verify's steps
# and the truths under the cap train so; its profile steps recompute (recompute=True): past what
# codecs alone hold, that is what a step does.
_RECOMPUTE = {RECOMPUTE_CHOICE: "auto"}


class Plan:
    """The planner's answer: per codec choice, the memory model and the largest batch."""

    def __init__(self, budget_bytes, batch_sizes, choices, verified, report, steps_run=None):
        self.budget_bytes = budget_bytes
        self.batch_sizes = list(batch_sizes)
        self.choices = choices  # name -> {"fixed_bytes", "per_sample_bytes", ...}
        self.verified = verified
        self.report = report
        self.steps_run = steps_run  # calls of the user's step() the plan made (None: not known)

    @property
    def max_batch_size(self):
        """Per choice, the largest batch: the model's estimate, or for the choice verified
        (verify=True) what real steps under the cap showed."""
        sizes = {name: c["max_batch_size"] for name, c in self.choices.items()}
        if self.verified:  # 0 where no batch trained under the cap
            sizes[self.verified["codec"]] = self.verified["batch_size"]
        return sizes

    def table(self):
        """The batch-size table as text."""
        lines = [f"budget {format_bytes(self.budget_bytes)}; profiled at batch sizes "
                 f"{', '.join(map(str, self.batch_sizes))}"
                 + (f"; {self.steps_run} steps run" if self.steps_run is not None else ""),
                 f"{'codec':<14} {'fixed':>12} {'per sample':>12} {'fragmentation':>14} "
                 f"{'headroom':>9} {'max batch':>10} {'grad cos':>9}"]
        for name, c in self.choices.items():
            # The headroom measured by a capped step (see _calibrate), or the default's, marked.
            headroom = f"{c['headroom']:.1%}" + ("" if c["calibration"] else "*")
            g = c.get("gradients")
            cosine = "-" if not g else (_cosine_text(g["min_cosine"])
                                        + ("!" if g["below_bound"] else ""))
            lines.append(f"{name:<14} {format_bytes(c['fixed_bytes']):>12} "
                         f"{format_bytes(c['per_sample_bytes']):>12} "
                         f"{c['fragmentation']:>14.3f} {headroom:>9} {c['max_batch_size']:>10} "
                         f"{cosine:>9}")
        if any(not c["calibration"] for c in self.choices.values()):
            lines.append(_C.PLAN_DEFAULT_HEADROOM_NOTE)  # report/plan.h, as `actpack plan`
        fidelity = self.report.get("planner", {}).get("gradients") if self.report else None
        if fidelity and not fidelity["repeatable"]:
            lines.append(f"grad cos: not measured: two exact runs of step({fidelity['batch_size']}) "
                         "from the same state had different gradients (does it draw new data "
                         "each call?)")
        elif fidelity:
            lines.append(f"grad cos: the worst parameter group's gradient cosine against exact "
                         f"training at batch {fidelity['batch_size']}; ! below {fidelity['bound']}")
            for name, c in self.choices.items():
                g = c.get("gradients")
                if g and g["below_bound"]:
                    lines.append(f"  {name}: {_groups_below(g, 6)}")
        if self.verified and self.verified["peak_bytes"] is not None:
            v = self.verified
            lines.append(f"verified: {v['codec']} at batch {v['batch_size']} (estimated "
                         f"{v['predicted_batch_size']}, at most {v['upper_bound']}): "
                         f"the largest that ran under the budget less "
                         f"{FRESH_PROCESS_SHARE:.0%} (what a fresh process may need beyond this "
                         f"one's), peak {format_bytes(v['peak_bytes'])} reserved")
        elif self.verified:
            v = self.verified
            lines.append(f"verified: {v['codec']} did not fit the cap at batch "
                         f"{v['smallest_tried']}..{v['predicted_batch_size']} (predicted "
                         f"{v['predicted_batch_size']}); the model of the step is off")
        return "\n".join(lines)

    def __repr__(self):
        return f"Plan(max_batch_size={self.max_batch_size}, steps_run={self.steps_run})"


HEADROOM = _C.DEFAULT_HEADROOM  # where no capped step measured it (as budget()'s policy)

# The capped steps that find a choice's batch start where the line leaves this share of the
# budget free (what a capped step needs beyond the line measured 3-6% of the budget on a CNN,
# a transformer and an MLP-Mixer, and the planner's cap holds back FRESH_PROCESS_SHARE more)
# and leave this much more free after each that runs out, up to 8%; past that the line is off
# (budgets of a few segments, or a peak that moves with the batch) and the tries step down by a
# tenth of the batch, this many times more, before the default headroom is all there is.
CALIBRATION_START = 0.05
CALIBRATION_STEP = 0.015
CALIBRATION_TRIES = 3
CALIBRATION_FALLBACK_TRIES = 4
# Between a try that fits and the smallest that ran out (or above a first try that fits: a line
# that overestimates, at small budgets where a sample is several percent of the budget) there
# may be samples to spare: the tries climb a twentieth of the batch (at least one sample) at a
# time, this many times at most, and the answer is the last that fitted. (Tried: doubling the
# stride once a climb fitted where the line fills the cap; test_policy's quant2 then jumped from
# 45 over the 47 that fitted, answering 45 for a truth of 50.)
CALIBRATION_CLIMB_TRIES = 2
# The planner's process has run the step's shapes before; a fresh process's pool lays its
# segments out anew, and a batch that trains here can run out there by a few MiB (a request
# that finds the free bytes it needs split across partly used segments). The planner's capped
# steps therefore run under the budget less this share, each from a fresh start (_FreshStart:
# the pool's free segments returned, the training state as plan() found it), counting what the
# warm-up left outside the pool as a fresh process counts it (_FreshStart.warmed_up). At 2%,
# tests/test_planner_recompute.py's GPT was answered a batch a fresh process cannot train.
FRESH_PROCESS_SHARE = 0.03


def max_batch(budget_bytes, fixed, per_sample, headroom=HEADROOM):
    """The largest batch whose modelled peak fixed + per_sample * b fits the budget's room, as
    the CLI's `actpack plan` computes it (one formula, in C++: runtime/policy.h's
    MaxBatchSize at UsableBytes)."""
    batch = _C._max_batch_size(int(budget_bytes), max(0, int(fixed)), max(0, int(per_sample)),
                               float(headroom))
    return sys.maxsize if batch is None else batch


# How far past the largest profiled batch the line may extrapolate before the planner profiles
# nearer (at most MAX_REFINEMENTS more steps per choice).
REFINE_SPAN = 4
MAX_REFINEMENTS = 3


def _fit(peaks):
    """(fixed, per_sample) of the least-squares line through (batch, allocated peak)."""
    n = len(peaks)
    mean_b = sum(p[0] for p in peaks) / n
    mean_y = sum(p[1] for p in peaks) / n
    var_b = sum((p[0] - mean_b) ** 2 for p in peaks)
    per_sample = sum((p[0] - mean_b) * (p[1] - mean_y) for p in peaks) / var_b
    fixed = max(0.0, mean_y - per_sample * mean_b)  # a negative intercept is noise
    return int(round(fixed)), int(math.ceil(per_sample))


def _progress(done, total, what, enabled, steps):
    if not enabled:
        return
    width = 24
    filled = width * done // total
    sys.stderr.write(f"\ractpack.plan [{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
                     f"{steps:>4} steps  {what:<40}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


PROFILE_LIMIT = "100%"  # a profile step's budget: the whole device, no cap below it


def _run_step(step, batch, choice):
    """One step at `batch` under `choice`; returns (reserved peak, allocated peak, report,
    whether an actpack.recompute region ran)."""
    spec = _codec_of(choice)
    # Uncapped: the step's allocated bytes are the profile, whatever the budget. "auto" packs
    # its first step with the harshest codecs its floor allows under any budget (its policy
    # plans after two steps); a one-byte budget, as before, let a step lift the cap to 1 GiB
    # at most, so a batch that needed more ran out while planning.
    with _budget_context(PROFILE_LIMIT, codec=spec, recompute=choice in _RECOMPUTE) as run:
        step(batch)
    if run.report["activations"]["totals"]["exact_fallbacks"] and spec != NONE:
        # Non-finite activations are packed exactly: the profile would count them raw and
        # plan from a step unlike training's.
        warnings.warn(
            f"actpack.plan: step({batch}) saved non-finite activations under {choice!r}, so "
            "they were kept exactly and the profile is off; if step() updates the weights, "
            "they may have diverged over the planner's steps (plan() restores them when it "
            "returns): plan with a learning rate of 0 (the memory is the same)",
            RuntimeWarning, stacklevel=3)
    return (run.report["run"]["peak_reserved_bytes"], run.report["run"]["peak_allocated_bytes"],
            run.report, run.regions)


def plan(step, budget, batch_sizes=(8, 16), verify=False, codecs=None, report=None,
         progress=True, restore=True, gradients=True):
    """The largest batch size `budget` supports, for no packing and each codec choice, found by
    real training steps: profiled, then tried under the cap.

    Per choice the planner runs `step` once at each profiled batch size (and up to
    MAX_REFINEMENTS more when the line through them extrapolates far), then tries batches near
    the line's answer under the budget's cap: 2 steps a try for a fixed codec, 3 for auto, 5 for
    auto+recompute, fewer when a try runs out (that is caught, not raised); with restore=True
    each try starts from the training state plan() found, as a fresh process's training starts.
    With one warm-up step, a default plan (five choices, no verify) ran 32-39 steps on small CNNs
    and transformers and 63 on one whose answers were 60x its profiled batches (see the module's
    docstring), and gradients=True adds one; verify=True adds 4 steps per batch its search
    tries. `plan.steps_run` says how many a plan ran.

    Those steps train: they move the weights, the optimizer's state, batch norm's statistics and
    the random streams. With restore=True (the default) the planner puts all of it back when it
    returns, raises or is interrupted: it snapshots to host memory (numpy's, outside actpack's
    budgeted allocator) the value and gradient of every parameter that requires grad, every
    module's buffers and training flag, every optimizer's state and param_groups, every LR
    scheduler's and GradScaler's state, and the CPU, CUDA, Python and numpy random states,
    found through the garbage collector (see actpack._snapshot); restoring writes them back bit
    for bit. The cost is host memory of that size, and no device memory (steps on copies would
    hold a second model inside the budget being measured). Not restored: Python state the step
    keeps elsewhere (a data iterator it advances).

    Args:
        step: a function running one full training step at the batch size it is given.
        budget: the memory budget ("6GiB", "1.5e9" or an int of bytes, or "80%" of the device
            / physical memory).
        batch_sizes: two (or more) batch sizes to profile at (ints >= 1); small ones are fine.
        verify: search for the largest batch of the best choice with real steps under the cap
            (more runs of `step`; the answer for that choice is what they found).
        codecs: the choices to plan for (default: none, each built-in codec's harshest spec
            that auto may choose — quant2, eb:rel=1e-2, division — auto, and auto+recompute
            when the warm-up step ran a region marked with actpack.recompute: auto under
            budget(recompute="auto"), profiled recomputing, its tries 5 steps as a user trains
            it).
        report: a path; the run report with the planner section is written there (read it
            with `actpack plan run.json --budget ...`). When the plan raises or is interrupted
            (a KeyboardInterrupt) after a step ran, what is written there is the run report of
            the budget its last step ran in, without a planner section, a warning saying
            where it stopped and on what.
        progress: print a progress bar to stderr, with the steps run so far.
        restore: put the training state back afterwards (above); False leaves it as the
            planner's steps left it and saves the host memory of the snapshot.
        gradients: measure what each choice does to the gradients (one more step, and host
            memory of a snapshot and of two copies of the gradients in float64). From the
            state after the warm-up, the step runs exactly twice and then under each choice
            (its first profile step), each run from that same state (weights, optimizer,
            random streams), and the gradients the optimizer steps on are compared per
            parameter group: plan.choices[c]["gradients"] has each group's cosine and
            relative error against exact training, the worst group, and those below
            _gradient_fidelity.COSINE_BOUND (0.95), which the table marks and a warning names.
            A step whose two exact runs differ (it draws new data each call) is not measured,
            and the table says so. auto is not measured: its profile steps pack with the
            harshest codecs its fidelity floor allows, before its policy's first plan, unlike
            its training steps. The
            measurement is at the first profiled batch, where saved tensors under 64 KiB stay
            exact: a larger batch packs more of them (profile at batches that save what
            training saves, or read the cosines as an upper bound).

    Every argument is checked before the first step runs: a wrong type is a TypeError and a
    value out of range a ValueError, one line naming it. On a machine with CUDA, actpack's
    CUDA allocator must be installed (actpack.install_allocator() before any CUDA work, or
    ACTPACK_CONF), or plan raises RuntimeError: its cap is what tells a batch that fits.
    """
    if not callable(step):
        raise TypeError("actpack.plan: step must be a function running one training step at "
                        f"the batch size it is given, got {_args.kind(step)}")
    sizes = _batch_sizes(batch_sizes)
    codecs = _codec_choices(codecs)
    verify = _args.flag(verify, "verify", "actpack.plan")
    progress = _args.flag(progress, "progress", "actpack.plan")
    restore = _args.flag(restore, "restore", "actpack.plan")
    gradients = _args.flag(gradients, "gradients", "actpack.plan")
    report = None if report is None else _args.path(report, "report", "actpack.plan")
    parsed = parse_budget(budget)
    _check_capped()

    saved = _snapshot.TrainingState() if restore else None
    counted = _CountedStep(step)
    try:
        return _plan(counted, parsed, sizes, verify, codecs, report, progress, gradients,
                     _FreshStart(saved))
    except BaseException as error:
        if report is not None:
            _report_stopped(report, counted, error, restore)
        raise
    finally:
        # Also after an exception or a KeyboardInterrupt in a step.
        if saved is not None:
            saved.restore()


def _check_capped():
    """The planner's answers come from steps held to the budget's cap: on CUDA that cap is
    actpack's allocator's. Under torch's, a budget is a target (actpack.budget's docstring),
    every batch tried would seem to fit, and the plan would answer past the budget (the second
    H100 run's planner test: its truth search found every batch up to its ceiling "fits")."""
    import torch

    if torch.cuda.is_available() and not memory.cuda_allocator_installed():
        raise RuntimeError(
            "actpack.plan: actpack's CUDA allocator is not installed, so no step can be held to "
            "the budget and every batch would seem to fit; call actpack.install_allocator() "
            "before any CUDA work (or set ACTPACK_CONF). On a machine with a GPU the budget is "
            "the GPU's, also for a model trained on the CPU")


def _iterable(value):
    """A list, tuple, set or iterator of items (not a str, bytes or a mapping)."""
    try:
        iter(value)
    except TypeError:
        return False
    return not isinstance(value, (str, bytes, bytearray, collections.abc.Mapping))


def _shown(given, items):
    """The collection as given, or its items when it is an iterator (whose repr says nothing)."""
    return _args.show(items if iter(given) is given else given)


def _batch_sizes(batch_sizes):
    """plan()'s batch_sizes, checked, distinct and sorted."""
    if not _iterable(batch_sizes):
        raise TypeError("actpack.plan: batch_sizes must be two or more ints such as (8, 16), "
                        f"got {_args.kind(batch_sizes)}")
    given = tuple(batch_sizes)
    shown = _shown(batch_sizes, given)
    for b in given:
        if not _args.is_int(b):
            raise TypeError(f"actpack.plan: batch_sizes must be ints such as (8, 16), got "
                            f"{_args.kind(b)} in {shown}")
    sizes = sorted(set(int(b) for b in given))
    if len(sizes) < 2 or sizes[0] < 1 or sizes[-1] > _args.INT64_MAX:
        raise ValueError("actpack.plan: batch_sizes needs two different sizes >= 1 (and at most "
                         f"2**63-1), got {shown}")
    return sizes


def _codec_choices(codecs):
    """plan()'s codecs, checked: None (the default choices) or a list of choice names."""
    if codecs is None:
        return None
    if not _iterable(codecs):
        raise TypeError("actpack.plan: codecs must be a list of choices such as ['none', "
                        f"'quant2'], or None for the default ones, got {_args.kind(codecs)}")
    given, codecs = codecs, list(codecs)
    shown = _shown(given, codecs)
    if not codecs:
        raise ValueError(f"actpack.plan: codecs is empty ({shown}); expected some of "
                         f"{', '.join(ALL_CHOICES)}, or None for the default ones")
    for choice in codecs:
        if isinstance(choice, str) and choice in ALL_CHOICES:
            continue
        why = ""
        if isinstance(choice, str):
            try:
                _C.canonical_codec_spec(choice)  # any codec the registry holds, as budget() takes it
                continue
            except ValueError as error:
                why = f" ({error})"
        raise ValueError(f"actpack.plan: unknown codec choice {_args.show(choice)} in {shown}; "
                         f"expected some of {', '.join(ALL_CHOICES)} or a codec spec such as "
                         f"'quant4'{why}")
    return codecs


class _CountedStep:
    """The user's step, counting its calls (what a plan costs); it keeps the last call's batch
    and budget run, and what the last call raised (its type and text: the error itself holds
    the failed step's frames)."""

    def __init__(self, step):
        self.step = step
        self.calls = 0
        self.batch = None
        self.run = None  # the Run of the budget the last call ran in
        self.raised = None  # (call, type, text) when the last call raised

    def __call__(self, batch):
        self.calls += 1
        budget = _innermost()
        self.batch, self.run, self.raised = batch, budget.run if budget else None, None
        try:
            return self.step(batch)
        except BaseException as error:
            self.raised = (self.calls, type(error), str(error))
            raise


def _report_stopped(path, step, error, restored):
    """Writes the report of a plan stopped by `error`: the run report of the budget its last
    step ran in (it names the error when the step raised it), without a planner section, with a
    warning saying where the plan stopped. Nothing when no step ran in a budget."""
    run = step.run
    if run is None or run.report is None:
        return
    where = "in" if step.raised == (step.calls, type(error), str(error)) else "after"
    document = dict(run.report)
    document["run"] = dict(document["run"])
    document["run"]["warnings"] = list(document["run"]["warnings"]) + [
        f"actpack.plan: stopped by {_error_text(type(error), error)} {where} its step "
        f"{step.calls} (step({step.batch})); no plan was made"
        + ("; the training state is put back (restore=True)" if restored else "")]
    try:
        _C.write_report(document, os.fspath(path))
    except Exception as write_error:  # noqa: BLE001 -- the error that stopped the plan goes on
        warnings.warn(f"actpack.plan: the report of the stopped plan could not be written to "
                      f"{os.fspath(path)}: {write_error}", RuntimeWarning, stacklevel=3)


def _codec_of(choice):
    """budget()'s codec for a plan's choice: its name, but auto+recompute's is auto."""
    return "auto" if choice == RECOMPUTE_CHOICE else choice


def _default_choices(regions):
    """CHOICES, and auto+recompute for a model with recompute regions."""
    return list(CHOICES) + ([RECOMPUTE_CHOICE] if regions else [])


def _plan(step, parsed, sizes, verify, codecs, report, progress, gradients, fresh):
    total = 1 + len(codecs or _default_choices(False)) * (len(sizes) + 1) + (1 if verify else 0)
    done = 0

    def say(what):
        _progress(done, total, what, progress, step.calls)

    say("warm-up step")
    _, _, last_report, regions = _run_step(step, sizes[0], NONE)  # optimizer state, caches
    fresh.warmed_up()
    # A share ("80%") is of the memory of the device the warm-up's budget packed on.
    device = None if step.run is None or step.run.device is None \
        else memory._device_index(step.run.device)
    budget_bytes = memory._resolve_budget(parsed, _budget_memory.share_device(parsed, device))
    done += 1
    if codecs is None:
        codecs = _default_choices(regions)
        total = 1 + len(codecs) * (len(sizes) + 1) + (1 if verify else 0)

    measured = [c for c in codecs if c not in _MEASURED_LATER]
    fidelity = _Fidelity(step, sizes[0]) if gradients and measured else None
    if fidelity is not None:
        total += 1 if NONE in codecs else 2
        say("exact gradients")
        fidelity.run(_REFERENCE)
        done += 1
        if NONE not in codecs:  # its first profile step is the second exact run
            say("exact gradients again")
            fidelity.run(NONE)
            done += 1

    choices = {}
    for choice in codecs:
        peaks = []
        for b in sizes:
            say(f"{choice} at batch {b}")
            if fidelity is not None and b == sizes[0] and choice in measured:
                reserved, allocated, last_report, _ = fidelity.run(choice)
            else:
                reserved, allocated, last_report, _ = _run_step(step, b, choice)
            peaks.append((b, allocated, reserved))
            done += 1
        fixed, per_sample = _fit(peaks)
        # A step's peak can sit where the batch barely matters at small batches (the optimizer
        # step's temporaries, a workspace) and move to the activations at larger ones, so the
        # line through small batches can overshoot many times over. An answer far beyond the
        # profiled sizes is profiled again nearer to it, and the line refitted through the two
        # largest batches, until it lies within REFINE_SPAN of the largest profiled.
        for _ in range(MAX_REFINEMENTS):
            largest = peaks[-1][0]
            estimate = max_batch(budget_bytes, fixed, per_sample)
            if estimate <= REFINE_SPAN * largest:
                break
            b = min(estimate // 2, REFINE_SPAN * largest)
            total += 1
            say(f"{choice} at batch {b}")
            reserved, allocated, last_report, _ = _run_step(step, b, choice)
            peaks.append((b, allocated, reserved))
            done += 1
            fixed, per_sample = _fit(peaks[-2:])
        fragmentation = max(1.0, peaks[-1][2] / peaks[-1][1]) if peaks[-1][1] else 1.0
        say(f"{choice}: steps under the cap")
        calibration = _calibrate(step, budget_bytes, choice, fixed, per_sample, fresh)
        done += 1
        choices[choice] = {
            "fixed_bytes": fixed,
            "per_sample_bytes": per_sample,
            "fragmentation": fragmentation,
            "headroom": calibration["headroom"] if calibration else HEADROOM,
            "calibration": calibration,
            "max_batch_size": calibration["batch_size"] if calibration else
            max_batch(budget_bytes, fixed, per_sample),
            "measured": [{"batch_size": b, "allocated_bytes": a, "reserved_bytes": r}
                         for b, a, r in peaks],
        }

    if fidelity is not None:
        fidelity.conclude(choices)

    verified = None
    if verify:
        best = "auto" if "auto" in choices else max(choices, key=lambda c: choices[c]["max_batch_size"])
        calibration = choices[best]["calibration"]
        verified, verify_report = _verify(
            step, budget_bytes, best, choices[best]["max_batch_size"],
            max_batch(budget_bytes, choices[best]["fixed_bytes"],
                      choices[best]["per_sample_bytes"], headroom=0.0),
            say, fresh, ran=calibration["batch_size"] if calibration else None)
        last_report = verify_report or last_report
        done += 1
    say("done")

    section = {"budget_bytes": budget_bytes, "headroom": HEADROOM, "batch_sizes": sizes,
               "choices": {name: {k: v for k, v in c.items()} for name, c in choices.items()},
               "verified": verified, "steps_run": step.calls}
    if fidelity is not None:
        section["gradients"] = fidelity.section()
    document = dict(last_report)
    document["planner"] = section
    if report is not None:
        _C.write_report(document, os.fspath(report))
    _report_observers.notify(document)
    return Plan(budget_bytes, sizes, choices, verified, document, step.calls)


# auto's profile steps pack with the harshest codecs its floor allows (its policy plans after two
# steps), which is not how it trains under a budget: its gradients are not measured from them
# (not yet otherwise).
_MEASURED_LATER = ("auto", RECOMPUTE_CHOICE)

# The gradients every choice's are compared with: a step packing nothing, run before NONE's own
# profile step (the two agreeing shows the step repeatable).
_REFERENCE = "reference"


class _Fidelity:
    """The gradients of exact training and of each choice's first profile step, each run from
    the state after the warm-up (see _gradient_fidelity)."""

    def __init__(self, step, batch):
        self._step, self.batch = step, batch
        self._anchor = _snapshot.TrainingState()
        self._roots = _gradient_fidelity.parameters_by_root(self._anchor.modules())
        self._parameters = [p for _, named in self._roots for p, _ in named]
        self._gradients = {}  # _REFERENCE or a choice -> {id(parameter): vector}
        self.repeatable = None

    def run(self, choice):
        """A profile step of `choice` (_run_step's answer) from the saved state, capturing its
        gradients; _REFERENCE is the reference run (no packing, as NONE's)."""
        self._anchor.restore()
        with _gradient_fidelity.Capture(self._parameters) as capture:
            result = _run_step(self._step, self.batch, NONE if choice == _REFERENCE else choice)
        self._gradients[choice] = capture.gradients
        return result

    def conclude(self, choices):
        """Puts each choice's comparison in its entry and warns of groups below the bound."""
        grouped = {name: _gradient_fidelity.by_group(g, self._roots)
                   for name, g in self._gradients.items() if g is not None}
        exact = grouped.get(_REFERENCE)
        self.repeatable = exact is not None and _gradient_fidelity.repeatable(
            exact, grouped.get(NONE))
        below = []
        for name, entry in choices.items():
            packed = grouped.get(name)
            if not self.repeatable or packed is None:
                entry["gradients"] = None
                continue
            entry["gradients"] = _gradient_fidelity.summary(
                _gradient_fidelity.compare(exact, packed), self.batch)
            if entry["gradients"]["below_bound"]:
                below.append(f"{name}: {_groups_below(entry['gradients'], 4)}")
        if below:
            warnings.warn(
                "actpack.plan: under some choices the gradients of some parameter groups point "
                f"elsewhere than exact training's (cosine below {_gradient_fidelity.COSINE_BOUND} "
                f"at batch {self.batch}): " + "; ".join(below) + ". Training under them may end "
                "above plain training's loss; a finer codec for those layers (budget(codec="
                "{pattern: spec})) or more memory keeps them", RuntimeWarning, stacklevel=4)

    def section(self):
        return {"bound": _gradient_fidelity.COSINE_BOUND, "batch_size": self.batch,
                "repeatable": bool(self.repeatable)}


def _cosine_text(cosine):
    return "non-finite" if cosine is None else f"{cosine:.3f}"


def _groups_below(gradients, shown):
    """The first `shown` parameter groups below the bound with their cosines, and how many
    more: "layer1 0.122, layer2 0.080 and 3 more"."""
    worst, groups = gradients["below_bound"], gradients["groups"]
    text = ", ".join(f"{g or '(root)'} {_cosine_text(groups[g]['cosine'])}"
                     for g in worst[:shown])
    return text + (f" and {len(worst) - shown} more" if len(worst) > shown else "")


# The steps before auto's first plan may go over the cap to measure themselves, so the peak
# verified is the reserved peak of the steps from the first auto holds to the cap
# (runtime::CappedFromStep), for every choice.
VERIFY_STEPS = 4
CAPPED_FROM = search.capped_from("auto")


def trains_under_cap(step, budget_bytes, choice, batch, steps=VERIFY_STEPS, **budget_options):
    """actpack.search.trains_under_cap for a plan's `choice` (its codec, and auto+recompute's
    recompute="auto"): the run report of `steps` real steps at `batch` under the budget's cap,
    or None when they ran out of it."""
    return search.trains_under_cap(step, budget_bytes, batch, codec=_codec_of(choice),
                                   recompute=_RECOMPUTE.get(choice, False), steps=steps,
                                   **budget_options)


def _capped_from(choice):
    """The first step a run of `choice` is held to the cap in, as the user trains it
    (actpack.search.capped_from)."""
    return search.capped_from(_codec_of(choice), _RECOMPUTE.get(choice, False))


def _calibration_steps(choice):
    """Steps per calibration try: up to and including the first step held to the cap from its
    start (two for a fixed codec, three for auto, five for auto+recompute: a try trains as the
    user does, and at a batch past what codecs alone hold recompute="auto" switches recomputation
    on after its second step and plans afresh after two more). Tried: auto+recompute's tries
    recomputing from their first step, 3 steps a try; a fresh process, whose first two steps at
    such a batch do not recompute, lays its segments out otherwise (the suite's ViT at depth 4
    and 24 MiB answered 221 so, which ran out in fresh processes). Measured: of the tries that
    ran out in plans and four-step truth searches on the demo CNN (40 MiB), the demo transformer
    (128 MiB) and a batch-norm CNN (16 MiB), every fixed codec's but one ran out in its first step
    and that one in its second, and every auto try in its second or third; none in a later
    step."""
    return _capped_from(choice) + 1


def _calibration_batches(budget_bytes, fixed, per_sample):
    """The batches _calibrate tries, largest first: where the line leaves CALIBRATION_START of
    the budget free, then CALIBRATION_STEP more each time; then, the line being off (a peak
    that moves as the batch grows), a tenth fewer samples each time."""
    batch = None
    for i in range(CALIBRATION_TRIES):
        batch = max_batch(budget_bytes, fixed, per_sample,
                          headroom=CALIBRATION_START + i * CALIBRATION_STEP)
        if batch < 1 or batch == sys.maxsize:
            return
        yield batch
    for _ in range(CALIBRATION_FALLBACK_TRIES):
        batch = batch * 9 // 10
        if batch < 1:
            return
        yield batch


def _calibrate(step, budget_bytes, choice, fixed, per_sample, fresh):
    """The choice's largest batch as far as real steps under the cap show without a search,
    trying _calibration_batches until one fits (climbing from a first try that fits). What the
    cap counts beyond the line (the pool's segments, what the system holds outside it) cannot be
    read off a pool that caches whatever its cap allows, so it is measured by whether the step
    fits (under the planning cap).
    Returns {"batch_size": the batch that ran, the answer, "tries", "peak_bytes": its capped
    steps' reserved peak, "headroom": the share of the budget its line leaves free}, or None
    when no batch worth trying fits."""
    def fits(batch):
        fresh()
        return trains_under_cap(step, _planning_cap(budget_bytes), choice, batch,
                                steps=_calibration_steps(choice),
                                _held_outside=fresh.held_outside)

    tried, ran_out = set(), sys.maxsize
    for batch in _calibration_batches(budget_bytes, fixed, per_sample):
        if batch in tried:
            continue
        tried.add(batch)
        report = fits(batch)
        if report is None:
            ran_out = min(ran_out, batch)
            continue
        for _ in range(CALIBRATION_CLIMB_TRIES):
            larger = batch + max(1, batch // 20)
            if larger >= ran_out:
                break
            tried.add(larger)
            found = fits(larger)
            if found is None:
                break
            batch, report = larger, found
        # Half a sample more than the answer's line: the line at the budget less this headroom
        # gives back the answer (`actpack plan` at another budget keeps the same share free).
        used = fixed + per_sample * (batch + 0.5)
        return {"batch_size": batch, "tries": len(tried),
                "peak_bytes": max(s["peak_reserved_bytes"]
                                  for s in report["activations"]["steps"]
                                  [_capped_from(choice):]),
                "headroom": min(0.5, max(0.0, 1.0 - used / budget_bytes))}
    return None


# verify's search (actpack.search's bracket): down by this factor from its start until a batch
# fits, at most VERIFY_MISSES batches that run out, then bisection up to the bound.
VERIFY_DOWN = 1 / 0.95
VERIFY_MISSES = 8


def _verify(step, budget_bytes, choice, predicted, upper, say, fresh, ran=None):
    """The largest batch that trains under the cap, by real steps: actpack.search's bracket
    from `ran` (a batch that already ran under the cap: tried first, for its report) or else
    from the estimate `predicted`, down 5% at a time until one fits, then a binary search up to
    `upper` (where the allocated bytes alone fill the budget, so nothing larger can fit).
    Returns (the verified section, the report of the answer's run or None)."""
    def fits(batch):
        say(f"verify {choice} at batch {batch}")
        fresh()
        return trains_under_cap(step, _planning_cap(budget_bytes), choice, batch,
                                steps=max(VERIFY_STEPS, _capped_from(choice) + 2),
                                _held_outside=fresh.held_outside)

    start = predicted if ran is None else ran
    high = max(start, upper)
    found = search.largest_batch(fits, 1, high, strategy=search.BRACKET, start=start, up=None,
                                 down=(VERIFY_DOWN,),
                                 misses=VERIFY_MISSES + (ran is not None))
    tries = [{"batch": t["batch"], "fits": t["fits"], "seconds": round(t["seconds"], 3)}
             for t in found.tries]
    if not found.batch:
        return {"codec": choice, "batch_size": 0, "predicted_batch_size": predicted,
                "smallest_tried": min(t["batch"] for t in tries), "peak_bytes": None,
                "peak_allocated_bytes": None, "tries": tries}, None
    report = found.value
    steps = report["activations"]["steps"]
    capped = max(CAPPED_FROM, _capped_from(choice))
    return ({"codec": choice, "batch_size": found.batch, "largest_run": found.batch,
             "predicted_batch_size": predicted, "upper_bound": high,
             "peak_bytes": max(s["peak_reserved_bytes"] for s in steps[capped:])
             if len(steps) > capped else None,
             "peak_allocated_bytes": report["run"]["peak_allocated_bytes"], "tries": tries},
            report)


class _FreshStart:
    """Called before each try under the cap: puts the training state back as plan() found it
    (with restore=True; `saved`) and returns the pool's free segments, so that a try starts as
    the user's training in a fresh process does: an optimizer that had not stepped makes its
    state in the try's first step, among that step's transient blocks, in segments laid out
    anew. Tries that went on from where the last step left off (the optimizer's state made at
    the warm-up's batch, segments cut for earlier batches) answered batches that fresh
    processes could not train.
    With restore=False there is no state to put back and only the cache goes."""

    def __init__(self, saved):
        self._saved = saved
        self._free()
        self._outside_start = _outside_pool_bytes()
        self.held_outside = 0

    def warmed_up(self):
        """Called after the plan's warm-up step. What the process came to hold outside the pool
        in it (torch's one-time setup of its CPU kernels, when plan() runs before training), a
        fresh process's run counts against its budget beyond the allowance; so each try counts
        it too (actpack.budget's _held_outside), besides its own growth at its batch (oneDNN's
        buffers grow with the batch), as a fresh process would; not counting it, the tries
        answered a batch above the fresh-process truth. Taken once: the process's count outside
        the pool grows with every batch it runs (oneDNN's buffers, torch's caches), which no
        fresh process holds."""
        self._free()
        now = _outside_pool_bytes()
        if now is not None and self._outside_start is not None:
            self.held_outside = max(0, now - self._outside_start)

    def __call__(self):
        if self._saved is not None:
            self._saved.restore()
        self._free()

    @staticmethod
    def _free():
        """Frees what is garbage and the pool's free segments (the budget's device: CUDA's
        current one where there is CUDA)."""
        import gc

        gc.collect()
        memory.empty_cache()


def _outside_pool_bytes():
    """The resident set less what actpack's host pool reserves (after empty_cache: its
    segments in use, which are resident; installed or not, the pool holds what it served), or
    None where the budget's system count is not the
    resident set (CUDA: the driver's count, with no allowance) or /proc cannot be read."""
    import torch

    if torch.cuda.is_available():
        return None
    resident = _C._resident_bytes()  # allocator::ResidentBytes
    return None if resident is None else resident - memory.memory_reserved("cpu")


def _planning_cap(budget_bytes):
    """The cap the planner's own steps run under: the budget less FRESH_PROCESS_SHARE (each
    try's budget then counts what the warm-up left outside the pool: _held_outside)."""
    return int(budget_bytes * (1.0 - FRESH_PROCESS_SHARE))
