#!/usr/bin/env bash
# Runs every test: installs what is missing, then
#   1. bazel test //...                      (C++ unit tests, CPU)
#   2. bazel build --config=cuda //...       (CUDA sources compile with nvcc; nothing runs)
#   3. bazel test --config=asan //codecs/... //runtime/... //allocator/...   (ASan + UBSan)
#   4. bash tools/fuzz.sh 20                 (libFuzzer on every decoder and the JSON parser)
#   5. pytest tests/                         (the installed package; GPU tests skip without CUDA)
# and ends with pytest's summary line. Exits non-zero if any stage failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/setup_env.sh || exit 1

failed=()
echo "== bazel test //... =="
bazel test //... || failed+=("bazel test")
echo "== bazel build --config=cuda //... (compile check) =="
if [ -x /usr/local/cuda/bin/nvcc ]; then
  bazel build --config=cuda //... || failed+=("bazel build --config=cuda")
else
  echo "actpack: skipped: no CUDA toolkit at /usr/local/cuda (nvcc), so the .cu sources were not compiled"
fi
echo "== bazel test --config=asan (AddressSanitizer + UndefinedBehaviorSanitizer) =="
bazel test --config=asan //codecs/... //runtime/... //allocator/... || failed+=("asan")
echo "== fuzz =="
bash tools/fuzz.sh 20 || failed+=("fuzz")
echo "== pytest =="
(cd tests && python3 -m pytest -q -p no:cacheprovider .) || failed+=("pytest")

if [ ${#failed[@]} -gt 0 ]; then
  echo "actpack: FAILED stages: ${failed[*]}"
  exit 1
fi
echo "actpack: all stages passed"
