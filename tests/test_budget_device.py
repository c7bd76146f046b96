"""The budget's device is the device of the tensors it packs, not torch's current device.

A DDP rank that moves its model to cuda:{rank} without torch.cuda.set_device keeps device 0 as
torch's current device; a budget that read it capped GPU 0 from every rank and created a CUDA
context there (cudaMemGetInfo, the device's name). Here torch is told two CUDA devices exist
and every actpack call that names a device is recorded: a budget whose tensors are on cuda:1
caps device 1, restores it at exit, and asks nothing of device 0 (torch's current device
raises if read). The tensors "on cuda:1" are CPU tensors of a subclass that says so: the pack
hook sees what a CUDA tensor shows it, and the session packs them on the CPU.
"""
import pytest
import torch

import actpack
from actpack import _C, _budget_memory, memory
from actpack._units import parse_budget

MiB = 1 << 20
cap = _C._budget  # a device's cap, read by the tests themselves (not recorded)


class OnCuda1(torch.Tensor):
    """A CPU tensor that tells Python it is on cuda:1 (ops on it give more of them)."""

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return 1


# actpack._C's functions that take a device (index) first, or by keyword.
DEVICE_FUNCTIONS = ["_set_device_budget", "_memory_stats", "_empty_cache", "_budget",
                    "_reset_peak_memory_stats", "_take_window_peaks", "_snapshot",
                    "_add_pressure_callback"]


@pytest.fixture
def two_gpus(monkeypatch):
    """torch told two CUDA devices exist and actpack's CUDA allocator is installed; returns the
    list of (call, device) actpack made."""
    calls = []

    def current_device():
        raise AssertionError("torch.cuda.current_device() was read")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", current_device)
    monkeypatch.setattr(torch.cuda, "get_device_name",
                        lambda device=None: calls.append(("get_device_name", device)) or "gpu")
    monkeypatch.setattr(memory, "_cuda_installed", True)
    # The driver's count and the system count: no CUDA in this build.
    monkeypatch.setattr(_C, "_device_used_bytes",
                        lambda device: calls.append(("_device_used_bytes", device)) or 0)
    monkeypatch.setattr(_C, "_count_system_memory",
                        lambda device, *a: calls.append(("_count_system_memory", device)))
    monkeypatch.setattr(_C, "_stop_counting_system_memory",
                        lambda device: calls.append(("_stop_counting_system_memory", device)))
    for name in DEVICE_FUNCTIONS:
        real = getattr(_C, name)

        def recorded(device, *args, _name=name, _real=real, **kwargs):
            calls.append((_name, device))
            return _real(device, *args, **kwargs)
        monkeypatch.setattr(_C, name, recorded)
    real_resolve = _C.resolve_budget

    def resolve_budget(size, fraction, device):  # a device's total: 80 GiB
        if device != _C._HOST_DEVICE:
            calls.append(("resolve_budget", device))
            return size or int(fraction * (80 << 30))
        return real_resolve(size, fraction, device)
    monkeypatch.setattr(_C, "resolve_budget", resolve_budget)
    before = {d: cap(d) for d in (0, 1)}
    _C._set_device_budget(0, 512 * MiB)  # what install_allocator(budget="512MiB") sets
    _C._set_device_budget(1, 512 * MiB)
    calls.clear()
    yield calls
    for d, found in before.items():
        _C._set_device_budget(d, found)


def devices(calls):
    return {device for _, device in calls}


def step(x, w):
    loss = (x * w).sum()  # mul saves x (on "cuda:1") for w's gradient
    loss.backward()


def test_a_budget_on_cuda1_tensors_caps_device_1_and_asks_nothing_of_device_0(two_gpus):
    budget = actpack.budget("64MiB", codec="quant2", min_bytes=0)
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(64, 64).as_subclass(OnCuda1)
    with budget as run:
        assert two_gpus == [] and run.device is None  # entering asks no device anything
        step(x, w)
        assert cap(1) == 64 * MiB and cap(0) == 512 * MiB
        assert run.device == torch.device("cuda", 1)
        step(x, w)
    assert cap(1) == 512 * MiB and cap(0) == 512 * MiB  # put back as found
    assert devices(two_gpus) == {1}, two_gpus
    assert ("get_device_name", 1) in two_gpus and ("_add_pressure_callback", 1) in two_gpus
    assert run.report["activations"]["steps"][0]["stored_bytes"] > 0  # it packed
    assert w.grad is not None


def test_device_given_caps_it_from_the_enter(two_gpus):
    with actpack.budget("64MiB", codec="quant2", device="cuda:1") as run:
        assert cap(1) == 64 * MiB and run.device == torch.device("cuda", 1)
    assert devices(two_gpus) == {1}, two_gpus


def test_a_share_is_of_the_budgets_device(two_gpus):
    with pytest.raises(ValueError, match=r"a budget of 80% of the device needs the device, and "
                                         r"2 CUDA devices are visible: name it with device="):
        actpack.budget("80%")
    budget = actpack.budget("80%", device=1)
    assert budget.budget_bytes == int(0.8 * (80 << 30))
    assert two_gpus == [("resolve_budget", 1)]


def test_actpack_conf_names_the_device(two_gpus):
    from actpack import _env
    budget = _env.activate("budget=80%,device=cuda:1,allocator=none,codec=quant2")
    try:
        assert budget.run.device == torch.device("cuda", 1)
        assert cap(1) == int(0.8 * (80 << 30)) and cap(0) == 512 * MiB
    finally:
        _env.deactivate()
    assert cap(1) == 512 * MiB
    assert devices(two_gpus) == {1}, two_gpus


def test_a_tensor_on_another_device_is_warned_of_once(two_gpus):
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(8, 8).as_subclass(OnCuda1)
    with pytest.warns(UserWarning, match=r"tensors on cuda:1 are packed, but the budget measures "
                                         r"and caps cuda:0 alone") as caught:
        with actpack.budget("64MiB", codec="quant2", min_bytes=0, device=0) as run:
            step(x, w)
            step(x, w)
    assert sum("tensors on cuda:1" in str(w.message) for w in caught) == 1
    assert run.device == torch.device("cuda", 0)
    assert cap(1) == 512 * MiB  # not the budget's: untouched


def test_a_step_without_a_cuda_tensor_says_nothing_was_measured(two_gpus):
    w = torch.randn(8, 8, requires_grad=True)
    with pytest.warns(UserWarning, match="before the budget packed a CUDA tensor"):
        with actpack.budget("64MiB", codec="quant2", min_bytes=0) as run:
            step(torch.randn(8, 8), w)
    assert run.device is None and two_gpus == []


@pytest.mark.parametrize("device,error", [
    ("tpu", ValueError), (1.5, TypeError), (True, TypeError), (2, ValueError),
    ("cuda:7", ValueError), (-1, ValueError), ("cpu", ValueError)])
def test_a_bad_device_is_refused_when_the_budget_is_made(two_gpus, device, error):
    with pytest.raises(error, match="actpack.budget: device"):
        actpack.budget("64MiB", device=device)


def test_without_cuda_the_budget_is_the_hosts(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _budget_memory.share_device(parse_budget("50%"), None) == _C._HOST_DEVICE
    with pytest.raises(ValueError, match="no CUDA device is available"):
        actpack.budget("64MiB", device="cuda:0")
    actpack.budget("64MiB", device="cpu")
