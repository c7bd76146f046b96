"""actpack.budget(): parity with plain PyTorch, the demo's compression and loss, the report."""
import json
import os
import statistics

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actpack
from benchmarks import demo


def small_cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, 10))


def gradients(model, x, y, **budget_args):
    model.zero_grad()
    if budget_args:
        with actpack.budget("1GiB", **budget_args):
            F.cross_entropy(model(x), y).backward()
    else:
        F.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("budget_args", [{"codec": "identity", "min_bytes": 1},
                                         {"codec": "quant2", "enabled": False}])
def test_lossless_packing_gives_bitwise_equal_gradients(budget_args):
    model = small_cnn()
    torch.manual_seed(1)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    plain = gradients(model, x, y)
    packed = gradients(model, x, y, **budget_args)
    for a, b in zip(plain, packed):
        assert torch.equal(a, b)


def test_identity_training_matches_plain_bitwise_over_steps():
    corpus = demo.load_corpus(1 << 20)
    device = torch.device("cpu")
    plain, _, _, _ = demo.train(corpus, 8, 8, 64, device, seed=3)
    packed, _, report, _ = demo.train(corpus, 8, 8, 64, device, seed=3, budget="1GiB",
                                      codec="identity")
    assert plain == packed
    assert report["activations"]["totals"]["packs"] > 0


def test_demo_quant2_compresses_12x_and_trains_within_5_percent(tmp_path):
    corpus = demo.load_corpus()
    device = torch.device("cpu")
    plain, _, _, _ = demo.train(corpus, 60, 32, 128, device, seed=0)
    packed, _, report, _ = demo.train(corpus, 60, 32, 128, device, seed=0, budget="1GiB",
                                      codec="quant2", report=tmp_path / "run.json")
    totals = report["activations"]["totals"]
    # Every packed fp32 activation is stored in at most 1/12 of its bytes.
    assert totals["packed_stored_bytes"] * 12 <= totals["packed_raw_bytes"]
    for saved in report["activations"]["saved_tensors"]:
        if saved["codec"].startswith("quant2") and saved["dtype"] == "float32":
            assert saved["stored_bytes"] * 12 <= saved["raw_bytes"], saved
    final_plain = statistics.mean(plain[-5:])
    final_packed = statistics.mean(packed[-5:])
    assert final_packed <= final_plain * 1.05, (final_plain, final_packed)
    assert json.loads((tmp_path / "run.json").read_text()) == report


def test_report_document(tmp_path):
    model = small_cnn()
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    with actpack.budget("256MiB", codec="quant4", report=tmp_path / "r.json", min_bytes="4KiB") as run:
        for _ in range(3):
            F.cross_entropy(model(x), y).backward()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report == run.report
    assert report["schema"] == "actpack.report" and report["schema_version"] == 2
    assert report["run"]["budget"] == "256.00 MiB"
    assert report["run"]["budget_bytes"] == 256 << 20
    activations = report["activations"]
    assert len(activations["steps"]) == 3
    # quant4's tensors, and ReLU's outputs as the masks their backward reads.
    assert activations["totals"]["packs"] == 3 * sum(
        1 for s in activations["saved_tensors"] if s["codec"].startswith("quant4")
        or s["codec"] == "mask")
    kept = {s["reason"] for s in activations["saved_tensors"] if s["codec"] == "none"}
    assert "parameter" in kept  # weights stay as they are
    assert activations["totals"]["ratio"] > 7


def test_a_share_of_the_host_is_taken_of_its_physical_memory():
    """budget("50%"), the planner and the CPU cap take a share of the same total: the host's
    physical memory (one C++ home: allocator::DeviceTotalBytes)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with actpack.budget("50%", codec="identity"):
        assert actpack.memory_budget("cpu") == physical // 2
    assert actpack.budget("25%", codec="identity", device="cpu").budget_bytes == physical // 4
    assert actpack.budget("6GiB", codec="identity", device="cpu").budget_bytes == 6 << 30


def test_a_tensor_saved_twice_is_packed_once():
    x = torch.randn(64, 1024, requires_grad=True)
    h = x * 3
    (h * h).sum().backward()
    plain = x.grad.clone()
    x.grad = None
    with actpack.budget("1GiB", codec="identity") as run:
        h = x * 3
        (h * h).sum().backward()  # mul saves h as both operands
    totals = run.report["activations"]["totals"]
    assert totals["packs"] == 1
    assert totals["reused_bytes"] == 64 * 1024 * 4
    assert torch.equal(x.grad, plain)


def test_non_finite_activations_are_kept_exact():
    torch.manual_seed(0)
    x = torch.randn(64, 256)
    x[0, 0], x[5, 7] = float("inf"), float("nan")
    w = torch.randn(64, 256, requires_grad=True)
    with actpack.budget("1GiB", codec="quant2", min_bytes="1KiB") as run:
        h = x * 2  # non-finite, saved by the product below
        (h * w).sum().backward()
    assert run.report["activations"]["totals"]["exact_fallbacks"] == 1
    assert torch.equal(w.grad.isnan(), (2 * x).isnan())
    finite = ~w.grad.isnan()
    assert torch.equal(w.grad[finite], (2 * x)[finite])


@pytest.mark.parametrize("codec", ["identity", "quant2", "auto"])
def test_max_pool_indices_are_bitpacked_and_the_input_gradient_stays_exact(codec):
    """max_pool2d's int64 indices are packed losslessly whatever the codec. The input gradient
    of conv -> max_pool -> sum needs only the conv's weight (a parameter, kept) and the indices
    (max_pool's backward reads its input for the shape only), so it equals plain PyTorch's bit
    for bit under any codec, and only while the indices decode exactly."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.MaxPool2d(3, 2, 1))
    x = torch.randn(2, 3, 32, 32, requires_grad=True)
    model(x).sum().backward()
    plain = x.grad.clone()
    x.grad = None
    with actpack.budget("100%", codec=codec) as run:
        model(x).sum().backward()
    assert torch.equal(x.grad, plain)
    saved = [s for s in run.report["activations"]["saved_tensors"] if s["dtype"] == "int64"]
    assert len(saved) == 1, run.report["activations"]["saved_tensors"]
    indices = saved[0]
    # [2, 64, 16, 16] indices into 32 x 32 planes: 10 bits each, 6.4x less than int64.
    assert indices["shape"] == [2, 64, 16, 16] and indices["codec"] == "bitpack"
    assert indices["raw_bytes"] == 2 * 64 * 16 * 16 * 8
    assert indices["stored_bytes"] == 128 + 2 * 64 * 16 * 16 * 10 // 8
    assert "error" not in indices  # lossless: nothing measured


def test_hooks_are_removed_and_report_written_after_an_exception(tmp_path):
    model = small_cnn()
    x = torch.randn(4, 3, 16, 16)
    budget = actpack.budget("1GiB", report=tmp_path / "r.json", min_bytes=1)
    with pytest.raises(ZeroDivisionError):
        with budget:
            model(x).sum()
            1 / 0
    assert (tmp_path / "r.json").exists()
    packs = budget.run.report["activations"]["totals"]["packs"]
    model(x).sum().backward()  # outside the context: nothing more is packed
    assert budget.run.totals()["packs"] == packs


@pytest.mark.parametrize("budget_args", [{"enabled": False}, {"codec": "auto"}],
                         ids=["kept-as-is", "kept-by-the-policy"])
def test_a_step_that_raises_before_its_backward_leaves_nothing_alive(budget_args):
    """Saved tensors kept exact (Tanh saves its output) must not hold their own autograd node:
    through C++ that cycle is invisible to Python's collector, and a step that failed (an
    out-of-memory error in the forward pass) would keep its whole graph for good."""
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(256, 256), nn.Tanh())])
    x = torch.randn(512, 256)
    import gc
    with actpack.budget("1GiB", min_bytes=0, **budget_args):
        for _ in range(3):  # whole steps first: the policy plans (keeping all exact) after two
            model(x).sum().backward()
        gc.collect()
        before = actpack.memory_allocated("cpu")
        try:
            model(x)  # 4 MiB saved, then the step fails
            raise RuntimeError("a bad batch")
        except RuntimeError:
            pass
        gc.collect()
        assert actpack.memory_allocated("cpu") == before


def test_the_planners_none_is_a_codec_a_user_can_type():
    """plan.max_batch_size has a "none" key: budget(codec="none") is what it measured, plain
    training (enabled=False) under the same cap, and a rule may say "none" too."""
    model = small_cnn()
    x = torch.randn(4, 3, 16, 16)
    with actpack.budget("1GiB", codec="none", min_bytes=0) as run:
        model(x).sum().backward()
    totals = run.report["activations"]["totals"]
    assert totals["packs"] == 0 and totals["kept_bytes"] > 0, totals
    assert run.report["run"]["codec"] == "none"
    # As a rule: the matching modules' tensors are kept as they are (no copy), the others
    # follow the default.
    with actpack.budget("1GiB", codec={"0": "none", "*": "quant2"}, min_bytes=0) as run:
        model(x).sum().backward()
    totals = run.report["activations"]["totals"]
    records = run.report["activations"]["saved_tensors"]
    first = [r for r in records if r.get("module") == "0"]
    assert first and all(r["codec"] == "none" and r["reason"] == "codec_none"
                         for r in first), first
    assert totals["packs"] > 0 and totals["kept_bytes"] >= sum(r["raw_bytes"] for r in first)
    with actpack.budget("1GiB", codec={"*": "none"}, min_bytes=0) as run:
        model(x).sum().backward()
    assert run.report["activations"]["totals"]["packs"] == 0


def test_bad_arguments_fail_before_training():
    with pytest.raises(ValueError, match="'6 gigs'"):
        actpack.budget("6 gigs")
    with pytest.raises(ValueError, match="'-1GiB'"):
        actpack.budget("-1GiB")
    with pytest.raises(ValueError, match="unknown codec 'zstd'"):
        actpack.budget("1GiB", codec="zstd")
    with pytest.raises(TypeError, match="codec must be .auto., a codec spec"):
        actpack.budget("1GiB", codec=2)
    with pytest.raises(ValueError, match="'12 apples'"):
        actpack.budget("1GiB", min_bytes="12 apples")


@pytest.mark.gpu
def test_cuda_training_with_quant2_tracks_plain():
    corpus = demo.load_corpus()
    device = torch.device("cuda")
    plain, _, _, _ = demo.train(corpus, 60, 32, 128, device, seed=0)
    packed, _, report, _ = demo.train(corpus, 60, 32, 128, device, seed=0, budget="1GiB",
                                      codec="quant2")
    assert statistics.mean(packed[-5:]) <= statistics.mean(plain[-5:]) * 1.05
    assert report["run"]["peak_allocated_bytes"] > 0
    identity, _, _, _ = demo.train(corpus, 10, 32, 128, device, seed=0, budget="1GiB",
                                   codec="identity")
    again, _, _, _ = demo.train(corpus, 10, 32, 128, device, seed=0)
    assert identity == again


def test_steps_end_with_each_backward_even_when_nothing_is_packed():
    model = small_cnn()
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    with actpack.budget("1GiB", enabled=False) as run:
        for _ in range(4):
            F.cross_entropy(model(x), y).backward()
    activations = run.report["activations"]
    assert len(activations["steps"]) == 4
    # One record per saved tensor of a step, folded across steps: bounded by the model.
    assert all(s["occurrences"] == 4 for s in activations["saved_tensors"])


@pytest.mark.usefixtures("cpu_allocator")
def test_a_budget_leaves_the_users_peak_counters_alone():
    """A budget measures each step's peak in a window of its own: max_memory_allocated() read
    after the run is the run's peak, including a first step larger than the rest."""
    model = small_cnn()
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    big = 64 << 20
    actpack.reset_peak_memory_stats("cpu")
    with actpack.budget("1GiB") as run:
        for step in range(4):
            loss = F.cross_entropy(model(x), y)
            if step == 0:
                del loss  # the first step holds a large temporary beside its graph
                scratch = torch.ones(big, dtype=torch.uint8)
                loss = F.cross_entropy(model(x), y) + scratch[0].float()
                del scratch
            loss.backward()
    assert len(run.report["activations"]["steps"]) == 4
    assert actpack.max_memory_allocated("cpu") >= big
    # The budget's own per-step peaks saw the same first step.
    assert run.report["activations"]["steps"][0]["peak_bytes"] >= big


def test_min_bytes_zero_packs_everything():
    x = torch.randn(3, 3, requires_grad=True)
    with actpack.budget("1GiB", codec="identity", min_bytes=0) as run:
        (x.sigmoid() * 2).sum().backward()
    assert run.report["activations"]["totals"]["packs"] == 1


def test_module_names_take_one_walk_of_the_model_and_follow_a_change():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(20)])
    walks = []
    named_modules = model.named_modules

    def counted(*args, **kwargs):
        walks.append(1)
        return named_modules(*args, **kwargs)

    model.named_modules = counted
    x = torch.randn(2, 8)
    with actpack.budget("1GiB", codec="identity", min_bytes=0) as run:
        model(x).sum().backward()
        # Every block is named from the one walk; its children are named by walking it.
        assert len(walks) == 1
        model[3] = nn.Sequential(nn.Linear(8, 8), nn.Tanh())  # a new module at a known name
        model(x).sum().backward()
        assert len(walks) == 2
    modules = {s["module"] for s in run.report["activations"]["saved_tensors"]}
    assert {f"{i}.0" for i in range(20)} <= modules and {f"{i}.1" for i in range(20)} <= modules


def test_saved_tensor_hooks_are_plain_functions_over_packed_handles():
    config = actpack._C.BudgetConfig("1GiB", codec="identity", min_bytes="0")
    hooks = actpack._C.SavedTensorHooks(config)
    pack, unpack = hooks.hooks()
    x = torch.randn(4, 5)
    handle = pack(x, "layer")
    assert isinstance(handle, actpack._C.PackedTensor)
    assert handle.raw_bytes == 4 * 5 * 4 < handle.stored_bytes  # identity adds a header
    assert torch.equal(unpack(handle), x) and torch.equal(unpack(handle), x)
    assert hooks.totals()["unpacks"] == 2
    weight = nn.Parameter(torch.randn(3))
    kept = pack(weight, "")  # a parameter is kept, as a tensor: unpack gives it back
    assert isinstance(kept, torch.Tensor) and unpack(kept) is kept
    assert hooks.hook_seconds() > 0
    with pytest.raises(TypeError):
        unpack(object())
    with pytest.raises(TypeError):
        pack(x, None)
    with pytest.raises(TypeError):
        actpack._C.PackedTensor()


def test_a_timed_budget_clocks_its_hooks_and_the_ends_of_its_steps():
    """budget.timed() (the overhead tools' clocks): the hooks' seconds hold the C++ session's,
    which hold the codecs'; every pack and unpack is counted; each step's end is timed. An
    untimed budget has the session's clock alone, and a budget is timed before it is entered."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 10))
    x = torch.randn(64, 128)
    with actpack.budget("64MiB", codec="quant8", min_bytes=0).timed() as run:
        for _ in range(3):
            model(x).square().mean().backward()
    clock, totals = run.clock(), run.totals()
    assert totals["packs"] > 0 and totals["codec_seconds"] > 0
    assert clock["hook_calls"] >= 2 * totals["packs"]  # a pack and an unpack each, at least
    assert clock["hooks_seconds"] >= clock["session_seconds"] >= totals["codec_seconds"]
    assert clock["end_of_step_seconds"] > 0
    with actpack.budget("64MiB", codec="quant8", min_bytes=0) as run:
        model(x).square().mean().backward()
    assert run.clock()["hooks_seconds"] is None and run.clock()["session_seconds"] > 0
    context = actpack.budget("64MiB", codec="quant8")
    with context:
        with pytest.raises(RuntimeError, match="before the budget is entered"):
            context.timed()


def test_on_report_hands_each_report_to_its_callback_until_removed(tmp_path):
    model = small_cnn()
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    seen = []
    handle = actpack.on_report(seen.append)
    try:
        with actpack.budget("1GiB", codec="quant4", report=tmp_path / "r.json") as run:
            F.cross_entropy(model(x), y).backward()
    finally:
        handle.remove()
    assert len(seen) == 1 and seen[0] is run.report
    assert seen[0] == json.loads((tmp_path / "r.json").read_text())
    assert seen[0]["activations"]["totals"]["packed_raw_bytes"] > 0
    with actpack.budget("1GiB", codec="quant4"):
        F.cross_entropy(model(x), y).backward()
    assert len(seen) == 1  # removed: no call
    with pytest.raises(TypeError, match="callback must be callable, got int"):
        actpack.on_report(3)
