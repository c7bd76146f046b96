#!/usr/bin/env python3
"""The run that diverges under 2-bit packing, and what actpack does about it.

A byte-level GPT (benchmarks/models.py: 2 pre-norm blocks, width 192, 4 heads, context 128) on
real text (the Python standard library), batch 32, AdamW at 3e-3 with a one-cycle schedule and
gradient clipping at 1.0, from one seed, under: plain PyTorch; actpack quant2 with its gradient
guard (the default), and without it; quant8; and auto. Per run: the step it ended at and why,
the last loss, and the largest gradient norm before clipping. Then `auto` at a budget that makes it
pack, with its fidelity floor (the default) and without (max_rel_rms=None, where it takes 2 bits
on attention's inputs and the guard makes it fall back to finer codecs).

    python3 benchmarks/diverging_lm.py [--steps 60] [--json benchmarks/results/diverging_lm.json]
"""
import argparse
import contextlib
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import provenance  # noqa: E402

import actpack  # noqa: E402

BATCH, CONTEXT, LR = 32, 128, 3e-3
# Plain training of this step peaks at 122 MiB allocated (154 MiB reserved): at 72 MiB `auto`
# must pack; with max_rel_rms=None it takes 2 bits on attention's inputs, runs away, and falls
# back to finer codecs (the gradient guard under auto).
TIGHT = "72MiB"
RUNS = {  # name -> budget keyword arguments, "limit" the budget (None: plain PyTorch)
    "plain": None,
    "quant2": {"codec": "quant2"},
    "quant2, gradient_guard=False": {"codec": "quant2", "gradient_guard": False},
    "quant8": {"codec": "quant8"},
    "auto": {"codec": "auto"},
    f"auto at {TIGHT}": {"codec": "auto", "limit": TIGHT},
    f"auto at {TIGHT}, max_rel_rms=None": {"codec": "auto", "limit": TIGHT, "max_rel_rms": None},
}


def run(options, steps, seed=0):
    torch.manual_seed(seed)
    corpus = models.load_corpus()
    model = models.GPT(context=CONTEXT, dim=192, depth=2, heads=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LR, total_steps=steps)
    generator = torch.Generator().manual_seed(seed)
    norms, losses, ended, skipped = [], [], "trained", 0
    options = None if options is None else dict(options)
    context = contextlib.nullcontext() if options is None else actpack.budget(
        options.pop("limit", "64GiB"), **options)
    try:
        with context:
            for step in range(steps):
                starts = torch.randint(0, corpus.numel() - CONTEXT - 1, (BATCH,),
                                       generator=generator)
                x = torch.stack([corpus[s:s + CONTEXT] for s in starts]).long()
                y = torch.stack([corpus[s + 1:s + CONTEXT + 1] for s in starts]).long()
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                loss.backward()
                # A runaway under auto drops the step's gradients (finer codecs from now on).
                skipped += all(p.grad is None for p in model.parameters())
                norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                schedule.step()
                losses.append(loss.item())
                if not all(torch.isfinite(p).all() for p in model.parameters()):
                    ended = f"weights NaN after step {step + 1}"
                    break
    except actpack.GradientRunaway as error:
        ended = f"stopped by the guard in step {len(losses) + 1}"
        print(f"  {error}")
    finite = [n for n in norms if math.isfinite(n)]
    return {"ended": ended, "steps": len(losses), "last_loss": losses[-1] if losses else None,
            "largest_grad_norm": max(norms) if norms else None,
            "largest_finite_grad_norm": max(finite) if finite else None,
            "steps_dropped": skipped,
            "floor_tightenings": getattr(context, "run", None) and
            context.run.report["activations"]["policy"].get("floor_tightenings", 0),
            "weights_finite": all(torch.isfinite(p).all().item() for p in model.parameters())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args()
    rows = {}
    print(f"{'run':<30} {'ended':<34} {'last loss':>9} {'max grad norm':>14}")
    for name, options in RUNS.items():
        rows[name] = r = run(options, args.steps)
        norm = f"{r['largest_grad_norm']:.3g}" if r["largest_grad_norm"] is not None else "-"
        print(f"{name:<30} {r['ended']:<34} {r['last_loss']:>9.3f} {norm:>14}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance.record(), "torch": torch.__version__, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
