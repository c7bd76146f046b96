"""Codec throughput through the Python package (actpack.encode / actpack.decode) as a fraction of
memcpy measured side by side, to compare with the C++ benchmark's fractions at the same size:

    python3 tools/package_speed.py [--shape 16,256,28,28] [--rounds 15] [--threads 2]
    bazel run -c opt //codecs:codecs_benchmark -- --sizes=3211264

memcpy is one single-threaded copy of the tensor's bytes (ctypes.memmove), as in the C++
benchmark; GB/s count the raw tensor's bytes.
"""
import argparse
import ctypes
import statistics
import time

import torch

import actpack

SPECS = ("quant1", "quant2", "quant4", "quant8", "cast:fp16", "cast:bf16", "mask", "pool4",
         "division", "eb:rel=1e-2", "identity")


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
    shape = [int(d) for d in args.shape.split(",")]
    torch.manual_seed(0)
    relu = torch.randn(shape).clamp_(min=0)
    mask = (relu > 0).float() * 2
    copy = torch.empty_like(relu)
    raw = relu.numel() * 4
    print(f"actpack package: float32 {shape} ({raw / 2**20:.1f} MiB), torch threads "
          f"{torch.get_num_threads()}, median of {args.rounds} rounds\n")
    print("| codec | encode GB/s | decode GB/s | memcpy GB/s | encode / memcpy | decode / memcpy |")
    print("|---|---|---|---|---|---|")
    for spec in SPECS:
        x = mask if spec == "mask" else relu
        buffer = actpack.encode(x, spec)
        actpack.decode(buffer)
        t_copy, t_encode, t_decode = [], [], []
        for _ in range(args.rounds):
            t_copy.append(seconds(lambda: ctypes.memmove(copy.data_ptr(), x.data_ptr(), raw)))
            t_encode.append(seconds(lambda: actpack.encode(x, spec)))
            t_decode.append(seconds(lambda: actpack.decode(buffer)))
        c, e, d = (statistics.median(t) for t in (t_copy, t_encode, t_decode))
        print(f"| {spec} | {raw / e / 1e9:.2f} | {raw / d / 1e9:.2f} | {raw / c / 1e9:.2f} | "
              f"{100 * c / e:.0f}% | {100 * c / d:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
