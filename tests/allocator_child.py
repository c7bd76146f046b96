"""Child process for tests/test_allocator.py: actpack's allocators are process-wide (the CPU one
cannot be taken back from tensors it made, the CUDA one must come before CUDA initialises), so
each scenario runs in a fresh interpreter and prints one JSON line of results.

    python tests/allocator_child.py SCENARIO
"""
import ctypes
import json
import os
import sys
import tempfile

import torch

import actpack

MiB = 1 << 20


def train(device, steps=4, seed=0):
    """Losses of a few SGD steps of a small CNN; bit-identical for the same seed and device."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(16, 3, 16, 16, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    y = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(seed + 2)).to(device)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def cpu_train():
    plain = train("cpu")
    actpack.install_cpu_allocator(budget="256MiB")
    before = actpack.memory_stats("cpu")
    packed = train("cpu")
    return {"plain": plain, "actpack": packed, "installed": actpack.cpu_allocator_installed(),
            "before": before, "stats": actpack.memory_stats("cpu")}


def cpu_oom():
    actpack.install_cpu_allocator(budget="64MiB")
    result = {}
    try:
        torch.empty(100 * MiB, dtype=torch.uint8)
        result["raised"] = None
    except torch.OutOfMemoryError as error:
        result["raised"] = "OutOfMemoryError"
        result["message"] = str(error).splitlines()[0]
    # Still usable: allocations under the budget succeed and compute right.
    result["after_sum"] = torch.ones(4 * MiB // 4).sum().item()
    actpack.set_cpu_budget("256MiB")
    result["after_raise_budget"] = torch.empty(100 * MiB, dtype=torch.uint8).numel()
    result["stats"] = actpack.memory_stats("cpu")
    result["budget"] = actpack.memory_budget("cpu")
    return result


def cpu_uninstall():
    actpack.install_cpu_allocator()
    kept = torch.arange(1000, dtype=torch.float32)
    allocated_with = actpack.memory_allocated("cpu")
    was = actpack.uninstall_cpu_allocator()
    plain = torch.zeros(1 << 20)  # torch's allocator again: not counted by actpack
    allocated_after = actpack.memory_allocated("cpu")
    total = kept.sum().item()
    del kept  # freed by actpack's deleter although uninstalled
    return {"was_installed": was, "installed": actpack.cpu_allocator_installed(),
            "allocated_with": allocated_with, "allocated_after": allocated_after,
            "allocated_end": actpack.memory_allocated("cpu"), "sum": total,
            "plain_numel": plain.numel()}


def cpu_snapshot():
    actpack.install_cpu_allocator(budget="256MiB")
    keep = [torch.empty(n) for n in (1000, 300000, 3 * MiB)]
    path = os.path.join(tempfile.mkdtemp(), "snapshot.pickle")
    actpack.dump_snapshot(path, "cpu")
    import pickle
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    del keep
    actpack.reset_peak_memory_stats("cpu")
    released = actpack.empty_cache("cpu")
    return {"keys": sorted(snapshot), "segments": len(snapshot["segments"]),
            "block_states": sorted({b["state"] for s in snapshot["segments"] for b in s["blocks"]}),
            "trace_actions": sorted({e["action"] for t in snapshot["device_traces"] for e in t}),
            "released": released, "stats": actpack.memory_stats("cpu")}


def device_abi_host():
    """The CUDA path's C ABI, exported from actpack._C, driven through ctypes on a host backend."""
    actpack._C._configure_device_allocator("host", 8 * MiB)
    lib = ctypes.CDLL(actpack._C.__file__)
    lib.actpack_alloc.restype = ctypes.c_void_p
    lib.actpack_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.actpack_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    p = lib.actpack_alloc(MiB, 0, None)
    during = actpack.memory_stats(0)
    over = lib.actpack_alloc(64 * MiB, 0, None)
    error = actpack.last_allocator_error()
    lib.actpack_free(p, MiB, 0, None)
    return {"ptr": bool(p), "over_ptr": over, "error": error, "during": during,
            "after": actpack.memory_stats(0), "budget": actpack.memory_budget(0)}


def cuda_train(mode):
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    result = {}
    if mode == "plugin":
        actpack.install_allocator(budget="4GiB")
        result["losses"] = train("cuda")
    elif mode == "pool":
        torch.zeros(1, device="cuda")  # CUDA in use already: a pool still works
        pool = actpack.mem_pool(budget="4GiB")
        with torch.cuda.use_mem_pool(pool):
            result["losses"] = train("cuda")
    else:
        result["losses"] = train("cuda")
        result["torch_keys"] = sorted(torch.cuda.memory_stats())
    torch.cuda.synchronize()
    result["stats"] = actpack.memory_stats(0)
    return result


def cuda_too_late():
    torch.zeros(1, device="cuda")
    try:
        actpack.install_allocator(budget="4GiB")
    except RuntimeError as error:
        return {"message": str(error)}
    return {"message": None}


SCENARIOS = {
    "cpu_train": cpu_train,
    "cpu_oom": cpu_oom,
    "cpu_uninstall": cpu_uninstall,
    "cpu_snapshot": cpu_snapshot,
    "device_abi_host": device_abi_host,
    "cuda_plain": lambda: cuda_train("plain"),
    "cuda_plugin": lambda: cuda_train("plugin"),
    "cuda_pool": lambda: cuda_train("pool"),
    "cuda_too_late": cuda_too_late,
}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]]()))
