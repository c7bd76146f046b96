#!/usr/bin/env bash
# Installs what actpack needs on a Debian machine, builds the sdist and the wheel against the
# installed torch (python -m build) and installs that wheel. Idempotent: installed packages are
# skipped. Run by tools/test.sh and tools/demo.sh; run it alone to get a working install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

APT_PACKAGES=(bazel-bootstrap libabsl-dev libhwy-dev libgtest-dev libgmock-dev libbenchmark-dev
              nlohmann-json3-dev libcli11-dev
              libkissfft-dev librsvg2-bin ninja-build clang libclang-rt-14-dev)
TORCH="torch==2.13.0"
# The optional integrations' frameworks (the extras actpack[transformers], actpack[lightning])
# are installed too, so their tests run. torch is named with them, pinned: pip then keeps the
# installed CPU torch instead of resolving one of its own.
# tqdm and matplotlib: the benchmark suite's progress bar and picture (benchmarks/).
# hypothesis: the property tests of tests/test_edge_inputs.py. pytest-xdist: the test command
# runs a test per core.
# scikit-learn: the handwritten digits it ships, the convergence benchmark's image data.
PIP_PACKAGES=("$TORCH" pytest pytest-xdist hypothesis numpy ninja setuptools wheel build tqdm matplotlib
              jsonschema scikit-learn "transformers>=4.40" "accelerate>=0.26" "lightning>=2.0")
PIP_PACKAGES+=(nvidia-cuda-nvdisasm)  # the SASS disassembler tools/kernel_model.py reads

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

missing=()
for package in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "actpack: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# torch first and alone: a bare `torch` requirement elsewhere would pull a CUDA build.
if ! python3 -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  echo "actpack: installing torch 2.13.0 (CPU)"
  python3 -m pip install -q "$TORCH"
fi
python3 -m pip install -q "${PIP_PACKAGES[@]}"

echo "actpack: building the sdist and the wheel (python -m build; torch.utils.cpp_extension)"
rm -rf dist
# No isolation: the extension is built against the installed torch, not one pip would fetch.
MAX_JOBS="${MAX_JOBS:-$(nproc)}" python3 -m build --no-isolation --outdir dist . >/dev/null
python3 -m pip install -q --no-deps --force-reinstall dist/actpack-*.whl
