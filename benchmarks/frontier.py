"""Error per byte of the lossy codecs on real activations: which low part DIVISION should keep.

    python3 benchmarks/frontier.py                   # the four suite models, 300 steps, 3 draws
    python3 benchmarks/frontier.py --smoke           # tiny models, 2 steps (the test command)
    python3 benchmarks/frontier.py --picture benchmarks/results/frontier.json   # the SVG again

For each of the suite's models (benchmarks/models.py, "cpu" sizes) trained for `--steps` steps
on real data (natural images: the photographs scikit-image ships and scikit-learn's
handwritten digits, cropped and resized; for the GPT, the Python standard library's source
text), one more training step is run exactly and then once per codec with every saved
activation of at least 64 KiB (floating, not a parameter, as actpack's session packs) replaced
by its decoded copy (a ReLU's backward reads its own 1-bit mask, exact, as in actpack's
session). Per model and codec the file records the bytes stored over the raw bytes,
the relative RMS error over all those tensors, and the parameters' gradient against the exact
step's: cosine and relative error, each the mean over `--draws` encodes with different seeds
(one draw's cosine moves by 0.1 where the error is near 0.4), with the cosines' range.

Codecs are actpack's own (`actpack.encode` / `actpack.decode`) and, for the choice of
DIVISION's low part, simulated ones (`sim:<transform>:keep=k`): the low part is the lowest
frequencies of each plane's real 2-D transform (per channel, along tokens for [B, T, C]
tensors: the view of codecs/FORMAT.md), either the DFT's (what the retired `division_fft`
stored: (2k-1) x k complex float16 pairs a plane) or the DCT-II's (`division_dct`'s: at most
k x k bfloat16 values, a quarter of each axis at most); the residual is quantized exactly as
`division`'s groups are (128 values, a bfloat16 min and step, stochastic 2-bit codes), so a
simulated row differs from a real one only by its low part and rounding. `sim:dct` beside
`division_dct:keep=4,bits=2` shows the simulation is faithful.

Writes a JSON file (command, commit, machine, one row per model and codec) and an SVG (error
against bits per value, one panel per model). CPU; about 15 minutes on 2 cores with
--steps 200 --draws 1, half an hour at --draws 3.
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import models, provenance  # noqa: E402

import actpack  # noqa: E402

HEADER_BYTES = 128  # codecs/FORMAT.md: every encoded tensor's header
MIN_BYTES = 64 << 10  # the session's default: smaller tensors stay exact

CODECS = ["quant2", "quant4", "quant8", "eb:rel=1e-2", "eb:rel=1e-3", "pool2", "pool4",
          "division:block=4,bits=2", "division", "division:block=16,bits=2",
          "division_dct", "division_dct:keep=2,bits=2", "division_dct:keep=4,bits=2",
          "division_dct:keep=8,bits=2", "division_dct:keep=16,bits=2",
          "division_dct:keep=32,bits=2", "sim:dct:keep=4", "sim:dct:keep=16",
          "sim:dft:keep=1", "sim:dft:keep=2", "sim:dft:keep=4", "sim:dft:keep=8"]


# ---- natural images ----

PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field",
          "immunohistochemistry", "retina", "camera", "coins", "moon", "brick", "grass",
          "gravel", "cell", "page", "text", "colorwheel"]


def image_sources():
    """[3, h, w] float images in [0, 1]: scikit-image's bundled photographs, then the 1797
    handwritten digits of scikit-learn (8 x 8, as [3, 8, 8]). Class = photo index, or the
    number of photos + the digit."""
    import numpy as np
    import skimage.data
    from sklearn.datasets import load_digits

    photos = []
    for name in PHOTOS:
        a = np.asarray(getattr(skimage.data, name)(), dtype=np.float32) / 255.0
        if a.ndim == 2:
            a = np.repeat(a[:, :, None], 3, axis=2)
        photos.append(torch.from_numpy(np.ascontiguousarray(a[:, :, :3])).permute(2, 0, 1))
    digits = load_digits()
    images = torch.from_numpy(digits.images.astype("float32") / 16.0)
    return photos, images[:, None].expand(-1, 3, -1, -1), torch.from_numpy(digits.target)


class ImageData:
    """Deterministic batches of natural images at `size` x `size`: half random crops of the
    photographs (a side of 1/4 to all of the shorter edge, flipped at random), half digits
    upsampled bilinearly with a random shift. Labels for classification: the source; for
    segmentation: whether a pixel is brighter than its 9 x 9 neighbourhood."""

    def __init__(self, size):
        self.size = size
        self.photos, self.digits, self.digit_labels = image_sources()

    def batch(self, n, index, segmentation=False):
        g = torch.Generator().manual_seed(7000 + index)
        xs, labels = [], []
        for _ in range(n):
            if torch.rand((), generator=g) < 0.5:
                k = int(torch.randint(len(self.photos), (), generator=g))
                photo = self.photos[k]
                short = min(photo.shape[1:])
                side = int(torch.randint(short // 4, short + 1, (), generator=g))
                top = int(torch.randint(photo.shape[1] - side + 1, (), generator=g))
                left = int(torch.randint(photo.shape[2] - side + 1, (), generator=g))
                crop = photo[:, top:top + side, left:left + side]
                if torch.rand((), generator=g) < 0.5:
                    crop = crop.flip(2)
                x = F.interpolate(crop[None], size=(self.size, self.size), mode="area")[0]
                labels.append(k)
            else:
                k = int(torch.randint(len(self.digits), (), generator=g))
                x = F.interpolate(self.digits[k][None], size=(self.size, self.size),
                                  mode="bilinear", align_corners=False)[0]
                shift = torch.randint(-self.size // 8, self.size // 8 + 1, (2,), generator=g)
                x = torch.roll(x, tuple(shift.tolist()), (1, 2))
                labels.append(len(self.photos) + int(self.digit_labels[k]))
            xs.append(x)
        x = (torch.stack(xs) - 0.45) / 0.25
        if segmentation:
            light = x.mean(1, keepdim=True)
            return x, (light > F.avg_pool2d(light, 9, 1, 4)).squeeze(1).long()
        return x, torch.tensor(labels)


# ---- simulated DIVISION low parts ----

def plane_view(t):
    """[P, C, H, W] of codecs/FORMAT.md's [P, H, W, C] view (a copy, float64)."""
    d = t.dim()
    if d >= 4:
        v = t.reshape(-1, 1, t.shape[-2], t.shape[-1])
    elif d in (2, 3):
        v = t.reshape(-1, t.shape[-2], t.shape[-1]).transpose(1, 2)[:, :, :, None]
    else:
        v = t.reshape(1, 1, 1, -1)
    return v.double()


def from_plane_view(v, t):
    d = t.dim()
    if d in (2, 3):
        v = v[:, :, :, 0].transpose(1, 2)
    return v.reshape(t.shape).to(t.dtype)


def dct_matrix(n, keep):
    """The first `keep` rows of the orthonormal DCT-II of size n, [keep, n] float64."""
    k = torch.arange(keep, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    m = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    m[0] /= math.sqrt(2.0)
    return m


def ceil_div(a, b):
    return -(-a // b)


def low_part(v, transform, keep):
    """(approximation, LFC bytes) of planes v [P, C, H, W]."""
    P, C, H, W = v.shape
    if transform == "dct":
        kh, kw = min(keep, ceil_div(H, 4)), min(keep, ceil_div(W, 4))
        A, B = dct_matrix(H, kh), dct_matrix(W, kw)
        coeffs = torch.einsum("uh,pchw,vw->pcuv", A, v, B)
        # Stored in bfloat16 (relative rounding: the scale does not matter).
        coeffs = coeffs.float().bfloat16().double()
        return torch.einsum("uh,pcuv,vw->pchw", A, coeffs, B), 2 * P * C * kh * kw
    X = torch.fft.rfft2(v, norm="forward")
    rows = list(range(H)) if 2 * keep - 1 >= H else \
        list(range(keep)) + list(range(H - keep + 1, H))
    cols = min(keep, W // 2 + 1)
    kept = torch.zeros_like(X)
    sel = X[:, :, rows, :cols]
    kept[:, :, rows, :cols] = torch.complex(sel.real.half().double(), sel.imag.half().double())
    return torch.fft.irfft2(kept, s=(H, W), norm="forward"), 4 * P * C * len(rows) * cols


def bf16_down(x):
    """x rounded toward -inf to bfloat16."""
    y = x.float().bfloat16().double()
    return torch.where(y > x, torch.nextafter(y.float().bfloat16(),
                                              torch.tensor(-math.inf, dtype=torch.bfloat16))
                       .double(), y)


def bf16_up(x):
    y = x.float().bfloat16().double()
    return torch.where(y < x, torch.nextafter(y.float().bfloat16(),
                                              torch.tensor(math.inf, dtype=torch.bfloat16))
                       .double(), y)


def quantize_residual(r, bits, group, generator):
    """(decoded residual, bytes) of residual planes r [P, n] with `division`'s groups
    (codecs/FORMAT.md: near-equal chunks of a multiple of 32 values)."""
    P, n = r.shape
    chunks = ceil_div(n, group)
    length = 32 * ceil_div(ceil_div(n, chunks), 32)
    groups = ceil_div(n, length)
    padded = F.pad(r, (0, groups * length - n), value=float("nan")).reshape(P, groups, length)
    lo = torch.nan_to_num(padded, nan=math.inf).amin(2, keepdim=True)
    hi = torch.nan_to_num(padded, nan=-math.inf).amax(2, keepdim=True)
    lo = bf16_down(lo)
    step = bf16_up((hi - lo) / (2 ** bits - 1))
    u = torch.rand(padded.shape, generator=generator, dtype=torch.float64)
    codes = torch.where(step > 0, torch.floor((padded - lo) / torch.where(step > 0, step, 1) + u),
                        torch.zeros_like(padded)).clamp(0, 2 ** bits - 1)
    out = (codes * step + lo).reshape(P, -1)[:, :n]
    return out, 4 * P * groups + 4 * P * ceil_div(n * bits, 32)


def simulate(t, transform, keep, generator, bits=2, group=128):
    """(decoded tensor, stored bytes) of the simulated codec."""
    v = plane_view(t)
    approx, lfc_bytes = low_part(v, transform, keep)
    P, C, H, W = v.shape
    # Residual groups run over a plane's H * W * C values in the view's row-major order.
    r = (v - approx).permute(0, 2, 3, 1).reshape(P, -1)
    decoded, residual_bytes = quantize_residual(r, bits, group, generator)
    y = approx + decoded.reshape(P, H, W, C).permute(0, 3, 1, 2)
    return from_plane_view(y, t), HEADER_BYTES + lfc_bytes + residual_bytes


def round_trip(t, spec, generator):
    """(decoded copy, stored bytes) of `t` under `spec`; (t, raw bytes) where refused."""
    if spec.startswith("sim:"):
        _, transform, strength = spec.split(":")
        return simulate(t, transform, int(strength.split("=")[1]), generator)
    try:
        buffer = actpack.encode(t, spec, seed=int(torch.randint(1 << 30, (), generator=generator)))
    except RuntimeError:  # refused (non-finite values): the session keeps it exact
        return t, t.numel() * t.element_size()
    return actpack.decode(buffer).reshape(t.shape), buffer.numel()


# ---- the measurement ----

class _MaskedRelu(torch.autograd.Function):
    """ReLU whose backward reads a 1-bit mask of its output, not the output: actpack's session
    keeps a ReLU's own mask exact (a sign mask) and packs the tensor only for its other readers,
    so a codec's error never opens a dead unit's gradient."""

    @staticmethod
    def forward(ctx, x):
        y = x.clamp_min(0)
        ctx.save_for_backward(y > 0)  # bool: never packed
        return y

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask


class MaskedRelu(torch.nn.Module):
    def forward(self, x):
        return _MaskedRelu.apply(x)


def mask_relus(module):
    """Every nn.ReLU of `module` replaced by MaskedRelu, in place."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.ReLU):
            setattr(module, name, MaskedRelu())
        else:
            mask_relus(child)
    return module


class Step:
    """One training step of a task's model on a fixed batch, exact or with every packable
    saved activation replaced by its round trip through a codec."""

    def __init__(self, task, steps, batch, images, log):
        self.task, self.batch, self.images = task, batch, images
        self.model = mask_relus(task.model(torch.device("cpu")))
        optimizer = task.make_optimizer(self.model)
        for i in range(steps):
            loss = self.loss(batch, i, images)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if (i + 1) % 50 == 0 or i + 1 == steps:
                log(f"  {task.name}: step {i + 1}/{steps}, loss {loss.item():.3f}")
        self.index = steps
        self.parameters = {p.data_ptr() for p in self.model.parameters()}

    def loss(self, batch, index, images):
        if self.task.kind == "gpt":
            x, y = self.task.batch(batch, index, torch.device("cpu"))
        else:
            x, y = images.batch(batch, index, segmentation=self.task.kind == "unet")
            if self.task.kind != "unet":
                y = y % self.task.classes
        return self.task.loss(self.model(x), y)

    def gradients(self, spec=None, seed=0):
        """(flat gradient, raw bytes, stored bytes, squared error, squared norm, tensors)."""
        generator = torch.Generator().manual_seed(seed)
        cache, totals = {}, [0, 0, 0.0, 0.0]

        def pack(t):
            if (spec is None or not t.is_floating_point() or t.numel() * t.element_size() < MIN_BYTES
                    or t.data_ptr() in self.parameters):
                return t
            # The same tensor saved twice is stored once. The cache holds the tensor itself, so
            # its memory cannot be reused by another one with the same address while keyed.
            key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t._version)
            if key not in cache:
                x = t.detach().contiguous()
                decoded, stored = round_trip(x, spec, generator)
                diff = decoded.double() - x.double()
                totals[0] += x.numel() * x.element_size()
                totals[1] += stored
                totals[2] += diff.pow(2).sum().item()
                totals[3] += x.double().pow(2).sum().item()
                cache[key] = (t, decoded)
            return cache[key][1]

        self.model.zero_grad(set_to_none=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            self.loss(self.batch, self.index, self.images).backward()
        flat = torch.cat([p.grad.reshape(-1).double() for p in self.model.parameters()
                          if p.grad is not None])
        return flat, totals, len(cache)


def measure(task, codecs, steps, batch, images, log, draws=3):
    """One row per codec: bytes of the first draw (the same in every draw but eb's), the
    relative error and the gradient's cosine and relative error as the mean over `draws`
    encodes with different seeds, and the cosines' range."""
    step = Step(task, steps, batch, images, log)
    exact, _, _ = step.gradients()
    rows = []
    for spec in codecs:
        errors, cosines, gradient_errors = [], [], []
        for draw in range(draws):
            grad, (raw, stored, err, norm), tensors = step.gradients(spec, seed=1 + draw)
            if draw == 0:
                first = (raw, stored, tensors)
            errors.append(math.sqrt(err / norm) if norm else 0.0)
            cosines.append((grad @ exact / (grad.norm() * exact.norm())).item())
            gradient_errors.append(((grad - exact).norm() / exact.norm()).item())
        raw, stored, tensors = first
        rows.append({
            "model": task.name, "codec": spec, "tensors": tensors, "raw_bytes": raw,
            "stored_bytes": stored, "bits_per_value": 32.0 * stored / raw if raw else None,
            "ratio": raw / stored if stored else None, "draws": draws,
            "rel_error": sum(errors) / draws,
            "grad_cosine": sum(cosines) / draws,
            "grad_cosine_min": min(cosines), "grad_cosine_max": max(cosines),
            "grad_rel_error": sum(gradient_errors) / draws})
        r = rows[-1]
        log(f"  {task.name:<10} {spec:<28} {r['bits_per_value']:6.2f} bits/value  rel error "
            f"{r['rel_error']:.4f}  gradient cosine {r['grad_cosine']:.5f} "
            f"({r['grad_cosine_min']:.4f}-{r['grad_cosine_max']:.4f})")
    return rows


def picture(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["model"] for r in results["rows"]))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        families = {}
        for r in results["rows"]:
            if r["model"] != name or r["rel_error"] is None:
                continue
            family = r["codec"].split(":")[0].rstrip("0123456789") if not r["codec"].startswith(
                "sim:") else ":".join(r["codec"].split(":")[:2])
            families.setdefault(family, []).append((r["bits_per_value"], r["rel_error"]))
        for family, points in families.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", ms=3, label=family)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ticks = [2, 3, 4, 6, 8, 16, 32]
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("bits stored per value (float32 = 32)")
        ax.set_title(name)
    axes[0][0].set_ylabel("relative RMS error of the saved activations")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, format="svg")
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny models, 2 training steps (what the test command runs)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 300)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--draws", type=int, default=3,
                        help="encodes per codec with different seeds (the cosine's mean and range)")
    parser.add_argument("--models", nargs="+", default=None,
                        help="suite names: resnet50 vit-b16 unet gpt2-small (default all)")
    parser.add_argument("--codecs", nargs="+", default=CODECS)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                      "frontier.json"))
    parser.add_argument("--picture", metavar="JSON",
                        help="only draw the SVG of a result file (beside it), measuring nothing")
    args = parser.parse_args(argv)
    if args.picture:
        with open(args.picture) as f:
            picture(json.load(f), os.path.splitext(args.picture)[0] + ".svg")
        return 0
    steps = args.steps if args.steps is not None else (2 if args.smoke else 300)
    size = "smoke" if args.smoke else "cpu"
    torch.manual_seed(0)
    chosen = [t for t in models.tasks(size) if args.models is None or t.name in args.models]
    image_size = next((t.image for t in chosen if t.image), 32)
    images = ImageData(image_size) if any(t.kind != "gpt" for t in chosen) else None
    results = {"size": size, "steps": steps, "batch": args.batch, "draws": args.draws,
               **provenance.record(),
               "rows": []}
    for task in chosen:
        print(f"{task.name}: {steps} training steps at batch {args.batch}", flush=True)
        results["rows"] += measure(task, args.codecs, steps, args.batch, images,
                                   lambda s: print(s, flush=True), args.draws)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    picture(results, os.path.splitext(args.out)[0] + ".svg")
    print(f"frontier: {len(results['rows'])} rows over {len(chosen)} models -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
