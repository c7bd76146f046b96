"""Record the allocation trace of real training steps of the demo models (tools/demo.py) on the
CPU, through actpack's CPU allocator and its tracing adaptor, as the text format of
allocator/testing/alloc_trace.h: one line per operation, `alloc ID SIZE STREAM` or `free ID`,
with the sizes torch asked for. allocator_benchmark and tools/gpu_allocator_benchmark.py replay
the files. The committed traces in allocator/testdata/ come from:

    python tools/record_trace.py --model cnn --out allocator/testdata/cnn_step.trace
    python tools/record_trace.py --model transformer --out allocator/testdata/transformer_step.trace

The steps run after --warmup steps (so that Adam's state and torch's lazy buffers exist, as in
the steady state of a training loop), on one thread (so the sequence does not depend on the
core count). Frees of tensors allocated before the window (none in a steady step) are left out,
and tensors still live at its end are freed at the end, so that the trace replays in a loop.
"""
import argparse
import os

import torch

import actpack
from actpack import _C

from benchmarks import demo  # the demo's models and data

HEADER = "# actpack allocation trace v1"


def trace_lines(entries):
    """The trace lines of tracing-adaptor entries (memory_snapshot()["device_traces"][d]).

    Returns (lines, counts): `alloc`s get IDs in order; a `free_requested` of an address
    allocated in the window becomes `free ID`; other actions (segments, free_completed, oom)
    are the allocator's, not the program's. Still-live allocations are freed at the end.
    """
    lines, live = [], {}
    counts = {"allocs": 0, "frees": 0, "outside_frees": 0, "freed_at_end": 0}
    for entry in entries:
        action, address = entry["action"], entry["addr"]
        if action == "alloc":
            if address in live:
                raise ValueError(f"actpack: the trace allocates {address:#x} twice without a free")
            live[address] = counts["allocs"]
            lines.append(f"alloc {counts['allocs']} {entry['requested_size']} {entry['stream']}")
            counts["allocs"] += 1
        elif action == "free_requested":
            if address not in live:
                counts["outside_frees"] += 1  # allocated before the window
                continue
            lines.append(f"free {live.pop(address)}")
            counts["frees"] += 1
    if live:
        lines.append(f"# {len(live)} allocation(s) still live at the end of the window")
        for trace_id in live.values():
            lines.append(f"free {trace_id}")
        counts["freed_at_end"] = len(live)
    return lines, counts


def record(model_name, steps, warmup, batch, context, seed):
    """Train `warmup` + `steps` steps; returns the trace entries of the last `steps`."""
    torch.set_num_threads(1)
    actpack.install_cpu_allocator()
    torch.manual_seed(seed)
    model = demo.MODELS[model_name](context=context)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = demo.batches(demo.load_corpus(), batch, context, seed, torch.device("cpu"))

    step = demo.training_step(model, optimizer, data)

    for _ in range(warmup):
        step()
    _C._clear_trace(_C._HOST_DEVICE)
    for _ in range(steps):
        step()
    entries = actpack.memory_snapshot("cpu")["device_traces"][0]
    dropped = _C._trace_dropped(_C._HOST_DEVICE)
    if dropped:
        raise SystemExit(f"actpack: the trace ring overflowed ({dropped} entries lost); "
                         "record fewer steps")
    return entries


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(demo.MODELS), default="cnn")
    parser.add_argument("--steps", type=int, default=1, help="steps recorded")
    parser.add_argument("--warmup", type=int, default=3, help="steps run before recording")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the trace file to write")
    args = parser.parse_args(argv)

    entries = record(args.model, args.steps, args.warmup, args.batch, args.context, args.seed)
    lines, counts = trace_lines(entries)
    live = peak = 0
    sizes = {}
    for line in lines:
        fields = line.split()
        if fields[0] == "alloc":
            sizes[fields[1]] = int(fields[2])
            live += int(fields[2])
            peak = max(peak, live)
        elif fields[0] == "free":
            live -= sizes[fields[1]]
    command = (f"python tools/record_trace.py --model {args.model} --steps {args.steps} "
               f"--warmup {args.warmup} --batch {args.batch} --context {args.context} "
               f"--seed {args.seed} --out {args.out}")
    header = [
        HEADER,
        f"# {args.steps} training step(s) of tools/demo.py's {args.model} model on the CPU "
        f"(batch {args.batch}, context {args.context}, Adam), after {args.warmup} warm-up steps",
        f"# torch {torch.__version__}, one thread; recorded by: {command}",
        f"# {counts['allocs']} allocations, peak {peak} bytes requested and live; "
        f"{counts['outside_frees']} frees of older tensors left out",
    ]
    with open(args.out, "w") as f:
        f.write("\n".join(header + lines) + "\n")
    print(f"{args.out}: {counts['allocs']} allocations, {counts['frees']} frees in the window, "
          f"{counts['freed_at_end']} freed at the end, peak {actpack.format_bytes(peak)}, "
          f"{os.path.getsize(args.out)} bytes")
