"""The memory side of a budget in Python: actpack's host pool (its C++ side,
torch_plugin::HostBudgetMemory, shared with the C++ guard), its CUDA allocator, or torch's
(measured, not capped), as runtime::BudgetMemory, which the C++ budget run drives."""
import torch

from actpack import _C

_HOST = _C._HOST_DEVICE

# How far beyond the budget a step before the first plan may go to measure itself at most, with
# 4x the budget (runtime/budget_run.h); read when a budget is entered (tests make it small).
LIFTED_CAP_EXTRA = _C._LIFTED_CAP_EXTRA_BYTES


def outside_allowance():
    """What the system may count outside the allocator before it takes from the budget: on the
    host, torch's one-time initialization of its CPU kernels; on CUDA nothing."""
    return 0 if torch.cuda.is_available() else _C._HOST_OUTSIDE_ALLOWANCE_BYTES


class BudgetMemory(_C.BudgetMemory):
    """The memory side of a budget: installs and reads the allocator, and caps it for the run
    (runtime::BudgetMemory, which runtime::BudgetRun drives: when to cap, lift and release).

    On a machine with CUDA the budget is one CUDA device's: `device` (an index) when given,
    else the device of the first CUDA tensor the budget packs (bind()). Until then nothing asks
    anything of any device: the memory is neither measured nor capped, and `bound` is False.
    Every call it makes names that device; torch's current device is never read."""

    def __init__(self, parsed_budget, device=None):
        super().__init__()
        from actpack import memory
        self._mem = memory
        self.warnings = []
        self._cuda = torch.cuda.is_available()
        self.outside_allowance = outside_allowance()
        # The device: _HOST for the host pool, a CUDA index, or None while not known.
        self.device = device if self._cuda else _HOST
        self.device_name = "cpu"  # the GPU's name when bound: asking it here would start CUDA
        self.budget_bytes = memory._resolve_budget(parsed_budget,
                                                   share_device(parsed_budget, self.device))
        # The host pool's memory side, the C++ guard's too (None on a machine with CUDA).
        self._host = None if self._cuda else _C.HostBudgetMemory()
        self._pressure_id = None
        self._actpack_cuda = False
        # The driver's count above its value at start; None where it cannot be read.
        self._driver_start = None
        self._pool_start = 0
        self._counting = None  # the device whose pool counts the system's memory
        self.system_memory = None

    @property
    def runtime_memory(self):
        """What the C++ budget run drives: the host pool's own memory side, or this object."""
        return self._host or self

    @property
    def bound(self):
        """Whether the budget's device is known (the host, a device= argument, or the device
        of the first CUDA tensor packed)."""
        return self.device is not None

    def start(self):
        if self._cuda:
            self._actpack_cuda = self._mem.cuda_allocator_installed()
            if not self._actpack_cuda:
                self.warnings.append(
                    "the budget is a target, not a cap: actpack's CUDA allocator is not "
                    "installed (call actpack.install_allocator(budget=...) before any CUDA work, "
                    "or set ACTPACK_CONF); the peak comes from torch.cuda.max_memory_allocated")
            if self.device is not None:
                self._bind()
            return
        self._host.start()
        self.system_memory = _C.HostBudgetMemory.SYSTEM_MEMORY

    def bind(self, device):
        """Makes CUDA device `device` (an index) the budget's, when none is yet: from now on it
        is measured and, under actpack's allocator, capped. True when this call bound it."""
        if not self._cuda or self.device is not None:
            return False
        self.device = device
        self._bind()
        return True

    def _bind(self):
        self.device_name = torch.cuda.get_device_name(self.device)
        self._start_system_count()

    @property
    def capped(self):
        """Whether actpack's allocator serves the budget's device, so that the budget is a cap
        (on the CPU and on the GPU alike: without a cap the planner's tries would find that
        every batch "fits")."""
        return not self._cuda or self._actpack_cuda

    def _start_system_count(self):
        # The allocator counts against its cap what the driver holds outside it (checked when
        # it reserves memory), and each step's peak as the driver counts it is measured.
        try:
            self._driver_start = _C._device_used_bytes(self.device)
            # The driver's count is taken above its value at enter; so is the pool's, which
            # the driver's count holds (weights, optimizer state reserved before the run).
            self._pool_start = self._reserved_now()
            self.system_memory = "CUDA driver's used memory above its value at enter " \
                                 "(cudaMemGetInfo, at step ends)"
            if self._actpack_cuda:
                self._counting = self.device
                _C._count_system_memory(self.device)
        except (RuntimeError, NotImplementedError):
            self._driver_start = None  # this build has no CUDA of its own

    def resume_counting(self):
        """Counts the system's memory against the cap again, from now, after a budget nested
        inside this one stopped that count (there is one per device)."""
        try:
            if self._host is not None:
                self._host.resume_counting()
            elif self._counting is not None:
                _C._count_system_memory(self._counting, self.outside_allowance)
        except (RuntimeError, NotImplementedError):
            self._counting = None  # the system's count cannot be read now: the pool's alone

    def _system_peak(self, reserved_peak):
        """The step's peak as the driver counts it, above its value at start (0: unknown)."""
        if self._driver_start is None:
            return 0
        # The driver only says what is in use now: the pool's peak plus what is in use outside
        # the pool at the step's end (the context, workspaces, other allocators).
        used = _C._device_used_bytes(self.device) - self._driver_start
        outside = used - (self._reserved_now() - self._pool_start)
        return reserved_peak + max(0, outside)

    def _reserved_now(self):
        return (self._mem.memory_reserved(self._pool()) if self._actpack_cuda
                else torch.cuda.memory_reserved(self.device))

    def _pool(self):
        """The budget's device as actpack.memory names it: "cpu" for the host pool."""
        return "cpu" if self.device == _HOST else self.device

    def _torchs(self):
        """Whether torch's own CUDA allocator serves the device (measured, not capped)."""
        return self._cuda and not self._actpack_cuda

    # ---- runtime::BudgetMemory, on CUDA (on the host the run drives the host pool's) ----

    def take_peaks(self):
        """(allocated, reserved, system) peaks since the last call; restarts measuring. Reserved
        bytes are what the budget caps, fragmentation included; `system` is the operating
        system's or the driver's count (0: unknown). Zeros while the device is not known."""
        if self.device is None:
            return 0, 0, 0
        if self._torchs():
            # torch's allocator has one peak: the budget restarts it (its docs say so).
            allocated = torch.cuda.max_memory_allocated(self.device)
            reserved = torch.cuda.max_memory_reserved(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            # A window of the budget's own: actpack.max_memory_allocated stays the user's.
            allocated, reserved = _C._take_window_peaks(self.device)
        return allocated, reserved, self._system_peak(reserved)

    def release_cache(self):
        if self.device is None:
            return
        if self._torchs():
            torch.cuda.empty_cache()
        else:
            self._mem.empty_cache(self._pool())

    def cap(self):
        """The cap of the pool the budget is on (None: none, or no device yet)."""
        return None if self.device is None else self._mem.memory_budget(self._pool())

    def set_cap(self, budget_bytes):
        """Caps actpack's CUDA allocator for the budget's device (None: no cap)."""
        _C._set_device_budget(self.device, budget_bytes)

    # ----

    def relieve_pressure_with(self, relieve):
        """Calls relieve(needed_bytes) when an allocation would cross the budget (actpack's
        allocator only: torch's has no such hook)."""
        if self.capped:
            self._pressure_id = self._mem.add_pressure_callback(relieve, self._pool())

    def stop_watching(self):
        """No more pressure callbacks, and no more counting of the system's memory."""
        if self._pressure_id is not None:
            self._mem.remove_pressure_callback(self._pressure_id)
            self._pressure_id = None
        if self._host is not None:
            self._host.stop_watching()
        elif self._counting is not None:
            _C._stop_counting_system_memory(self._counting)
        self._counting = None

    def stop(self, snapshot, run_peaks):
        """The report's allocator section, with the run's (allocated, reserved, system) peaks;
        the allocator as start() found it (the run put its cap back)."""
        if self._host is not None:
            return self._host.stop(snapshot, tuple(run_peaks), self.budget_bytes)
        # backend: the device kind; allocator: whose allocator served it (the CLI's schema).
        ours = self.capped
        if self.device is None:
            stats = {}  # no CUDA tensor was packed: no device was measured
        elif ours:
            stats = self._mem.memory_stats(self._pool())
        else:
            stats = dict(torch.cuda.memory_stats(self.device))
        return _C.allocator_section(
            "cuda", ours, self.budget_bytes, stats, run_peaks[0], run_peaks[1],
            self._mem.memory_snapshot(self._pool())
            if snapshot and ours and self.device is not None else None)


def share_device(parsed_budget, device):
    """The device whose memory a share ("80%") of `parsed_budget` is taken of: the budget's own
    (`device`: an index, _HOST for the host), the host without CUDA, or on CUDA without one,
    the one device there is. A size names no device: the host, which resolving it never asks."""
    if device is not None:
        return device
    if parsed_budget["bytes"] or not torch.cuda.is_available():
        return _HOST
    count = torch.cuda.device_count()
    if count == 1:
        return 0
    raise ValueError(
        f"actpack.budget: a budget of {parsed_budget['text']} needs the device, and {count} CUDA "
        "devices are visible: name it with device= (the model's, such as "
        "device=f'cuda:{local_rank}'; ACTPACK_CONF's device=cuda:N), or give the budget as a "
        "size ('60GiB')")
