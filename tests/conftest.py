import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# How long a child process (a subprocess, a spawned rank, a gloo collective) may run before a test
# calls it hung. A guard against hangs, not a time limit: the slowest child takes a few minutes on
# an idle 2-core machine, and a machine running other work may take several times that.
HANG_GUARD_S = 1800

# The workloads in benchmarks/ (the demo's, the GPU checks') are imported by tests as modules.
sys.path.insert(0, ROOT)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; tools/gpu_check.sh runs these on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def fresh_pool():
    """The host pool as a fresh process has it: earlier tests' tensors that are garbage but not
    yet collected pin segments whose free space a run could fill under any cap (the run warns
    of that), and count against a small budget's peak."""
    import gc
    import actpack
    gc.collect()
    actpack.memory.empty_cache("cpu")


@pytest.fixture
def cpu_allocator():
    """actpack's CPU allocator from before the model is built: a budget counts everything."""
    import actpack
    installed = actpack.cpu_allocator_installed()
    actpack.install_cpu_allocator()
    yield
    if not installed:
        actpack.uninstall_cpu_allocator()



def report_validator():
    """A validator for report/schema.json, the run report's format (report/FORMAT.md)."""
    import json

    import jsonschema
    with open(os.path.join(ROOT, "report", "schema.json")) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# How many reports the tests produced and checked (test_report_schema.py reads it).
VALIDATED_REPORTS = [0]


@pytest.fixture(autouse=True, scope="session")
def every_report_matches_the_schema():
    """Every report a test produces, by a budget's exit or by actpack.plan, is validated against
    report/schema.json as it is made: a writer that drifts from the format fails the test that
    made the report."""
    import actpack
    validator = report_validator()

    def check(report):
        errors = sorted(validator.iter_errors(report), key=lambda e: list(e.absolute_path))
        if errors:
            raise AssertionError("a report does not match report/schema.json: " + "; ".join(
                f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                for e in errors[:5]))
        VALIDATED_REPORTS[0] += 1

    handle = actpack.on_report(check)
    yield
    handle.remove()
