"""Ratio and error of every lossy codec on real activations: the float tensors the demo's models
save for backward after some training (tools/demo.py), encoded and decoded through actpack.

    python3 tools/codec_table.py                    # the conv net and the transformer
    python3 tools/codec_table.py --model cnn --steps 40 --codecs quant2,eb:rel=1e-2

Prints, per model and codec: raw / encoded bytes over all tensors, the relative RMS error
(||decoded - x|| / ||x|| over all values) and the largest absolute error.
"""
import argparse
import sys

import torch
import torch.nn.functional as F

import actpack
import demo

DEFAULT_CODECS = ("quant8", "quant4", "quant2", "eb:rel=1e-3", "eb:rel=1e-2", "division",
                  "division_fft", "pool4")


def saved_activations(model_name, steps, batch, context, seed=0):
    """The distinct float tensors of at least 64 KiB that one training step saves, after
    `steps` steps of training (parameters excluded)."""
    torch.manual_seed(seed)
    corpus = demo.load_corpus(1 << 20)
    model = demo.MODELS[model_name](context=context)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = demo.batches(corpus, batch, context, seed, torch.device("cpu"))
    for _ in range(steps):
        x, y = next(data)
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    parameters = {p.data_ptr() for p in model.parameters()}
    saved, seen = [], set()

    def pack(t):
        key = (t.data_ptr(), tuple(t.shape))
        if (t.is_floating_point() and t.numel() * t.element_size() >= 64 << 10
                and t.data_ptr() not in parameters and key not in seen):
            seen.add(key)
            saved.append(t.detach().contiguous().clone())
        return t

    x, y = next(data)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    return saved


def measure(tensors, codec):
    raw = encoded = 0
    squared_error = squared_norm = 0.0
    max_abs = 0.0
    for t in tensors:
        buffer = actpack.encode(t, codec, 0)
        decoded = actpack.decode(buffer)
        raw += t.numel() * t.element_size()
        encoded += buffer.numel()
        error = (decoded.double() - t.double())
        squared_error += error.pow(2).sum().item()
        squared_norm += t.double().pow(2).sum().item()
        max_abs = max(max_abs, error.abs().max().item())
    return raw / encoded, (squared_error / squared_norm) ** 0.5, max_abs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(demo.MODELS) + ["all"], default="all")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--codecs", default=",".join(DEFAULT_CODECS))
    args = parser.parse_args(argv)
    built = set(actpack.codec_names())
    models = sorted(demo.MODELS) if args.model == "all" else [args.model]
    for name in models:
        tensors = saved_activations(name, args.steps, args.batch, args.context)
        shapes = sorted({tuple(t.shape) for t in tensors})
        print(f"\n{name}: {len(tensors)} saved float tensors after {args.steps} steps "
              f"(batch {args.batch}), shapes {shapes[:4]}{' ...' if len(shapes) > 4 else ''}")
        print(f"  {'codec':<16} {'ratio':>8} {'rel rms error':>14} {'max abs error':>14}")
        for codec in args.codecs.split(","):
            if codec.split(":")[0].rstrip("0123456789") not in built and codec not in built:
                print(f"  {codec:<16} not built in")
                continue
            ratio, rel_rms, max_abs = measure(tensors, codec)
            print(f"  {codec:<16} {ratio:>7.2f}x {rel_rms:>14.4f} {max_abs:>14.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
