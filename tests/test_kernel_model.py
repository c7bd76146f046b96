"""tools/kernel_model.py reads the loads a thread has in flight from the SASS scoreboards:
checked on kernels whose independent loads are known (copies with 1, 2 and 4 independent
16-byte loads per iteration, a scalar 4-byte copy, a pointer chase whose loads depend on each
other). Skips where there is no nvcc."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "kernel_model.py")
NVCC = "/usr/local/cuda/bin/nvcc"

SYNTHETIC = r"""
#include <cuda_runtime.h>

__global__ void CopyOne(const float4* __restrict__ in, float4* __restrict__ out, int n) {
#pragma unroll 1
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = in[i];
  }
}

__global__ void CopyTwo(const float4* __restrict__ in, float4* __restrict__ out, int n) {
#pragma unroll 1
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float4 a = in[i];
    const float4 b = in[i + n];
    out[i] = a;
    out[i + n] = b;
  }
}

__global__ void CopyFour(const float4* __restrict__ in, float4* __restrict__ out, int n) {
#pragma unroll 1
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = in[i + k * n];
#pragma unroll
    for (int k = 0; k < 4; ++k) out[i + k * n] = v[k];
  }
}

__global__ void CopyScalar(const float* __restrict__ in, float* __restrict__ out, int n) {
#pragma unroll 1
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = in[i] * 2.0f;
  }
}

__global__ void Chase(const int* __restrict__ next, int* __restrict__ out, int steps) {
  int i = threadIdx.x;
#pragma unroll 1
  for (int s = 0; s < steps; ++s) {
    i = next[i];
    i = next[i];
  }
  out[threadIdx.x] = i;
}
"""


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    if not os.access(NVCC, os.X_OK):
        pytest.skip(f"no nvcc at {NVCC}")
    source = tmp_path_factory.mktemp("kernel_model") / "synthetic.cu"
    source.write_text(SYNTHETIC)
    run = subprocess.run([sys.executable, TOOL, "--loops", str(source), "--include",
                          str(source.parent)], text=True, capture_output=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(run.stdout)
    # Each kernel has one loop.
    assert all(len(k["loops"]) == 1 for k in report.values()), report
    return {name: k["loops"][0] for name, k in report.items()}


@pytest.mark.parametrize("kernel, width, count", [
    ("CopyOne", "LDG.E.128", 1), ("CopyTwo", "LDG.E.128", 2), ("CopyFour", "LDG.E.128", 4),
    ("CopyScalar", "LDG.E.CONSTANT", 1)])
def test_independent_loads_are_in_flight_together(loops, kernel, width, count):
    loop = loops[kernel]
    assert [op.startswith(width) for op in loop["loads"]] == [True] * count, loop
    assert loop["in_flight"] == count, loop
    assert loop["exposures"] == 1, loop  # one wait for memory per iteration


def test_dependent_loads_wait_one_at_a_time(loops):
    loop = loops["Chase"]
    assert len(loop["loads"]) == 2, loop
    assert loop["in_flight"] == 1, loop
    assert loop["exposures"] == 2, loop


def _tool():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import kernel_model
    finally:
        sys.path.pop(0)
    return kernel_model


def _kernel(km, blocks, succ):
    """A kernel of `blocks` ([[source line of each instruction]]) and successors, its loop's
    header block 0 (the entry) and every block in that loop."""
    addr, made = 0, []
    for lines in blocks:
        made.append([])
        for line in lines:
            made[-1].append(km.Instr(addr, "IADD3 R0, R0, 0x1, RZ", "IADD3", ("k.cu", line), 0,
                                     7, chain=(("k.cu", line),)))
            addr += 16
    f = km.Function(made, succ, set(range(len(blocks))), {0: set(range(len(blocks)))})
    return km.Kernel("K", 32, 0, f)


def test_a_loop_unswitched_on_a_cold_condition_counts_the_hot_copy_only():
    # header 0 -> copy A (1, then 2 running cold line 99, then the latch 5) or copy B (3 -> 4 ->
    # latch 5); A's first block reaches the header only through the cold line.
    km = _tool()
    k = _kernel(km, [[1], [10, 10, 10], [99], [20, 20], [21], [30]],
                [[1, 3], [2], [5], [4], [5], [0]])
    assert len(k.body(0).instrs) == 9  # no cold lines: every block
    hot = k.body(0, [("k.cu", 99)]).instrs
    assert sorted({i.line[1] for i in hot}) == [1, 20, 21, 30]  # A's copy is cold from its start


def test_cold_lines_that_cut_every_way_back_leave_the_forward_walk():
    # The cold line shares the latch's block (an arm of a conditional expression merged into it):
    # no way back avoids it, so the blocks the header reaches without entering it count.
    km = _tool()
    k = _kernel(km, [[1], [10, 10], [99, 30]], [[1], [2], [0]])
    assert sorted(i.line[1] for i in k.body(0, [("k.cu", 99)]).instrs) == [1, 10, 10]
