"""actpack.budget's cap on actpack's CUDA allocator, driven on a machine without a GPU.

A CUDA budget that set no cap would let a largest-batch search call every batch a fit. The
budget's memory side (_budget_memory.BudgetMemory, driven by the C++ budget run) caps the CUDA
allocator as it caps the host pool. Here torch is told a CUDA device exists and actpack's CUDA
allocator serves it; every allocator call is the real one (the C++ keeps device 0's budget in
its configuration until the device's stack is built), so what is checked is the cap the
allocator holds at each point of a run: set at start, lifted by a step that measures, put back,
and the previous one restored at exit."""
import pytest
import torch

import actpack
from actpack import _C, _budget_memory
from actpack._units import parse_budget

MiB = 1 << 20


@pytest.fixture
def cuda_with_actpack(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "emulated")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(actpack.memory, "_cuda_installed", True)  # install_allocator ran
    before = actpack.memory_budget(0)
    _C._set_device_budget(0, 512 * MiB)  # what install_allocator(budget="512MiB") sets
    yield
    _C._set_device_budget(0, before)


def _run(memory, automatic):
    """The C++ budget run over `memory`, as actpack.budget makes it."""
    config = _C.BudgetConfig("64MiB", codec="auto" if automatic else "quant2", headroom=0.15)
    hooks = _C.SavedTensorHooks(config)
    return _C.BudgetRun(hooks, memory, config, memory.budget_bytes, capped=memory.capped,
                        outside_allowance_bytes=0)


def test_the_budget_caps_the_cuda_allocator_from_its_start_and_restores_it(cuda_with_actpack):
    memory = _budget_memory.BudgetMemory(parse_budget("64MiB"), device=0)
    memory.start()
    assert not memory.warnings  # actpack's allocator is in use: a cap, not a target
    run = _run(memory, automatic=True)
    run.start()
    assert actpack.memory_budget(0) == 64 * MiB
    # A step before the first plan may go over to measure; the cap comes back after it.
    room = run.relieve(10 * MiB)
    assert room > 0 and actpack.memory_budget(0) == 64 * MiB + room
    assert run.end_step() is None  # auto's first step: its plan comes at the second's end
    assert actpack.memory_budget(0) == 64 * MiB
    run.stop()
    memory.stop_watching()
    memory.stop(snapshot=False, run_peaks=run.run_peaks)
    assert actpack.memory_budget(0) == 512 * MiB  # the install's cap, as start() found it


def test_without_actpacks_cuda_allocator_the_budget_is_a_target(cuda_with_actpack, monkeypatch):
    monkeypatch.setattr(actpack.memory, "_cuda_installed", False)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 0)
    memory = _budget_memory.BudgetMemory(parse_budget("64MiB"), device=0)
    memory.start()
    assert "the budget is a target, not a cap" in memory.warnings[0]
    run = _run(memory, automatic=False)
    run.start()
    assert actpack.memory_budget(0) == 512 * MiB  # torch's allocator: nothing of ours to cap
    assert run.relieve(10 * MiB) == 0
    run.stop()
    assert actpack.memory_budget(0) == 512 * MiB


def test_making_a_budget_leaves_cuda_unstarted(monkeypatch):
    """ACTPACK_CONF makes its budget, then installs the allocator, which must come before
    anything starts torch's CUDA: making a budget asks nothing of the device (its name and
    current device are read when it is entered)."""
    def starts_cuda(*args):
        raise AssertionError("torch's CUDA started")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", starts_cuda)
    monkeypatch.setattr(torch.cuda, "get_device_name", starts_cuda)
    actpack.budget("64MiB", codec="quant2")


def test_a_plan_on_cuda_without_actpacks_allocator_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(actpack.memory, "_cuda_installed", False)
    steps = []
    with pytest.raises(RuntimeError, match="actpack's CUDA allocator is not installed"):
        actpack.plan(steps.append, "64MiB", progress=False)
    assert steps == []  # refused before any step ran


def test_the_system_peak_counts_cuda_memory_outside_the_pool(cuda_with_actpack, monkeypatch):
    """The driver's used memory and the pool's reserved bytes are both taken above their values
    at enter: the pool held 600 MiB then (weights), 900 at the step's end, and the driver's
    count grew by 500 MiB: 200 MiB are outside the pool (a library's workspace, NCCL)."""
    driver = {"used": 1000 * MiB}
    pool = {"reserved": 600 * MiB}
    monkeypatch.setattr(_C, "_device_used_bytes", lambda device: driver["used"])
    monkeypatch.setattr(actpack.memory, "memory_reserved", lambda device=None: pool["reserved"])
    monkeypatch.setattr(_C, "_count_system_memory", lambda *args: None)
    monkeypatch.setattr(_C, "_stop_counting_system_memory", lambda *args: None)
    monkeypatch.setattr(_C, "_take_window_peaks", lambda device: (900 * MiB, 950 * MiB))
    memory = _budget_memory.BudgetMemory(parse_budget("2GiB"), device=0)
    memory.start()
    driver["used"] += 500 * MiB
    pool["reserved"] += 300 * MiB
    assert memory.take_peaks() == (900 * MiB, 950 * MiB, 950 * MiB + 200 * MiB)
