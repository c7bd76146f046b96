"""The budget policy and the batch-size planner on CPU, end to end on the demo models.

The CPU allocator is installed before the model is built, so the budget counts everything the
training step allocates (parameters, gradients, optimizer state, activations, workspace).
"""
import gc
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import actpack
from benchmarks import demo

CONTEXT = 128


@pytest.fixture(scope="module")
def corpus():
    return demo.load_corpus()


pytestmark = pytest.mark.usefixtures("cpu_allocator")


def plain_peak(corpus, model_name, batch, steps=3):
    """Allocated peak of plain training at `batch` (its steady state, after the warm-up)."""
    actpack.empty_cache("cpu")
    actpack.reset_peak_memory_stats("cpu")
    losses, _, _, _ = demo.train(corpus, steps, batch, CONTEXT, torch.device("cpu"), 0,
                                 model_name=model_name)
    return actpack.max_memory_reserved("cpu"), losses


@pytest.mark.parametrize("model_name,steps,fraction", [("cnn", 40, 0.6), ("transformer", 30, 0.85)])
def test_trains_under_a_budget_plain_training_exceeds(corpus, model_name, steps, fraction):
    peak, _ = plain_peak(corpus, model_name, 32)
    budget = int(peak * fraction)
    plain, _, _, _ = demo.train(corpus, steps, 32, CONTEXT, torch.device("cpu"), 0,
                                model_name=model_name)
    packed, _, report, _ = demo.train(corpus, steps, 32, CONTEXT, torch.device("cpu"), 0,
                                      budget=budget, codec="auto", model_name=model_name)
    # Reserved: what the cap counts, fragmentation included.
    step_peaks = [s["peak_reserved_bytes"] for s in report["activations"]["steps"]]
    assert len(step_peaks) == steps
    assert max(step_peaks) <= budget, (step_peaks, budget)
    assert report["activations"]["policy"]["plans"] >= 1
    assert report["activations"]["policy"]["feasible"]
    # Less error than the harshest codec on everything: the policy keeps what fits exact or
    # finely quantized.
    codecs = {r["codec"] for r in report["activations"]["saved_tensors"]}
    assert codecs - {"quant2"}, codecs
    final_plain = sum(plain[-5:]) / 5
    final_packed = sum(packed[-5:]) / 5
    assert abs(final_packed - final_plain) / final_plain < 0.05, (final_plain, final_packed)


def test_records_carry_modules_candidates_and_errors(corpus):
    _, _, report, _ = demo.train(corpus, 3, 16, CONTEXT, torch.device("cpu"), 0,
                                 budget="1GiB", codec={"convs.0": "quant4", "norms.0": "quant4"},
                                 model_name="cnn")
    saved = report["activations"]["saved_tensors"]
    modules = {r.get("module") for r in saved}
    assert {"convs.0", "norms.0", "convs.5", "head"} <= modules, modules
    assert any(r.get("module") == "convs.0" and r["codec"] == "quant4" for r in saved), saved
    assert report["activations"]["policy"]["sensitivity"] == "gradient"
    # The output head's gradients dwarf the normalisation layers': its error weighs more.
    weight = {r.get("module"): r["sensitivity"] for r in saved if "sensitivity" in r}
    assert weight["head"] > 1 > weight["norms.3"], weight
    for r in saved:
        if r.get("module") in ("convs.0", "norms.0") and r["codec"] not in ("none", "reused"):
            assert r["codec"] == "quant4"
            assert 0 < r["error"]["rel_rms"] < 0.2
        if "sensitivity" in r:  # from the modules' parameter gradients, half of the weight
            assert r["sensitivity"] >= 0.5
        if "candidates" in r:  # auto, with a budget that holds everything: kept exact
            assert r["codec"] in ("none", "reused")
            assert {c["codec"] for c in r["candidates"]} >= {"none", "quant8", "quant4", "quant2"}


def test_an_impossible_budget_names_the_smallest_that_works(corpus):
    # Both runs below in the same state: a first training step in a fresh process also pays
    # torch's one-time initialization outside the allocator (20-45 MiB of resident set), which
    # the first run's message would count and the second run would not meet again.
    demo.train(corpus, 1, 32, CONTEXT, torch.device("cpu"), 0)
    with pytest.raises(torch.OutOfMemoryError) as error:
        demo.train(corpus, 4, 32, CONTEXT, torch.device("cpu"), 0, budget="4MiB", codec="auto")
    message = str(error.value)
    # The traceback holds the failed run's model and tensors alive; the next run must not pay.
    del error
    gc.collect()
    assert "a budget of 4.00 MiB cannot hold this training step" in message
    assert "the smallest budget that would work is" in message
    smallest = message.split("the smallest budget that would work is ")[1].split(" (")[0]
    # It is honest: with that budget the same training runs.
    demo.train(corpus, 4, 32, CONTEXT, torch.device("cpu"), 0,
               budget=smallest.replace(" ", ""), codec="auto")


@pytest.mark.parametrize("args", [{"enabled": False}, {"codec": "quant8"}])
def test_a_budget_too_small_for_a_fixed_plan_says_what_the_step_needs(corpus, args):
    """Nothing to plan: the first step finishes over the cap, and its end says what it took."""
    demo.train(corpus, 1, 32, CONTEXT, torch.device("cpu"), 0)  # torch's one-time setup
    with pytest.raises(torch.OutOfMemoryError) as error:
        with actpack.budget("2MiB", min_bytes=0, **args):
            demo.train(corpus, 3, 32, CONTEXT, torch.device("cpu"), 0)
    message = str(error.value)
    del error
    gc.collect()
    assert "a budget of 2.00 MiB cannot hold this training step with" in message, message
    needed = message.split("the smallest budget that would work is ")[1].split(" (")[0]
    # What it names is what that step measured: more than the cap it went over, and enough.
    assert actpack.parse_size(needed.replace(" ", "")) > 2 << 20
    with actpack.budget(needed.replace(" ", ""), min_bytes=0, **args):
        demo.train(corpus, 3, 32, CONTEXT, torch.device("cpu"), 0)


def test_a_batch_far_too_large_fails_fast_on_its_first_step(corpus):
    """Steps before the first plan go over the cap to measure themselves, but not without
    bound: past the budget plus 1 GiB (a 1 MiB budget) they fail, naming the budget."""
    with pytest.raises(torch.OutOfMemoryError) as error:
        with actpack.budget("1MiB", enabled=False):
            demo.train(corpus, 2, 1024, CONTEXT, torch.device("cpu"), 0)  # ~2 GiB a step
    message = str(error.value)
    del error
    gc.collect()
    assert "a budget of 1.00 MiB cannot hold this training step: step 1 ran out even at " \
           "1.00 GiB" in message, message
    assert "budget 1.00 GiB" in message  # the allocator's own words, at the lifted cap


def test_planner_answers_within_5_percent_and_2_samples_below_the_largest_batch_that_trains(
        corpus, tmp_path):
    check_planner_against_the_scan(corpus, tmp_path, torch.device("cpu"))


@pytest.mark.gpu
def test_planner_answers_within_5_percent_and_2_samples_below_the_largest_batch_on_cuda(
        tmp_path):
    """The same check on the GPU (tools/gpu_check.sh), in a process of its own whose CUDA memory
    is actpack's allocator's, installed before CUDA starts: the plan's and the truth's steps are
    held to its cap (under torch's allocator a budget is a target, and plan refuses to run)."""
    here = os.path.dirname(os.path.abspath(__file__))
    script = ("import pathlib, sys, torch, actpack\n"
              "actpack.install_allocator()\n"
              f"sys.path[:0] = [{here!r}, {os.path.join(here, '..')!r}]\n"
              "import test_policy\n"
              "from benchmarks import demo\n"
              "test_policy.check_planner_against_the_scan(\n"
              "    demo.load_corpus(), pathlib.Path(sys.argv[1]), torch.device('cuda'))\n")
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True)
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def check_planner_against_the_scan(corpus, tmp_path, device):
    """The plan and the scan with one intra-op thread, as tools/test.sh runs every test: each
    thread's scratch memory counts in the budget, so at two threads the truth moves by a sample
    or two between the plan's pool state and the scan's (measured: quant2 48 against 47 at two
    threads, 47 against 49 at one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _check_planner_against_the_scan(corpus, tmp_path, device)
    finally:
        torch.set_num_threads(threads)


def _check_planner_against_the_scan(corpus, tmp_path, device):
    torch.manual_seed(0)
    model = demo.MODELS["cnn"](context=CONTEXT).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(batch):
        x, y = next(demo.batches(corpus, batch, CONTEXT, 0, device))
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    budget = 40 << 20
    if device.type == "cuda":
        # A CUDA step holds more beside its activations (cuBLAS's and cuDNN's workspaces): the
        # first GPU run found no batch that trains under 40 MiB on an H100. The budget there
        # leaves room for about 40 samples of a plain step past its fixed part, from two steps.
        def reserved_peak(batch):
            report = actpack.search.trains_under_cap(step, "100%", batch, codec="none")
            return max(s["peak_reserved_bytes"] for s in report["activations"]["steps"])
        at8, at16 = reserved_peak(8), reserved_peak(16)
        budget = -(-(at8 + 4 * max(at16 - at8, 0)) // (1 << 20)) << 20
        print(f"CUDA: a plain step reserves {at8} at batch 8, {at16} at 16: budget {budget}")
    plan = actpack.plan(step, budget=budget, batch_sizes=(8, 16), codecs=("none", "quant2"),
                        report=tmp_path / "plan.json", progress=False, verify=True)
    assert set(plan.max_batch_size) == {"none", "quant2"}
    assert plan.max_batch_size["quant2"] > 1.5 * plan.max_batch_size["none"]
    assert "max batch" in plan.table() and "verified: quant2" in plan.table()
    assert plan.verified["codec"] == "quant2"

    # The truth from real steps in this process: the largest batch that trains under the cap,
    # by actpack.search's scan over [1, twice the answer and 4] (no bisection: fits need not be
    # monotone in the batch), a coarser grid than the default to keep the test short.
    for choice in ("none", "quant2"):
        predicted = plan.max_batch_size[choice]
        found = actpack.search.largest_batch(
            lambda b: actpack.search.trains_under_cap(step, budget, b, codec=choice),
            1, 2 * predicted + 4, coarse=2, fine=8)
        lo = found.batch
        assert found.status == "done", found.tries  # the range held the truth
        print(f"planner at {budget >> 20} MiB, {choice}: predicted {predicted}, truth {lo} "
              f"({len(found.tries)} tries, {found.seconds:.0f} s)")
        # The planner's steps run under the budget less FRESH_PROCESS_SHARE (what a fresh
        # process may need beyond this one's), the truth's under the whole budget: never above
        # the truth. Below it by at most 5% and two samples: 5% of 18 is one, and the plan and
        # the search run in different pool states (measured: a segment, 2 MiB, about one sample
        # of this CNN, more reserved at every batch in the search after the plan under pytest
        # than in a fresh interpreter; CI saw 17 against 19).
        assert 0.95 * lo - 2 <= predicted <= lo, (choice, predicted, lo)
        if choice != plan.verified["codec"]:
            assert plan.choices[choice]["calibration"]["batch_size"] == predicted

    import json
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert saved["planner"]["choices"]["none"]["max_batch_size"] == plan.max_batch_size["none"]


def test_a_try_that_runs_out_leaves_no_gradients_behind():
    """A step that runs out of memory after its backward never reaches its zero_grad: the
    planner drops the gradients it left, or they would sit in the next try's budget. Those
    that were there before the try stay."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    kept = torch.nn.Parameter(torch.ones(3))
    kept.grad = torch.full((3,), 2.0)
    budget = 8 << 20

    def step(batch):
        model(torch.randn(batch, 64)).sum().backward()
        torch.empty(2 * budget, dtype=torch.uint8)  # runs out after the backward
        model.zero_grad(set_to_none=True)

    assert actpack.search.trains_under_cap(step, budget, 4, codec="none") is None
    assert [p.grad for p in model.parameters()] == [None] * 4
    assert torch.equal(kept.grad, torch.full((3,), 2.0))


def test_pressure_mid_step_repacks_instead_of_failing(corpus):
    """Under a generous budget the plan keeps most activations exact; then the cap drops below
    what that plan's step needs (another pool took memory, say). The allocator's pressure
    callback re-packs the kept activations with the harshest codec mid-step, and training goes
    on under the cap."""
    train_step = demo.plan_step(corpus, CONTEXT, torch.device("cpu"), 0, "cnn")

    def step():
        return train_step(32)

    # Garbage an earlier test in this worker left could be collected mid-run and leave room the
    # cap was meant to take away.
    gc.collect()
    step()  # optimizer state
    with actpack.budget("1GiB", codec="auto") as run:
        for _ in range(3):
            step()
        # What the plan's step needs, above the memory held between steps.
        held = actpack.memory_allocated("cpu")
        actpack.reset_peak_memory_stats("cpu")
        step()
        # 5% below it: relief re-packs only what is alive at the pressure, at the harshest
        # codec, and made room for 10% (not 15%) when this was measured.
        tight = held + int(0.95 * (actpack.max_memory_allocated("cpu") - held))
        # Without relief this cap fails the next step (checked below with a fixed codec).
        actpack.set_cpu_budget(tight)
        actpack.empty_cache("cpu")
        actpack.reset_peak_memory_stats("cpu")
        losses = [step() for _ in range(2)]
        assert actpack.max_memory_reserved("cpu") <= tight
    policy = run.report["activations"]["policy"]
    assert policy["pressure_events"] >= 1, policy
    assert policy["relieved_bytes"] > 0, policy
    assert all(math.isfinite(v) for v in losses)

    # The same cap with nothing to relieve (every activation kept exact) runs out.
    actpack.set_cpu_budget(None)
    with pytest.raises(torch.OutOfMemoryError):
        with actpack.budget("1GiB", codec={"*": "identity"}):
            step()
            actpack.set_cpu_budget(tight)
            actpack.empty_cache("cpu")
            step()
    actpack.set_cpu_budget(None)
