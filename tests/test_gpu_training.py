"""The GPU training benchmark's logic on the CPU, in seconds: its search for the largest batch
(growth, bisection, the stops), the share of time each job gets, the per-step count of CUDA API
calls, and the driver with its two workers simulated (no torch in them): every job, the JSON
it writes, a worker that hangs and one that crashes. benchmarks/gpu_training.py --device cpu
--size smoke runs the real workers on the CPU (minutes); tools/gpu_check.sh runs it on a GPU."""
import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks import gpu_training as gt

SCRIPT = os.path.join(os.path.dirname(gt.__file__), "gpu_training.py")


def oracle(limit, extra=None):
    """fits(batch) for a method that trains up to `limit`; `extra` maps batches to outcomes."""
    asked = []

    def fits(batch):
        asked.append(batch)
        if extra and batch in extra:
            outcome = extra[batch]
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        return "fits" if batch <= limit else "oom"
    return fits, asked


@pytest.mark.parametrize("limit, guess", [(70, 60), (70, 200), (70, 2), (2, 50), (300, 300),
                                          (1000, 16), (5, 5)])
def test_the_search_brackets_the_limit_to_its_precision(limit, guess):
    fits, asked = oracle(limit)
    found = gt.search(fits, guess, ceiling=4096, precision=0.05)
    assert found["status"] == "done"
    assert found["max_batch"] <= limit <= found["max_batch_upper"]
    assert found["max_batch_upper"] - found["max_batch"] <= max(0, int(0.05 * found["max_batch"]))
    assert [t["batch"] for t in found["tries"]] == asked
    assert len(asked) == len(set(asked))  # never the same batch twice
    assert len(asked) <= 14


def test_nothing_fits_and_the_ceiling_fits():
    found = gt.search(oracle(1)[0], 8, ceiling=4096)
    assert (found["max_batch"], found["max_batch_upper"], found["status"]) == (0, 1, "done")
    assert [t["batch"] for t in found["tries"]][-1] == 2  # batch 1 is not tried (batch norm)
    found = gt.search(oracle(10 ** 6)[0], 100, ceiling=300)
    assert (found["max_batch"], found["status"]) == (300, "ceiling")


def test_a_hang_or_an_error_stops_the_search_and_crashes_count_as_running_out():
    found = gt.search(oracle(100, {150: "hang"})[0], 100, ceiling=4096)
    assert found["status"] == "hang" and found["max_batch"] == 100
    found = gt.search(oracle(100, {150: "error"})[0], 100, ceiling=4096)
    assert found["status"] == "error"
    found = gt.search(oracle(100, {150: "crash", 125: "cuda_error"})[0], 100, ceiling=4096)
    assert found["status"] == "done" and found["max_batch"] == 100
    always = {b: "crash" for b in range(101, 5000)}
    found = gt.search(oracle(100, always)[0], 100, ceiling=4096)
    assert found["status"] == "crashes"
    assert sum(t.get("outcome") == "crash" for t in found["tries"]) == gt.MAX_CRASHES + 1


def test_out_of_time_keeps_the_bracket_so_far():
    fits, _ = oracle(100, {150: gt.Stop("time", "no time left")})
    found = gt.search(fits, 100, ceiling=4096)
    assert found["status"] == "time" and found["max_batch"] == 100
    assert found["tries"][-1] == {"stopped": "time", "message": "no time left"}


def test_each_job_gets_its_share_of_what_is_left():
    assert gt.allowance(100, 0.1, 0.5) == pytest.approx(20)
    assert gt.allowance(-5, 0.1, 0.5) == 0
    assert gt.allowance(10, 0.1, 0) == 10
    # The most telling first: the figures the issue checks are core jobs, before any extra one.
    tiers = [j[4] for j in gt.JOBS]
    assert set(tiers) == {"core", "extra"} and tiers == sorted(tiers)
    core = {(j[0], j[1], j[2]) for j in gt.JOBS if j[4] == "core"}
    for model in ("resnet50", "gpt2-small"):
        assert {("search", model, "plain"), ("search", model, "checkpoint"),
                ("search", model, "auto"), ("timing", model, None),
                ("profile", model, None)} <= core
    assert ("search", "gpt2-small", "auto+recompute") in core
    assert gt.JOBS[0][:3] == ("search", "resnet50", "plain")


def test_api_calls_are_counted_per_step():
    events = [("gpu_training.step.0", 0, 10), ("gpu_training.step.1", 20, 30),
              ("cudaStreamSynchronize", 5, 6), ("cudaMalloc", 7, 8), ("cudaLaunchKernel", 8, 9),
              ("cuMemMap", 21, 22), ("cudaStreamSynchronize", 25, 26),
              ("cudaDeviceSynchronize", 35, 36),  # the profiler's own, after the steps
              ("aten::mm", 22, 23), ("cudnn_convolution", 22, 23),
              ("gpu_training.step.1", 21, 29)]  # a range's second record: the first counts
    steps = gt.steps_of(events)
    assert [s["step"] for s in steps] == [0, 1]
    assert steps[0]["calls"] == {"cudaStreamSynchronize": 1, "cudaMalloc": 1,
                                 "cudaLaunchKernel": 1}
    assert (steps[0]["waits"], steps[0]["allocations"]) == (2, 1)
    assert (steps[1]["waits"], steps[1]["allocations"]) == (1, 1)


def test_round_statistics():
    s = gt.round_stats([1.0, 1.1, 1.3, 0.9])
    assert (s["median"], s["min"], s["max"], s["n"]) == (1.05, 0.9, 1.3, 4)
    assert s["q1"] <= s["median"] <= s["q3"]
    assert gt.round_stats([]) is None
    timing = {"rounds": [{"plain": 1.0, "auto": a, "ratio": a} for a in (1.1, 1.15, 1.3, 1.0)],
              "none_rounds": [1.0, 1.02]}
    summary = gt.timing_summary(timing)
    assert summary["rounds_within_1.2x"] == 3
    assert summary["auto_over_none"] == pytest.approx(summary["auto_seconds"]["median"] / 1.01)


LIMITS = {"resnet50": {"plain": 70, "checkpoint": 150, "selective": 80, "auto": 200,
                       "auto+recompute": 190},
          "gpt2-small": {"plain": 12, "checkpoint": 70, "selective": 15, "auto": 30,
                         "auto+recompute": 125}}


def simulate(tmp_path, spec, *extra, time_limit=60):
    out = tmp_path / "training.json"
    argv = [sys.executable, SCRIPT, "--device", "cpu", "--size", "smoke", "--json", str(out),
            "--simulate", json.dumps(spec), "--time-limit", str(time_limit), *extra]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done, time.monotonic() - started


def test_the_driver_runs_every_job_and_records_every_try(tmp_path):
    result, done, seconds = simulate(tmp_path, {"limits": LIMITS, "crash": ["gpt2-small selective"]})
    assert result["status"] == "done" and seconds < 30
    assert result["command"].startswith("python3 benchmarks/gpu_training.py")
    assert "commit" in result and result["device"]["name"] == "simulated"
    for model, limits in LIMITS.items():
        methods = result["models"][model]["methods"]
        assert set(methods) == set(limits)  # save_on_cpu is left out on the CPU
        for method, limit in limits.items():
            m = methods[method]
            assert m["max_batch"] <= limit <= m["max_batch_upper"], (model, method, m)
            assert all("outcome" in t and "batch" in t for t in m["tries"] if "stopped" not in t)
        assert methods["auto"]["gradients"]["worst_cosine"] == 0.99
        timing = result["models"][model]["timing"]
        assert len(timing["rounds"]) == 10 and len(timing["none_rounds"]) == 10
        assert timing["batch"] == min(methods["auto"]["max_batch"],
                                      methods["checkpoint"]["max_batch"])
        assert result["models"][model]["profile"]["plain"]["at_the_cap"]["waits_per_step"] == 1
    # Its tries above the limit crash the worker, which loses the gradients it kept: the
    # largest batch runs once more for them.
    selective = result["models"]["gpt2-small"]["methods"]["selective"]
    assert any(t.get("outcome") == "crash" for t in selective["tries"])
    assert selective["verified_again"]["outcome"] == "fits"
    assert selective["gradients"]["worst_cosine"] == 1.0
    s = result["summary"]["resnet50"]
    assert s["auto_over_plain"] == pytest.approx(
        result["models"]["resnet50"]["methods"]["auto"]["max_batch"] / s["max_batch"]["plain"])
    assert "gpu_training: wrote" in done.stdout and "step time at" in done.stdout


def test_a_hung_worker_is_stopped_with_its_stacks_and_the_run_goes_on(tmp_path):
    spec = {"limits": LIMITS, "hang": ["gpt2-small auto"]}
    result, done, seconds = simulate(tmp_path, spec, "--models", "gpt2-small", "--methods",
                                     "plain", "checkpoint", "auto", "--hang-seconds", "1",
                                     time_limit=16)
    methods = result["models"]["gpt2-small"]["methods"]
    assert methods["auto"]["status"] == "hang"
    assert "Current thread" in done.stderr or "Thread 0x" in done.stderr  # faulthandler's dump
    assert methods["plain"]["max_batch"] == 12
    assert result["models"]["gpt2-small"]["profile"]["plain"]["outcome"] == "done"
    assert seconds < 20
