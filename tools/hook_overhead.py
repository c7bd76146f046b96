"""What actpack's saved-tensor hooks cost per saved tensor, the codecs' own time excluded.

A model of several hundred small layers (Linear + Tanh, batch 8, width 64: 2 KiB activations,
where the hooks' fixed cost dominates) trains for a few steps under actpack.budget with
`quant8` on every saved tensor (min_bytes=0). Each call of the pack and unpack hooks is timed
from Python (what autograd calls: the Python hook, the module tracker, the C++ session); the
session's own clock of its codec calls (totals "codec_seconds") is subtracted. Also printed:
a plain step and a step under the budget, for scale.

    python3 tools/hook_overhead.py [--layers 300] [--steps 20] [--threads 2]
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn

import actpack


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=300)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.Tanh()]
    model = nn.Sequential(*layers)
    x = torch.randn(args.batch, args.width)

    def step():
        model(x).square().mean().backward()

    def plain_step_seconds():
        start = time.perf_counter()
        step()
        return time.perf_counter() - start

    for _ in range(3):
        step()
    plain = statistics.median(plain_step_seconds() for _ in range(args.steps))

    context = actpack.budget("90%", codec="quant8", min_bytes=0)
    pack, unpack = context._pack, context._unpack
    hook_seconds = [0.0]
    calls = [0]

    def timed(hook):
        def run(value):
            start = time.perf_counter()
            result = hook(value)
            hook_seconds[0] += time.perf_counter() - start
            calls[0] += 1
            return result
        return run

    context._hooks = torch.autograd.graph.saved_tensors_hooks(timed(pack), timed(unpack))
    step_seconds = []
    with context:
        step()  # the first step under a budget sets the session up
        hook_seconds[0], calls[0] = 0.0, 0
        codec_before = context._session.totals()["codec_seconds"]
        packs_before = context._session.totals()["packs"]
        for _ in range(args.steps):
            start = time.perf_counter()
            step()
            step_seconds.append(time.perf_counter() - start)
        totals = context._session.totals()
    codec = totals["codec_seconds"] - codec_before
    saved = calls[0] / 2  # a pack and an unpack per saved tensor
    per_tensor = (hook_seconds[0] - codec) / saved
    print(f"model: {args.layers} x (Linear({args.width}, {args.width}) + Tanh), batch "
          f"{args.batch}, torch threads {torch.get_num_threads()}")
    print(f"saved tensors per step: {saved / args.steps:.0f} "
          f"({(totals['packs'] - packs_before) / args.steps:.0f} packed with quant8)")
    print(f"step: plain {plain * 1e3:.2f} ms, under actpack.budget "
          f"{statistics.median(step_seconds) * 1e3:.2f} ms")
    print(f"hooks: {hook_seconds[0] / args.steps * 1e3:.2f} ms a step, of which codecs "
          f"{codec / args.steps * 1e3:.2f} ms")
    print(f"hook overhead per saved tensor (pack + unpack, codec time excluded): "
          f"{per_tensor * 1e6:.1f} us")


if __name__ == "__main__":
    main()
