"""actpack's caching allocator under PyTorch: CPU and CUDA, with a budget, stats and snapshots.

    import actpack
    actpack.install_allocator(budget="6GiB")       # before the first CUDA allocation
    ... train ...
    print(actpack.max_memory_allocated())
    actpack.dump_snapshot("mem.pickle")             # open in pytorch.org/memory_viz

On a CPU-only machine `install_cpu_allocator` puts the same pool (budget, stats, snapshots)
under torch's CPU tensors. Through torch's CUDAPluggableAllocator, torch.cuda.memory_stats and
torch.cuda.memory._snapshot do not work: read them here instead (same names and shapes).

A `device` argument is "cpu" (the host pool behind install_cpu_allocator), "cuda" or "cuda:N",
an int N, or a torch.device; None means the current CUDA device when CUDA is available, else
"cpu".
"""
import pickle
import warnings

import torch

from actpack import _C, _args
from actpack._units import format_bytes, parse_budget

_HOST = _C._HOST_DEVICE


def _resolve_budget(parsed, device):
    """Bytes of a parsed budget (actpack.parse_budget) on `device` (an index; _HOST: the host's
    physical memory): runtime::MemoryLimit::Resolve against allocator::DeviceTotalBytes."""
    return _C.resolve_budget(parsed["bytes"], parsed["fraction"], device)


def _host_budget_bytes(budget):
    """Bytes for `budget` ("6GiB", "80%" of physical memory, an int), or None (no cap)."""
    return None if budget is None else _resolve_budget(parse_budget(budget), _HOST)


def _device_index(device):
    """-1 for the host pool, else the CUDA device index."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if isinstance(device, bool):
        raise TypeError(f"actpack: expected a device like 'cpu', 'cuda:0' or 0, got {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"actpack: device index {device} is negative; expected 0, 1, ...")
        if device > _args.INT32_MAX:  # the C++ takes an int and names its own range below that
            raise ValueError(f"actpack: device index {device} is out of range; expected 0, 1, ...")
        return device
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"actpack: expected a device like 'cpu', 'cuda:0' or 0, got {device!r}") from error
    if device.type == "cpu":
        return _HOST
    if device.type != "cuda":
        raise ValueError(f"actpack: actpack allocates for 'cpu' and 'cuda', not {device.type!r}")
    if device.index is not None:
        return device.index
    # current_device() would initialise CUDA, which must not happen before install_allocator.
    return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


# ---- CPU ----

def install_cpu_allocator(budget=None):
    """Serve every new CPU tensor from actpack's host pool, capped at `budget`.

    `budget` is a size ("512MiB", an int in bytes), a share of physical memory ("50%"), or None
    for no cap. Process-wide: tensors allocated before stay with torch's allocator, tensors
    allocated after are freed by actpack even after uninstall_cpu_allocator. A request over the
    budget raises torch.OutOfMemoryError saying what was asked, what is in use, and the budget.
    Calling it again changes the budget.
    """
    _C._set_host_budget(_host_budget_bytes(budget))
    _C._install_cpu_allocator()


def uninstall_cpu_allocator():
    """Give CPU allocation back to the allocator torch had before; True if actpack's was installed.

    Tensors actpack allocated stay valid and return to actpack's pool when freed.
    """
    return _C._uninstall_cpu_allocator()


def cpu_allocator_installed():
    """Whether torch's CPU allocator is actpack's host pool now."""
    return _C._cpu_allocator_installed()


def set_cpu_budget(budget):
    """Change the host pool's cap (same forms as install_cpu_allocator; None: no cap).

    Memory already reserved above a lowered budget stays until it is freed; empty_cache("cpu")
    releases what is cached.
    """
    _C._set_host_budget(_host_budget_bytes(budget))


# ---- CUDA ----

# torch's CUDAPluggableAllocator over actpack's device stacks: under install_allocator the
# allocation function throws torch.OutOfMemoryError with actpack's reason
# (torch_plugin/csrc/pluggable_alloc.h; torch would wrap a null pointer in a tensor); a MemPool
# region keeps the C ABI's, which returns null, and torch's caching allocator retries and raises.
_ALLOC_FN = "actpack_torch_alloc"
_POOL_ALLOC_FN = "actpack_alloc"
_FREE_FN = "actpack_free"


def _check_cuda_usable(what):
    if not _C.with_cuda:
        raise RuntimeError(
            f"actpack.{what}: this actpack build has no CUDA support (it was built against a "
            f"CPU-only torch {torch.__version__} or without nvcc); reinstall actpack against a "
            "CUDA torch, or use actpack.install_cpu_allocator for CPU training")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"actpack.{what}: no CUDA device is available (torch.cuda.is_available() is False)")


def _configure_cuda(budget):
    """Configure the device stacks (before their first allocation) and set `budget` on all."""
    parsed = None if budget is None else parse_budget(budget)
    if not _C._device_allocator_in_use():
        _C._configure_device_allocator("cuda", parsed["bytes"] if parsed else None)
    if parsed is None:
        _C._set_device_budget(-1, None)
    elif parsed["bytes"]:
        _C._set_device_budget(-1, parsed["bytes"])
    else:
        for device in range(torch.cuda.device_count()):
            _C._set_device_budget_fraction(device, parsed["fraction"])


_pluggables = {}


def _pluggable_allocator(alloc_fn=_ALLOC_FN):
    """torch's CUDAPluggableAllocator over actpack's C ABI with `alloc_fn` (_ALLOC_FN for
    install_allocator, _POOL_ALLOC_FN for a MemPool region), with every hook torch has wired.

    torch 2.13's pluggable allocator calls optional hooks for init, emptyCache
    (torch.cuda.empty_cache), setMemoryFraction (torch.cuda.set_per_process_memory_fraction),
    recordStream (Tensor.record_stream), getBaseAllocation (CUDA IPC) and the CUDA-graph pool
    calls, but its Python object exposes no setter (only alloc_fn and free_fn reach
    torch._C._cuda_customAllocator), so actpack._C sets them from C++ (see Note [pluggable
    hooks] in allocator_bindings.cc). For everything else torch's pluggable allocator has no
    hook and raises "CUDAPluggableAllocator does not yet support ...": memory_stats,
    reset_peak_memory_stats, reset_accumulated_memory_stats, memory snapshots and
    _record_memory_history, cacheInfo (max_split_size bookkeeping), OOM observers and
    get_per_process_memory_fraction. Use this module's functions of the same names instead
    (memory_budget for the fraction).
    One instance per allocation function and process: torch keeps the allocator it was given.
    """
    pluggable = _pluggables.get(alloc_fn)
    if pluggable is None:
        pluggable = torch.cuda.memory.CUDAPluggableAllocator(_C.__file__, alloc_fn, _FREE_FN)
        try:
            _C._wire_pluggable_hooks(pluggable.allocator())
        except (TypeError, RuntimeError) as error:
            # A torch whose allocator type actpack cannot see (built with another pybind11
            # ABI): allocation still works; torch.cuda.empty_cache and friends do nothing.
            warnings.warn(
                f"actpack: could not wire torch.cuda.empty_cache, set_per_process_memory_fraction "
                f"and record_stream to actpack's allocator ({error}); use actpack.empty_cache and "
                f"actpack.install_allocator(budget=...) instead", RuntimeWarning, stacklevel=3)
        _pluggables[alloc_fn] = pluggable
    return pluggable


def install_allocator(budget=None):
    """Serve all CUDA memory of this process from actpack's caching allocator, capped at `budget`.

    `budget` is per device: a size ("6GiB", an int in bytes), a share of the device's memory
    ("80%"), or None for no cap. It must run before the first CUDA allocation (torch cannot swap
    an allocator in use). A request that does not fit raises torch.OutOfMemoryError (in the
    thread that allocated, as torch's own allocator raises it: a backward's reaches the caller
    of backward()) whose message starts "CUDA out of memory." and gives actpack's reason: what
    was requested, in use and cached, the budget and the smallest budget that would have fitted
    the request. torch.cuda.memory_stats and snapshots do not work through a pluggable
    allocator: use actpack.memory_stats and actpack.dump_snapshot.
    """
    _check_cuda_usable("install_allocator")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "actpack: install_allocator must run before the first CUDA allocation; CUDA is "
            "already initialised in this process. Call it at the start of the program, before "
            "any tensor or model is moved to the GPU, or use actpack.mem_pool(budget=...) for a "
            "region")
    _configure_cuda(budget)
    torch.cuda.memory.change_current_allocator(_pluggable_allocator())
    global _cuda_installed
    _cuda_installed = True


# Whether install_allocator made actpack torch's CUDA allocator (torch cannot swap it back).
# Not _C._device_allocator_in_use(): that is true only once a device's stack is built, on its
# first allocation, and also for a mem_pool region, where torch's allocator serves the rest.
_cuda_installed = False


def cuda_allocator_installed():
    """Whether torch's CUDA allocator is actpack's (install_allocator or ACTPACK_CONF), so that
    a budget caps every CUDA allocation of the process."""
    return _cuda_installed


def mem_pool(budget=None):
    """A torch.cuda.MemPool served by actpack, for `with torch.cuda.use_mem_pool(pool):`.

    Unlike install_allocator this works after CUDA is initialised: only the region's
    allocations go through actpack. The pool shares actpack's per-device stacks (and so their
    budget and stats) with install_allocator; `budget` (as there) sets that budget, None leaves
    it as it is. torch's caching allocator serves the region from segments actpack hands it; when
    actpack cannot hand one out, torch gives back the region's cached blocks, retries, and then
    raises its own torch.OutOfMemoryError, whose message is torch's: last_allocator_error()
    tells actpack's reason.
    """
    _check_cuda_usable("mem_pool")
    if budget is not None or not _C._device_allocator_in_use():
        _configure_cuda(budget)
    return torch.cuda.MemPool(_pluggable_allocator(_POOL_ALLOC_FN).allocator())


def last_allocator_error():
    """Why the last actpack CUDA allocation that failed did ("" when none has since one
    succeeded), in any thread: actpack's message, "actpack: out of budget: requested ... with
    ... in use and ... cached; budget ...; the smallest budget that would have fitted it: ...".

    Under install_allocator the torch.OutOfMemoryError raised carries the same reason; in a
    mem_pool region torch raises its own error, and this is where actpack's reason is.
    """
    return _C._last_allocator_error()


# ---- Stats and snapshots (either device kind) ----

def memory_stats(device=None):
    """Allocator counters under torch.cuda.memory_stats' names ("allocated_bytes.all.peak", ...).

    Each of allocation, active, segment, allocated_bytes, active_bytes, requested_bytes,
    reserved_bytes has .all.{current,peak,allocated,freed}; plus num_alloc_retries, num_ooms,
    num_device_alloc, num_device_free and actpack's num_allocs, num_frees. All zero for a device
    actpack has not allocated on.
    """
    return dict(_C._memory_stats(_device_index(device)))


def memory_allocated(device=None):
    """Bytes in tensors actpack has handed out on `device` now (after rounding)."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    """The most bytes handed out on `device` at once since start or reset_peak_memory_stats."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    """Bytes actpack holds from the system on `device` (handed out and cached)."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    """The most bytes actpack held on `device` at once since start or reset_peak_memory_stats."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    """Set every peak counter of `device` to its current value."""
    _C._reset_peak_memory_stats(_device_index(device))


def reset_accumulated_memory_stats(device=None):
    """Zero `device`'s .allocated/.freed totals and event counts; current and peak stay."""
    _C._reset_accumulated_memory_stats(_device_index(device))


def empty_cache(device=None):
    """Return `device`'s cached free segments to the system; returns the bytes released."""
    return _C._empty_cache(_device_index(device))


def memory_budget(device=None):
    """`device`'s budget in bytes, or None when it has no cap."""
    return _C._budget(_device_index(device))


def counts_system_memory(device=None):
    """Whether `device`'s budget counts what the system holds outside the pool (the resident
    set on the host, the driver's count on CUDA), as it does while an actpack.budget is open on
    it."""
    return _C._counts_system_memory(_device_index(device))


def memory_snapshot(device=None):
    """The allocator's state as torch.cuda.memory._snapshot() returns it.

    A dict with "segments" (each with its "blocks"), "device_traces" (recent alloc/free
    actions per device) and "allocator_settings". For "cpu" the host pool appears as device 0.
    Stack frames are not recorded.
    """
    return _C._snapshot(_device_index(device))


def dump_snapshot(path, device=None):
    """Pickle memory_snapshot(device) to `path`, for pytorch.org/memory_viz."""
    snapshot = memory_snapshot(device)
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)
    return snapshot


# ---- Memory pressure ----

def add_pressure_callback(fn, device="cpu"):
    """Call `fn(needed_bytes)` when an allocation of `device` would cross its budget.

    Before a request over the budget fails, actpack releases its cache and then calls the
    registered callbacks in registration order, retrying the request after each one that freed
    memory; the runtime uses this to pack saved activations harder in the middle of a step.
    `needed_bytes` is how far over the budget the request would go. `fn` frees what it can
    (drops tensors) and returns the bytes it freed, or None: actpack also counts what it sees
    freed. `fn` runs on the thread that allocates (possibly an autograd thread), holding the
    GIL, and must not wait for other threads. An exception in `fn` is reported through
    sys.unraisablehook (printed to stderr) and counts as freeing nothing; it never reaches the
    allocation. Allocations inside `fn` do not call the callbacks again.

    `device` is "cpu" (the host pool behind install_cpu_allocator; the default) or a CUDA
    device (as elsewhere here): a stack not built yet gets the callback when it is. Returns an
    id for remove_pressure_callback.
    """
    if not callable(fn):
        raise TypeError(f"actpack: add_pressure_callback needs a callable, got {fn!r}")
    return _C._add_pressure_callback(_device_index(device), fn)


def remove_pressure_callback(callback_id):
    """Unregister a callback by the id add_pressure_callback returned (ValueError if unknown).

    A call already running on another thread finishes; no new call starts.
    """
    callback_id = _args.integer(callback_id, "callback_id", "actpack.remove_pressure_callback",
                                -_args.INT64_MAX - 1)
    _C._remove_pressure_callback(callback_id)


def memory_summary(device=None):
    """A short human-readable line of `device`'s allocated, reserved and budget."""
    stats = memory_stats(device)
    cap = memory_budget(device)
    return (f"allocated {format_bytes(stats['allocated_bytes.all.current'])} "
            f"(peak {format_bytes(stats['allocated_bytes.all.peak'])}), "
            f"reserved {format_bytes(stats['reserved_bytes.all.current'])} "
            f"(peak {format_bytes(stats['reserved_bytes.all.peak'])}), "
            f"budget {'none' if cap is None else format_bytes(cap)}")
