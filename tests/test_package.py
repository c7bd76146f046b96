"""The installed package: one version everywhere, the core free of the optional frameworks, and
an integration without its framework saying which extra installs it. (tools/wheel_check.sh
installs the wheel into a fresh virtual environment.)"""
import importlib.metadata
import json
import pathlib
import re
import subprocess
import sys

import torch

import actpack
from conftest import HANG_GUARD_S

REPO = pathlib.Path(__file__).resolve().parents[1]


def python(code, **kwargs):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=HANG_GUARD_S, **kwargs)


def test_one_version_in_the_source_the_metadata_the_cli_and_every_report(tmp_path):
    written = re.search(r'#define ACTPACK_VERSION "([^"]+)"',
                        (REPO / "common" / "version.h").read_text()).group(1)
    assert actpack.__version__ == written
    assert importlib.metadata.version("actpack") == written
    cli = subprocess.run([sys.executable, "-m", "actpack.cli", "--version"], capture_output=True,
                         text=True, timeout=HANG_GUARD_S)
    assert (cli.returncode, cli.stdout, cli.stderr) == (0, f"actpack {written}\n", "")
    with actpack.budget("1GiB", report=tmp_path / "run.json") as run:
        torch.randn(64, 64, requires_grad=True).tanh().sum().backward()
    assert run.report["actpack_version"] == written
    assert json.loads((tmp_path / "run.json").read_text())["actpack_version"] == written


def test_the_core_imports_none_of_the_optional_frameworks():
    result = python("import sys, actpack, actpack.integrations\n"
                    "print([m for m in ('transformers', 'lightning', 'accelerate') "
                    "if m in sys.modules])")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_an_integration_without_its_framework_names_the_extra():
    for module, extra in (("transformers", "transformers"), ("lightning", "lightning")):
        # A None entry in sys.modules makes `import <module>` fail as if it were not installed.
        result = python(f"import sys; sys.modules[{module!r}] = None\n"
                        f"import actpack.integrations.{extra}")
        assert result.returncode != 0
        assert f'pip install "actpack[{extra}]"' in result.stderr, result.stderr
