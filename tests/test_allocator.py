"""actpack's allocator under PyTorch: the CPU allocator, the CUDA pluggable allocator and
MemPool, stats and snapshots.

Installing an allocator is process-wide and cannot be undone for tensors it made, so every
scenario that installs one runs in a fresh interpreter (tests/allocator_child.py) and the rest
of the pytest session keeps torch's allocators.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

import actpack
from conftest import HANG_GUARD_S

MiB = 1 << 20
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allocator_child.py")

# The "all"-pool names of torch.cuda.memory_stats() that actpack keeps.
TORCH_STAT_NAMES = sorted(
    [f"{stat}.all.{field}"
     for stat in ("allocation", "active", "segment", "allocated_bytes", "active_bytes",
                  "requested_bytes", "reserved_bytes")
     for field in ("current", "peak", "allocated", "freed")]
    + ["num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free"])

requires_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and actpack._C.with_cuda),
    reason="needs a CUDA device and an actpack build with CUDA")


def run_child(scenario):
    """The JSON result of one scenario in a fresh interpreter using this same actpack."""
    env = dict(os.environ)
    site = os.path.dirname(os.path.dirname(os.path.abspath(actpack.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([site, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, CHILD, scenario], env=env, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, f"{scenario} failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cpu_training_same_losses_with_actpack_allocator():
    result = run_child("cpu_train")
    assert result["installed"]
    assert result["actpack"] == result["plain"]  # bit-identical, not approximately
    stats = result["stats"]
    assert stats["allocated_bytes.all.peak"] > 0
    assert stats["num_allocs"] > result["before"]["num_allocs"]
    assert stats["reserved_bytes.all.peak"] >= stats["allocated_bytes.all.peak"]
    assert stats["num_ooms"] == 0


def test_cpu_over_budget_raises_oom_and_allocator_stays_usable():
    result = run_child("cpu_oom")
    assert result["raised"] == "OutOfMemoryError"
    message = result["message"]
    assert "requested 100.00 MiB" in message, message
    assert "budget 64.00 MiB" in message, message
    assert result["after_sum"] == 4 * MiB // 4
    assert result["after_raise_budget"] == 100 * MiB
    assert result["stats"]["num_ooms"] >= 1
    assert result["budget"] == 256 * MiB


def test_cpu_uninstall_restores_torch_allocator_and_frees_own_tensors():
    result = run_child("cpu_uninstall")
    assert result["was_installed"] and not result["installed"]
    assert result["allocated_with"] > 0
    assert result["allocated_after"] == result["allocated_with"]  # torch's tensor not counted
    assert result["allocated_end"] < result["allocated_with"]  # actpack freed its own
    assert result["sum"] == sum(range(1000))


def test_dump_snapshot_writes_memory_viz_pickle():
    result = run_child("cpu_snapshot")
    assert {"segments", "device_traces"} <= set(result["keys"])
    assert result["segments"] > 0
    assert "active_allocated" in result["block_states"]
    assert "alloc" in result["trace_actions"]
    assert result["released"] > 0
    assert result["stats"]["allocated_bytes.all.peak"] == result["stats"]["allocated_bytes.all.current"]


def test_device_c_abi_is_exported_and_reports_out_of_budget():
    result = run_child("device_abi_host")
    assert result["ptr"]
    assert result["over_ptr"] is None
    assert "out of budget" in result["error"] and "requested 64.00 MiB" in result["error"]
    assert result["during"]["allocated_bytes.all.current"] >= MiB
    assert result["after"]["allocated_bytes.all.current"] == 0
    assert result["budget"] == 8 * MiB


def test_memory_stats_keys_match_torch_names():
    stats = actpack.memory_stats("cpu")
    assert set(TORCH_STAT_NAMES) <= set(stats)
    assert set(stats) - set(TORCH_STAT_NAMES) == {"num_allocs", "num_frees"}
    assert all(isinstance(v, int) for v in stats.values())
    # A device actpack never allocated on reads as zeros and builds nothing.
    assert set(actpack.memory_stats(3)) == set(stats)
    assert actpack.max_memory_allocated(3) == 0


@pytest.mark.parametrize("device", ["tpu", -2, True, "mps"])
def test_bad_device_names_the_value(device):
    with pytest.raises((ValueError, TypeError), match="actpack"):
        actpack.memory_stats(device)


@pytest.mark.parametrize("budget", ["lots", -5, 1.5])
def test_bad_cpu_budget_is_refused_before_installing(budget):
    with pytest.raises((ValueError, TypeError), match="actpack"):
        actpack.install_cpu_allocator(budget=budget)
    assert not actpack.cpu_allocator_installed()


@pytest.mark.skipif(torch.cuda.is_available() and actpack._C.with_cuda,
                    reason="CUDA is available here")
def test_install_allocator_without_cuda_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"actpack\.install_allocator: .*(CUDA|cuda)"):
        actpack.install_allocator(budget="6GiB")
    with pytest.raises(RuntimeError, match=r"actpack\.mem_pool: .*(CUDA|cuda)"):
        actpack.mem_pool(budget="6GiB")


@pytest.mark.gpu
@requires_cuda
def test_cuda_training_through_pluggable_allocator_same_losses():
    plain = run_child("cuda_plain")
    plugged = run_child("cuda_plugin")
    assert plugged["losses"] == plain["losses"]
    assert plugged["stats"]["allocated_bytes.all.peak"] > 0
    assert plugged["stats"]["num_allocs"] > 0
    assert set(TORCH_STAT_NAMES) <= set(plain["torch_keys"])


@pytest.mark.gpu
@requires_cuda
def test_cuda_training_through_mem_pool_same_losses():
    plain = run_child("cuda_plain")
    pooled = run_child("cuda_pool")
    assert pooled["losses"] == plain["losses"]
    assert pooled["stats"]["num_allocs"] > 0


@pytest.mark.gpu
@requires_cuda
def test_install_allocator_after_cuda_init_is_a_clear_error():
    result = run_child("cuda_too_late")
    assert "must run before the first CUDA allocation" in (result["message"] or "")
