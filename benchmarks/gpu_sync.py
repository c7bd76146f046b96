"""Host waits per training step on a real GPU, from the CUDA runtime's own API trace.

The CUDA emulator predicts (runtime/session_cuda_test, SessionWaitTest): in steady state, no
wait in any pack or unpack, one per step (the statuses' read at the end of backward), and one
more in a step whose `eb` tensors are unpacked before their sizes were read. This script counts
what torch.profiler's CUDA activity records of the calls that block the host
(cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, cudaMemcpy, cudaFree,
cudaMalloc) over the steady-state steps of a small CNN and a small GPT block, plain and under
actpack's codecs, and prints them per step beside the prediction. A plain step's own waits
(none, for these loops: the loss is never read) are the baseline.

    python3 tools/gpu_sync_check.py      # the entry point, run by tools/gpu_check.sh
"""
import collections
import contextlib

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import actpack

WAITS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy",
         "cudaFree", "cudaFreeHost", "cudaMalloc", "cudaHostAlloc")
WARMUP, MEASURED = 6, 4


def cnn():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 16 * 16, 10))


class Block(nn.Module):
    def __init__(self, width=256, heads=4):
        super().__init__()
        self.embed = nn.Embedding(512, width)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(0.1),
                                 nn.Linear(4 * width, width))
        self.head = nn.Linear(width, 512)

    def forward(self, tokens):
        x = self.embed(tokens)
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        x = x + self.mlp(self.norm2(x))
        return self.head(x)


def batches(kind):
    if kind == "cnn":
        x = torch.randn(32, 3, 64, 64, device="cuda")
        y = torch.randint(0, 10, (32,), device="cuda")
        return cnn().cuda(), x, y
    tokens = torch.randint(0, 512, (16, 128), device="cuda")
    return Block().cuda(), tokens, tokens


def waits_per_step(kind, codec):
    """{blocking CUDA call: times per step} over MEASURED steady steps, as torch.profiler's CUDA
    API trace records them, the profiler's own included (one cudaDeviceSynchronize as it stops:
    `extra_waits_per_step` takes a plain run's counts off)."""
    torch.manual_seed(0)
    model, x, y = batches(kind)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        out = model(x)
        loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    context = actpack.budget("64GiB", codec=codec) if codec != "plain" else contextlib.nullcontext()
    with context:
        for _ in range(WARMUP):  # the policy's profile steps, the pool's growth
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(MEASURED):
                step()
        torch.cuda.synchronize()
    counts = collections.Counter(e.name for e in prof.events() if e.name in WAITS)
    return {name: n / MEASURED for name, n in counts.items() if n}


def extra_waits_per_step(kind, codec):
    """What actpack adds to a plain step's blocking calls, per step, by call."""
    plain, under = waits_per_step(kind, "plain"), waits_per_step(kind, codec)
    extra = {name: under.get(name, 0) - plain.get(name, 0) for name in set(plain) | set(under)}
    return {name: n for name, n in extra.items() if n}


PREDICTED = {"quant2": 1, "division": 1, "eb": 2, "auto": 2}  # at most, per step


def main():
    if not torch.cuda.is_available():
        raise SystemExit("gpu_sync_check: no CUDA device")
    print(f"device: {torch.cuda.get_device_name()}")
    print(f"{'model':<5} {'codec':<10} {'waits/step':>10}  {'predicted':>9}  calls per step "
          "(beyond a plain step's)")
    for kind in ("cnn", "gpt"):
        plain = waits_per_step(kind, "plain")
        print(f"{kind:<5} {'plain':<10} {'0':>10}  {'0':>9}  the profiler's own: "
              + ", ".join(f"{name} {n:g}" for name, n in sorted(plain.items())))
        for codec, most in PREDICTED.items():
            counts = extra_waits_per_step(kind, codec)
            detail = ", ".join(f"{name} {n:g}" for name, n in sorted(counts.items()))
            print(f"{kind:<5} {codec:<10} {sum(counts.values()):>10.2f}  {'<= %d' % most:>9}  {detail}")
