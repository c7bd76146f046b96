"""The convergence benchmark's smoke run (benchmarks/convergence.py --smoke): both tasks and
every method run a few steps of real training, and what it writes means what it says. The full
runs (3 seeds, full schedules) make docs/results.md's convergence table."""
import json
import math
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "convergence.py")


def test_smoke_run_trains_every_method_on_both_tasks(tmp_path):
    out = tmp_path / "convergence.json"
    run = subprocess.run([sys.executable, SCRIPT, "--smoke", "--json", str(out),
                          "--svg", str(tmp_path / "convergence.svg")],
                         text=True, capture_output=True)
    assert run.returncode == 0, run.stderr[-4000:]
    results = json.loads(out.read_text())
    assert set(results["tasks"]) == {"digits-cnn", "stdlib-lm"}
    for name, task in results["tasks"].items():
        methods = task["methods"]
        assert list(methods) == ["plain", "quant2", "division", "eb", "auto@50%", "auto@30%"]
        plain = methods["plain"]["runs"][0]
        assert plain["ended"] == "trained" and plain["curve"][0][0] == 0
        # 12 steps learn something: above chance (10 classes), below a uniform byte's loss.
        if task["higher_is_better"]:
            assert plain["metric"] > 0.15, plain
        else:
            assert plain["metric"] < math.log(256) - 0.5, plain
        assert task["plain_peak_reserved_bytes"] > 0
        assert methods["auto@50%"]["budget_bytes"] == task["plain_peak_reserved_bytes"] // 2
        for method, m in methods.items():
            for r in m["runs"]:
                # Either a finite metric, or the reason it has none.
                assert (r["ended"] == "trained") == (r["metric"] is not None), (name, method, r)
                if r["metric"] is not None:
                    assert math.isfinite(r["metric"])
            assert m["completed"] == sum(r["metric"] is not None for r in m["runs"])
        # Half of plain's peak holds both steps under auto.
        assert methods["auto@50%"]["completed"] == 1, methods["auto@50%"]
    assert "| digits-cnn (12 steps) | test accuracy |" in run.stdout
    assert (tmp_path / "convergence.svg").read_text().lstrip().startswith("<?xml")
