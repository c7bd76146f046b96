"""The largest batch for which a test says "fits", with every batch tried recorded.

    from actpack import search

    def fits(batch):                      # e.g. real steps under the budget's cap
        ...; return True or False

    found = search.largest_batch(fits, 1, 1024)                       # the scan
    found = search.largest_batch(fits, 1, 1024, strategy="bracket", start=130)
    found.batch      # the answer (0: nothing tried fitted)
    found.tries      # [{"batch", "fits", "seconds", "phase"}, ...] in the order tried
    found.seconds    # what the search cost

Whether a training step fits under a memory cap is not monotone in the batch: the pool's
segments fall out differently at each size, so a batch can run out where a larger one trains.
Two strategies, named in the call:

  "scan"     the truth: a geometric grid over the whole range [low, high] (each point `coarse`
             times the last, at least one more; `high` included), every point tried; then a
             finer grid (`fine` steps) between the largest grid point that fitted and the next
             grid point above it; then every batch between the largest batch that fitted and
             the smallest above it that did not. The answer is the largest batch that fitted,
             and the batch tried just above it did not. No bisection: bisection assumes that
             everything below a fitting batch fits and everything above a failing one fails.
             It costs about log(high / low) / log(coarse) + fine + (the last gap) tries.
  "bracket"  the fast search from a guess: from `start`, up by the factors in `up` (the first,
             then the last, repeatedly) while tries fit, or down by those in `down` while they
             do not, then bisection between the largest batch that fitted and the smallest
             above it that did not, until their gap is at most `precision` of the former. It
             costs about log2 of the bracket, but where fits are not monotone it answers some
             batch that fits below one that does not, which may be short of the largest.

`fits(batch)` returns a truth value (the value itself is kept for the answer's batch, as
`found.value`) or raises `Stop` to end the search early; the batches tried so far stand, and the
status says why it stopped. A batch is never tried twice.

The test a search under a budget runs is `trains_under_cap(step, budget, batch, codec=...)`:
real steps inside actpack.budget, the run's report when they fit and None when one ran out of
memory; `capped_from(codec, recompute)` is the first step such a run holds to the cap from its
start (the steps before may lift it to measure). This module imports nothing from the package
until those two are called.
"""
import math
import time

SCAN = "scan"
BRACKET = "bracket"
STRATEGIES = (SCAN, BRACKET)

# float products of exact decimal ratios (100 * 0.95) can land a hair under the integer they
# name; a batch is rounded down from a little above.
_ROUNDING = 1e-9


class Stop(Exception):
    """Raised by a search's `fits` to end the search: `status` says why ("time", "hang", ...),
    `message` more."""

    def __init__(self, status, message=""):
        super().__init__(message)
        self.status, self.message = status, message


class BatchSearch:
    """A finished search.

    batch: the largest batch that fitted (0 when none did); value: what `fits` returned for it;
    upper: the largest batch not shown not to fit above `batch` (the smallest batch tried above
    it that did not fit, less one; `high` when none did); status: "done", "ceiling" (`high`
    itself fitted: a larger batch may too) or a Stop's status; tries: every batch tried, in
    order, as {"batch", "fits", "seconds", "phase"} ("coarse", "fine", "every" for the scan;
    "start", "up", "down", "bisect" for the bracket), and a last {"batch", "stopped",
    "message", "seconds"} where a Stop ended it; seconds: the tries' time, summed."""

    def __init__(self, strategy, low, high):
        self.strategy, self.low, self.high = strategy, low, high
        self.batch, self.value, self.upper = 0, None, high
        self.status = "done"
        self.tries = []
        self._outcomes = {}

    @property
    def seconds(self):
        return sum(t["seconds"] for t in self.tries)

    def fitted(self, batch):
        """Whether `batch` was tried and fitted (None: not tried)."""
        return self._outcomes.get(batch)

    def as_dict(self):
        """The search as JSON-ready data: strategy, range, answer, status, tries, cost."""
        return {"strategy": self.strategy, "low": self.low, "high": self.high,
                "batch": self.batch, "upper": self.upper, "status": self.status,
                "tries": [dict(t) for t in self.tries], "seconds": round(self.seconds, 3)}

    def __repr__(self):
        return (f"BatchSearch({self.strategy}, batch={self.batch}, tries={len(self.tries)}, "
                f"status={self.status!r}, seconds={self.seconds:.1f})")

    def _try(self, fits, batch, phase):
        if batch in self._outcomes:
            return self._outcomes[batch]
        start = time.perf_counter()
        try:
            value = fits(batch)
        except Stop as stop:
            self.tries.append({"batch": batch, "stopped": stop.status, "message": stop.message,
                               "seconds": time.perf_counter() - start})
            raise
        ok = bool(value)
        self.tries.append({"batch": batch, "fits": ok, "seconds": time.perf_counter() - start,
                           "phase": phase})
        self._outcomes[batch] = ok
        if ok and batch >= self.batch:
            self.batch, self.value = batch, value
        return ok

    def _finish(self):
        if self.batch:
            above = [b for b, ok in self._outcomes.items() if not ok and b > self.batch]
            self.upper = min(above) - 1 if above else self.high
            if self.batch == self.high and self.status == "done":
                self.status = "ceiling"
        else:
            below = [b for b in self._outcomes if b >= self.low]
            self.upper = min(below) - 1 if below else self.high
        return self


def largest_batch(fits, low, high, *, strategy=SCAN, start=None, coarse=1.5, fine=16,
                  up=(1.5, 2.0), down=(1.5, 2.0), precision=0.0, misses=None):
    """The largest batch in [low, high] for which `fits(batch)` is true, by `strategy` ("scan",
    the default, or "bracket"; see the module's docstring). Returns a BatchSearch.

    scan: `coarse` (> 1) is the grid's ratio, `fine` the number of steps of the finer grid.
    bracket: `start` the first batch (required); `up` and `down` the factors (> 1) it moves by,
    the first for its first move and the last for each after (up=None: no climbing, the
    bisection runs from a start that fits straight up to `high`); `precision` the gap, as a share
    of the answer, at which bisection stops (0: adjacent batches); `misses` the most tries that
    do not fit before one does (None: no limit).
    """
    low, high = int(low), int(high)
    if low < 1 or high < low:
        raise ValueError(f"actpack.search.largest_batch: needs 1 <= low <= high, got low={low}, "
                         f"high={high}")
    if strategy not in STRATEGIES:
        raise ValueError(f"actpack.search.largest_batch: strategy must be one of "
                         f"{', '.join(STRATEGIES)}, got {strategy!r}")
    found = BatchSearch(strategy, low, high)
    try:
        if strategy == SCAN:
            if not coarse > 1 or int(fine) < 1:
                raise ValueError("actpack.search.largest_batch: the scan needs coarse > 1 and "
                                 f"fine >= 1, got coarse={coarse}, fine={fine}")
            _scan(found, fits, low, high, coarse, int(fine))
        else:
            if start is None:
                raise ValueError("actpack.search.largest_batch: the bracket needs start=")
            if any(f <= 1 for f in (up or ()) + tuple(down)) or not down:
                raise ValueError("actpack.search.largest_batch: up and down are factors > 1, "
                                 f"got up={up}, down={down}")
            _bracket(found, fits, low, high, min(high, max(low, int(start))), up, down,
                     precision, misses)
    except Stop as stop:
        found.status = stop.status
    return found._finish()


def grid(low, high, ratio):
    """The scan's coarse grid: low, then each point `ratio` times the last (at least one more),
    up to and including high."""
    points, batch = [], low
    while batch < high:
        points.append(batch)
        batch = max(batch + 1, math.ceil(batch * ratio - _ROUNDING))
    points.append(high)
    return points


def _scan(found, fits, low, high, coarse, fine):
    points = grid(low, high, coarse)
    for batch in points:
        found._try(fits, batch, "coarse")
    if not found.batch:
        return
    # Finer between the largest grid point that fitted and the grid point above it.
    best = found.batch
    above = next((b for b in points if b > best), None)
    if above is not None:
        step = max(1, math.ceil((above - best) / fine))
        for batch in range(best + step, above, step):
            found._try(fits, batch, "fine")
    # Every batch between the largest that fitted and the smallest above it that did not.
    best = found.batch
    failed = [b for b, ok in found._outcomes.items() if not ok and b > best]
    for batch in range(best + 1, min(failed) if failed else best + 1):
        found._try(fits, batch, "every")


def _bracket(found, fits, low, high, start, up, down, precision, misses):
    missed = 0

    def attempt(batch, phase):
        nonlocal missed
        ok = found._try(fits, batch, phase)
        if not ok:
            missed += 1
        return ok

    lo, hi = 0, high
    if attempt(start, "start"):
        lo = start
        factors = iter(up or ())
        factor = next(factors, None)
        while factor is not None and lo < hi:
            batch = min(hi, max(lo + 1, int(lo * factor + _ROUNDING)))
            factor = next(factors, up[-1])
            if attempt(batch, "up"):
                lo = batch
            else:
                hi = batch - 1
                break
    else:
        hi, failed = start - 1, start
        factors = iter(down)
        factor = next(factors)
        while hi >= low and (misses is None or missed < misses):
            batch = max(low, min(hi, int(failed / factor + _ROUNDING)))
            factor = next(factors, down[-1])
            if attempt(batch, "down"):
                lo = batch
                break
            hi, failed = batch - 1, batch
    while lo and hi - lo > int(lo * precision):
        mid = (lo + hi + 1) // 2
        if attempt(mid, "bisect"):
            lo = mid
        else:
            hi = mid - 1


# auto's policy plans at the end of its second step; the steps before may go over the cap.
def capped_from(codec="auto", recompute=False):
    """The first step (counted from 0) that a run under actpack.budget(codec=codec,
    recompute=recompute) holds to the cap from its start: the steps before the policy's first
    plan may lift the cap to measure themselves (runtime::CappedFromStep, the run's own rule).
    A fixed codec (or "none") has nothing to plan and may lift it in its first step (1); "auto"
    or a mapping plans at the end of its second (2); with recompute="auto", a step past what
    codecs alone hold switches recomputation on at the end of the second and plans afresh after
    two more (4)."""
    from actpack import _C
    from actpack._budget import _codec_rules

    default, rules = _codec_rules(codec)
    recompute = recompute if isinstance(recompute, str) else str(bool(recompute)).lower()
    return _C.capped_from(_C.BudgetConfig("1", codec=default, rules=rules, recompute=recompute))


def trains_under_cap(step, budget, batch, *, codec="auto", recompute=False, steps=None,
                     **options):
    """The run report of `steps` calls of `step(batch)` inside actpack.budget(budget,
    codec=codec, recompute=recompute, **options), or None when one ran out of memory
    (torch.OutOfMemoryError, caught here): whether `batch` trains under the budget's cap, the
    test a largest-batch search runs. steps=None: two steps held to the cap from their start
    (capped_from(codec, recompute) + 2), at least 4.

    A step that ran out leaves no gradients behind: those its backward accumulated into
    parameters that had none are dropped, as its zero_grad(set_to_none=True) would have, so the
    next try starts as this one did. In one process a try follows whatever ran before it (the
    pool's segments, oneDNN's caches); a truth is tried in fresh processes."""
    import gc

    import torch

    from actpack._budget import budget as budget_context

    if steps is None:
        steps = max(4, capped_from(codec, recompute) + 2)
    had_gradients = _parameters_with_gradients()
    try:
        with budget_context(budget, codec=codec, recompute=recompute, **options) as run:
            for _ in range(steps):
                step(batch)
        return run.report
    except torch.OutOfMemoryError:
        pass
    # Out of the except clause: the error's traceback holds the failed step's frames in a
    # cycle, which only a collection after it is gone frees.
    gc.collect()
    # A step that ran out in its backward leaves the gradients it accumulated (its zero_grad
    # never ran): the next try would start with them held (measured: the benchmark's ResNet-50,
    # 90 MiB of gradients in a 320 MiB budget, answered 17 for 22).
    for leaf in _parameters_with_gradients() - had_gradients:
        leaf.grad = None
    return None


def _parameters_with_gradients():
    """The tensors alive in this process that a backward accumulates into (leaves that require
    grad: parameters) and that hold a gradient. The step names none of them: they are found
    through the garbage collector."""
    import gc

    import torch

    # type(), not isinstance(): the latter asks some objects for their __class__, and a
    # deprecated module attribute warns when asked.
    return {obj for obj in gc.get_objects()
            if issubclass(type(obj), torch.Tensor) and obj.is_leaf and obj.requires_grad
            and obj.grad is not None}
