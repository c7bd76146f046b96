"""actpack's main job: train a byte-level language model (a causal conv net, or a small
transformer with --model transformer) on the Python standard library's own source files, twice
with the same seed: plain PyTorch, then under a memory budget plain training does not fit, with
actpack choosing the codecs. Prints the two runs side by side (loss, activation bytes raw vs
stored, peak memory, wall time), the batch size the budget supports per codec choice
(actpack.plan, verified by real steps), and writes the run report.

    python3 tools/demo.py                 # 40 steps, batch 32, codec auto, 60% of plain's peak
    python3 tools/demo.py --steps 200 --codec quant4 --budget 64MiB --report run.json

(tools/demo.py is the entry point; this module is the workload, which tests and tools import.)

Uses CUDA when a GPU is present, the CPU otherwise. Needs nothing from the network: the data
is the interpreter's own standard library.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack

# The corpus and the transformer block are the benchmark suite's (benchmarks/models.py).
from benchmarks.models import TransformerBlock, load_corpus


class Block(TransformerBlock):
    """The benchmark suite's pre-norm causal block, with explicit attention (not the fused
    kernel) so the scores are saved activations, as in most models people train."""

    def __init__(self, dim, heads):
        super().__init__(dim, heads, causal=True)

    def attention(self, q, k, v):
        t, head_dim = q.shape[-2], q.shape[-1]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


class CharTransformer(nn.Module):
    def __init__(self, vocab=256, dim=128, heads=4, layers=2, context=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.zeros(context, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class CausalConvNet(nn.Module):
    """A byte-level convolutional language model (ByteNet/WaveNet style): dilated causal 1-D
    convolutions with batch norm and ReLU, residual connections. Its saved activations are
    the convolution feature maps ActNN-style quantization was designed for."""

    def __init__(self, vocab=256, channels=128, layers=6, context=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, channels)
        self.convs = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size=3, dilation=2 ** (i % 4))
            for i in range(layers))
        self.norms = nn.ModuleList(nn.BatchNorm1d(channels) for _ in range(layers))
        self.head = nn.Conv1d(channels, vocab, kernel_size=1)

    def forward(self, tokens):
        x = self.embed(tokens).transpose(1, 2)  # [batch, channels, time]
        for conv, norm in zip(self.convs, self.norms):
            pad = conv.dilation[0] * (conv.kernel_size[0] - 1)
            x = x + F.relu(norm(conv(F.pad(x, (pad, 0)))))
        return self.head(x).transpose(1, 2)


MODELS = {"cnn": CausalConvNet, "transformer": CharTransformer}


def batches(corpus, batch, context, seed, device):
    generator = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, corpus.numel() - context - 1, (batch,), generator=generator)
        window = torch.stack([corpus[s: s + context + 1] for s in starts.tolist()])
        window = window.long()
        yield window[:, :-1].to(device), window[:, 1:].to(device)


def training_step(model, optimizer, data):
    """One step of the demo's training: next batch, cross-entropy, backward, optimizer step;
    returns the loss."""
    def step():
        x, y = next(data)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()
    return step


def train(corpus, steps, batch, context, device, seed, budget=None, codec="quant2",
          report=None, model_name="cnn", allowed_loss_increase=None):
    """Trains from a fixed seed; returns (losses, wall seconds, run report or None, model)."""
    torch.manual_seed(seed)
    model = MODELS[model_name](context=context).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = batches(corpus, batch, context, seed, device)
    losses = []

    step = training_step(model, optimizer, data)

    # actpack's own counters: torch's refuse to reset under a CUDAPluggableAllocator.
    actpack.reset_peak_memory_stats(device.type)
    start = time.perf_counter()
    run = None
    if budget is None:
        for i in range(steps):
            losses.append(step())
    else:
        with actpack.budget(budget, codec=codec, report=report, seed=seed,
                            allowed_loss_increase=allowed_loss_increase) as run:
            for i in range(steps):
                losses.append(step())
    wall = time.perf_counter() - start
    return losses, wall, (run.report if run is not None else None), model


def measure(device):
    """The allocator's peaks since the last reset: (reserved, allocated)."""
    return (actpack.max_memory_reserved(device.type), actpack.max_memory_allocated(device.type))


def install_allocator(device):
    """actpack's allocator under torch for `device`, without a cap: the plain run and the
    budgeted run are measured by the same allocator (the budget caps only inside its context)."""
    if device.type == "cpu":
        actpack.install_cpu_allocator()
    else:
        actpack.install_allocator()


def plan_step(corpus, context, device, seed, model_name):
    """step(batch) for actpack.plan: one training step of a fresh model at that batch size (the
    same batch of data each time); returns the loss."""
    torch.manual_seed(seed)
    model = MODELS[model_name](context=context).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    def step(batch):
        return training_step(model, optimizer, batches(corpus, batch, context, seed, device))()

    return step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--codec", default="auto")
    parser.add_argument("--budget", default=None,
                        help="e.g. 48MiB; default: 60%% of what plain training reserved")
    parser.add_argument("--report", default="run.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plan-batches", default="8,16",
                        help="batch sizes the planner profiles; 'none' skips planning")
    parser.add_argument("--snapshot", action="store_true",
                        help="put the allocator snapshot in the report (for actpack snapshot)")
    parser.add_argument("--allowed-loss-increase", type=float, default=None,
                        help="the error-bounded mode (with --codec eb or auto), e.g. 0.01")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    fmt = actpack.format_bytes
    install_allocator(device)
    corpus = load_corpus()
    print(f"actpack demo: byte-level {args.model} language model on {corpus.numel() / 1e6:.1f} "
          f"MB of the Python standard library, {args.steps} steps, batch {args.batch}, context "
          f"{args.context}, device {device}, codec {args.codec}"
          + (f", allowed loss increase {args.allowed_loss_increase}"
             if args.allowed_loss_increase else ""))

    actpack.empty_cache(device.type)
    actpack.reset_peak_memory_stats(device.type)
    plain, plain_wall, _, _ = train(corpus, args.steps, args.batch, args.context, device,
                                    args.seed, model_name=args.model)
    plain_reserved, plain_allocated = measure(device)
    budget = args.budget or int(0.6 * plain_reserved)
    budget_bytes = actpack.parse_budget(budget)["bytes"] or budget
    print(f"plain PyTorch peaked at {fmt(plain_reserved)} reserved ({fmt(plain_allocated)} "
          f"allocated); budget {fmt(budget_bytes)}"
          + ("" if args.budget else " (60% of plain's peak: plain training does not fit)"))

    actpack.empty_cache(device.type)
    with actpack.budget(budget, codec=args.codec, seed=args.seed, snapshot=args.snapshot,
                        allowed_loss_increase=args.allowed_loss_increase) as run:
        torch.manual_seed(args.seed)
        model = MODELS[args.model](context=args.context).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        data = batches(corpus, args.batch, args.context, args.seed, device)
        packed = []
        start = time.perf_counter()
        for _ in range(args.steps):
            x, y = next(data)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            packed.append(loss.item())
        packed_wall = time.perf_counter() - start
    report = run.report

    print(f"\n{'step':>6} {'plain loss':>12} {'actpack loss':>13}")
    for i in range(0, args.steps, max(1, args.steps // 10)):
        print(f"{i:>6} {plain[i]:>12.4f} {packed[i]:>13.4f}")
    print(f"{args.steps - 1:>6} {plain[-1]:>12.4f} {packed[-1]:>13.4f}")

    steps = report["activations"]["steps"]
    last = steps[-1]
    codecs = {}
    for record in report["activations"]["saved_tensors"]:
        codecs[record["codec"]] = codecs.get(record["codec"], 0) + 1
    print("\nactivation memory of one step (what autograd saves for backward):")
    print(f"  plain PyTorch        {fmt(last['saved_raw_bytes']):>12}")
    print(f"  actpack              {fmt(last['stored_bytes']):>12}   "
          f"({last['saved_raw_bytes'] / max(1, last['stored_bytes']):.1f}x smaller)")
    print("  codecs chosen        " + ", ".join(f"{c} x{n}" for c, n in sorted(codecs.items())))
    print(f"peak memory per step: plain {fmt(plain_reserved)}; actpack at most "
          f"{fmt(max(s['peak_reserved_bytes'] for s in steps))} under the {fmt(budget_bytes)} budget "
          f"(reserved, everything: parameters, optimizer state, activations, workspace)")
    print(f"wall time: plain {plain_wall:.1f} s, actpack {packed_wall:.1f} s "
          f"({packed_wall / plain_wall:.2f}x)")
    print(f"final loss: plain {plain[-1]:.4f}, actpack {packed[-1]:.4f} "
          f"({100 * (packed[-1] / plain[-1] - 1):+.2f}%)")

    if args.plan_batches != "none":
        sizes = tuple(int(b) for b in args.plan_batches.split(","))
        print(f"\nthe batch size {fmt(budget_bytes)} supports (actpack.plan, profiled at "
              f"batch {', '.join(map(str, sizes))}, verified by real steps under the cap):")
        plan = actpack.plan(plan_step(corpus, args.context, device, args.seed, args.model),
                            budget_bytes, batch_sizes=sizes, verify=True)
        print(plan.table())
        report["planner"] = plan.report["planner"]
    with open(args.report, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"report written to {args.report} (read it with: actpack report {args.report})")
    return 0
