"""Stops a run whose gradients run away under lossy packing, before the optimizer steps on them.

Measured (benchmarks/diverging_lm.py, benchmarks/results/diverging_lm.json): a byte-level GPT
of 2 pre-norm blocks, width 192, on real text with AdamW, a one-cycle schedule and clipping at
1.0 trains like plain PyTorch under `quant2` for 20 steps, then its gradient norm (plain: 0.3
to 6.5) climbs to 1.8e3 by step 27 and 1.7e7 later; clipping hides it from the loss for a
while, and after 60 steps the loss is 3.19 against plain's 2.80. The cause, found by packing
one kind of saved tensor at a time: 2 bits on attention's inputs. Its backward recomputes the
probabilities from q and k and exponentiates their error (q's relative RMS error under quant2
is 0.77); its logsumexp, packed too until now, put errors of up to e^2.4 in them as well (now
kept exact, runtime/session.cc: an op's statistics).

A gradient norm far above its recent median in two of the last three steps, while saved tensors
were packed lossily, is a runaway (two in a row let a runaway through whose norms alternate
between 50x and 150x the median, each lower one resetting the count: the small GPT's ran five
steps longer so), caught in the backward that produced it: the optimizer has not stepped yet,
so the weights are still finite. Under a fixed codec it raises `GradientRunaway`.
Where `auto` chooses, the choice is the runtime's to correct: the fidelity floor halves (from
0.2 where there was none), the tensors whose codec it now rules out take finer ones from the
next pack on, and this step's gradients are dropped (set to None: the optimizer skips the
parameters, as it skips a GradScaler's overflow step); a third tightening that does not hold
raises. Steps with non-finite gradients are not judged (a GradScaler makes them on purpose, and
skips them itself).
"""
import math
import statistics

RUNAWAY_FACTOR = 100.0  # a norm this many times the recent median...
RUNAWAY_STEPS = 2       # ...in this many...
RUNAWAY_OF = 3          # ...of the last this many steps
WINDOW = 16             # the recent steps whose median is the norm's usual size
WARMUP = 4              # steps measured before any judgment
TIGHTENINGS = 3         # floors auto tries (0.2, 0.1, 0.05 from none) before it raises


class GradientRunaway(RuntimeError):
    """Raised by actpack.budget when the gradient norm runs away under lossy packing."""


class GradientGuard:
    def __init__(self, codec):
        self.codec = codec
        self.norms = []  # the recent finite norms
        self.high = []   # of the last RUNAWAY_OF judged steps: above RUNAWAY_FACTOR x the median

    def observe(self, step, norm, modules):
        """Judges `norm`, step `step`'s total gradient norm; `modules` ({name: norm}) names
        the worst layers. Returns None, or a runaway's description (one sentence)."""
        if not math.isfinite(norm):
            return None
        usual = statistics.median(self.norms) if len(self.norms) >= WARMUP else None
        high = bool(usual) and norm > RUNAWAY_FACTOR * usual
        self.high = (self.high + [high])[-RUNAWAY_OF:]
        if high:
            if sum(self.high) < RUNAWAY_STEPS:
                return None  # a runaway's norms stay out of the median
            self.high = []
            worst = sorted(modules.items(), key=lambda kv: -kv[1])[:3]
            return (f"actpack: the gradient norm ran away under codec {self.codec!r}: "
                    f"{norm:.3g} at step {step}, {norm / usual:.0f}x its median over the last "
                    f"{len(self.norms)} steps ({usual:.3g}), in {RUNAWAY_STEPS} of the last "
                    f"{RUNAWAY_OF} steps; largest in "
                    f"{', '.join(name or '(top)' for name, _ in worst)}")
        self.norms.append(norm)
        del self.norms[:-WINDOW]
        return None

    def stopped(self, runaway, tightenings):
        """The error that stops the run, after `runaway` (observe's description) and
        `tightenings` of auto's floor."""
        if tightenings:
            return GradientRunaway(
                f"{runaway}, after auto had tightened its fidelity floor {tightenings} "
                f"times for runaways. Stopped before the optimizer step, with the weights still "
                f"finite: use a larger budget, recompute=True, or a smaller learning rate")
        return GradientRunaway(
            f"{runaway}. Stopped before the optimizer step, with the weights still finite: use "
            f"a finer codec (quant4, quant8, eb) or a larger budget, or "
            f"budget(..., gradient_guard=False) to train on")
