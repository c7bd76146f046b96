"""actpack.budget with FSDP2 (torch.distributed.fsdp.fully_shard): two gloo ranks on the CPU,
each under its own budget and writing its own report, against the same FSDP run without
actpack."""
import json
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import actpack
from test_integrations import _free_port, mlp, run_ranks, teacher_batch
from training_checks import check_budgeted_run
from conftest import HANG_GUARD_S

fully_shard = pytest.importorskip("torch.distributed.fsdp").fully_shard

WORLD_SIZE, STEPS, BATCH = 2, 20, 4096


def sharded_mlp():
    # Every rank starts from the same weights, then shards them. Four hidden layers: the saved
    # activations outweigh what a step holds raw at its peak (a layer's gradients in flight),
    # so that packing can bring the step under 80% of plain training.
    model = mlp(width=256, seed=0, hidden=4)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def train(rank, budget=None, **budget_args):
    model = sharded_mlp()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    losses = []
    context = actpack.budget(budget, **budget_args) if budget else None
    run = context.__enter__() if context else None
    try:
        for _ in range(STEPS):
            x, y = teacher_batch(generator, batch=BATCH)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        if context:
            context.__exit__(None, None, None)
    shard = [p.to_local().detach().clone() for p in model.parameters()]
    return losses, shard, run


def _worker(rank, port, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD_SIZE, timeout=timedelta(seconds=HANG_GUARD_S))
    try:
        plain, _, _ = train(rank)
        # Packing off: the same losses, and this rank's plain peak.
        measured, _, measure = train(rank, "4GiB", enabled=False)
        peak = measure.report["run"]["peak_reserved_bytes"]
        # Each rank its own budget: 80% of what its plain training reserved.
        budget = int(peak * 0.8)
        packed, packed_shard, _ = train(rank, budget,
                                        report=os.path.join(out_dir, "run-{rank}.json"))
        torch.save({"plain": plain, "measured": measured, "packed": packed, "budget": budget,
                    "plain_peak": peak, "packed_shard": packed_shard}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_fsdp2_two_gloo_ranks_each_under_its_own_budget(tmp_path):
    run_ranks(_worker, (_free_port(), str(tmp_path)), WORLD_SIZE)
    for rank in range(WORLD_SIZE):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        plain, packed = result["plain"], result["packed"]
        assert result["measured"] == plain  # the budget with packing off changes nothing
        assert plain[-1] < plain[0] * 0.5
        # Sharded: each rank holds a different half of the parameters.
        assert sum(p.numel() for p in result["packed_shard"]) < sum(
            p.numel() for p in mlp(width=256, hidden=4).parameters())
        report = json.loads((tmp_path / f"run-{rank}.json").read_text())
        assert report["run"]["rank"] == rank and report["run"]["world_size"] == WORLD_SIZE
        check_budgeted_run(report, result["budget"], plain, packed, result["plain_peak"],
                           label=f"rank {rank}")
