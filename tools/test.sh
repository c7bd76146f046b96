#!/usr/bin/env bash
# Runs every test: installs what is missing, then
#   1. bazel test //...                          (C++ tests, CPU build; LibTorch C++ training)
#   2. bazel build --config=cuda //...           (nvcc compiles the kernels; nothing runs)
#      python3 tools/ptxas_check.py              (registers, shared memory, spills per kernel)
#   3. bazel test --config=cudaemu //...         (the CUDA code paths on the CUDA emulator)
#      ... the emulated tests again under the reverse and a random schedule,
#      bazel test --config=cudaemu_asan //codecs/... //runtime/... //allocator/... //testing/...
#                                                (AddressSanitizer + UBSan, CPU and CUDA paths)
#      python3 tools/cudaemu_coverage.py         (the emulated tests with the race checker, and
#                                                 kernel line coverage >= 95%, mode branches)
#      python3 tools/mutate_kernels.py           (every kernel bug in its list must be caught)
#   4. bash tools/fuzz.sh 20                     (libFuzzer on every decoder and the JSON parser)
#   5. bash tools/wheel_check.sh                 (the wheel in a fresh virtual environment)
#   6. pytest tests/                             (the installed package; GPU tests skip)
# and ends with pytest's summary line. Exits non-zero if any stage failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/setup_env.sh || exit 1

failed=()
stage() { echo; echo "== $* =="; }

stage "bazel test //..."
bazel test //... || failed+=("bazel test")

stage "bazel build --config=cuda //... (compile check) and ptxas table"
if [ -x /usr/local/cuda/bin/nvcc ]; then
  bazel build --config=cuda //... || failed+=("bazel build --config=cuda")
  python3 tools/ptxas_check.py || failed+=("ptxas table")
else
  echo "actpack: skipped: no CUDA toolkit at /usr/local/cuda (nvcc), so the .cu sources were not compiled"
fi

# The emulated configs leave out //torch_plugin: it builds against the wheel's CPU LibTorch,
# and its CUDA paths are the codecs' and the allocator's, emulated below.
stage "bazel test --config=cudaemu //... (CUDA emulator, forward schedule)"
bazel test --config=cudaemu -- //... -//torch_plugin/... || failed+=("cudaemu")
# Every test that links the emulator: the codec, allocator and session tests with CUDA cases.
emulated=$(bazel cquery --config=cudaemu 'kind(".*_test", rdeps(//... except //torch_plugin/..., //testing/cudaemu:runtime))' \
           2>/dev/null | cut -d' ' -f1 | tr '\n' ' ')
for schedule in reverse random:7; do
  stage "emulated tests, schedule $schedule"
  bazel test --config=cudaemu --test_env=CUDAEMU_SCHEDULE="$schedule" $emulated ||
    failed+=("cudaemu $schedule")
done
# One sanitizer build: the CUDA-enabled one runs the CPU paths too (only the "CUDA is not
# compiled in" branches are left to the plain build above).
stage "codec, runtime, allocator and emulator tests under AddressSanitizer + UBSan"
bazel test --config=cudaemu_asan //codecs/... //runtime/... //allocator/... //testing/... ||
  failed+=("asan")
stage "emulated tests with the race checker, and the kernels' coverage"
python3 tools/cudaemu_coverage.py || failed+=("cudaemu race and coverage")
stage "kernel mutation tests"
python3 tools/mutate_kernels.py || failed+=("kernel mutations")

stage "fuzz"
bash tools/fuzz.sh 20 || failed+=("fuzz")

stage "the wheel in a fresh virtual environment"
bash tools/wheel_check.sh || failed+=("wheel")

stage "pytest"
(cd tests && python3 -m pytest -q -p no:cacheprovider .) || failed+=("pytest")

if [ ${#failed[@]} -gt 0 ]; then
  echo "actpack: FAILED stages: ${failed[*]}"
  exit 1
fi
echo "actpack: all stages passed"
