#!/usr/bin/env bash
# Runs every test: installs what is missing, then
#   1. bazel test --config=cuda <libraries, binaries> //torch_plugin/... //common/...
#                                                (nvcc compiles the kernels; every library and
#                                                 binary against the real CUDA headers and
#                                                 runtime; the tests no emulated build runs:
#                                                 LibTorch C++ training, the checked mutex.
#                                                 Without nvcc: bazel test //..., CPU-only)
#   2. python3 tools/ptxas_check.py              (registers, shared memory, spills per kernel,
#                                                 from that build's ptxas reports)
#   3. bazel test --config=cudaemu_asan //codecs/... //runtime/... //allocator/... //report/...
#                 //testing/...                   (the CUDA code paths on the CUDA emulator, and
#                                                 the CPU paths, under AddressSanitizer + UBSan,
#                                                 blocks in the reverse schedule)
#      python3 tools/cudaemu_coverage.py         (the emulated tests that run kernels, with the
#                                                 race checker in the forward schedule, and
#                                                 kernel line coverage >= 95%, mode branches)
#      python3 tools/traffic_check.py            (each kernel's memory traffic, as the race
#                                                 checker sees it, against codecs/cuda/traffic.tsv)
#      python3 tools/kernel_model.py --check     (each kernel's H100 time from its SASS against
#                                                 codecs/cuda/model.tsv: no fraction of a copy fell)
#      python3 tools/mutate_kernels.py           (every kernel bug in its list must be caught)
#   4. bash tools/fuzz.sh 20                     (libFuzzer on every decoder and the JSON parser)
#   5. bash tools/wheel_check.sh                 (the wheel in a fresh virtual environment)
#   6. pytest -n auto tests/                     (the installed package, a test per core; GPU
#                                                 tests skip)
# then the time each stage took. ACTPACK_FULL=1 runs the long sweeps in full (see FULL below). Exits non-zero if any stage failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# ACTPACK_FULL=1 runs the long sweeps in full (every kernel mutant, a second random schedule,
# 120 s of fuzzing per target, a 2,000-step soak); by default each keeps a smoke run.
FULL="${ACTPACK_FULL:-0}"
failed=()
timings=()
stage_name=""
stage_start=$SECONDS
# Closes the running stage's timer and opens the next one.
stage() {
  [ -n "$stage_name" ] && timings+=("$(printf '%5d s  %s' $((SECONDS - stage_start)) "$stage_name")")
  stage_name="$*"
  stage_start=$SECONDS
  [ -n "$stage_name" ] && { echo; echo "== $* =="; }
}

stage "install what is missing, build and install the wheel (tools/setup_env.sh)"
bash tools/setup_env.sh || exit 1

stage "bazel build --config=cuda (compile check), the tests outside the emulated builds, ptxas table"
if [ -x /usr/local/cuda/bin/nvcc ]; then
  # Every library, binary and nvcc object against the real CUDA headers and runtime, and the
  # tests the emulated builds below cannot run (//torch_plugin builds against the wheel's CPU
  # LibTorch; //common), in one command: a `bazel build` beside a `bazel test` would compile
  # the libraries twice (the test command configures them apart). The other tests run in the
  # emulated builds, CPU paths included; the "CUDA is not compiled in" branches are the wheel's
  # here (built against CPU torch), which pytest runs.
  cuda_targets=$(bazel query 'kind("cc_library|cc_binary|genrule", //...) except attr(tags, manual, //...)')
  # shellcheck disable=SC2086
  [ -n "$cuda_targets" ] && bazel test --config=cuda $cuda_targets //torch_plugin/... //common/... ||
    failed+=("bazel --config=cuda")
  python3 tools/ptxas_check.py --built || failed+=("ptxas table")
else
  echo "actpack: no CUDA toolkit at /usr/local/cuda (nvcc): the CPU-only build, .cu sources not compiled"
  bazel test //... || failed+=("bazel test")
fi

# The emulated configs leave out //torch_plugin: it builds against the wheel's CPU LibTorch,
# and its CUDA paths are the codecs' and the allocator's, emulated below. Each emulated build
# is one that checks something more, and each runs the emulated tests in a different order of
# blocks, so the tests that launch kernels run in two schedules without a third pass: the
# sanitizers' build in the reverse schedule (every test, the CPU paths too), the race checker's
# in the forward one (those tagged no_race_stage launch only kernels other tests run there).
# The full run adds random schedules on the race checker's build.
stage "emulated CUDA and CPU paths under AddressSanitizer + UBSan (reverse schedule)"
# The 16 MiB identity case runs in the race checker's build, which also reports a kernel's
# accesses outside every allocation; under ASan it took a tenth of this stage.
bazel test --config=cudaemu_asan --build_tests_only --test_env=CUDAEMU_SCHEDULE=reverse \
  --test_env=GTEST_FILTER=-CudaIdentityLargeTest.* \
  //codecs/... //runtime/... //allocator/... //report/... //testing/... ||
  failed+=("asan")
stage "emulated codec kernels with blocks at once (concurrent:8 schedule)"
# Blocks on several host threads, lanes taking turns at atomics: what a look-back or a flag
# between blocks does on a GPU (the race checker and ASan watch one host thread, so its build
# is the plain emulated one).
bazel test --config=cudaemu --test_env=CUDAEMU_SCHEDULE=concurrent:8 //codecs:cuda_identity_test \
  //codecs:eb_test //codecs:deferred_test //testing/cudaemu:executor_test ||
  failed+=("cudaemu concurrent")
stage "emulated tests with the race checker (forward schedule), and the kernels' coverage"
python3 tools/cudaemu_coverage.py || failed+=("cudaemu race and coverage")
stage "the kernels' memory traffic against codecs/cuda/traffic.tsv"
python3 tools/traffic_check.py || failed+=("traffic table")
stage "the kernels' performance model against codecs/cuda/model.tsv"
python3 tools/kernel_model.py --check || failed+=("kernel model")
# The full run: random:SEED reorders the blocks and the streams' progress, on every test that
# links the emulator, with the race checker.
if [ "$FULL" = 1 ]; then
  emulated=$(bazel cquery --config=cudaemu_race "kind(\".*_test\", rdeps(//... except //torch_plugin/..., //testing/cudaemu:runtime))" \
             2>/dev/null | cut -d' ' -f1 | tr '\n' ' ')
  for schedule in random:7 random:11; do
    stage "emulated tests with the race checker, schedule $schedule"
    # shellcheck disable=SC2086
    [ -n "$emulated" ] && bazel test --config=cudaemu_race --test_env=CUDAEMU_SCHEDULE="$schedule" $emulated ||
      failed+=("cudaemu $schedule")
  done
fi
stage "kernel mutation tests"
if [ "$FULL" = 1 ]; then
  python3 tools/mutate_kernels.py || failed+=("kernel mutations")
else
  python3 tools/mutate_kernels.py --smoke || failed+=("kernel mutations")
fi

stage "fuzz"
if [ "$FULL" = 1 ]; then bash tools/fuzz.sh 120 || failed+=("fuzz"); else bash tools/fuzz.sh 20 || failed+=("fuzz"); fi

stage "the wheel in a fresh virtual environment"
bash tools/wheel_check.sh || failed+=("wheel")

stage "pytest"
# The soak (tests/test_soak.py): 200 steps per codec, 2,000 in the full run.
[ "$FULL" = 1 ] && export ACTPACK_SOAK_STEPS=2000
pytest_log=$(mktemp)
# Two tests at a time per two cores (pytest-xdist), each worker with one intra-op thread: two
# workers with torch's default of one thread per core would oversubscribe the cores, and
# OpenMP's waits at every parallel region then cost more than the second worker gains
# (measured on 2 cores: 1,876 s so, 633 s with one thread each). The tests that pack with
# several threads set torch's thread count themselves (tests/test_codec.py).
(cd tests && OMP_NUM_THREADS=1 python3 -m pytest -q -p no:cacheprovider -n auto --dist loadgroup --durations=12 . 2>&1 |
   tee "$pytest_log"; exit "${PIPESTATUS[0]}") ||
  failed+=("pytest")
stage ""

echo
echo "actpack: time per stage (total $SECONDS s)"
printf '%s\n' "${timings[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "actpack: FAILED stages: ${failed[*]}"
else
  echo "actpack: all stages passed"
fi
# pytest's summary line closes the run.
tail -n 1 "$pytest_log"
rm -f "$pytest_log"
[ ${#failed[@]} -eq 0 ]
