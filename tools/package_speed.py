"""Codec throughput through the Python package (actpack.encode / actpack.decode) as a fraction of
memcpy measured side by side, to compare with the C++ benchmark's fractions at the same size:

    python3 tools/package_speed.py [--shape 16,256,28,28] [--rounds 15] [--threads 2]
    bazel run -c opt //codecs:codecs_benchmark -- --sizes=3211264

The cases are the C++ benchmark's (codecs/codecs_benchmark.cc): the same codecs on the same
kind of data laid out the same way, n values (the product of --shape): post-ReLU values of a
normal distribution as a 1-D tensor (for `mask`, the ReLU's mask scaled like a dropout mask),
a smooth 2-D field [n / 1024, 1024], NCHW maps [n / 64^3, 64, 64, 64] or tokens
[n / 65536, 128, 512]. memcpy is one single-threaded copy of the tensor's bytes
(ctypes.memmove), as in the C++ benchmark; GB/s count the raw tensor's bytes. The package runs
the codecs on torch's intra-op pool (--threads), the benchmark on its own pool (a thread per
core).
"""
import argparse
import ctypes
import math
import statistics
import time

import torch

import actpack

# (codec, data, label), as kCases in codecs/codecs_benchmark.cc.
CASES = (("quant1", "activations", "1-D"), ("quant2", "activations", "1-D"),
         ("quant4", "activations", "1-D"), ("quant8", "activations", "1-D"),
         ("quant2", "nchw", "NCHW"), ("cast:fp16", "activations", "1-D"),
         ("cast:bf16", "activations", "1-D"), ("mask", "activations", "1-D"),
         ("pool4", "activations", "1-D"), ("division", "nchw", "NCHW"),
         ("division", "tokens", "tokens"), ("eb:rel=1e-2", "activations", "1-D"),
         ("eb:rel=1e-3", "activations", "1-D"), ("eb:rel=1e-2", "smooth", "smooth 2-D"),
         ("identity", "activations", "1-D"), ("division_dct", "nchw", "NCHW"),
         ("division_dct", "tokens", "tokens"), ("division_dct:keep=8,bits=2", "nchw", "NCHW"))


def data(n, spec, kind):
    """The benchmark's input for a case, n values (fewer where the layout divides n)."""
    if kind == "smooth":
        i = torch.arange(n - n % 1024, dtype=torch.float32)
        return (torch.sin((i % 1024) / 37.0) * torch.cos(torch.floor(i / 1024) / 23.0)).reshape(
            -1, 1024)
    shape = {"activations": [n], "nchw": [n // 64 ** 3, 64, 64, 64],
             "tokens": [n // (128 * 512), 128, 512]}[kind]
    x = torch.randn(shape).clamp_(min=0)
    return (x > 0).float() * 2 if spec == "mask" else x


def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="16,256,28,28")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n = math.prod(int(d) for d in args.shape.split(","))
    torch.manual_seed(0)
    print(f"actpack package: float32, {n} values ({n * 4 / 2**20:.1f} MiB), torch threads "
          f"{torch.get_num_threads()}, median of {args.rounds} rounds\n")
    print("| codec | data | encode GB/s | decode GB/s | memcpy GB/s | encode / memcpy | "
          "decode / memcpy |")
    print("|---|---|---|---|---|---|---|")
    for spec, kind, label in CASES:
        x = data(n, spec, kind)
        if x.numel() == 0:
            continue  # the layout needs more values
        copy = torch.empty_like(x)
        raw = x.numel() * 4
        buffer = actpack.encode(x, spec)
        actpack.decode(buffer)
        t_copy, t_encode, t_decode = [], [], []
        for _ in range(args.rounds):
            t_copy.append(seconds(lambda: ctypes.memmove(copy.data_ptr(), x.data_ptr(), raw)))
            t_encode.append(seconds(lambda: actpack.encode(x, spec)))
            t_decode.append(seconds(lambda: actpack.decode(buffer)))
        c, e, d = (statistics.median(t) for t in (t_copy, t_encode, t_decode))
        print(f"| {spec} | {label} | {raw / e / 1e9:.2f} | {raw / d / 1e9:.2f} | "
              f"{raw / c / 1e9:.2f} | {100 * c / e:.0f}% | {100 * c / d:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
