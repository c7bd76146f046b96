"""Allocation traces: tools/record_trace.py (benchmarks/record_trace.py) records real training
steps, the parser of benchmarks/alloc_replay.py (tools/gpu_allocator_benchmark.py) reads them
(the same rules and messages as allocator/testing/alloc_trace.cc), and its C++ loop
(benchmarks/alloc_replay.cc, built on first use, not shipped in the wheel) replays them; the GPU
comparison runs only with CUDA but its CPU parts run here.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

import actpack
from actpack import _C

from benchmarks import alloc_replay as bench
from benchmarks import record_trace
from conftest import HANG_GUARD_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTDATA = os.path.join(ROOT, "allocator", "testdata")
TOOLS = os.path.join(ROOT, "tools")
EXPECTED = "expected 'alloc ID SIZE STREAM' or 'free ID'"


def child_env():
    env = dict(os.environ)
    site = os.path.dirname(os.path.dirname(os.path.abspath(actpack.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([site, env.get("PYTHONPATH", "")])
    return env


def test_parse_reads_ops_slots_and_peak():
    trace = bench.parse_trace(
        "# actpack allocation trace v1\n\n"
        "alloc 7 1000 0   # a comment after an op\n"
        "alloc 3 5000 2\n"
        "free 7\n"
        "alloc 7 100 0\r\n"
        "free 3\n"
        "\tfree   7\n", "t.trace")
    assert trace.ops == [(True, 0, 1000, 0), (True, 1, 5000, 2), (False, 0, 1000, 0),
                         (True, 2, 100, 0), (False, 1, 5000, 2), (False, 2, 100, 0)]
    assert (trace.slots, trace.allocations) == (3, 3)
    assert (trace.peak_live_bytes, trace.peak_op) == (6000, 1)


# The cases and messages of allocator/testing/alloc_trace_test.cc: both parsers agree.
@pytest.mark.parametrize("text,message", [
    ("alloc 0 8 0\nallc 1 8 0\n", f"actpack: bad.trace:2: {EXPECTED}, got 'allc 1 8 0'"),
    ("alloc 0 8\n", f"actpack: bad.trace:1: {EXPECTED}, got 'alloc 0 8'"),
    ("free 0 8\n", f"actpack: bad.trace:1: {EXPECTED}, got 'free 0 8'"),
    ("alloc x 8 0\n", f"actpack: bad.trace:1: ID 'x' is not an unsigned integer ({EXPECTED})"),
    ("alloc 0 -8 0\n", f"actpack: bad.trace:1: SIZE '-8' is not a byte count ({EXPECTED})"),
    ("alloc 0 8 s\n", f"actpack: bad.trace:1: STREAM 's' is not an unsigned integer ({EXPECTED})"),
    ("alloc 0 99999999999999999 0\n", "actpack: bad.trace:1: SIZE 99999999999999999 is over 256 TiB"),
    ("alloc 0 8 0\nalloc 0 8 0\n",
     "actpack: bad.trace:2: alloc of ID 0, which is still live (allocated at line 1)"),
    ("alloc 0 8 0\nfree 0\nfree 0\n", "actpack: bad.trace:3: free of ID 0, which is not live"),
    ("alloc 0 8 0\nalloc 1 8 0\nalloc 2 8 0\nfree 1\n",
     "actpack: bad.trace: 2 allocation(s) never freed (first: ID 0 at line 1); a trace must "
     "free everything"),
    ("# only a comment\n\n", f"actpack: bad.trace: no operations ({EXPECTED})"),
])
def test_malformed_trace_names_the_line_and_the_problem(text, message):
    with pytest.raises(ValueError) as error:
        bench.parse_trace(text, "bad.trace")
    assert str(error.value) == message


@pytest.mark.parametrize("name", ["cnn_step.trace", "transformer_step.trace"])
def test_committed_traces_are_real_steps_under_a_mebibyte(name):
    path = os.path.join(TESTDATA, name)
    assert os.path.getsize(path) < 1 << 20
    trace = bench.read_trace(path)
    assert trace.allocations > 100
    assert trace.peak_live_bytes > 1 << 20
    with open(path) as f:
        header = f.read(2000)
    assert header.startswith(record_trace.HEADER)
    # The header's peak (computed by the recorder) is the parser's.
    assert f"peak {trace.peak_live_bytes} bytes requested" in header
    assert "tools/record_trace.py --model" in header


def test_trace_lines_pair_frees_with_allocs_in_the_window():
    entries = [
        {"action": "segment_alloc", "addr": 4096, "requested_size": 2 << 20, "stream": 0},
        {"action": "alloc", "addr": 4096, "requested_size": 1000, "stream": 0},
        {"action": "free_requested", "addr": 999, "requested_size": 8, "stream": 0},  # older
        {"action": "alloc", "addr": 8192, "requested_size": 24, "stream": 5},
        {"action": "free_requested", "addr": 4096, "requested_size": 1000, "stream": 0},
        {"action": "free_completed", "addr": 4096, "requested_size": 1000, "stream": 0},
        {"action": "alloc", "addr": 4096, "requested_size": 300, "stream": 0},  # address reused
        {"action": "free_requested", "addr": 4096, "requested_size": 300, "stream": 0},
    ]
    lines, counts = record_trace.trace_lines(entries)
    assert lines == ["alloc 0 1000 0", "alloc 1 24 5", "free 0", "alloc 2 300 0", "free 2",
                     "# 1 allocation(s) still live at the end of the window", "free 1"]
    assert counts == {"allocs": 3, "frees": 2, "outside_frees": 1, "freed_at_end": 1}
    bench.parse_trace("\n".join(lines))  # a valid trace


def test_record_trace_writes_a_trace_of_a_real_step(tmp_path):
    out = tmp_path / "small.trace"
    done = subprocess.run(
        [sys.executable, os.path.join(TOOLS, "record_trace.py"), "--model", "cnn", "--steps", "1",
         "--warmup", "1", "--batch", "4", "--context", "32", "--out", str(out)],
        env=child_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    trace = bench.read_trace(str(out))
    # Forward, backward and Adam of a 6-layer network: hundreds of allocations, each freed.
    assert trace.allocations > 100
    assert sum(1 for op in trace.ops if not op[0]) == trace.allocations
    assert "allocations" in done.stdout


def test_replay_through_each_cpu_target_frees_everything():
    trace = bench.read_trace(os.path.join(TESTDATA, "cnn_step.trace"))
    ops = bench.replay_ops(trace, {})
    for target in ("malloc", torch.empty(1)):  # glibc; torch's CPU allocator
        assert 0 < bench.replay(ops, target, 2) < 60


def test_replay_through_the_host_pool_frees_everything(cpu_allocator):
    trace = bench.read_trace(os.path.join(TESTDATA, "cnn_step.trace"))
    ops = bench.replay_ops(trace, {})
    target = torch.empty(1)  # made after the install: its storage's allocator is actpack's
    before = actpack.memory_stats("cpu")
    assert 0 < bench.replay(ops, target, 2) < 60
    after = actpack.memory_stats("cpu")
    # The host pool served one trace twice and holds nothing of it now.
    assert after["num_allocs"] - before["num_allocs"] == 2 * trace.allocations
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["allocated_bytes.all.peak"] >= trace.peak_live_bytes


def test_replay_pauses_once_at_the_peak(cpu_allocator):
    trace = bench.parse_trace("alloc 0 3000000 0\nalloc 1 1000 0\nfree 0\nfree 1\n")
    seen = []
    bench.replay(bench.replay_ops(trace, {}), torch.empty(1), 3, trace.peak_op,
                 lambda: seen.append(actpack.memory_allocated("cpu")))
    assert len(seen) == 1
    assert seen[0] >= 3000000 + 1000


def test_a_failed_allocation_through_the_c_abi_raises_with_its_reason():
    # A device outside the C ABI's range: actpack_alloc returns null and says why.
    ops = [(True, 0, 8, 0), (False, 0, 8, 0)]
    with pytest.raises(RuntimeError, match="allocating 8 bytes failed: actpack: device 9999"):
        bench.replay(ops, bench.actpack_target(9999))


@pytest.mark.parametrize("ops,target,repeats,message", [
    ([(False, 0, 8, 0)], "malloc", 1, "free of slot 0, which is not live"),
    ([(True, 0, 8, 0), (True, 0, 8, 0)], "malloc", 1, "alloc into slot 0, which is live"),
    ([(True, 0, 8, 0)], "malloc", 1, "leave allocations live"),
    ([(True, 0, 8, 0), (False, 0, 8, 0)], "glibc", 1, "unknown replay target 'glibc'"),
    ([(True, 0, 8, 0), (False, 0, 8, 0)], "malloc", 0, "repeats must be >= 1, got 0"),
    ([(True, 0, 8, 0), (False, 0, 8, 0)], (0, 0, 0, 0), 1, "got a null one"),
])
def test_replay_refuses_bad_input(ops, target, repeats, message):
    with pytest.raises(ValueError, match=message):
        bench.replay(ops, target, repeats)


def test_the_replay_loop_is_not_in_the_shipped_module():
    assert not hasattr(_C, "_replay_trace")


def test_worker_replays_through_actpacks_device_stack_on_the_host():
    # The GPU comparison's actpack path, on the host backend: same stack, same code.
    done = subprocess.run(
        [sys.executable, os.path.join(TOOLS, "gpu_allocator_benchmark.py"), "--worker",
         "actpack", "--backend", "host", "--trace", os.path.join(TESTDATA, "cnn_step.trace"),
         "--repeats", "10"],
        env=child_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    trace = bench.read_trace(os.path.join(TESTDATA, "cnn_step.trace"))
    assert result["ops"] == len(trace.ops)
    assert result["requested_bytes"] == trace.peak_live_bytes
    # Blocks round up to 512 B; segments are 2 MiB / 20 MiB: caching costs some, not 2x.
    assert trace.peak_live_bytes <= result["allocated_bytes"] <= 1.01 * trace.peak_live_bytes
    assert result["allocated_bytes"] <= result["reserved_bytes"] <= 1.5 * trace.peak_live_bytes
    assert result["cpp_ns_per_op"] > 0 and result["py_ns_per_op"] > 0


def test_format_table_shows_allocators_side_by_side():
    common = {"trace": "cnn_step.trace", "ops": 976, "requested_bytes": 50 << 20,
              "allocated_bytes": 51 << 20, "py_ns_per_op": 900.0}
    table = bench.format_table([
        dict(common, allocator="actpack", cpp_ns_per_op=60.0, reserved_bytes=60 << 20),
        dict(common, allocator="torch", cpp_ns_per_op=120.0, reserved_bytes=55 << 20),
    ])
    rows = table.splitlines()
    assert "C++ ns/op" in rows[0] and "resv/req" in rows[0]
    assert rows[1].split()[1:4] == ["actpack", "976", "60.0"]
    assert rows[1].split()[4] == "0.50"  # half torch's time
    assert rows[2].split()[-1] == "1.10"  # 55 MiB reserved for 50 MiB requested
    no_stats = bench.format_table([dict(common, allocator="cudaMallocAsync", cpp_ns_per_op=1.0,
                                        allocated_bytes=None, reserved_bytes=None)])
    assert no_stats.splitlines()[1].split()[-3:] == ["n/a", "n/a", "n/a"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_gpu_comparison_without_cuda_says_it_needs_cuda():
    done = subprocess.run([sys.executable, os.path.join(TOOLS, "gpu_allocator_benchmark.py")],
                          env=child_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode != 0
    assert "gpu_allocator_benchmark: needs CUDA" in done.stderr


@pytest.mark.gpu
def test_gpu_comparison_runs_every_allocator(tmp_path):
    out = tmp_path / "replay.json"
    done = subprocess.run(
        [sys.executable, os.path.join(TOOLS, "gpu_allocator_benchmark.py"), "--repeats", "3",
         "--trace", os.path.join(TESTDATA, "cnn_step.trace"), "--json", str(out)],
        env=child_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())["results"]
    assert [r["allocator"] for r in results] == ["actpack", "torch", "cudaMallocAsync"]
    assert results[2]["torch_backend"] == "cudaMallocAsync"
    for r in results[:2]:  # cudaMallocAsync may not report memory
        assert r["reserved_bytes"] >= r["allocated_bytes"] >= r["requested_bytes"] > 0
    for r in results:
        assert r["cpp_ns_per_op"] > 0
