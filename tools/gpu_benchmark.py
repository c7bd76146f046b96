"""Codec throughput on the GPU as a fraction of a device-to-device copy of the same bytes,
both measured in this run (CUDA events, warm-up, median of repeats, 64 MiB and 256 MiB fp32;
and the device's own time from torch.profiler, without the host's part of a call),
beside what the CUDA emulator's traffic table predicts (codecs/cuda/traffic.tsv: the bytes DRAM
must move per input byte and the launches of each encode and decode, at this copy's measured
bandwidth and 2 us a launch): the first GPU run checks that model.

    python3 tools/gpu_benchmark.py            # prints a table; run by tools/gpu_check.sh
"""
import csv
import os
import statistics

import torch

import actpack

TRAFFIC = os.path.join(os.path.dirname(__file__), "..", "codecs", "cuda", "traffic.tsv")
PER_LAUNCH_SECONDS = 2e-6


def predicted(spec, nbytes, copy_ms):
    """The traffic table's fraction of a copy for `spec`'s float32 encode and decode."""
    codec = {"eb:rel=1e-2": "eb"}.get(spec, spec)
    rows = {}
    with open(TRAFFIC) as f:
        for row in csv.DictReader((l for l in f if not l.startswith("#")), delimiter="\t"):
            if row["codec"] == codec and row["dtype"] == "float32" and row["kernel"] == "(all)":
                rows[row["phase"]] = row
    if len(rows) != 2:
        return None, None
    bandwidth = 2 * nbytes / (copy_ms / 1e3)  # the copy reads and writes every byte
    fractions = []
    for phase in ("encode", "decode"):
        seconds = (float(rows[phase]["dram_per_input_byte"]) * nbytes / bandwidth +
                   int(rows[phase]["launches"]) * PER_LAUNCH_SECONDS)
        fractions.append(copy_ms / 1e3 / seconds)
    return fractions


def time_ms(fn, repeats=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def device_ms(fn, repeats=10, warmup=3):
    """The device's own time per call of `fn` (its kernels and copies, from torch.profiler's
    CUDA activity), or None where the profiler gives none. Unlike the CUDA events around a
    call, this leaves out the host's part: the standalone actpack.encode reads its status
    back (one wait per call, which training does not make) and returns to Python before the
    end event is queued, so the events measure the host's turnaround as well."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                fn()
            torch.cuda.synchronize()
        total_us = sum(getattr(e, "self_device_time_total", None) or
                       getattr(e, "self_cuda_time_total", 0) for e in prof.key_averages())
    except Exception as error:  # a profiler that cannot trace here: the column says so
        print(f"gpu_benchmark: no device times from torch.profiler ({error})")
        return None
    return total_us / 1e3 / repeats if total_us else None


def main():
    if not torch.cuda.is_available():
        raise SystemExit("gpu_benchmark: no CUDA device")
    print(f"device: {torch.cuda.get_device_name()}")
    # enc/copy, dec/copy: CUDA events around each call (host turnaround included); kern:
    # the device's own time (torch.profiler), which is what a training step's packing costs.
    print(f"{'codec':<22} {'size':>8} {'copy GB/s':>10} {'enc GB/s':>9} {'dec GB/s':>9} "
          f"{'enc/copy':>9} {'dec/copy':>9} {'e+d/copy':>9} {'ratio':>7} "
          f"{'kern enc':>9} {'kern dec':>9} {'pred enc':>9} {'pred dec':>9}")
    for mib in (64, 256):
        n = mib * (1 << 20) // 4
        x = torch.randn(n, device="cuda").relu_()
        y = torch.empty_like(x)
        copy = time_ms(lambda: y.copy_(x))
        copy_device = device_ms(lambda: y.copy_(x))
        nbytes = x.numel() * 4
        # division pools 8x8 windows of NCHW maps: the same values as [n, 64, 64, 64].
        for spec, tensor in (("identity", x), ("quant2", x), ("quant4", x), ("quant8", x),
                             ("eb:rel=1e-2", x), ("eb:rel=1e-3", x),
                             ("division", x.view(-1, 64, 64, 64))):
            buffer = actpack.encode(tensor, spec)
            encode = time_ms(lambda: actpack.encode(tensor, spec))
            decode = time_ms(lambda: actpack.decode(buffer))
            encode_device = device_ms(lambda: actpack.encode(tensor, spec))
            decode_device = device_ms(lambda: actpack.decode(buffer))
            gbs = lambda ms: nbytes / ms / 1e6
            pred_encode, pred_decode = predicted(spec, nbytes, copy)
            shown = lambda v: f"{v:>9.2f}" if v is not None else f"{'-':>9}"
            fraction = lambda ms: copy_device / ms if ms and copy_device else None
            print(f"{spec:<22} {mib:>5}MiB {gbs(copy):>10.0f} {gbs(encode):>9.0f} "
                  f"{gbs(decode):>9.0f} {copy / encode:>9.2f} {copy / decode:>9.2f} "
                  f"{2 * copy / (encode + decode):>9.2f} {nbytes / buffer.numel():>7.2f} "
                  f"{shown(fraction(encode_device))} {shown(fraction(decode_device))} "
                  f"{shown(pred_encode)} {shown(pred_decode)}")


if __name__ == "__main__":
    main()
