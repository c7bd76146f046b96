#!/usr/bin/env bash
# Installs what actpack needs on a Debian machine, builds the sdist and the wheel against the
# installed torch (python -m build) and installs that wheel. Idempotent: installed packages are
# skipped. Run by tools/test.sh and tools/demo.sh; run it alone to get a working install.
#
# It prints one line per step; what apt-get, pip and the build print goes to a log
# ($ACTPACK_SETUP_LOG, default build/setup.log, which .gitignore covers). When a step fails, the
# log's last lines and its path are printed and the script exits non-zero.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

APT_PACKAGES=(bazel-bootstrap libabsl-dev libhwy-dev libgtest-dev libgmock-dev libbenchmark-dev
              nlohmann-json3-dev libcli11-dev
              librsvg2-bin ninja-build clang libclang-rt-14-dev)
TORCH="torch==2.13.0"
# The optional integrations' frameworks (the extras actpack[transformers], actpack[lightning])
# are installed too, so their tests run. torch is named with them, pinned: pip then keeps the
# installed CPU torch instead of resolving one of its own.
# tqdm and matplotlib: the benchmark suite's progress bar and picture (benchmarks/).
# hypothesis: the property tests of tests/test_edge_inputs.py. pytest-xdist: the test command
# runs a test per core.
# scikit-learn and scikit-image: the handwritten digits and photographs they ship, the image
# data of the convergence and frontier benchmarks.
PIP_PACKAGES=("$TORCH" pytest pytest-xdist hypothesis numpy ninja setuptools wheel build tqdm matplotlib
              jsonschema scikit-learn scikit-image "transformers>=4.40" "accelerate>=0.26"
              "lightning>=2.0")
PIP_PACKAGES+=(nvidia-cuda-nvdisasm)  # the SASS disassembler tools/kernel_model.py reads

LOG="${ACTPACK_SETUP_LOG:-$PWD/build/setup.log}"
mkdir -p "$(dirname "$LOG")"
: >"$LOG"

fail() {
  echo "actpack: failed: $1; the last lines of $LOG:" >&2
  tail -n 40 "$LOG" | sed 's/^/  | /' >&2
  echo "actpack: the whole log: $LOG" >&2
  exit 1
}

# step "what it does" command...: one line on the terminal, the command's output in the log.
step() {
  local what="$1"
  shift
  echo "actpack: $what"
  printf '\n== %s\n$ %s\n' "$what" "$*" >>"$LOG"
  "$@" >>"$LOG" 2>&1 || fail "$what"
}

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for package in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "updating the Debian package lists (apt-get update)" as_root apt-get update -qq
  step "installing Debian packages: ${missing[*]}" \
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
fi

# torch first and alone: a bare `torch` requirement elsewhere would pull a CUDA build.
if ! python3 -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  step "installing torch 2.13.0 (CPU)" python3 -m pip install -q "$TORCH"
fi
step "installing the Python packages the tests and benchmarks use (pip)" \
  python3 -m pip install -q "${PIP_PACKAGES[@]}"

rm -rf dist
# No isolation: the extension is built against the installed torch, not one pip would fetch.
step "building the sdist and the wheel (python -m build; this takes minutes)" \
  env MAX_JOBS="${MAX_JOBS:-$(nproc)}" python3 -m build --no-isolation --outdir dist .
wheel=$(ls dist/actpack-*.whl)
step "installing $wheel" python3 -m pip install -q --no-deps --force-reinstall "$wheel"
# From outside the source tree, so that the installed package is what imports.
installed=$(cd / && python3 -c 'import actpack, torch; print(f"actpack {actpack.__version__} (torch {torch.__version__})")' 2>>"$LOG") ||
  fail "import actpack after installing it"
echo "actpack: installed $installed"
