"""Every allocation of a training step failed in turn (issue 31, item 1), SQLite's way: run the
step once to count the allocations it makes from actpack's CPU allocator, then once per k with
the k-th failed (allocator/fault_injection_adaptor.h, in every allocator stack between the
statistics and the budget: a failure there is what a budget that its relief could not satisfy
returns). The steps: a CNN with batch norm under codec="auto" at a budget that makes the
policy pack (profiling, planning, packing, unpacking), and a small transformer whose MLPs are
actpack.recompute regions under quant2 (packing, recomputation in backward, unpacking); each
run opens its budget, trains two or three steps and writes its report.

For each k:
- the run completes (the runtime's own handling absorbed the failure) or raises
  torch.OutOfMemoryError carrying the injected failure's message: nothing swallowed or turned
  into another error;
- once the abandoned step's gradients are dropped, the pool holds the bytes it held before the
  run, byte for byte: nothing the run packed, unpacked or recomputed is left allocated;
- the budget put the process back (no saved-tensor hooks, module hooks or cap left);
- then, from the same state, a run at half the batch trains with the losses of a run that
  never saw a failure, bit for bit (the packing after a failure is the packing without one):
  after every absorbed failure and every third k, after every k with ACTPACK_FULL=1.

The C++ session has the same test over the emulated CUDA device (runtime/session_fault_test.cc).
"""
import copy
import gc
import json
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack
from actpack import _C
from test_interrupts import process_state

HOST = -1  # the host pool's device index in actpack._C
FULL = os.environ.get("ACTPACK_FULL") == "1"
BATCH = 8


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU())
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm1(x)
        mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + actpack.recompute(self.mlp, self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, vocab=64, width=32, depth=1):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.out = nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def cnn_case():
    torch.manual_seed(0)
    x, y = torch.randn(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))
    # Three steps: auto's two profiling steps and the first under its plan.
    return Cnn(), (x, y), F.cross_entropy, dict(codec="auto", min_bytes=0), 3


def transformer_case():
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (BATCH, 17))
    loss = lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten())  # noqa: E731
    return (Transformer(), (tokens[:, :-1], tokens[:, 1:]), loss,
            dict(codec="quant2", min_bytes=0, recompute=True), 2)


class Case:
    """A model, its optimizer and a batch, restorable to the state after one warm-up step (the
    optimizer's moments exist, so a run allocates none that outlive it)."""

    def __init__(self, make, budget_bytes, tmp_path):
        self.model, self.batch, self.loss_fn, self.options, self.steps = make()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.budget = budget_bytes
        self.report = tmp_path / "run.json"
        self.train(self.batch, steps=1, budget=None)
        self.saved = (copy.deepcopy(self.model.state_dict()),
                      copy.deepcopy(self.optimizer.state_dict()))

    def restore(self):
        self.model.load_state_dict(self.saved[0])
        # A copy: the optimizer takes the saved tensors as its state and would step them.
        self.optimizer.load_state_dict(copy.deepcopy(self.saved[1]))
        self.optimizer.zero_grad(set_to_none=True)

    def train(self, batch, steps=None, budget=True):
        x, y = batch
        steps = steps or self.steps
        losses = []

        def step():
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach().clone())

        if budget is None:
            step()
            return losses
        with actpack.budget(self.budget, report=self.report, **self.options):
            for _ in range(steps):
                step()
        return losses

    def half(self):
        return tuple(t[: BATCH // 2] for t in self.batch)


def allocated():
    return _C._memory_stats(HOST)["allocated_bytes.all.current"]


def settle():
    """Lets go of what an abandoned step left: the cycles its exception's traceback made, and
    the nodes a backward that raised left in autograd's ready queue. PyTorch's engine keeps
    those in a thread-local queue until the next backward runs (plain PyTorch too: a
    two-branch MLP under this allocator held 1.1 MiB after a failed backward, none after one
    more), so one tiny backward runs first."""
    torch.ones(1, requires_grad=True).sum().backward()
    gc.collect()


@pytest.mark.parametrize("make,budget", [(cnn_case, "8MiB"), (transformer_case, "8MiB")],
                         ids=["cnn-auto", "transformer-quant2-recompute"])
def test_every_allocation_of_a_step_fails_in_turn(make, budget, cpu_allocator, tmp_path):
    case = Case(make, actpack.parse_size(budget), tmp_path)
    clean = process_state()
    # Each k collects cycles (settle): frozen, the objects made before the test are not walked
    # by every collection (0.13 s each, most of the test's time, without).
    gc.collect()
    gc.freeze()
    try:
        check_every_failure(case, clean)
    finally:
        gc.unfreeze()


def check_every_failure(case, clean):
    # The run without a failure: its allocations, losses, weights and report, and the half
    # batch's losses after it.
    case.restore()
    _C._fail_allocation_at(HOST, 0)
    full = case.train(case.batch)
    total, failed = _C._allocations_counted(HOST)
    assert not failed and total > 100, total
    steps = json.loads(case.report.read_text())["activations"]["steps"]
    # It packed in every step (auto: two profiling steps, then its plan), so the failures
    # land among packs and unpacks, not only around tensors kept as they are.
    assert len(steps) == case.steps and all(s["stored_bytes"] < s["saved_raw_bytes"]
                                            for s in steps), steps
    case.restore()
    half = case.train(case.half(), steps=2)

    outcomes = {"raised": 0, "completed": 0, "not reached": 0}
    k = 0
    while k < total:
        k += 1
        case.restore()
        case.report.unlink()
        before = allocated()
        _C._fail_allocation_at(HOST, k)
        try:
            losses = case.train(case.batch)
        except torch.OutOfMemoryError as error:
            assert f"injected failure of allocation #{k} " in str(error), (k, str(error)[:400])
            losses = None
        finally:
            fired = _C._allocations_counted(HOST)[1]
            _C._fail_allocation_at(HOST, 0)
        made = _C._allocations_counted(HOST)[0]
        # auto's plan after its profiling steps counts what the process's resident set holds
        # outside the pool, which varies from run to run: a run may make another number of
        # allocations (measured: 729 and 745 for the CNN). Every number a run made is covered.
        total = max(total, made)
        warnings = json.loads(case.report.read_text())["run"]["warnings"]
        if not fired:
            assert losses is not None and made < k, (k, made)
            outcomes["not reached"] += 1
        elif losses is None:
            outcomes["raised"] += 1
            assert any(f"injected failure of allocation #{k} " in w for w in warnings), k
        else:
            # Absorbed (by the runtime's relief): then it trained as if nothing had failed (the
            # losses: every step's forward follows the profiling steps, which pack the same
            # way in every run). A pack or unpack that swallowed the failure would not.
            outcomes["completed"] += 1
            assert all(map(torch.equal, losses, full)), (k, losses, full)
        case.optimizer.zero_grad(set_to_none=True)
        settle()
        assert allocated() == before, (k, allocated() - before)
        assert process_state() == clean, k

        # The run after: after every run that completed (an absorbed failure, where a state
        # the failure left behind would show, or a k past the run's allocations), and after
        # every third k otherwise; after every k in the full run
        # (ACTPACK_FULL=1 bash tools/test.sh). A leftover the checks above do not see would
        # come from a code path, and neighbouring k's fail in the same ones.
        if losses is not None or k % 3 == 0 or FULL:
            case.restore()
            after = case.train(case.half(), steps=2)
            assert all(map(torch.equal, after, half)), (k, after, half)
    print(f"{case.model.__class__.__name__}: {total} allocations, each failed in turn: {outcomes}")
    assert outcomes["not reached"] < total // 10, outcomes
