#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, a CUDA build of torch and no network, builds
# actpack against that torch for this GPU's architecture only, then runs its stages under one
# time budget, most telling first, and writes what the docs' GPU tables are made from.
#
#   OUT=/some/dir bash tools/gpu_check.sh     # on the GPU machine, .deps/ carried along
#   ACTPACK_GPU_DRY=1 bash tools/gpu_check.sh # the plumbing on a CPU machine (installed actpack)
#
# With no variables it ends within 9 minutes on an H100 or H200, the build included: the
# stages' limits add up to ACTPACK_GPU_STAGE_SECONDS (405) after the build, and the whole run
# stops by ACTPACK_GPU_DEADLINE (520 s from its start). A stage gets the lesser of its limit and
# what is left; one that no longer fits is skipped and named; the last takes what the others
# left. Stages (name: limit):
#   budget 45      the capped CUDA path: tests/test_gpu_budget.py (capped steps, out of memory
#                  as torch.OutOfMemoryError, relief under pressure, two streams, ACTPACK_CONF)
#   identity 25    CPU = CUDA byte identity of every codec (tests/test_codec_registry.py, -m gpu,
#                  and tests/test_gpu_codecs.py): training.json's gradients rest on it
#   training 160   benchmarks/gpu_training.py: largest batch per method under 8 GiB, gradient
#                  cosines, step time, waits and allocations per step at the cap
#   kernels 90     tools/gpu_benchmark.py: codec kernels as fractions of a copy (division_dct,
#                  the frequency-domain codec, among them)
#   counters 75    tools/gpu_counters.py: the same kernels' hardware counters under Nsight
#                  Compute (DRAM bytes, throughput, occupancy, stall reasons) at 256 MiB float32
#   tests 10+      every other GPU test (pytest -m gpu), with what the stages before left unused
# Opt-in, beyond the 405 s (name them in ACTPACK_GPU_STAGES, raise the two limits): triage
# (each codec alone at 1, 64 and 256 MiB, launches blocking, the failures under compute-sanitizer,
# tools/gpu_triage.py), sync (host
# waits of a 64 GiB budget, tools/gpu_sync_check.py), demo, replay (allocator traces), suite
# (benchmarks/suite.py --size smoke), cputests (the CPU tests against the CUDA build).
#
# Variables: OUT (default benchmarks/results/gpu_<date>/), ACTPACK_GPU_STAGES (a comma list),
# ACTPACK_GPU_STAGE_SECONDS, ACTPACK_GPU_DEADLINE, ACTPACK_GPU_DRY, ACTPACK_GPU_REBUILD=1 (build
# even when this machine holds a build of these sources), ACTPACK_GPU_COMMIT (recorded where
# there is no .git). Writes under OUT at most 8 files, none in subfolders (what a lent GPU
# machine returns): gpu_check_log.txt (this whole console log), manifest.md (a README for the
# results folder: device, driver, torch, commit, each stage's outcome and time), manifest.json,
# training.json, kernels.json, counters.json, build.log.
# What the machine lacks to build (Abseil, Highway, nlohmann/json, CLI11) and to test
# (jsonschema) comes from .deps/, filled beforehand by tools/fetch_gpu_deps.sh.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
DIGEST=
DRY=${ACTPACK_GPU_DRY:-0}
STAGE_SECONDS=${ACTPACK_GPU_STAGE_SECONDS:-405}
DEADLINE=${ACTPACK_GPU_DEADLINE:-520}
STAGES=${ACTPACK_GPU_STAGES:-budget,identity,training,kernels,counters,tests}
DATE=$(date -u +%Y-%m-%d)
OUT=${OUT:-$ROOT/benchmarks/results/gpu_$DATE}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu_check_log.txt
WORK=$(mktemp -d /tmp/actpack-gpu-check.XXXXXX)
SITE=/tmp/actpack-site
export PYTHONUNBUFFERED=1

selected() { [[ ",$STAGES," == *",$1,"* ]]; }

# meta KEY VALUE: a line of what the manifest records about the run.
meta() { printf '%s\t%s\n' "$1" "$2" >>"$WORK/meta.tsv"; }

# The sources' digest: what the build is of, and the commit's stand-in where there is no .git.
source_digest() {
  find . -path ./build -prune -o -path ./.deps -prune -o -path ./.git -prune -o \
    -path ./benchmarks/results -prune -o -type f \
    \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' \
       -o -name 'setup.py' -o -name 'pyproject.toml' -o -name '*.pth' -o -name BUILD.system \) \
    -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}

STAGES_START=
status=0

# stage NAME LIMIT SOAK TITLE COMMAND...: runs COMMAND for at most the lesser of LIMIT and what
# is left of the stages' budget and the deadline (SOAK=1: all of what is left), under a SIGINT 5 s
# before that (Python scripts keep what they measured; pytest reports what ran) and a SIGKILL at
# it. Exports ACTPACK_STAGE_SECONDS for the command. Records the outcome in stages.tsv.
stage() {
  local name=$1 limit=$2 soak=$3 title=$4
  shift 4
  if ! selected "$name"; then
    return
  fi
  local used=$((SECONDS - STAGES_START))
  local left=$((STAGE_SECONDS - used))
  local to_deadline=$((DEADLINE - SECONDS - 5))
  ((to_deadline < left)) && left=$to_deadline
  local give=$limit
  ((soak == 1 && left > give)) && give=$left
  ((give > left)) && give=$left
  if ((give < 15)); then
    echo "actpack: stage $name skipped: ${left} s left of the stages' ${STAGE_SECONDS} s" \
      "(deadline ${DEADLINE} s)"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$title" "$limit" 0 0 - \
      "skipped: ${left} s left" >>"$WORK/stages.tsv"
    status=1
    return
  fi
  echo
  echo "== $name: $title (limit ${give} s; ${used} s of the stages' ${STAGE_SECONDS} used," \
    "${SECONDS} s in) =="
  local begun=$SECONDS
  ACTPACK_STAGE_SECONDS=$give timeout --signal=INT --kill-after=5 $((give - 5)) "$@"
  local rc=$?
  local took=$((SECONDS - begun))
  local outcome=passed
  if ((rc == 124 || rc == 137)); then
    outcome="cut at its limit"
    echo "actpack: stage $name ran past its ${give} s and was stopped"
  elif ((rc == 5)) && [[ $title == pytest* ]]; then
    outcome="no tests ran"
  elif ((rc != 0)); then
    outcome="failed (exit $rc)"
  fi
  [[ $outcome == passed ]] || status=1
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$title" "$limit" "$give" "$took" "$rc" \
    "$outcome" >>"$WORK/stages.tsv"
}

build() {
  local arch=$ARCH
  meta arch "sm_${arch/./}"
  local digest=$DIGEST
  if [[ ${ACTPACK_GPU_REBUILD:-0} != 1 && -f $SITE/.actpack-build ]] &&
    [[ $(cat "$SITE/.actpack-build") == "$digest $arch" ]]; then
    echo "== build: this machine holds a build of these sources for sm_${arch/./} ($SITE) =="
    meta build_seconds 0
    meta build "reused ($SITE)"
    return 0
  fi
  echo "== build (CUDA, sm_${arch/./} only, $(nproc) jobs) =="
  rm -rf "$SITE"
  local begun=$SECONDS
  # build/'s objects are kept: on a machine still warm from a call before, ninja recompiles what
  # changed (headers too, by its depfiles). The linked module goes, or setuptools would keep it
  # when no .cc or .cu is newer than it.
  rm -rf build/lib.*
  TORCH_CUDA_ARCH_LIST=$arch MAX_JOBS=$(nproc) python3 -m pip install -q --no-build-isolation \
    --no-deps --target "$SITE" . >"$OUT/build.log" 2>&1 || {
    tail -60 "$OUT/build.log"
    return 1
  }
  meta build_seconds $((SECONDS - begun))
  meta build "TORCH_CUDA_ARCH_LIST=$arch MAX_JOBS=$(nproc) pip install --target $SITE ."
  # The install's actpack-env.pth (ACTPACK_CONF at interpreter start) runs only from a site
  # directory: this makes $SITE one for every Python started from here, and runs the
  # sitecustomize it shadows, if the machine has one.
  cat >"$SITE/sitecustomize.py" <<'EOF'
import importlib.util
import os
import site
import sys

here = os.path.dirname(os.path.abspath(__file__))
site.addsitedir(here)
for path in sys.path:
    shadowed = os.path.join(path, "sitecustomize.py")
    if os.path.abspath(path or ".") != here and os.path.isfile(shadowed):
        spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", shadowed)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        break
EOF
  echo "$digest $arch" >"$SITE/.actpack-build"
  echo "built in $((SECONDS - begun)) s"
}

# Modules the tests need that the machine may lack, each with the wheels that make it up.
declare -A WHEELS=(
  [jsonschema]="jsonschema jsonschema_specifications referencing rpds_py"
  [hypothesis]="hypothesis"
  [tqdm]="tqdm"
  [pytest_timeout]="pytest_timeout"
)

carried_wheels() {
  local module wheel files
  for module in "${!WHEELS[@]}"; do
    python3 -c "import $module" 2>/dev/null && continue
    for wheel in ${WHEELS[$module]}; do
      files=(.deps/wheels/"$wheel"-*.whl)
      if [[ ! -f ${files[0]} ]]; then
        echo "actpack: no $wheel wheel in .deps/wheels for $module: run tools/fetch_gpu_deps.sh"
        continue
      fi
      python3 -m pip install -q --no-index --no-deps --target "$SITE" "${files[0]}" ||
        echo "actpack: could not install ${files[0]}"
    done
  done
}

main() {
  echo "actpack GPU check, $(date -u '+%Y-%m-%d %H:%M:%S UTC'); results in $OUT"
  : >"$WORK/meta.tsv"
  : >"$WORK/stages.tsv"
  meta started "$(date -u '+%Y-%m-%dT%H:%M:%SZ')"
  meta command "OUT=$OUT${ACTPACK_GPU_STAGES:+ ACTPACK_GPU_STAGES=$STAGES}${ACTPACK_GPU_DRY:+ ACTPACK_GPU_DRY=$DRY} bash tools/gpu_check.sh"
  meta stage_seconds "$STAGE_SECONDS"
  meta deadline "$DEADLINE"
  meta dry "$DRY"
  local commit
  # ACTPACK_GPU_COMMIT first: a lent machine's copy of the tree may carry a .git older than the
  # tree, which would name a commit the files are not.
  if [[ -n ${ACTPACK_GPU_COMMIT:-} ]]; then
    commit=$ACTPACK_GPU_COMMIT
  else
    commit=$(git rev-parse HEAD 2>/dev/null) &&
      [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]] && commit="$commit+changes"
    commit=${commit:-unknown (no .git here; ACTPACK_GPU_COMMIT names it)}
  fi
  DIGEST=$(source_digest)
  meta commit "$commit"
  meta source_digest "$DIGEST"
  export ACTPACK_GPU_COMMIT=$commit ACTPACK_GPU_SOURCE_DIGEST=$DIGEST
  echo "commit $commit, sources $DIGEST"

  # One interpreter for what the run needs to know of torch (each start imports it anew).
  local facts
  facts=$(python3 -c '
import platform, importlib.util as u
import pytest, setuptools, torch
cuda = torch.cuda.is_available()
print("torch", torch.__version__, "CUDA", torch.version.cuda)
print("python", platform.python_version())
print("capability", "%d.%d" % torch.cuda.get_device_capability() if cuda else "none")
print("pytest_timeout", u.find_spec("pytest_timeout") is not None)') || {
    echo "actpack: this machine lacks pytest, setuptools or torch; carry them as wheels"
    return 1
  }
  ARCH=$(awk '$1 == "capability" {print $2}' <<<"$facts")
  meta torch "$(awk '$1 == "torch" {$1 = ""; print substr($0, 2)}' <<<"$facts")"
  meta python "$(awk '$1 == "python" {print $2}' <<<"$facts")"
  if [[ $DRY != 1 && $ARCH == none ]]; then
    echo "actpack: torch sees no CUDA device here (ACTPACK_GPU_DRY=1 runs the plumbing on a CPU)"
    return 1
  fi
  if [[ $DRY == 1 ]]; then
    echo "actpack: a dry run: no build, the installed actpack, the CPU in the GPU's place"
    (cd / && python3 -c 'import actpack; print("actpack", actpack.__version__, actpack.__file__)') ||
      return 1
    meta device "CPU (dry run: $(nproc) cores)"
    meta build "none (dry run)"
  else
    if ! ls /usr/lib/x86_64-linux-gnu/libabsl_status.so /usr/lib/x86_64-linux-gnu/libhwy.so \
      /usr/include/nlohmann/json.hpp /usr/include/CLI/CLI.hpp >/dev/null 2>&1; then
      ls .deps/*.deb >/dev/null 2>&1 || {
        echo "actpack: no Abseil here and no .deps/*.deb; run tools/fetch_gpu_deps.sh on a machine with apt first"
        return 1
      }
      mkdir -p .deps/root
      for deb in .deps/*.deb; do dpkg -x "$deb" .deps/root; done
      export ACTPACK_ABSL_PREFIX="$PWD/.deps/root/usr"
    fi
    local gpu
    gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)
    echo "GPU: $gpu"
    meta device "$gpu"
    meta nvidia_smi "$(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv 2>&1 | tr '\n' ';')"
    build || return 1
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    mkdir -p "$SITE"
    carried_wheels
    python3 -c 'import actpack, actpack._C as c; assert c.with_cuda, "built without CUDA"; print("actpack", actpack.__version__, actpack.__file__)' ||
      return 1
  fi
  # A pytest stage: its results to $WORK/<stage>.xml; a test that hangs prints every thread's
  # stack and ends the stage (pytest-timeout, where the machine has it or .deps brought it).
  local pytest=(python3 -m pytest -q -p no:cacheprovider -rfEs --durations=8)
  if grep -q "pytest_timeout True" <<<"$facts" || python3 -c 'import pytest_timeout' 2>/dev/null; then
    pytest+=(--timeout=90 --timeout-method=thread)
  fi
  # The other GPU tests' files, most telling first, then any other file with a GPU test.
  local first=(tests/test_allocator.py tests/test_budget.py tests/test_allocator_hooks.py
    tests/test_codec_eb.py tests/test_gpu_sync.py tests/test_cli.py tests/test_policy.py
    tests/test_allocator_trace.py) others=() file
  for file in "${first[@]}" tests/test_*.py; do
    case $file in
      tests/test_gpu_budget.py | tests/test_codec_registry.py | tests/test_gpu_codecs.py) continue ;;
    esac
    [[ -f $file ]] && grep -q "mark.gpu" "$file" && [[ " ${others[*]} " != *" $file "* ]] &&
      others+=("$file")
  done

  local device=(--device cuda) sizes=()
  [[ $DRY == 1 ]] && device=(--device cpu) && sizes=(--sizes 1)
  STAGES_START=$SECONDS
  meta stages_started_at "$SECONDS"
  stage budget 45 0 "pytest -m gpu tests/test_gpu_budget.py: the capped CUDA path" \
    "${pytest[@]}" -p no:hypothesispytest --junitxml="$WORK/budget.xml" -m gpu \
    tests/test_gpu_budget.py
  stage identity 25 0 "pytest -m gpu tests/test_codec_registry.py tests/test_gpu_codecs.py: CPU = CUDA bytes" \
    "${pytest[@]}" -p no:hypothesispytest --junitxml="$WORK/identity.xml" -m gpu \
    tests/test_codec_registry.py tests/test_gpu_codecs.py
  # The scripts' own limits are inside the stage's: their JSON written, their workers stopped.
  # shellcheck disable=SC2016  # expanded by the inner bash, where the stage's seconds are set
  stage training 160 0 "benchmarks/gpu_training.py: training under an 8 GiB budget" \
    bash -c 'exec python3 benchmarks/gpu_training.py "$@" --time-limit $((ACTPACK_STAGE_SECONDS - 10))' _ \
    "${device[@]}" --json "$OUT/training.json"
  # shellcheck disable=SC2016
  stage kernels 90 0 "tools/gpu_benchmark.py: codec kernels against a copy" \
    bash -c 'exec python3 tools/gpu_benchmark.py "$@" --time-limit $((ACTPACK_STAGE_SECONDS - 10))' _ \
    "${device[@]}" "${sizes[@]}" --json "$OUT/kernels.json"
  if [[ $DRY != 1 ]]; then
    # shellcheck disable=SC2016
    stage counters 75 0 "tools/gpu_counters.py: the kernels' counters under Nsight Compute" \
      bash -c 'exec python3 tools/gpu_counters.py --json "$1" --time-limit $((ACTPACK_STAGE_SECONDS - 8))' _ \
      "$OUT/counters.json"
  fi
  stage tests 10 1 "pytest -m gpu: the other GPU tests, most telling first" \
    "${pytest[@]}" --junitxml="$WORK/tests.xml" -m gpu "${others[@]}"
  # Opt-in stages (ACTPACK_GPU_STAGES names them), beyond the default budget.
  stage triage 150 0 "tools/gpu_triage.py: each codec alone, launches blocking, then compute-sanitizer" \
    bash -c 'exec python3 tools/gpu_triage.py --json "$1" --time-limit $((ACTPACK_STAGE_SECONDS - 8))' _ \
    "$OUT/triage.json"
  stage sync 120 0 "tools/gpu_sync_check.py: host waits per step, 64 GiB budget" \
    python3 tools/gpu_sync_check.py
  stage demo 180 0 "tools/demo.py --device cuda" \
    python3 tools/demo.py --device cuda --steps 200 --report "$WORK/run.json"
  stage replay 120 0 "tools/gpu_allocator_benchmark.py: allocator traces" \
    python3 tools/gpu_allocator_benchmark.py --json "$WORK/allocator_replay.json"
  stage suite 300 0 "benchmarks/suite.py --device cuda --size smoke" \
    python3 benchmarks/suite.py --device cuda --size smoke --out "$WORK/suite" --quiet
  stage cputests 900 0 "pytest -m 'not gpu' against the CUDA build, the GPU hidden" \
    env CUDA_VISIBLE_DEVICES= "${pytest[@]}" --junitxml="$WORK/cputests.xml" -m "not gpu" tests
  meta stages_seconds $((SECONDS - STAGES_START))
  meta total_seconds "$SECONDS"
  echo
  python3 tools/gpu_manifest.py --out "$OUT" --work "$WORK" --status "$status" ||
    { echo "actpack: the manifest could not be written; the stages:"; cat "$WORK/stages.tsv"; }
  echo "actpack: the GPU check took $SECONDS s (stages $((SECONDS - STAGES_START)) s of" \
    "$STAGE_SECONDS); exit $status"
  return $status
}

main "$@" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
rm -rf "$WORK"
exit "$rc"
