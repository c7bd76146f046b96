#!/usr/bin/env bash
# Installs what actpack needs on a Debian machine and builds the Python package against the
# installed torch. Idempotent: installed packages are skipped. Sourced by tools/test.sh and
# tools/demo.sh; run it alone to get a working install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

APT_PACKAGES=(bazel-bootstrap libabsl-dev libhwy-dev libgtest-dev libgmock-dev libbenchmark-dev
              libkissfft-dev librsvg2-bin ninja-build clang libclang-rt-14-dev)
PIP_PACKAGES=("torch==2.13.0" pytest numpy ninja setuptools wheel)

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
  python3 -m pip install -q "torch==2.13.0"
fi
python3 -m pip install -q "${PIP_PACKAGES[@]}"

echo "actpack: building the Python package (torch.utils.cpp_extension)"
MAX_JOBS="${MAX_JOBS:-$(nproc)}" python3 -m pip install -q --no-build-isolation --no-deps .
