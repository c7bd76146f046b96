#!/usr/bin/env bash
# Run on a machine with apt and pip (this one), before tools/gpu_check.sh on a GPU machine without
# a network: downloads into .deps/ (git-ignored; carry it with the working tree) what that
# machine lacks.
#   .deps/*.deb     Abseil, Highway, nlohmann/json and CLI11 to build actpack (gpu_check.sh
#                   unpacks them into .deps/root when the machine has no Abseil of its own)
#   .deps/wheels/   the Python modules the GPU check imports that the lent GPU machine's image
#                   does not hold (it holds torch, pytest, pytest-timeout, hypothesis, tqdm,
#                   matplotlib and numpy, not jsonschema): jsonschema (the tests' report schema
#                   check, in tests/conftest.py)
#                   with its own dependencies the image lacks (jsonschema-specifications,
#                   referencing, rpds-py); and hypothesis, tqdm and pytest-timeout, small, for
#                   an image without them. gpu_check.sh installs each only where its module does
#                   not import.
# The scripts of the GPU check import nothing else beyond the standard library, torch and
# actpack (benchmarks/gpu_training.py, tools/gpu_benchmark.py, tools/gpu_manifest.py,
# tests/test_gpu_*.py).
# Wheels: one version each, for the GPU machine's Python (ACTPACK_GPU_PYTHON, 3.12 by default)
# on x86-64 Linux, without their dependencies (named here one by one: two versions of one
# package stop an install). The working tree that travels to a lent GPU is limited to 64 MiB.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p .deps
cd .deps
rm -f ./*.deb
rm -rf wheels root
mkdir -p wheels
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
  manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --implementation cp \
  --python-version "${ACTPACK_GPU_PYTHON:-3.12}" "${platforms[@]}" --dest wheels \
  jsonschema jsonschema-specifications referencing rpds-py hypothesis tqdm pytest-timeout
# The runtime library package is named after the Abseil release (libabsl20220623 on bookworm).
runtime_package=$(apt-cache depends libabsl-dev | awk '/Depends: libabsl2/{print $2; exit}')
# Highway: the codecs' vector kernels (headers in libhwy-dev, libhwy.so in libhwy1).
# nlohmann/json (the report) and CLI11 (the CLI's arguments): headers only.
apt-get download libabsl-dev "$runtime_package" libhwy-dev libhwy1 nlohmann-json3-dev libcli11-dev
ls -l ./*.deb wheels
du -sh .
