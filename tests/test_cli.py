"""The `actpack` console command (actpack.cli -> actpack._C.run_cli) on a report from a fresh
real run: exit codes, the text and JSON reports, diff, plan, and the SVG rendered to PNG by
rsvg-convert (Debian librsvg2-bin).

Runs against whichever actpack is importable; to test a build without replacing the
installed package:
    pip install --no-build-isolation --target /tmp/cli-site .
    PYTHONPATH=/tmp/cli-site python -m pytest tests/test_cli.py
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest
import torch
import torch.nn as nn

import actpack
from actpack import _C

pytestmark = pytest.mark.skipif(
    not hasattr(_C, "run_cli"),
    reason=f"the importable actpack ({actpack.__file__}) was built without the CLI (run_cli)")


def actpack_cli(*args):
    """Runs `python -m actpack.cli ARGS` in a child process, as the console script would."""
    return subprocess.run([sys.executable, "-m", "actpack.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def run_report(tmp_path_factory):
    """A report written by actpack.budget around three steps of a tiny MLP."""
    path = tmp_path_factory.mktemp("cli") / "run.json"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, labels = torch.randn(512, 64), torch.randint(0, 10, (512,))
    with actpack.budget("64MiB", codec="quant4", report=path):
        for _ in range(3):
            loss = nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return path


def test_report_text(run_report):
    result = actpack_cli("report", run_report)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "actpack run report: run.json" in result.stdout
    assert "64.00 MiB" in result.stdout
    assert "top consumers by producer" in result.stdout
    assert "quant4" in result.stdout


def test_report_json_matches_the_run(run_report):
    result = actpack_cli("report", run_report, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    report = json.loads(run_report.read_text())
    assert summary["schema"] == "actpack.report_summary"
    assert summary["run"]["budget_bytes"] == 64 << 20
    totals = report["activations"]["totals"]
    assert summary["activations"]["totals"]["packed_raw_bytes"] == totals["packed_raw_bytes"]
    assert totals["packs"] > 0, "the tiny model should have packed something"
    producers = {p["producer"] for p in summary["producers"]}
    assert producers == {t["producer"] for t in report["activations"]["saved_tensors"]}


def test_diff_of_a_run_with_itself_changes_nothing(run_report):
    result = actpack_cli("diff", run_report, run_report)
    assert result.returncode == 0, result.stderr
    assert "packed ratio" in result.stdout
    assert "changed" not in result.stdout and "%" not in result.stdout


def test_plan_without_planner_profile_exits_2(run_report):
    result = actpack_cli("plan", run_report, "--budget", "12GiB")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "run report has no planner profile" in result.stderr


def test_plot_renders_to_png(run_report, tmp_path):
    svg = tmp_path / "memory.svg"
    result = actpack_cli("plot", run_report, "-o", svg)
    assert result.returncode == 0, result.stderr
    root = ElementTree.parse(svg).getroot()  # well-formed XML
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    for label in ("training step", "bytes per step", "stored by actpack", "budget"):
        assert label in texts, (label, texts)
    # The budget is drawn as a line, or stated when it lies far above the activations' scale.
    assert any(t and t.startswith("budget 64.00 MiB") for t in texts), texts
    assert any(t and t.endswith("MiB") for t in texts)

    rsvg = shutil.which("rsvg-convert")
    if rsvg is None:
        pytest.skip("rsvg-convert not installed (Debian package librsvg2-bin)")
    png = tmp_path / "memory.png"
    subprocess.run([rsvg, str(svg), "-o", str(png)], check=True, timeout=60)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (int(root.get("width")), int(root.get("height")))
    assert len(data) > 10_000, "a rendered chart, not an empty canvas"


@pytest.mark.parametrize("contents, problem", [
    ("not json at all", "not JSON"),
    ('{"schema": "actpack.report", "schema_version": 1, "run": {', "truncated JSON"),
    ('{"schema": "torch.memory_snapshot", "schema_version": 1}', "not an actpack run report"),
    ('{"schema": "actpack.report", "schema_version": 99}', "unsupported run report schema_version"),
    (None, "No such file or directory"),
])
def test_bad_files_exit_2_with_one_line(tmp_path, contents, problem):
    path = tmp_path / "bad.json"
    if contents is not None:
        path.write_text(contents)
    result = actpack_cli("report", path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert str(path) in result.stderr and problem in result.stderr
    assert "Traceback" not in result.stderr


def test_usage_errors_exit_2():
    for args in ([], ["frobnicate"], ["plot", "run.json"]):
        result = actpack_cli(*args)
        assert result.returncode == 2, args
        assert "usage: actpack" in result.stderr
