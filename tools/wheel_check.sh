#!/usr/bin/env bash
# Installs the wheel in dist/ (tools/setup_env.sh builds it with `python -m build`) into a fresh
# virtual environment with the CPU torch, and checks from outside the source tree that it works
# there: `import actpack` comes from the venv, `actpack --version`, the demo's budget context
# (a short tools/demo.py run) and `actpack report` on the report it wrote.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheel=$(ls "$repo"/dist/actpack-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  echo "actpack: no wheel in $repo/dist; build one: python3 -m build --no-isolation" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
torch_version=$(python3 -c 'import torch; print(torch.__version__.split("+")[0])')

echo "actpack: a fresh virtual environment with torch $torch_version (CPU) and $(basename "$wheel")"
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
# torch first and pinned, as tools/setup_env.sh does: the wheel's torch requirement is then met
# and pip fetches nothing else for it (numpy only quiets torch's warning without it).
"$py" -m pip install -q "torch==$torch_version" numpy
"$py" -m pip install -q "$wheel"

cd "$work"  # not the source tree: the installed package must stand alone
"$py" -c 'import actpack, sys; assert actpack.__file__.startswith(sys.prefix), actpack.__file__; print("import actpack:", actpack.__file__)'
"$work/venv/bin/actpack" --version
"$py" "$repo/tools/demo.py" --steps 6 --batch 8 --context 64 --plan-batches none --report run.json
"$work/venv/bin/actpack" report run.json | head -5
echo "actpack: the wheel works in a fresh virtual environment"
