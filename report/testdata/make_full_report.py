"""Writes run_quant2_full.json: a real report of the demo (benchmarks/demo.py) with every section the runtime
writes (per-module records with measured errors, the policy, per-step peaks, the allocator's
stats and snapshot, the planner's profile with a verified step).

    python3 report/testdata/make_full_report.py      # from the repository root; needs actpack

The run: the demo's causal conv net on the CPU, 6 steps at batch 32 under a 256 MiB budget with
codec quant2, planned at batch sizes 8, 16 and 32. The allocator trace is cut to its last
TRACE_KEPT actions to keep the file small. Regenerate the goldens afterwards (the
commands are at the top of report/report_test.cc).
"""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository root

from benchmarks import demo  # noqa: E402

TRACE_KEPT = 1500


def dumps(report):
    """Indented like the runtime's reports, except the snapshot: one segment or trace entry a
    line, so that the fixture stays small."""
    snapshot = report["allocator"]["snapshot"]
    report["allocator"]["snapshot"] = "@SNAPSHOT@"
    text = json.dumps(report, indent=2)
    lines = ['{"segments": [']
    lines += [json.dumps(s) + ("," if i + 1 < len(snapshot["segments"]) else "")
              for i, s in enumerate(snapshot["segments"])]
    lines.append('], "device_traces": [')
    for d, trace in enumerate(snapshot["device_traces"]):
        lines.append("[")
        lines += [json.dumps(e) + ("," if i + 1 < len(trace) else "") for i, e in enumerate(trace)]
        lines.append("]" + ("," if d + 1 < len(snapshot["device_traces"]) else ""))
    lines.append('], "allocator_settings": ' + json.dumps(snapshot["allocator_settings"]) + "}")
    report["allocator"]["snapshot"] = snapshot
    return text.replace('"@SNAPSHOT@"', "\n".join(lines)) + "\n"


def main():
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "run.json")
        demo.main(["--steps", "6", "--batch", "32", "--codec", "quant2", "--budget", "256MiB",
                   "--plan-batches", "8,16,32", "--snapshot", "--report", path])
        with open(path) as f:
            report = json.load(f)
    # The allocator's trace ring holds ~19k actions of these runs; the fixture keeps the last
    # TRACE_KEPT, as a smaller ring would have (the segments are the snapshot's, whole).
    traces = report["allocator"]["snapshot"]["device_traces"]
    report["allocator"]["snapshot"]["device_traces"] = [t[-TRACE_KEPT:] for t in traces]
    text = dumps(report)
    assert json.loads(text) == report
    with open(os.path.join(HERE, "run_quant2_full.json"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
