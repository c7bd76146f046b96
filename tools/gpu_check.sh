#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, a CUDA build of torch and no network: builds actpack
# against that torch (with the CUDA kernels) and runs every GPU test and GPU benchmark,
# writing results under $OUT (default ./gpu-results). What the machine lacks (Abseil, Highway,
# nlohmann/json, CLI11) comes from .deps/, filled beforehand by tools/fetch_gpu_deps.sh on a
# machine with apt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-$PWD/gpu-results}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

python3 -c 'import pytest, setuptools, torch' 2>/dev/null ||
  { echo "actpack: this machine lacks pytest, setuptools or torch; carry them as wheels"; exit 1; }
if ! ls /usr/lib/x86_64-linux-gnu/libabsl_status.so /usr/lib/x86_64-linux-gnu/libhwy.so \
    /usr/include/nlohmann/json.hpp /usr/include/CLI/CLI.hpp >/dev/null 2>&1; then
  ls .deps/*.deb >/dev/null 2>&1 || { echo "actpack: no Abseil here and no .deps/*.deb; run tools/fetch_gpu_deps.sh on a machine with apt first"; exit 1; }
  mkdir -p .deps/root
  for deb in .deps/*.deb; do dpkg -x "$deb" .deps/root; done
  export ACTPACK_ABSL_PREFIX="$PWD/.deps/root/usr"
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/device.txt"

SITE=/tmp/actpack-site
rm -rf "$SITE" build
echo "== build (CUDA) =="
MAX_JOBS="$(nproc)" python3 -m pip install -q --no-build-isolation --no-deps --target "$SITE" . \
  > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
export PYTHONPATH="$SITE"
python3 -c 'import actpack, actpack._C as c; assert c.with_cuda, "built without CUDA"; print("actpack", actpack.__file__)'
# The tests' report schema check (jsonschema), the benchmark suite's progress bar and picture:
# from the wheels tools/fetch_gpu_deps.sh downloaded (no network here).
python3 -m pip install -q --no-index --find-links .deps/wheels --target "$SITE" \
  jsonschema tqdm matplotlib ||
  echo "actpack: jsonschema/tqdm/matplotlib wheels missing: run tools/fetch_gpu_deps.sh first"

status=0
echo "== GPU tests =="
(cd tests && python3 -m pytest -q -p no:cacheprovider -m gpu -rs .) 2>&1 | tee "$OUT/gpu_tests.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "== CPU tests against the CUDA build =="
(cd tests && python3 -m pytest -q -p no:cacheprovider -m "not gpu" .) 2>&1 | tail -5 | tee "$OUT/cpu_tests.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "== codec benchmark =="
python3 tools/gpu_benchmark.py 2>&1 | tee "$OUT/benchmark.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "== host waits per training step (torch.profiler's CUDA API trace) =="
python3 tools/gpu_sync_check.py 2>&1 | tee "$OUT/sync_check.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "== demo on the GPU =="
python3 tools/demo.py --device cuda --steps 200 --report "$OUT/run.json" 2>&1 | tee "$OUT/demo.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "== allocator trace replay: actpack vs torch's caching allocator vs cudaMallocAsync =="
# Recorded training steps (allocator/testdata/, tools/record_trace.py), each allocator in a
# fresh process: per-op latency and requested/allocated/reserved at the trace's peak.
python3 tools/gpu_allocator_benchmark.py --json "$OUT/allocator_replay.json" 2>&1 |
  tee "$OUT/allocator_benchmark.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "== model benchmarks (benchmarks/suite.py --device cuda) =="
timeout 300 python3 benchmarks/suite.py --device cuda --quiet --out "$OUT/benchmarks" 2>&1 |
  tee "$OUT/model_benchmarks.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status
