"""Stops a run whose gradients run away under lossy packing, before the optimizer steps on them.

Measured (benchmarks/diverging_lm.py, benchmarks/results/diverging_lm.json): a byte-level GPT
of 2 pre-norm blocks, width 192, on real text with AdamW, a one-cycle schedule and clipping at
1.0 trains like plain PyTorch under `quant2` for 20 steps, then its gradient norm (plain: 0.3
to 6.5) climbs to 1.8e3 by step 27 and 1.7e7 later; clipping hides it from the loss for a
while, and after 60 steps the loss is 3.19 against plain's 2.80. The cause, found by packing
one kind of saved tensor at a time: 2 bits on attention's inputs. Its backward recomputes the
probabilities from q and k and exponentiates their error (q's relative RMS error under quant2
is 0.77); its logsumexp, packed, puts errors of up to e^2.4 in them as well (it is kept exact:
runtime/session.cc, an op's statistics).

The guard and its decision are runtime::GradientGuard and BudgetRun::ObserveGradients
(runtime/budget_run.h), which actpack.budget and the C++ guard actpack::Budget both feed with the
parameters' gradient norms at the end of each backward: a gradient norm far above its recent
median in two of the last three steps, while saved tensors were packed lossily, is a runaway,
caught in the backward that produced it, before the optimizer steps on it. Under a fixed codec it
raises `GradientRunaway`. Where `auto` chooses, the fidelity floor halves (from 0.2 where there
was none), the tensors whose codec it now rules out take finer ones from the next pack on, and
this step's gradients are dropped (set to None: the optimizer skips the parameters, as it skips a
GradScaler's overflow step); a third tightening that does not hold raises. Steps with non-finite
gradients are not judged (a GradScaler makes them on purpose, and skips them itself).
"""


class GradientRunaway(RuntimeError):
    """Raised by actpack.budget when the gradient norm runs away under lossy packing."""
