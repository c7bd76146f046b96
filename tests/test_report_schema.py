"""The run report's format: report/schema.json (described in report/FORMAT.md) accepts the
reports actpack writes and the CLI's fixtures, and rejects what a drifting writer would produce.

Every report another test produces is validated too, as it is made (conftest.py,
every_report_matches_the_schema).
"""
import copy
import glob
import json
import os

import pytest
import torch

import actpack
from conftest import ROOT, VALIDATED_REPORTS, report_validator

FIXTURES = sorted(glob.glob(os.path.join(ROOT, "report", "testdata", "*.json")))


@pytest.fixture(scope="module")
def validator():
    return report_validator()


def errors(validator, report):
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(report)]


@pytest.fixture(scope="module")
def full_report():
    with open(os.path.join(ROOT, "report", "testdata", "run_quant2_full.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("path", FIXTURES, ids=os.path.basename)
def test_the_cli_fixtures_match(validator, path):
    with open(path) as f:
        assert errors(validator, json.load(f)) == []


def test_a_report_written_now_matches_and_is_counted(validator, tmp_path):
    # Activations of 512 KiB, above the default min_bytes, so the policy plans.
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    before = VALIDATED_REPORTS[0]
    with actpack.budget("1GiB", codec="auto", report=tmp_path / "run.json") as run:
        for _ in range(3):
            model(torch.randn(256, 512)).square().mean().backward()
    # The conftest hook saw it (so the other tests' reports are checked as well) ...
    assert VALIDATED_REPORTS[0] == before + 1
    # ... and the file on disk is the same document.
    with open(tmp_path / "run.json") as f:
        written = json.load(f)
    assert errors(validator, written) == []
    assert written["activations"]["policy"]["plans"] >= 1


def set_path(report, path, value):
    node = report
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value


DELETE = object()


# What a writer that drifts from the format would produce; each must be refused, and the
# message must name where.
@pytest.mark.parametrize("path, value, where", [
    (("schema",), "torch.report", "schema"),
    (("schema_version",), 3, "schema_version"),
    (("run", "budget_bytes"), "6GiB", "run/budget_bytes"),
    (("run", "peak_allocated_bytes"), -1, "run/peak_allocated_bytes"),
    (("run", "peak_bytes_typo"), 1, "run"),
    (("activations", "totals"), DELETE, "activations"),
    (("activations", "totals", "ratio"), "15x", "activations/totals/ratio"),
    (("activations", "steps", 0, "stored_bytes"), 1.5, "activations/steps/0/stored_bytes"),
    (("activations", "saved_tensors", 0, "shape"), [16, "x"], "activations/saved_tensors/0/shape/1"),
    (("activations", "saved_tensors", 0, "codec"), "", "activations/saved_tensors/0/codec"),
    (("activations", "policy", "fragmentation"), 0.5, "activations/policy/fragmentation"),
    (("allocator", "allocator"), "rmm", "allocator/allocator"),
    (("planner", "choices", "quant2", "max_batch_size"), "12", "planner/choices/quant2/max_batch_size"),
    (("planner", "verified", "batch_size"), None, "planner/verified"),
])
def test_a_drifting_writer_is_refused(validator, full_report, path, value, where):
    assert errors(validator, full_report) == []
    report = copy.deepcopy(full_report)
    set_path(report, path, value)
    found = errors(validator, report)
    assert found, (path, value)
    assert any(e.startswith(where) for e in found), found


# The report crosses the binding as Python objects (torch_plugin/bindings/python_json.h), not JSON text.
def test_the_report_in_memory_is_the_file_in_member_order(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    with actpack.budget("1GiB", codec="quant4", report=tmp_path / "run.json") as run:
        model(torch.randn(256, 512)).square().mean().backward()
    with open(tmp_path / "run.json") as f:
        text = f.read()
    assert json.loads(text) == run.report
    # Member order survives both crossings (C++ -> dict -> C++ writer -> file).
    assert list(run.report) == ["schema", "schema_version", "actpack_version", "run",
                                "activations", "allocator"]
    assert list(json.loads(text)["activations"]) == list(run.report["activations"])
    assert isinstance(run.report["activations"]["totals"]["packs"], int)


def test_the_writer_refuses_an_invalid_report_and_writes_nothing(full_report, tmp_path):
    path = tmp_path / "bad.json"
    report = copy.deepcopy(full_report)
    report["planner"]["choices"]["quant2"]["per_sample_bytes"] = "x"
    with pytest.raises(ValueError, match=r"planner\.choices\.quant2\.per_sample_bytes"):
        actpack._C.write_report(report, str(path))
    assert not path.exists()
    with pytest.raises(ValueError, match="schema"):
        actpack._C.write_report({"schema": "torch.report"}, str(path))
    assert not path.exists()
    actpack._C.write_report(full_report, str(path))
    with open(path) as f:
        assert json.load(f) == full_report


def test_what_json_cannot_hold_is_refused_by_path(full_report, tmp_path):
    report = copy.deepcopy(full_report)
    report["run"]["warnings"] = ["ok", object()]
    with pytest.raises(TypeError, match=r"run\.warnings\[1\] is <object object"):
        actpack._C.write_report(report, str(tmp_path / "r.json"))
    report["run"]["warnings"] = []
    report["run"]["budget_bytes"] = 2**70
    with pytest.raises(TypeError, match=r"run\.budget_bytes is the integer 1180591620717411303424"):
        actpack._C.write_report(report, str(tmp_path / "r.json"))
    report["run"]["budget_bytes"] = 2**63 + 1  # fits uint64: kept exact
    report["run"]["wall_seconds"] = float("nan")  # written as null, as every non-finite number
    actpack._C.write_report(report, str(tmp_path / "r.json"))
    with open(tmp_path / "r.json") as f:
        written = json.load(f)
    assert written["run"]["budget_bytes"] == 2**63 + 1
    assert written["run"]["wall_seconds"] is None
