#!/usr/bin/env bash
# The main job: installs what is missing, then trains the demo model on the Python standard
# library's sources twice (plain and under actpack) and prints the memory report and the
# supported batch size. Extra arguments go to tools/demo.py (e.g. --steps 200 --codec quant4).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/setup_env.sh
python3 tools/demo.py "$@"
