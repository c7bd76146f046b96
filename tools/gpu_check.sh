#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, a CUDA build of torch and no network: builds actpack
# against that torch (with the CUDA kernels) and runs every GPU test and GPU benchmark,
# writing results under $OUT (default ./gpu-results). ACTPACK_GPU_DEADLINE=SECONDS bounds the whole
# run (a lent GPU comes for minutes): each stage gets at most what is left, and the stages that no
# longer fit are skipped, named in the output. What the machine lacks (Abseil, Highway,
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
python3 -c 'import actpack, actpack._C as c; assert c.with_cuda, "built without CUDA"; print("actpack", actpack.__file__)' ||
  exit 1
echo "built in $SECONDS s"
# The tests' report schema check (jsonschema) and property tests (hypothesis), the benchmark
# suite's progress bar and picture: from the wheels tools/fetch_gpu_deps.sh downloaded (no
# network here).
# Only the missing ones: a second numpy or pillow in front of the machine's would shadow the
# ones its torch was built with.
for module in jsonschema hypothesis tqdm matplotlib; do
  python3 -c "import $module" 2>/dev/null && continue
  python3 -m pip install -q --no-index --find-links .deps/wheels --target "$SITE" "$module" ||
    echo "actpack: no $module wheel in .deps/wheels: run tools/fetch_gpu_deps.sh first"
done

status=0
# Each stage has its own limit (sized for an H100, a few times what it should take), so that a
# hang in one still leaves the rest their turn; the most telling stages come first.
deadline="${ACTPACK_GPU_DEADLINE:-0}"
stage() {  # stage SECONDS NAME OUTFILE COMMAND...
  local seconds=$1 name=$2 file=$3
  shift 3
  if [ "$deadline" -gt 0 ]; then
    local left=$((deadline - SECONDS))
    if [ "$left" -lt 20 ]; then
      echo "actpack: $name skipped: ${left} s of the ${deadline} s deadline left"
      status=1
      return
    fi
    [ "$left" -lt "$seconds" ] && seconds=$left
  fi
  echo "== $name ($SECONDS s in) =="
  timeout "$seconds" "$@" 2>&1 | tee "$OUT/$file"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 124 ] && echo "actpack: $name ran past its $seconds s limit"
  [ "$rc" = 0 ] || status=1
}
# torch.profiler's CUDA API trace of the calls that block the host.
stage 120 "host waits per training step" sync_check.txt python3 tools/gpu_sync_check.py
stage 240 "GPU tests" gpu_tests.txt \
  bash -c 'cd tests && python3 -m pytest -q -p no:cacheprovider -m gpu -rs .'
stage 120 "codec benchmark" benchmark.txt python3 tools/gpu_benchmark.py
stage 180 "demo on the GPU" demo.txt \
  python3 tools/demo.py --device cuda --steps 200 --report "$OUT/run.json"
# Recorded training steps (allocator/testdata/, tools/record_trace.py), each allocator in a
# fresh process: per-op latency and requested/allocated/reserved at the trace's peak.
stage 120 "allocator trace replay: actpack vs torch's caching allocator vs cudaMallocAsync" \
  allocator_benchmark.txt python3 tools/gpu_allocator_benchmark.py --json "$OUT/allocator_replay.json"
# The smoke sizes by default: the suite's truths start a fresh process per try, each a CUDA
# start-up, and a lent GPU comes for minutes (the first run, at the CPU sizes, printed nothing
# in 300 s). ACTPACK_GPU_SUITE_SIZE=full for the GPU sizes on a machine kept for longer.
suite_size="${ACTPACK_GPU_SUITE_SIZE:-smoke}"
stage 300 "model benchmarks (benchmarks/suite.py --device cuda --size $suite_size)" \
  model_benchmarks.txt python3 benchmarks/suite.py --device cuda --size "$suite_size" \
  --out "$OUT/benchmarks"
# The GPU hidden: a budget on a machine with CUDA is the GPU's (and plan refuses without
# actpack's CUDA allocator), so the CPU tests run as on a CPU machine, against the CUDA build.
stage 900 "CPU tests against the CUDA build" cpu_tests.txt \
  env CUDA_VISIBLE_DEVICES= bash -c 'cd tests && python3 -m pytest -q -p no:cacheprovider -m "not gpu" .'
exit $status
