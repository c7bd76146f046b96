"""actpack.budget's cap on actpack's CUDA allocator, driven on a machine without a GPU.

The second H100 run found that a CUDA budget set no cap at all (the planner's truth search
called every batch a fit). The budget's memory side (_budget._PeakMeter) now caps the CUDA
allocator as it caps the host pool. Here torch is told a CUDA device exists and actpack's CUDA
allocator serves it; every allocator call is the real one (the C++ keeps device 0's budget in
its configuration until the device's stack is built), so what is checked is the cap the
allocator holds at each point of a run: set at start, lifted by a step that measures, put back,
and the previous one restored at exit."""
import pytest
import torch

import actpack
from actpack import _C, _budget
from actpack._units import parse_budget

MiB = 1 << 20


@pytest.fixture
def cuda_with_actpack(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "emulated")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(_C, "_device_allocator_in_use", lambda: True)
    before = actpack.memory_budget(0)
    _C._set_device_budget(0, 512 * MiB)  # what install_allocator(budget="512MiB") sets
    yield
    _C._set_device_budget(0, before)


def test_the_budget_caps_the_cuda_allocator_from_its_start_and_restores_it(cuda_with_actpack):
    memory = _budget._PeakMeter(parse_budget("64MiB"))
    memory.start()
    assert not memory.warnings  # actpack's allocator is in use: a cap, not a target
    assert actpack.memory_budget(0) == 64 * MiB
    # A step before the first plan may go over to measure; the cap comes back after it.
    room = memory.lift_cap(10 * MiB)
    assert room > 0 and actpack.memory_budget(0) == 64 * MiB + room
    assert memory.restore_cap()
    assert actpack.memory_budget(0) == 64 * MiB
    memory.stop(snapshot=False)
    assert actpack.memory_budget(0) == 512 * MiB  # the install's cap, as start() found it


def test_without_actpacks_cuda_allocator_the_budget_is_a_target(cuda_with_actpack, monkeypatch):
    monkeypatch.setattr(_C, "_device_allocator_in_use", lambda: False)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 0)
    memory = _budget._PeakMeter(parse_budget("64MiB"))
    memory.start()
    assert "the budget is a target, not a cap" in memory.warnings[0]
    assert actpack.memory_budget(0) == 512 * MiB  # torch's allocator: nothing of ours to cap
    assert memory.lift_cap(10 * MiB) == 0
