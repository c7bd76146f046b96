"""The `actpack` console command (actpack.cli -> actpack._C.run_cli) on a report from a fresh
real run: exit codes, the text and JSON reports, diff, plan, the SVG rendered to PNG by
rsvg-convert (Debian librsvg2-bin), and the allocator snapshot pickled in C++ and read by
Python's pickle and torch's memory_viz.

The planner, allocator and per-module sections are read from report/testdata/run_quant2_full.json
(a real demo run with every section, report/testdata/make_full_report.py), from a fresh
actpack.plan report, and from a live CPU-allocator snapshot put into a fresh report here.

Runs against whichever actpack is importable; to test a build without replacing the
installed package:
    pip install --no-build-isolation --target /tmp/cli-site .
    PYTHONPATH=/tmp/cli-site python -m pytest tests/test_cli.py
"""
import copy
import json
import math
import os
import pathlib
import pickle
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
from conftest import HANG_GUARD_S

pytestmark = pytest.mark.skipif(
    not hasattr(_C, "run_cli"),
    reason=f"the importable actpack ({actpack.__file__}) was built without the CLI (run_cli)")


REPO = pathlib.Path(__file__).resolve().parents[1]
FULL_REPORT = REPO / "report" / "testdata" / "run_quant2_full.json"
FIXTURES = [p.name for p in (REPO / "report" / "testdata").glob("*.json")]


def actpack_cli(*args):
    """Runs `python -m actpack.cli ARGS` in a child process, as the console script would."""
    return subprocess.run([sys.executable, "-m", "actpack.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


def run_cli(*args):
    """The same command line in this process (actpack._C.run_cli, what actpack.cli calls),
    for tests that run it many times: (exit code, stdout, stderr)."""
    return _C.run_cli([str(a) for a in args])


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
    assert "top consumers by module" in result.stdout
    assert "quant4" in result.stdout
    # nn.Sequential's children by name, as named_modules() gives them.
    assert "\n  0 " in result.stdout and "\n  3 " in result.stdout


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
    subprocess.run([rsvg, str(svg), "-o", str(png)], check=True, timeout=HANG_GUARD_S)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (int(root.get("width")), int(root.get("height")))
    assert len(data) > 10_000, "a rendered chart, not an empty canvas"


# A report with as little as reads, and one whose optional sections are ill-typed (read as absent).
BARE_REPORTS = {
    "bare": {"schema": "actpack.report", "schema_version": 1},
    "odd": {"schema": "actpack.report", "schema_version": 1, "run": [1],
            "activations": {"totals": 3, "steps": {"a": 1},
                            "saved_tensors": [1, {"raw_bytes": "x"}, {}]}},
}


@pytest.mark.parametrize("source", sorted(FIXTURES) + sorted(BARE_REPORTS))
def test_every_plot_is_well_formed_svg(source, tmp_path):
    """The SVG writer on every fixture and on reports with nothing to draw: XML a parser
    accepts, that rsvg renders at its stated size."""
    path = REPO / "report" / "testdata" / source if source in FIXTURES else tmp_path / "r.json"
    if source in BARE_REPORTS:
        path.write_text(json.dumps(BARE_REPORTS[source]))
    svg = tmp_path / "memory.svg"
    result = actpack_cli("plot", path, "-o", svg)
    assert result.returncode == 0, result.stderr
    root = ElementTree.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    rsvg = shutil.which("rsvg-convert")
    if rsvg is None:
        pytest.skip("rsvg-convert not installed (Debian package librsvg2-bin)")
    png = tmp_path / "memory.png"
    subprocess.run([rsvg, str(svg), "-o", str(png)], check=True, timeout=HANG_GUARD_S)
    assert struct.unpack(">II", png.read_bytes()[16:24]) == (int(root.get("width")),
                                                            int(root.get("height")))


def test_snapshot_pickles_any_json_document(tmp_path):
    """`actpack snapshot` pickles what the report holds, whatever its values: Python's pickle
    reads back the same objects, of the same types, in the same order."""
    snapshot = {"segments": [{"address": 140737488355328, "blocks": [], "is_expandable": False,
                              "ratio": 0.25, "name": "w\u00e9ight \u2713", "empty": {},
                              "big": 2**63 - 1, "small": -2**63, "negative_zero": -0.0,
                              "values": [[[[]]], -7, 1e300, None, 2.0, 255, 256, 65536, -1,
                                         2**31, -2**31 - 1]}],
                "device_traces": [], "z": {"y": {"x": [1, 2.5, "3", True]}}}
    report = dict(BARE_REPORTS["bare"],
                  allocator={"backend": "cpu", "stats": {}, "snapshot": snapshot})
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report, ensure_ascii=False), encoding="utf-8")
    out = tmp_path / "snap.pickle"
    result = actpack_cli("snapshot", path, "-o", out)
    assert result.returncode == 0, result.stderr
    with open(out, "rb") as f:
        back = pickle.load(f)
    assert same_types(back, snapshot)
    assert math.copysign(1.0, back["segments"][0]["negative_zero"]) == -1.0


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


# ---- the planner, allocator and per-module sections ----

def full_report():
    return json.loads(FULL_REPORT.read_text())


def same_types(a, b):
    """Equal, and of the same Python types all the way down (1, 1.0 and True are == apart)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_types(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_types(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def test_report_shows_modules_planner_and_allocator():
    result = actpack_cli("report", FULL_REPORT)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for text in ("top consumers by module", "convs.0", "rel rms", "max abs",
                 "batch-size planner", "verified: auto at batch",
                 "allocator (cpu)", "peak reserved", "fragmentation", "alloc retries", "OOMs"):
        assert text in out, (text, out)
    stats = full_report()["allocator"]["stats"]
    fragmentation = stats["reserved_bytes.all.peak"] / stats["allocated_bytes.all.peak"]
    assert f"{fragmentation:.2f}x (reserved / allocated, at peak)" in out


@pytest.mark.parametrize("budget, budget_bytes", [
    ("12GiB", 12 << 30), ("24MiB", 24 << 20), ("256MiB", 256 << 20), ("300000000", 300000000)])
def test_plan_replans_with_fixed_plus_per_sample(budget, budget_bytes):
    code, out, err = run_cli("plan", FULL_REPORT, "--budget", budget, "--json")
    assert code == 0, err
    plan = json.loads(out)
    planner = full_report()["planner"]
    assert plan["schema"] == "actpack.plan"
    assert plan["budget_bytes"] == budget_bytes
    assert plan["recorded_budget_bytes"] == planner["budget_bytes"]
    assert list(plan["choices"]) == list(planner["choices"])
    expected = {}
    for name, choice in planner["choices"].items():
        fits = int(budget_bytes * (1 - planner["headroom"])) - choice["fixed_bytes"]
        expected[name] = max(0, fits // choice["per_sample_bytes"])
        assert plan["choices"][name]["max_batch_size"] == expected[name], name
        assert plan["choices"][name]["recorded_max_batch_size"] == choice["max_batch_size"]
    assert plan["best"] == max(expected, key=expected.get)
    profiled = planner["batch_sizes"]
    assert plan["extrapolated"] == any(
        b and not min(profiled) <= b <= max(profiled) for b in expected.values())

    code, text, err = run_cli("plan", FULL_REPORT, "--budget", budget)
    assert code == 0, err
    for name, batch in expected.items():
        row = next(line for line in text.splitlines() if line.split()[:1] == [name])
        assert row.split()[-2] == str(batch), row


def test_cli_plan_agrees_with_the_python_planner(tmp_path):
    """actpack.plan's answer, re-planned by the CLI from its report at the same budget."""
    torch.manual_seed(0)
    # Deep enough that saved activations, not one layer's transients, make the peak.
    model = nn.Sequential(*[m for _ in range(12) for m in (nn.Linear(256, 256), nn.Tanh())],
                          nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch):
        x, y = torch.randn(batch, 256), torch.randint(0, 10, (batch,))
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    path = tmp_path / "plan.json"
    plan = actpack.plan(step, "64MiB", batch_sizes=(64, 256), codecs=("none", "quant2"),
                        report=path, progress=False)
    assert plan.max_batch_size["quant2"] > plan.max_batch_size["none"] > 0, plan.table()
    code, out, err = run_cli("plan", path, "--budget", "64MiB", "--json")
    assert code == 0, err
    cli = json.loads(out)
    assert {n: c["max_batch_size"] for n, c in cli["choices"].items()} == plan.max_batch_size
    assert cli["headroom"] == plan.report["planner"]["headroom"]  # the default headroom


def test_plan_refuses_a_share_of_the_device():
    result = actpack_cli("plan", FULL_REPORT, "--budget", "80%")
    assert result.returncode == 2
    assert result.stdout == ""
    first_line = result.stderr.splitlines()[0]
    assert "--budget 80%" in first_line and "share of the device" in first_line
    assert "12GiB" in first_line


def check_memory_viz_accepts(snapshot):
    """torch's memory_viz (no CUDA needed) walks the snapshot: segsum checks that every
    segment's blocks add up, trace replays the actions, the plots embed it for the web page."""
    from torch.cuda import _memory_viz
    summary = _memory_viz.segsum(copy.deepcopy(snapshot))
    assert f"segments: {len(snapshot['segments'])}" in summary
    trace = _memory_viz.trace(copy.deepcopy(snapshot))
    assert f"{len(snapshot['device_traces'][0])} entries" in trace
    for html in (_memory_viz.trace_plot(copy.deepcopy(snapshot)),
                 _memory_viz.segment_plot(copy.deepcopy(snapshot))):
        assert "snapshot.pickle" in html and "<script" in html


def test_snapshot_pickle_is_what_torch_memory_viz_reads(tmp_path):
    out = tmp_path / "snap.pickle"
    result = actpack_cli("snapshot", FULL_REPORT, "-o", out)
    assert result.returncode == 0, result.stderr
    assert str(out) in result.stdout and "memory_viz" in result.stdout
    with open(out, "rb") as f:
        snapshot = pickle.load(f)
    assert same_types(snapshot, full_report()["allocator"]["snapshot"])
    check_memory_viz_accepts(snapshot)


LIVE_ALLOCATOR = """
import json, sys, torch, actpack
device = sys.argv[3]
if device == "cuda":
    actpack.install_allocator(budget="512MiB")  # before CUDA is initialised
else:
    actpack.install_cpu_allocator(budget="512MiB")
kept = [torch.randn(256, 1024, device=device) for _ in range(4)]
del kept[1]
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 8)).to(device)
model(torch.randn(64, 256, device=device)).square().sum().backward()
if device == "cuda":
    torch.cuda.synchronize()
snapshot = actpack.memory_snapshot(device)
actpack.dump_snapshot(sys.argv[2], device)
json.dump({"backend": device, "budget_bytes": actpack.memory_budget(device),
           "stats": actpack.memory_stats(device), "snapshot": snapshot}, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_snapshot_of_a_live_allocator_matches_python_pickle(run_report, tmp_path, device):
    """A real snapshot of actpack's allocator (in a child process: the allocator is
    process-wide), put into a fresh run report: `actpack snapshot` writes what Python's own
    pickle of the same dict (actpack.dump_snapshot) reads back as."""
    allocator_json, python_pickle = tmp_path / "allocator.json", tmp_path / "python.pickle"
    subprocess.run([sys.executable, "-c", LIVE_ALLOCATOR, allocator_json, python_pickle, device],
                   check=True, timeout=HANG_GUARD_S)
    report = json.loads(run_report.read_text())
    report["allocator"] = json.loads(allocator_json.read_text())
    path = tmp_path / "run_with_allocator.json"
    path.write_text(json.dumps(report))

    out = tmp_path / "snap.pickle"
    result = actpack_cli("snapshot", path, "-o", out)
    assert result.returncode == 0, result.stderr
    with open(out, "rb") as f:
        ours = pickle.load(f)
    with open(python_pickle, "rb") as f:
        theirs = pickle.load(f)
    assert same_types(ours, theirs)
    assert sum(len(trace) for trace in ours["device_traces"]) > 0
    check_memory_viz_accepts(ours)

    text = actpack_cli("report", path)
    assert text.returncode == 0, text.stderr
    assert f"allocator ({device})" in text.stdout and "512.00 MiB" in text.stdout
    stats = report["allocator"]["stats"]
    assert f"{stats['reserved_bytes.all.peak'] / stats['allocated_bytes.all.peak']:.2f}x" \
        in text.stdout


def test_snapshot_pickles_edge_values_exactly(tmp_path):
    values = [0, 255, 256, 65535, 65536, -1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**47 + 3,
              2**63 - 1, -2**63, 0.0, -0.0, 1.5, 1e300, 5e-324, 2.0, True, False, None,
              "", "plain", "w\u00e9ight \u2713 \U0001f600", "quote \" and \\ and \n",
              [], {}, [[[]]], {"nested": {"deeper": [1, {"x": None}]}}]
    snapshot = {"segments": [], "device_traces": [[]], "values": values,
                "keys": {str(i): v for i, v in enumerate(values)}}
    report = full_report()
    report["allocator"]["snapshot"] = snapshot
    path = tmp_path / "edge.json"
    path.write_text(json.dumps(report, ensure_ascii=False), encoding="utf-8")
    out = tmp_path / "edge.pickle"
    result = actpack_cli("snapshot", path, "-o", out)
    assert result.returncode == 0, result.stderr
    with open(out, "rb") as f:
        assert same_types(pickle.load(f), snapshot)


def test_snapshot_without_one_exits_2(run_report, tmp_path):
    # budget(snapshot=False), the default: the allocator section has stats, no snapshot.
    result = actpack_cli("snapshot", run_report, "-o", tmp_path / "x.pickle")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert "allocator section has no snapshot" in result.stderr
    assert not (tmp_path / "x.pickle").exists()


@pytest.mark.parametrize("path, value, problem", [
    (["planner"], [1], "planner is an array, expected an object or null"),
    (["planner", "budget_bytes"], "12GiB", "planner.budget_bytes is the string \"12GiB\""),
    (["planner", "batch_sizes"], [8, 16.5], "planner.batch_sizes[1] is the number 16.5"),
    (["planner", "choices", "quant2", "per_sample_bytes"], -3,
     "planner.choices.quant2.per_sample_bytes is the number -3"),
    (["planner", "verified"], "yes", "planner.verified is the string \"yes\""),
    (["allocator", "backend"], "xla", "allocator.backend is the string \"xla\""),
    (["allocator", "stats", "num_ooms"], None, "allocator.stats.num_ooms is null"),
    (["allocator", "snapshot", "device_traces"], {}, "allocator.snapshot.device_traces is an object"),
    (["activations", "saved_tensors", 1, "module"], ["layer1"],
     "activations.saved_tensors[1].module is an array"),
    (["activations", "saved_tensors", 1, "error", "rms"], "small",
     "activations.saved_tensors[1].error.rms is the string \"small\""),
])
def test_ill_typed_new_sections_exit_2_with_one_line(tmp_path, path, value, problem):
    report = full_report()
    target = report
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    bad = tmp_path / "bad_section.json"
    bad.write_text(json.dumps(report))
    result = actpack_cli("report", bad)  # the console command: no traceback
    outcomes = [(result.returncode, result.stdout, result.stderr)]
    outcomes += [run_cli(*args) for args in ([
        "plan", bad, "--budget", "1GiB"], ["snapshot", bad, "-o", tmp_path / "x.pickle"],
        ["diff", FULL_REPORT, bad])]
    for code, out, err in outcomes:
        assert code == 2, out
        assert out == ""
        assert err.count("\n") == 1, err
        assert str(bad) in err and problem in err, err
        assert "Traceback" not in err
    assert not (tmp_path / "x.pickle").exists()


def test_diff_compares_planner_and_modules(tmp_path):
    report = full_report()
    report["planner"]["budget_bytes"] = 512 << 20
    report["planner"]["choices"]["quant2"]["max_batch_size"] += 400
    after = tmp_path / "after.json"
    after.write_text(json.dumps(report))
    result = actpack_cli("diff", FULL_REPORT, after)
    assert result.returncode == 0, result.stderr
    assert "planner: largest batch size by choice (before: 256.00 MiB, after: 512.00 MiB)" \
        in result.stdout
    quant2 = next(line for line in result.stdout.splitlines() if line.split()[:1] == ["quant2"])
    assert quant2.split()[-1] == "+400", quant2
    assert "stored bytes per step by module" in result.stdout
