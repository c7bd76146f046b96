#!/usr/bin/env bash
# Run on a machine with apt (this one), before tools/gpu_check.sh on a GPU machine without a
# network: downloads the Debian packages the GPU machine lacks into .deps/ (git-ignored), which
# travels with the working tree, and the Python wheels the benchmark suite needs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p .deps
cd .deps
rm -f ./*.deb
# The tests' report schema check and property tests (hypothesis), the benchmark suite's
# progress bar and picture, as wheels for the GPU machine's Python (x86-64;
# ACTPACK_GPU_PYTHON, 3.12 by default). One version only:
# the working tree that travels to a lent GPU machine is limited to 64 MiB.
rm -rf wheels
mkdir -p wheels
python3 -m pip download -q --only-binary=:all: --platform manylinux2014_x86_64 \
  --python-version "${ACTPACK_GPU_PYTHON:-3.12}" --dest wheels jsonschema tqdm matplotlib \
  hypothesis
# The runtime library package is named after the Abseil release (libabsl20220623 on bookworm).
runtime_package=$(apt-cache depends libabsl-dev | awk '/Depends: libabsl2/{print $2; exit}')
# Highway: the codecs' vector kernels (headers in libhwy-dev, libhwy.so in libhwy1).
# nlohmann/json (the report) and CLI11 (the CLI's arguments): headers only.
apt-get download libabsl-dev "$runtime_package" libhwy-dev libhwy1 nlohmann-json3-dev libcli11-dev
ls -l
