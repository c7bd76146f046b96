#!/usr/bin/env bash
# The benchmark suite: installs what it needs (tools/setup_env.sh: apt and pip packages, the
# actpack wheel), then runs benchmarks/suite.py with the arguments given (--size smoke|cpu|full,
# --device cuda, --models ..., --out DIR). Idempotent.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/setup_env.sh
exec python3 benchmarks/suite.py "$@"
