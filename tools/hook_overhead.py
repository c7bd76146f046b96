"""What actpack's saved-tensor hooks cost per saved tensor, the codecs' own time excluded.

A model of several hundred small layers (Linear + Tanh, batch 8, width 64: 2 KiB activations,
where the hooks' fixed cost dominates) trains for a few steps under actpack.budget with
`quant8` on every saved tensor (min_bytes=0). Each call of the pack and unpack hooks is timed
from Python (what autograd calls: the Python hook, the module tracker's name, the C++ session);
the session's own clock of its codec calls (totals "codec_seconds") is subtracted. The split:
the C++ session's clock of its pack and unpack (Session.hook_seconds(), the binding included)
less the codecs, and the rest, Python's. Each number is the median over the steps (a step that
another process preempted does not set it). Also printed: a plain step and a step under the
budget, for scale.

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

    # Per step: (wall, hooks, codecs, C++ session, hook calls, packs). Medians over steps, so
    # that a step another process preempted does not set the number. The clocks are the
    # budget's own (actpack.budget.timed, Run.clock).
    steps = []
    with actpack.budget("90%", codec="quant8", min_bytes=0).timed() as run:
        step()  # the first step under a budget sets the session up
        for _ in range(args.steps):
            before = run.totals(), run.clock()
            start = time.perf_counter()
            step()
            wall = time.perf_counter() - start
            after = run.totals(), run.clock()
            steps.append((wall, after[1]["hooks_seconds"] - before[1]["hooks_seconds"],
                          after[0]["codec_seconds"] - before[0]["codec_seconds"],
                          after[1]["session_seconds"] - before[1]["session_seconds"],
                          after[1]["hook_calls"] - before[1]["hook_calls"],
                          after[0]["packs"] - before[0]["packs"]))
    median = statistics.median
    saved = median(s[4] for s in steps) / 2  # a pack and an unpack per saved tensor
    per_tensor = median((s[1] - s[2]) / (s[4] / 2) for s in steps)
    cpp = median((s[3] - s[2]) / (s[4] / 2) for s in steps)
    print(f"model: {args.layers} x (Linear({args.width}, {args.width}) + Tanh), batch "
          f"{args.batch}, torch threads {torch.get_num_threads()}")
    print(f"saved tensors per step: {saved:.0f} ({median(s[5] for s in steps):.0f} packed "
          f"with quant8); medians of {args.steps} steps")
    print(f"step: plain {plain * 1e3:.2f} ms, under actpack.budget "
          f"{median(s[0] for s in steps) * 1e3:.2f} ms")
    print(f"hooks: {median(s[1] for s in steps) * 1e3:.2f} ms a step, of which codecs "
          f"{median(s[2] for s in steps) * 1e3:.2f} ms")
    print(f"hook overhead per saved tensor (pack + unpack, codec time excluded): "
          f"{per_tensor * 1e6:.1f} us: C++ session {cpp * 1e6:.1f} us, Python hook "
          f"{(per_tensor - cpp) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
