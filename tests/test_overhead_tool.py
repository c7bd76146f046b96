"""benchmarks/overhead.py's smoke run: every row runs, and the clocks say what ran."""
import json
import os
import subprocess
import sys

TOOL = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "overhead.py")


def test_the_split_adds_up_and_auto_packs(tmp_path):
    out = tmp_path / "overhead.json"
    run = subprocess.run([sys.executable, TOOL, "--size", "smoke", "--model", "gpt2-small",
                          "--batch", "8", "--budget", "4MiB", "--steps", "2", "--rounds", "2",
                          "--accumulate", "3", "--threads", "1", "--json", str(out)],
                         text=True, capture_output=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "budget, codec auto" in run.stdout and "minor page faults" in run.stdout
    data = json.loads(out.read_text())
    # The rows took turns twice: each row's ratio to plain per round, and its spread.
    for row in ("none", "auto", "accumulate"):
        values, spread = data["per_round"][row], data["over_plain"][row]
        assert len(values) == 2 and spread["n"] == 2, (row, data["over_plain"])
        assert spread["min"] == min(values) and spread["max"] == max(values)
        assert spread["min"] <= spread["q1"] <= spread["median"] <= spread["q3"] <= spread["max"]
    assert "upper quartile" in run.stdout
    assert data["command"].startswith("python3 benchmarks/overhead.py --size smoke")
    assert {"commit", "dirty", "date"} <= set(data) and data["machine"]["cpus"] > 0
    # Plain reaching batch 8 by accumulation over micro-batches of 3: 3, 3 and 2.
    assert data["accumulate"]["micro_steps"] == 3 and data["accumulate"]["wall"] > 0
    for row in ("none", "auto"):  # the codecs run inside the hooks: never more than them
        assert data[row]["hooks"] >= 0 and data[row]["model"] > 0, data[row]
    assert data["none"]["codec"] == 0  # nothing packed
    # auto under 4 MiB packs (the smoke GPT saves more than that), and its codecs took time.
    assert data["auto_packed_stored_bytes"] < data["auto_packed_raw_bytes"]
    assert data["auto"]["codec"] > 0
