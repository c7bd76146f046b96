"""Error per byte of codecs on realistic activations: the tensors autograd saves in one training
step of the demo models (tools/demo.py) after a short warm-up, encoded and decoded with actpack.

    python3 tools/measure_codecs.py                       # both models, the default codecs
    python3 tools/measure_codecs.py --model cnn --codecs quant2 division division_dct:keep=1,bits=2

For each model and codec: the compression ratio (raw bytes / encoded bytes, all saved float
tensors of at least 64 KiB, as the session packs), the relative RMS error
sqrt(sum (x' - x)^2 / sum x^2) and the largest absolute error over them, overall and (ratio,
relative error) by tensor rank. A codec followed by
"@last" sees each 2-D and 3-D tensor [..., n, d] as [1, rows, 1, d]: the division codecs then
low-pass along the last dim (hidden) instead of dim -2 (tokens), with the same residual groups
(contiguous runs of at most `group` values along the last dim). Tensors a codec refuses
(non-finite values) count as kept exact. CPU only; a few minutes.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks import demo  # noqa: E402

import actpack  # noqa: E402

DEFAULT_CODECS = ["quant8", "quant4", "quant2", "eb:rel=1e-3", "eb:rel=1e-2", "division", "division@last", "division:block=4,bits=2",
                  "division:block=16,bits=2", "division:block=8,bits=2,group=64",
                  "division:block=8,bits=2,group=256", "division_dct:keep=1,bits=2",
                  "division_dct", "division_dct:keep=8,bits=2", "division_dct:keep=16,bits=2"]


def saved_activations(model_name, steps, batch, context, seed=0):
    """The distinct floating tensors of >= 64 KiB that one training step saves for backward,
    after `steps` steps of training from `seed` (parameters excluded)."""
    torch.manual_seed(seed)
    corpus = demo.load_corpus(1 << 20)
    model = demo.MODELS[model_name](context=context)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = demo.batches(corpus, batch, context, seed, torch.device("cpu"))

    def loss_of(x, y):
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    for _ in range(steps):
        loss_of(*next(data)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    parameters = {p.data_ptr() for p in model.parameters()}
    saved, seen = [], set()

    def pack(t):
        key = (t.data_ptr(), tuple(t.shape), t.dtype)
        if (t.is_floating_point() and t.numel() * t.element_size() >= 65536
                and t.data_ptr() not in parameters and key not in seen):
            seen.add(key)
            saved.append(t.detach().clone())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_of(*next(data)).backward()
    return saved


def smooth_maps(noise, shape=(4, 16, 56, 56), seed=0):
    """Synthetic smooth 2-D maps (image-like: waves with periods of 100 to 250 pixels, a phase
    and an offset per plane) plus Gaussian noise of standard deviation `noise`."""
    torch.manual_seed(seed)
    n, c, h, w = shape
    ys = torch.arange(h, dtype=torch.float64)[:, None]
    xs = torch.arange(w, dtype=torch.float64)[None, :]
    planes = [2 * torch.sin(2 * math.pi * ys / (100 + 30 * (p % 6)) + 0.7 * p)
              * torch.cos(2 * math.pi * xs / (120 + 25 * (p % 5))) + 0.3 * (p % 3)
              for p in range(n * c)]
    return (torch.stack(planes).reshape(shape)
            + noise * torch.randn(shape, dtype=torch.float64)).float()


def encode_each(tensors, spec):
    """Per tensor: (rank, raw bytes, stored bytes, squared error, squared norm, kept exact,
    max abs error)."""
    codec, _, layout = spec.partition("@")
    rows = []
    for t in tensors:
        x = t.reshape(1, -1, 1, t.shape[-1]) if layout == "last" and t.dim() in (2, 3) else t
        raw = x.numel() * x.element_size()
        norm = x.double().pow(2).sum().item()
        try:
            buffer = actpack.encode(x, codec, seed=1)
        except RuntimeError:  # refused (non-finite values): the session keeps it exact
            rows.append((t.dim(), raw, raw, 0.0, norm, True, 0.0))
            continue
        diff = actpack.decode(buffer).double() - x.double()
        rows.append((t.dim(), raw, buffer.numel(), diff.pow(2).sum().item(), norm, False,
                     diff.abs().max().item() if diff.numel() else 0.0))
    return rows


def summarise(rows):
    """(ratio, relative RMS error, tensors kept exact, max abs error) of some of encode_each's
    rows."""
    raw = sum(r[1] for r in rows)
    stored = sum(r[2] for r in rows)
    return raw / stored, math.sqrt(sum(r[3] for r in rows) / sum(r[4] for r in rows)), \
        sum(r[5] for r in rows), max(r[6] for r in rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["cnn", "transformer", "smooth", "all"], default="all",
                        help="smooth: synthetic image-like maps [4, 16, 56, 56], noise 0.02 and 0.2")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--codecs", nargs="+", default=DEFAULT_CODECS)
    args = parser.parse_args(argv)
    models = ["cnn", "transformer", "smooth"] if args.model == "all" else [args.model]
    datasets = []
    for name in models:
        if name == "smooth":
            for noise in (0.02, 0.2):
                x = smooth_maps(noise)
                datasets.append((f"smooth maps {tuple(x.shape)}, noise {noise}", [x]))
            continue
        tensors = saved_activations(name, args.steps, args.batch, args.context)
        shapes = sorted({tuple(t.shape) for t in tensors})
        datasets.append((f"{name}: {len(tensors)} saved float tensors after {args.steps} steps "
                         f"(batch {args.batch}, context {args.context}); shapes {shapes}", tensors))
    for title, tensors in datasets:
        print(f"\n{title}")
        ranks = sorted({t.dim() for t in tensors})
        header = f"{'codec':<36} {'ratio':>6} {'rel rms':>8} {'max abs':>8}"
        for rank in ranks:
            header += f" | {rank}-D ratio  rel rms"
        print(header)
        for spec in args.codecs:
            rows = encode_each(tensors, spec)
            ratio, error, exact, max_abs = summarise(rows)
            line = f"{spec:<36} {ratio:>6.2f} {error:>8.4f} {max_abs:>8.3g}"
            for rank in ranks:
                r, e, _, _ = summarise([row for row in rows if row[0] == rank])
                line += f" | {r:>10.2f} {e:>8.4f}"
            print(line + (f"  ({exact} kept exact)" if exact else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
