"""A device allocation that fails raises torch.OutOfMemoryError with actpack's reason.

torch's CUDAPluggableAllocator wraps whatever its allocation function returns in a tensor,
without a check: the C ABI's null pointer (allocator/pluggable.h's actpack_alloc) became a
tensor at address 0 and, at the first kernel that touched it, a sticky illegal-address error
that ended the process's CUDA context. Under install_allocator torch now calls
actpack_torch_alloc (torch_plugin/csrc/pluggable_alloc.h), which throws. Here the function
memory.py hands torch is found as torch finds it (ctypes, by name, in actpack._C) and called
as torch calls it (through a std::function: actpack._C._call_alloc_fn), over the device
stacks on the host backend, in a fresh interpreter (the stacks are process-wide). The GPU test
does the same through torch itself.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import actpack
from conftest import HANG_GUARD_S

requires_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and actpack._C.with_cuda),
    reason="needs a CUDA device and an actpack build with CUDA")


def run_script(body):
    """The JSON `report(...)` of `body` run in a fresh interpreter with this actpack."""
    script = textwrap.dedent("""
        import ctypes, json, sys, threading
        import torch
        import actpack
        from actpack import _C, memory
        MiB = 1 << 20
        def report(result):
            sys.stdout.flush()
            print(json.dumps(result))
        """) + textwrap.dedent(body)
    env = dict(os.environ)
    site = os.path.dirname(os.path.dirname(os.path.abspath(actpack.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([site, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def on_the_host_backend():
    """What the allocation functions memory.py hands torch did, in one fresh interpreter over
    device stacks on the host backend (8 MiB budget): "pool" for a MemPool region's, "torch"
    for install_allocator's."""
    return run_script("""
        _C._configure_device_allocator("host", 8 * MiB)
        lib = ctypes.CDLL(_C.__file__)
        def address(name):
            return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        lib.actpack_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                     ctypes.c_void_p]
        # The C ABI's allocation functions: a MemPool region's, and install_allocator's.
        pool = {"over": _C._call_alloc_fn(address("actpack_alloc"), 64 * MiB, 0),
                "reason": memory.last_allocator_error()}
        alloc = address("actpack_torch_alloc")
        out = {}
        held = _C._call_alloc_fn(alloc, MiB, 0)
        out["held"] = held != 0
        try:
            out["over"] = _C._call_alloc_fn(alloc, 64 * MiB, 0)
        except Exception as error:
            out["type"] = type(error).__name__
            out["is_oom"] = isinstance(error, torch.OutOfMemoryError)
            out["args"] = list(error.args)
        out["reason"] = memory.last_allocator_error()
        lib.actpack_free(held, MiB, 0, None)
        small = _C._call_alloc_fn(alloc, MiB, 0)
        out["after_success"] = memory.last_allocator_error()
        # The reason is the process's, not the thread's: backward allocates on autograd's
        # device threads and the error is caught on the caller's.
        def fail_elsewhere():
            try:
                _C._call_alloc_fn(alloc, 64 * MiB, 0)
            except torch.OutOfMemoryError:
                pass
        thread = threading.Thread(target=fail_elsewhere)
        thread.start()
        thread.join()
        out["from_thread"] = memory.last_allocator_error()
        lib.actpack_free(small, MiB, 0, None)
        try:
            _C._call_alloc_fn(alloc, MiB, 99)
        except Exception as error:
            out["bad_device"] = [type(error).__name__, str(error)]
        out["in_use"] = memory.memory_allocated(0)
        report({"pool": pool, "torch": out})
        """)


def test_a_failed_allocation_raises_out_of_memory_with_actpacks_reason(on_the_host_backend):
    result = on_the_host_backend["torch"]
    assert result["held"]
    assert "over" not in result, "a failed allocation returned a pointer instead of raising"
    assert result["type"] == "OutOfMemoryError" and result["is_oom"]
    # One argument, saying "CUDA out of memory." as torch's allocator does (Lightning's
    # batch-size finder and accelerate's find_executable_batch_size look for those words),
    # then actpack's reason whole, as last_allocator_error() gives it.
    (message,) = result["args"]
    assert message.startswith("CUDA out of memory. Device 0: actpack: out of budget: "), message
    assert "requested 64.00 MiB" in message and "budget 8.00 MiB" in message, message
    assert "; the smallest budget that would have fitted it: " in message, message
    assert result["reason"] and message.endswith(result["reason"]), (message, result["reason"])
    assert result["after_success"] == ""
    assert "requested 64.00 MiB" in result["from_thread"]
    assert result["bad_device"][0] == "ValueError" and "99" in result["bad_device"][1]
    assert result["in_use"] == 0


def test_a_mem_pool_region_keeps_the_null_returning_c_abi(on_the_host_backend):
    """torch's own caching allocator serves a MemPool region: on a null segment it gives back
    the region's cached blocks and retries before it raises its own torch.OutOfMemoryError, a
    retry an exception would cut short."""
    result = on_the_host_backend["pool"]
    assert result["over"] == 0
    assert "out of budget" in result["reason"] and "requested 64.00 MiB" in result["reason"]


@pytest.mark.gpu
@requires_cuda
def test_out_of_budget_on_the_gpu_is_a_clean_out_of_memory_error():
    """Through torch: an allocation over the budget raises torch.OutOfMemoryError with
    actpack's reason, in forward and in backward (autograd's device thread), and the CUDA
    context stays usable (a null pointer used to end it with an illegal address)."""
    result = run_script("""
        actpack.install_allocator(budget="64MiB")
        out = {}
        try:
            torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as error:
            out["forward"] = str(error)
        w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
        x = torch.randn(1024, 1024, device="cuda")
        loss = (x @ w).sum()
        # No room for a new segment: backward's 4 MiB weight gradient cannot be had.
        memory.empty_cache(0)
        _C._set_device_budget(0, memory.memory_reserved(0))
        try:
            loss.backward()
        except torch.OutOfMemoryError as error:
            out["backward"] = str(error)
        _C._set_device_budget(0, 64 * MiB)
        out["after"] = torch.ones(1000, device="cuda").sum().item()
        report(out)
        """)
    assert result["forward"].startswith("CUDA out of memory. Device 0: actpack: out of budget")
    assert "requested 256.00 MiB" in result["forward"]
    assert "the smallest budget that would have fitted it" in result["forward"]
    assert result["backward"].startswith("CUDA out of memory. Device 0: actpack: ")
    assert result["after"] == 1000.0
