"""actpack's main job: train a character-level transformer on the Python standard library's own
source files, twice with the same seed (plain PyTorch, then under actpack), and print the two
runs side by side: the loss, activation bytes raw vs stored, peak memory, wall time, the run
report and the batch size the budget supports.

    python tools/demo.py                      # defaults: 60 steps, batch 32, quant2, 256MiB
    python tools/demo.py --steps 200 --codec quant4 --budget 1GiB --report run.json

Uses CUDA when a GPU is present, the CPU otherwise. Needs nothing from the network: the data
is the interpreter's own standard library.
"""
import argparse
import glob
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack


def load_corpus(max_bytes=4 << 20):
    """The bytes of the standard library's .py files, in a fixed order."""
    stdlib = os.path.dirname(os.__file__)
    chunks, total = [], 0
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        with open(path, "rb") as f:
            data = f.read()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8).long()


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        # Explicit attention (not the fused kernel) so the scores are saved activations, as in
        # most models people train.
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        attention = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (attention @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.norm2(x))


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
        yield window[:, :-1].to(device), window[:, 1:].to(device)


def train(corpus, steps, batch, context, device, seed, budget=None, codec="quant2",
          report=None, model_name="cnn"):
    """Trains from a fixed seed; returns (losses, wall seconds, run report or None, model)."""
    torch.manual_seed(seed)
    model = MODELS[model_name](context=context).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = batches(corpus, batch, context, seed, device)
    losses = []

    def step():
        x, y = next(data)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    run = None
    if budget is None:
        for i in range(steps):
            losses.append(step())
    else:
        with actpack.budget(budget, codec=codec, report=report, seed=seed) as run:
            for i in range(steps):
                losses.append(step())
    wall = time.perf_counter() - start
    return losses, wall, (run.report if run is not None else None), model


def model_state_bytes(model):
    """Parameters + gradients + Adam's two moments."""
    return 4 * sum(p.numel() * p.element_size() for p in model.parameters())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--codec", default="quant2")
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--report", default="run.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    budget_bytes = actpack.parse_budget(args.budget)
    corpus = load_corpus()
    print(f"actpack demo: byte-level {args.model} language model on {corpus.numel() / 1e6:.1f} MB of the Python "
          f"standard library, {args.steps} steps, batch {args.batch}, context {args.context}, "
          f"device {device}, codec {args.codec}, budget {budget_bytes['text']}")
    plain, plain_wall, _, model = train(corpus, args.steps, args.batch, args.context, device,
                                        args.seed, model_name=args.model)
    plain_peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    packed, packed_wall, report, _ = train(corpus, args.steps, args.batch, args.context, device,
                                           args.seed, budget=args.budget, codec=args.codec,
                                           report=args.report, model_name=args.model)
    packed_peak = report["run"]["peak_allocated_bytes"]

    print(f"\n{'step':>6} {'plain loss':>12} {'actpack loss':>13}")
    for i in range(0, args.steps, max(1, args.steps // 10)):
        print(f"{i:>6} {plain[i]:>12.4f} {packed[i]:>13.4f}")
    print(f"{args.steps - 1:>6} {plain[-1]:>12.4f} {packed[-1]:>13.4f}")

    totals = report["activations"]["totals"]
    last = report["activations"]["steps"][-1]
    per_step_raw = max(s["peak_live_raw_bytes"] for s in report["activations"]["steps"])
    per_step_stored = max(s["peak_live_stored_bytes"] for s in report["activations"]["steps"])
    fmt = actpack.format_bytes
    print("\nactivation memory of one step (what autograd saves for backward):")
    print(f"  plain PyTorch        {fmt(last['saved_raw_bytes']):>12}")
    print(f"  actpack {args.codec:<12} {fmt(last['stored_bytes']):>12}   "
          f"({last['saved_raw_bytes'] / last['stored_bytes']:.1f}x overall)")
    print(f"  of which packed      {fmt(per_step_raw):>12} -> {fmt(per_step_stored)}   "
          f"(ratio {totals['ratio']:.1f}x; {totals['exact_fallbacks']} tensors kept exact)")
    print(f"  kept as they are     {fmt(last['stored_bytes'] - per_step_stored):>12}   "
          "(parameters, small tensors, the loss's log-probabilities)")
    if plain_peak is not None:
        print(f"peak device memory: plain {fmt(plain_peak)}, actpack {fmt(packed_peak)}")
    print(f"wall time: plain {plain_wall:.1f} s, actpack {packed_wall:.1f} s "
          f"({packed_wall / plain_wall:.2f}x)")
    print(f"final loss: plain {plain[-1]:.4f}, actpack {packed[-1]:.4f} "
          f"({100 * (packed[-1] / plain[-1] - 1):+.2f}%)")

    # First-order estimate until the planner lands: fixed model state plus per-sample
    # activations must fit the budget.
    budget = budget_bytes["bytes"] or int(budget_bytes["fraction"] * (
        torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0))
    fixed = model_state_bytes(model)
    if budget:
        plain_batch = max(0, (budget - fixed) * args.batch // last['saved_raw_bytes'])
        packed_batch = max(0, (budget - fixed) * args.batch // last['stored_bytes'])
        print(f"\nsupported batch size under {fmt(budget)} (model state {fmt(fixed)} + saved "
              f"activations; estimate): plain {plain_batch}, actpack {args.codec} {packed_batch}")
    print(f"report written to {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
