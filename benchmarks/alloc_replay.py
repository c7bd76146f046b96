"""Replay recorded training-step allocation traces (allocator/testdata/*.trace, written by
tools/record_trace.py) on the GPU through three allocators, each in a fresh process, and print
per-operation latency and, at the trace's peak, requested / allocated / reserved memory side by
side:

  actpack          actpack's CUDA stack (caching pool + budget + stats + trace), as
                   actpack.install_allocator serves torch;
  torch            PyTorch's caching allocator (the native backend);
  cudaMallocAsync  PyTorch with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync.

Latency is measured twice: "C++ ns/op" replays the trace in a C++ loop (alloc_replay.cc, built on
first use: actpack's stack through its C ABI, or the c10 allocator behind torch's CUDA tensors),
which is what an allocation
costs inside torch; "py ns/op" makes one Python call per operation (ctypes actpack_alloc /
actpack_free; torch.cuda.caching_allocator_alloc / caching_allocator_delete), call overhead
included. Memory is read right after the trace's peak op, on a pass after a warm-up pass (the
steady state of a training loop).

    python3 tools/gpu_allocator_benchmark.py [--json results.json]   # run by tools/gpu_check.sh
"""
import argparse
import ctypes
import glob
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY_POINT = os.path.join(ROOT, "tools", "gpu_allocator_benchmark.py")  # runs main()
TRACE_DIR = os.path.join(ROOT, "allocator", "testdata")
EXPECTED = "expected 'alloc ID SIZE STREAM' or 'free ID'"
MiB = 1 << 20
TARGETS = {
    # name: (worker kind, PYTORCH_CUDA_ALLOC_CONF)
    "actpack": ("actpack", None),
    "torch": ("torch", "backend:native"),
    "cudaMallocAsync": ("torch", "backend:cudaMallocAsync"),
}


# ---- Traces (the format of allocator/testing/alloc_trace.h; the same checks and messages) ----

@dataclass
class Trace:
    name: str
    ops: list = field(default_factory=list)  # (is_alloc, slot, bytes, stream id)
    slots: int = 0
    allocations: int = 0
    peak_live_bytes: int = 0
    peak_op: int = 0


def _unsigned(text):
    return int(text) if text.isascii() and text.isdigit() else None


def parse_trace(text, name="<trace>"):
    """Parse a trace's text; ValueError naming the line for anything malformed."""
    trace = Trace(name)
    live = {}  # id -> (slot, line)
    slot_bytes, slot_streams = [], []
    live_bytes = 0
    for number, line in enumerate(text.split("\n"), start=1):
        content = line.split("#", 1)[0].strip()
        if not content:
            continue

        def error(message):
            return ValueError(f"actpack: {name}:{number}: {message}")

        fields = content.split()
        is_alloc = fields[0] == "alloc" and len(fields) == 4
        if not is_alloc and not (fields[0] == "free" and len(fields) == 2):
            raise error(f"{EXPECTED}, got '{content}'")
        trace_id = _unsigned(fields[1])
        if trace_id is None:
            raise error(f"ID '{fields[1]}' is not an unsigned integer ({EXPECTED})")
        if not is_alloc:
            if trace_id not in live:
                raise error(f"free of ID {trace_id}, which is not live")
            slot, _ = live.pop(trace_id)
            trace.ops.append((False, slot, slot_bytes[slot], slot_streams[slot]))
            live_bytes -= slot_bytes[slot]
            continue
        nbytes, stream = _unsigned(fields[2]), _unsigned(fields[3])
        if nbytes is None:
            raise error(f"SIZE '{fields[2]}' is not a byte count ({EXPECTED})")
        if stream is None:
            raise error(f"STREAM '{fields[3]}' is not an unsigned integer ({EXPECTED})")
        if nbytes > 1 << 48:
            raise error(f"SIZE {nbytes} is over 256 TiB")
        if trace_id in live:
            raise error(f"alloc of ID {trace_id}, which is still live (allocated at line "
                        f"{live[trace_id][1]})")
        slot = len(slot_bytes)
        live[trace_id] = (slot, number)
        slot_bytes.append(nbytes)
        slot_streams.append(stream)
        trace.ops.append((True, slot, nbytes, stream))
        trace.allocations += 1
        live_bytes += nbytes
        if live_bytes > trace.peak_live_bytes:
            trace.peak_live_bytes, trace.peak_op = live_bytes, len(trace.ops) - 1
    if live:
        first_id, (_, first_line) = min(live.items(), key=lambda item: item[1][1])
        raise ValueError(f"actpack: {name}: {len(live)} allocation(s) never freed (first: ID "
                         f"{first_id} at line {first_line}); a trace must free everything")
    if not trace.ops:
        raise ValueError(f"actpack: {name}: no operations ({EXPECTED})")
    trace.slots = len(slot_bytes)
    return trace


def read_trace(path):
    with open(path) as f:
        return parse_trace(f.read(), os.path.basename(path))


def replay_ops(trace, stream_handles):
    """The trace's ops with stream ids mapped to handles (missing ids map to themselves)."""
    return [(is_alloc, slot, nbytes, stream_handles.get(stream, stream))
            for is_alloc, slot, nbytes, stream in trace.ops]


# ---- One allocator in this process (the worker) ----

_replay_module = None


def replay_module():
    """The C++ replay loop (alloc_replay.cc), compiled on first use and cached by torch's
    extension builder: a benchmark's tool, kept out of the actpack wheel."""
    global _replay_module
    if _replay_module is None:
        from torch.utils import cpp_extension
        _replay_module = cpp_extension.load(
            name="actpack_alloc_replay",
            sources=[os.path.join(os.path.dirname(os.path.abspath(__file__)), "alloc_replay.cc")],
            extra_cflags=["-O2"], verbose=False)
    return _replay_module


def replay(ops, target, repeats=1, pause_at=-1, on_pause=None):
    """Replay `ops` `repeats` times through `target` in C++; the seconds all passes took.
    target: "malloc", a tensor (its storage's c10 allocator) or actpack_target(device)."""
    return replay_module().replay(ops, target, repeats, pause_at, on_pause)


def _actpack_library():
    from actpack import _C
    lib = ctypes.CDLL(_C.__file__)
    lib.actpack_alloc.restype = ctypes.c_void_p
    lib.actpack_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.actpack_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    return lib


def actpack_target(device):
    """actpack's device stack `device` as a replay target: the C ABI torch calls, by address."""
    lib = _actpack_library()
    address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
    return (address(lib.actpack_alloc), address(lib.actpack_free),
            address(lib.actpack_last_error), device)


def _python_ns_per_op(ops, allocate, free, repeats):
    """One Python call per op, as a user of the public API would make them."""
    ptrs = [None] * (max(op[1] for op in ops) + 1)

    def once():
        for is_alloc, slot, nbytes, stream in ops:
            if is_alloc:
                ptrs[slot] = allocate(nbytes, stream)
            else:
                free(ptrs[slot], nbytes, stream)

    once()
    start = time.perf_counter()
    for _ in range(repeats):
        once()
    return (time.perf_counter() - start) * 1e9 / (repeats * len(ops))


def run_worker(kind, trace_path, repeats, backend="cuda"):
    """Replay one trace through one allocator in this process; returns a dict of results.

    kind "actpack": actpack's device stack 0 on `backend` ("cuda"; "host" runs the same code on
    the CPU, for tests). kind "torch": the c10 allocator behind torch's CUDA tensors, whichever
    backend PYTORCH_CUDA_ALLOC_CONF selected.
    """
    from actpack import _C
    import actpack

    trace = read_trace(trace_path)
    device = 0
    if backend == "cuda":
        torch.cuda.init()
        streams = {i: (0 if i == 0 else torch.cuda.Stream(device).cuda_stream)
                   for i in {op[3] for op in trace.ops}}
    else:
        streams = {}
    ops = replay_ops(trace, streams)
    result = {"trace": trace.name, "kind": kind, "ops": len(ops), "backend": backend,
              "requested_bytes": trace.peak_live_bytes}
    if kind == "actpack":
        _C._configure_device_allocator(backend, None)
        target = actpack_target(device)

        def usage():
            stats = actpack.memory_stats(device)
            return stats["allocated_bytes.all.current"], stats["reserved_bytes.all.current"]

        lib = _actpack_library()

        def allocate(nbytes, stream):
            ptr = lib.actpack_alloc(nbytes, device, stream)
            if not ptr:
                raise MemoryError(actpack.last_allocator_error())
            return ptr

        def free(ptr, nbytes, stream):
            lib.actpack_free(ptr, nbytes, device, stream)
    elif kind == "torch":
        if backend != "cuda":
            raise ValueError("actpack: the torch target replays on CUDA only")
        target = torch.empty(1, device="cuda")  # its storage's allocator is torch's
        result["torch_backend"] = torch.cuda.get_allocator_backend()

        def usage():
            try:
                return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
            except RuntimeError:  # a backend without stats: report latency only
                return None, None

        def allocate(nbytes, stream):
            return torch.cuda.caching_allocator_alloc(nbytes, device, stream)

        def free(ptr, nbytes, stream):
            torch.cuda.caching_allocator_delete(ptr)
    else:
        raise ValueError(f"actpack: unknown worker kind {kind!r}; expected 'actpack' or 'torch'")

    base_allocated, base_reserved = usage()
    replay(ops, target, 1)  # warm-up: the cache a training loop would have
    peak = {}

    def at_peak():
        allocated, reserved = usage()
        if allocated is None:
            peak.update(allocated=None, reserved=None)
        else:
            peak.update(allocated=allocated - base_allocated, reserved=reserved - base_reserved)

    replay(ops, target, 1, trace.peak_op, at_peak)
    result["allocated_bytes"] = peak["allocated"]
    result["reserved_bytes"] = peak["reserved"]
    seconds = replay(ops, target, repeats)
    result["cpp_ns_per_op"] = seconds * 1e9 / (repeats * len(ops))
    result["py_ns_per_op"] = _python_ns_per_op(ops, allocate, free, max(1, repeats // 10))
    if backend == "cuda":
        torch.cuda.synchronize()
    return result


# ---- The comparison ----

def run_target(name, trace_path, repeats):
    """Run one target's worker in a fresh process (its own allocator state and environment)."""
    kind, conf = TARGETS[name]
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if conf is not None:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    done = subprocess.run(
        [sys.executable, ENTRY_POINT, "--worker", kind, "--trace", trace_path,
         "--repeats", str(repeats)],
        env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"actpack: the {name} replay of {trace_path} failed:\n"
                           f"{done.stdout}\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["allocator"] = name
    return result


def format_table(results):
    header = (f"{'trace':<24} {'allocator':<16} {'ops':>6} {'C++ ns/op':>10} {'x torch':>8} "
              f"{'py ns/op':>9} {'req MiB':>8} {'alloc MiB':>9} {'resv MiB':>9} "
              f"{'resv/req':>9}")
    lines = [header]
    torch_ns = {r["trace"]: r["cpp_ns_per_op"] for r in results if r["allocator"] == "torch"}
    for r in results:
        ratio = r["cpp_ns_per_op"] / torch_ns[r["trace"]] if r["trace"] in torch_ns else float("nan")
        allocated, reserved = r["allocated_bytes"], r["reserved_bytes"]
        memory = (f"{allocated / MiB:>9.2f} {reserved / MiB:>9.2f} "
                  f"{reserved / r['requested_bytes']:>9.2f}") if reserved is not None else (
                      f"{'n/a':>9} {'n/a':>9} {'n/a':>9}")
        lines.append(
            f"{r['trace']:<24} {r['allocator']:<16} {r['ops']:>6} {r['cpp_ns_per_op']:>10.1f} "
            f"{ratio:>8.2f} {r['py_ns_per_op']:>9.0f} {r['requested_bytes'] / MiB:>8.2f} "
            f"{memory}")
    return "\n".join(lines)


def check_cuda():
    from actpack import _C
    if not torch.cuda.is_available():
        raise SystemExit("gpu_allocator_benchmark: needs CUDA: torch.cuda.is_available() is "
                         f"False (torch {torch.__version__}); run it on a GPU machine "
                         "(tools/gpu_check.sh)")
    if not _C.with_cuda:
        raise SystemExit("gpu_allocator_benchmark: needs CUDA: this actpack build has no CUDA "
                         "support; rebuild it against a CUDA torch")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", action="append",
                        help="trace file(s) (default: allocator/testdata/*.trace)")
    parser.add_argument("--repeats", type=int, default=50, help="timed passes per trace")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--worker", choices=("actpack", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=("cuda", "host"), default="cuda",
                        help=argparse.SUPPRESS)  # host: the actpack worker on the CPU (tests)
    args = parser.parse_args(argv)

    if args.worker:
        if not args.trace or len(args.trace) != 1:
            parser.error("--worker replays exactly one --trace")
        if args.backend == "cuda":
            check_cuda()
        print(json.dumps(run_worker(args.worker, args.trace[0], args.repeats, args.backend)))
        return
    check_cuda()
    traces = args.trace or sorted(glob.glob(os.path.join(TRACE_DIR, "*.trace")))
    for path in traces:
        read_trace(path)  # a malformed file stops here, before any GPU work
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    results = [run_target(name, path, args.repeats) for path in traces for name in TARGETS]
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)
