"""On a GPU: the budget caps actpack's CUDA allocator in real training steps, through the public
API only (actpack.install_allocator or ACTPACK_CONF, actpack.budget, actpack.memory_stats).

  - capped steps: under a cap plain training cannot meet (half way between plain's peak and a
    fixed codec's), `auto` trains and every step after its first plan stays under the cap, plain
    training (codec "none") raises torch.OutOfMemoryError and the device works after it; `eb`
    (every tensor resolved after its encode) and `quant2` train under the same cap
  - out of memory: a request over install_allocator's budget and a step over a budget raise
    torch.OutOfMemoryError carrying actpack's reason, and the process's CUDA context works after
  - relief: under a budget the plan meets with room, a tensor allocated mid-run takes the room;
    the next steps train under the cap by re-packing what the plan kept (the report's
    pressure_events and relieved_bytes), where a run that keeps everything exact runs out
  - two streams: the first block runs on a side stream that lags the host, the main stream
    allocates and frees meanwhile; gradients match plain training's (identity: to rounding)
  - ACTPACK_CONF: an unmodified script on the GPU is capped and reported
  - the budget's device: a model on cuda:1 is capped on device 1 (two GPUs only)

actpack's allocator must be installed before CUDA starts, and an allocation that goes wrong can
end a process's CUDA context, so each group runs in a child process (this file run as a
script), one JSON line per scenario; a scenario that does not finish in SCENARIO_SECONDS has
its threads' stacks printed (faulthandler) and the child exits: on a GPU a hang is a finding,
reported with where it stood. Skipped without CUDA; tools/gpu_check.sh runs these first.
"""
import json
import os
import subprocess
import sys

import pytest

MARK = "@@gpu_budget@@ "
SCENARIO_SECONDS = int(os.environ.get("ACTPACK_GPU_BUDGET_SECONDS", 25))
MiB = 1 << 20
# The child's device: "cuda"; "cpu" runs the scenarios' code on actpack's host pool, to check
# the code itself on a machine without a GPU (ACTPACK_GPU_BUDGET_DEVICE=cpu python3 THIS_FILE
# --install --budget "" capped relief oom), not what they test.
DEVICE = os.environ.get("ACTPACK_GPU_BUDGET_DEVICE", "cuda")
IMAGE = 128 if DEVICE == "cuda" else 32  # the CPU check's is smaller: it checks the code


def _sync(torch):
    if DEVICE == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------- the child's scenarios ----

def _model(torch, width=32):
    """A CNN whose saved activations dominate its memory: batch norm, ReLU and max-pool (int64
    indices: bitpack) at IMAGE x IMAGE."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2 * width * (IMAGE // 4) ** 2, 10)).to(DEVICE)


def _trainer(torch, batch=32, seed=0):
    torch.manual_seed(seed)
    model = _model(torch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    x = torch.randn(batch, 3, IMAGE, IMAGE, device=DEVICE, generator=g)
    y = torch.randint(0, 10, (batch,), device=DEVICE, generator=g)

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
    return step


def _peaks(run, key="peak_reserved_bytes"):
    """Per step of the run, its peak: reserved (what the cap holds), or "peak_bytes" (allocated:
    what the step needed, without the pool's cached and fragmented bytes)."""
    return [s.get(key) for s in run.report["activations"]["steps"]]


def _highest(run, key, first=0):
    """The highest of the run's step peaks from step `first` on (a report without them is a
    failure that says so)."""
    found = [p for p in _peaks(run, key)[first:] if p is not None]
    if not found:
        raise AssertionError(f"the run's report has no {key} per step: {_peaks(run, key)}")
    return max(found)


def _healthy(torch):
    """Whether the CUDA context still computes (a failed allocation must not end it)."""
    x = torch.ones(1 << 20, device=DEVICE)
    _sync(torch)
    return x.sum().item() == float(1 << 20)


def _runs_out(torch, run_steps):
    """(the exception type's name or None, its first line) of `run_steps()`."""
    try:
        run_steps()
    except torch.OutOfMemoryError as error:
        return "OutOfMemoryError", str(error).splitlines()[0] if str(error) else ""
    except Exception as error:  # noqa: BLE001  the test names what came instead
        return type(error).__name__, (str(error).splitlines() or [""])[0]
    return None, ""


def scenario_capped():
    import torch

    import actpack
    step = _trainer(torch)
    step()  # the optimizer's state and cuDNN's handles, outside any budget
    with actpack.budget("100%", codec="none") as run:
        for _ in range(2):
            step()
    plain = _highest(run, "peak_bytes")
    with actpack.budget("100%", codec="quant4") as run:
        for _ in range(3):
            step()
    packed = _highest(run, "peak_reserved_bytes", 1)
    cap = (plain + packed) // 2
    out = {"plain_peak": plain, "packed_peak": packed, "cap": cap}

    def steps_under(codec, n):
        def run_steps():
            with actpack.budget(cap, codec=codec) as run:
                for _ in range(n):
                    loss = step()
                out[f"{codec}_loss"] = loss.item()
            out[f"{codec}_peaks"] = _peaks(run)
            out[f"{codec}_packed"] = run.report["activations"]["totals"].get("ratio")
        return run_steps

    out["none_error"], out["none_message"] = _runs_out(torch, steps_under("none", 3))
    out["healthy_after_none"] = _healthy(torch)
    for codec in ("auto", "quant2", "eb"):
        out[f"{codec}_error"], out[f"{codec}_message"] = _runs_out(torch, steps_under(codec, 6))
        out[f"healthy_after_{codec}"] = _healthy(torch)
    out["stats"] = {k: v for k, v in actpack.memory_stats().items()
                    if k in ("num_ooms", "num_alloc_retries", "num_device_alloc",
                             "num_device_free")}
    return out


def scenario_relief():
    import torch

    import actpack
    step = _trainer(torch, seed=3)
    step()
    with actpack.budget("100%", codec="none") as run:
        for _ in range(2):
            step()
    plain = _highest(run, "peak_bytes")
    limit = int(1.5 * plain)
    room = int(0.8 * plain)  # below what plain training needs
    out = {"plain_peak": plain, "limit": limit, "room": room}

    def relieved():
        with actpack.budget(limit, codec="auto") as run:
            for _ in range(3):
                step()
            ballast = torch.empty(limit - room, dtype=torch.uint8, device=DEVICE)
            actpack.reset_peak_memory_stats()
            for _ in range(2):
                loss = step()
            out["peak_with_ballast"] = actpack.max_memory_reserved()
            out["loss"] = loss.item()
            del ballast
        out["policy"] = {k: run.report["activations"]["policy"].get(k)
                         for k in ("pressure_events", "relieved_bytes")}

    out["auto_error"], out["auto_message"] = _runs_out(torch, relieved)
    out["healthy"] = _healthy(torch)

    def kept_exact():
        with actpack.budget(limit, codec={"*": "identity"}):
            for _ in range(3):
                step()
            ballast = torch.empty(limit - room, dtype=torch.uint8, device=DEVICE)
            for _ in range(2):
                step()
            del ballast

    out["identity_error"], out["identity_message"] = _runs_out(torch, kept_exact)
    out["healthy_after_identity"] = _healthy(torch)
    return out


def scenario_streams():
    import torch
    import torch.nn.functional as F

    import actpack
    if DEVICE != "cuda":
        return {"skipped": "streams are CUDA's"}
    nn = torch.nn
    torch.manual_seed(5)
    first = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)).to(DEVICE)
    second = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Flatten(),
                           nn.Linear(32 * 32 * 32, 10)).to(DEVICE)
    parameters = list(first.parameters()) + list(second.parameters())
    g = torch.Generator(device=DEVICE).manual_seed(6)
    x = torch.randn(16, 3, 64, 64, device=DEVICE, generator=g)
    y = torch.randint(0, 10, (16,), device=DEVICE, generator=g)
    side = torch.cuda.Stream()

    def gradients():
        """One step's gradients (no update): the first block on the side stream, behind a
        sleep, while the main stream allocates and frees; backward as autograd schedules it
        (the first block's on the side stream)."""
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)
            h = first(x)
        main.wait_stream(side)
        churn = [torch.randn(1 << 18, device=DEVICE) for _ in range(32)]
        del churn
        loss = F.cross_entropy(second(h), y)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in parameters])
        for p in parameters:
            p.grad = None
        return grads

    exact = gradients()
    out = {}
    for name, codec, limit in (("identity", "identity", "100%"), ("quant8", "quant8", "100%"),
                               ("eb", "eb:rel=1e-3", "100%"), ("auto", "auto", None)):
        if limit is None:  # auto under a cap that binds: packing and relief on both streams
            with actpack.budget("100%", codec="none") as run:
                gradients()
            limit = int(0.7 * _highest(run, "peak_bytes"))
        try:
            with actpack.budget(limit, codec=codec, min_bytes=0):
                for _ in range(4):
                    grads = gradients()
            torch.cuda.synchronize()
            cosine = F.cosine_similarity(grads.double(), exact.double(), 0).item()
            out[name] = {"cosine": cosine, "finite": bool(torch.isfinite(grads).all()),
                         "max_abs_diff": (grads - exact).abs().max().item()}
        except Exception as error:  # noqa: BLE001
            out[name] = {"error": f"{type(error).__name__}: {error}".splitlines()[0]}
    out["exact_norm"] = exact.norm().item()
    return out


def scenario_oom():
    import torch

    import actpack
    out = {}
    out["request_error"], out["request_message"] = _runs_out(
        torch, lambda: torch.empty(2 << 30, dtype=torch.uint8, device=DEVICE))
    out["last_allocator_error"] = actpack.last_allocator_error()
    out["healthy_after_request"] = _healthy(torch)
    step = _trainer(torch, batch=8)
    step()

    def over_budget():
        with actpack.budget(64 * MiB, codec="none"):
            big = _trainer(torch, batch=256, seed=1)
            for _ in range(3):
                big()

    out["step_error"], out["step_message"] = _runs_out(torch, over_budget)
    out["healthy_after_step"] = _healthy(torch)
    out["small_step_after"] = bool(torch.isfinite(step()).item())
    out["num_ooms"] = actpack.memory_stats()["num_ooms"]
    return out


def scenario_second_device():
    import torch

    import actpack
    device = torch.device("cuda", 1)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).to(device)
    x = torch.randn(256, 512, device=device)
    seen = {}

    def hook(module, args, output):
        seen["budget_1"] = actpack.memory_budget(1)
        seen["budget_0"] = actpack.memory_budget(0)

    model[0].register_forward_hook(hook)
    with actpack.budget("256MiB", codec="quant8"):
        model(x).sum().backward()
    torch.cuda.synchronize(device)
    seen["current_device"] = torch.cuda.current_device()
    return seen


SCENARIOS = {"capped": scenario_capped, "relief": scenario_relief, "streams": scenario_streams,
             "oom": scenario_oom, "second_device": scenario_second_device}


def child(names, install, budget):
    """Runs the scenarios `names` in this process, printing a MARK line for each."""
    import faulthandler
    import traceback

    # A crash prints where Python was (the H200's oom scenario ended with SIGSEGV and nothing).
    faulthandler.enable()
    if install:
        import actpack
        if DEVICE == "cuda":
            actpack.install_allocator(budget=budget)
        else:
            actpack.install_cpu_allocator(budget=budget)
    for name in names:
        faulthandler.dump_traceback_later(SCENARIO_SECONDS, exit=True)
        try:
            result = SCENARIOS[name]()
        except BaseException as error:  # noqa: BLE001  reported, the next scenario runs
            result = {"child_error": f"{type(error).__name__}: {error}",
                      "traceback": traceback.format_exc()[-3000:]}
        faulthandler.cancel_dump_traceback_later()
        print(MARK + json.dumps({"scenario": name, **result}), flush=True)


# ------------------------------------------------------------------------ the parent side ----

def run_child(names, install=True, budget=None, env=None, script=None, timeout=None):
    """{scenario: result} from a child process, and the process (for its stderr)."""
    argv = [sys.executable, script or os.path.abspath(__file__)]
    if script is None:
        argv += ["--install" if install else "--no-install", "--budget", str(budget or ""), *names]
    full_env = dict(os.environ)
    full_env.pop("ACTPACK_CONF", None)
    full_env.update(env or {})
    done = subprocess.run(argv, capture_output=True, text=True, env=full_env,
                          timeout=timeout or SCENARIO_SECONDS * max(1, len(names)) + 60)
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            entry = json.loads(line[len(MARK):])
            results[entry.pop("scenario")] = entry
    return results, done


def _result(results, done, name):
    """The scenario's result, or a failure that shows what the child printed."""
    if name not in results:
        pytest.fail(f"the child stopped before scenario {name!r} (exit code {done.returncode}; a "
                    f"hang prints its stacks):\n{done.stderr[-6000:]}")
    result = results[name]
    assert "child_error" not in result, result.get("traceback", result["child_error"])
    return result


@pytest.fixture(scope="module")
def in_one_child():
    """capped, relief and streams share one child (each scenario uses the device alone)."""
    return run_child(["capped", "relief", "streams"])


@pytest.mark.gpu
def test_auto_trains_under_a_cap_plain_training_cannot_meet(in_one_child):
    r = _result(*in_one_child, "capped")
    assert r["packed_peak"] < 0.8 * r["plain_peak"], (
        f"quant4 left the step at {r['packed_peak']} of plain's {r['plain_peak']} bytes: this "
        "model leaves no room between them to test a cap in")
    assert r["none_error"] == "OutOfMemoryError", r
    assert r["healthy_after_none"]
    assert r["auto_error"] is None, r["auto_message"]
    # From the step after auto's first plan (its end of step 2) every step is under the cap.
    capped = [p for p in r["auto_peaks"][2:] if p is not None]
    assert capped and max(capped) <= r["cap"], (r["auto_peaks"], r["cap"])
    assert r["auto_loss"] == r["auto_loss"]  # not NaN


@pytest.mark.gpu
def test_eb_and_bitpack_and_quant2_under_the_cap_finish_and_leave_the_device_working(in_one_child):
    """eb's tensors are resolved (shrunk to their size) after their encode, and the max-pool
    indices go to bitpack: at a cap that binds, those paths allocate under the pressure of the
    cap. A run may run out (eb's ratio is the data's), but only as torch.OutOfMemoryError."""
    r = _result(*in_one_child, "capped")
    assert r["quant2_error"] is None, r["quant2_message"]
    assert max(p for p in r["quant2_peaks"][1:] if p is not None) <= r["cap"]
    assert r["eb_error"] in (None, "OutOfMemoryError"), (r["eb_error"], r["eb_message"])
    assert r["healthy_after_eb"] and r["healthy_after_quant2"] and r["healthy_after_auto"]


@pytest.mark.gpu
def test_pressure_mid_run_repacks_under_the_cap(in_one_child):
    r = _result(*in_one_child, "relief")
    assert r["auto_error"] is None, r["auto_message"]
    assert r["policy"]["pressure_events"] >= 1, r
    assert r["policy"]["relieved_bytes"] > 0, r
    assert r["peak_with_ballast"] <= r["limit"], r
    assert r["healthy"]
    # The same cap with nothing to relieve runs out, as torch.OutOfMemoryError.
    assert r["identity_error"] == "OutOfMemoryError", r
    assert r["healthy_after_identity"]


@pytest.mark.gpu
def test_two_streams_give_plain_trainings_gradients(in_one_child):
    r = _result(*in_one_child, "streams")
    for name in ("identity", "quant8", "eb", "auto"):
        assert "error" not in r[name], (name, r[name])
        assert r[name]["finite"], (name, r[name])
    # identity stores the bytes: what differs is cuDNN's own run-to-run rounding.
    assert r["identity"]["cosine"] > 0.999999, r["identity"]
    assert r["quant8"]["cosine"] > 0.99, r["quant8"]
    assert r["eb"]["cosine"] > 0.99, r["eb"]
    assert r["auto"]["cosine"] > 0.9, r["auto"]


@pytest.mark.gpu
def test_out_of_memory_is_torchs_error_and_the_context_survives():
    results, done = run_child(["oom"], budget="1GiB")
    r = _result(results, done, "oom")
    assert r["request_error"] == "OutOfMemoryError", r
    assert "actpack" in r["request_message"] + r["last_allocator_error"], r
    assert r["healthy_after_request"]
    assert r["step_error"] == "OutOfMemoryError", r
    assert r["healthy_after_step"] and r["small_step_after"]
    assert r["num_ooms"] >= 1, r


CONF_SCRIPT = """
import json, sys
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Flatten(), torch.nn.Linear(32 * 64 * 64, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 3, 64, 64, device="cuda")
y = torch.randint(0, 10, (32,), device="cuda")
for _ in range(5):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
actpack = sys.modules.get("actpack")
print(MARK + json.dumps({"scenario": "conf", "imported": actpack is not None,
                         "installed": bool(actpack and actpack.cuda_allocator_installed())}))
"""


@pytest.mark.gpu
def test_actpack_conf_caps_an_unmodified_script_on_the_gpu(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(f"MARK = {MARK!r}\n" + CONF_SCRIPT)
    report = tmp_path / "run.json"
    results, done = run_child([], script=str(script),
                              env={"ACTPACK_CONF": f"budget=2GiB,codec=auto,report={report}"})
    assert done.returncode == 0, done.stderr[-4000:]
    r = _result(results, done, "conf")
    if not r["imported"]:
        pytest.skip("actpack-env.pth is not run at start here (actpack is not installed in a site "
                    "directory; tools/gpu_check.sh makes its install one)")
    assert r["installed"], "ACTPACK_CONF did not install actpack's CUDA allocator"
    data = json.loads(report.read_text())
    assert data["allocator"]["allocator"] == "actpack", data["allocator"]
    assert data["run"]["budget_bytes"] == 2 << 30
    assert len(data["activations"]["steps"]) == 5
    assert data["activations"]["totals"]["packs"] > 0 or data["activations"]["policy"], data


@pytest.mark.gpu
def test_the_budget_caps_the_device_the_model_is_on():
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    results, done = run_child(["second_device"])
    r = _result(results, done, "second_device")
    # The cap is on the device the packed tensors are on; device 0 (current) keeps none.
    assert r["budget_1"] is not None and r["budget_0"] is None, r
    assert r["current_device"] == 0  # the model's device was never made current


if __name__ == "__main__":
    arguments = sys.argv[1:]
    install = arguments.pop(0) == "--install"
    assert arguments.pop(0) == "--budget"
    budget = arguments.pop(0) or None
    child(arguments, install, budget)
