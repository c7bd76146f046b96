"""The memory side of a budget in Python: actpack's host pool, its CUDA allocator, or torch's
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


class PeakMeter(_C.BudgetMemory):
    """The memory side of a budget: installs and reads the allocator, and caps it for the run
    (runtime::BudgetMemory, which runtime::BudgetRun drives: when to cap, lift and release)."""

    def __init__(self, parsed_budget):
        super().__init__()
        from actpack import memory
        self._mem = memory
        self.warnings = []
        self._cuda = torch.cuda.is_available()
        self.outside_allowance = outside_allowance()
        self.device_name = "cpu"  # the GPU's name at start(): asking it here would start CUDA
        self.budget_bytes = memory._resolve_budget(parsed_budget, memory._budget_device())
        self._installed_here = False
        self._pressure_id = None
        self._actpack_cuda = False
        # The system's count: the resident set (CPU) or the driver's (CUDA), above its value
        # at start; None where it cannot be read.
        self._resident = None
        self._driver_start = None
        self._pool_start = 0
        self._counting = None  # the device whose pool counts the system's memory
        self.system_memory = None

    def start(self):
        if self._cuda:
            self.device_name = torch.cuda.get_device_name()
            self._actpack_cuda = self._mem.cuda_allocator_installed()
            if not self._actpack_cuda:
                self.warnings.append(
                    "the budget is a target, not a cap: actpack's CUDA allocator is not "
                    "installed (call actpack.install_allocator(budget=...) before any CUDA work, "
                    "or set ACTPACK_CONF); the peak comes from torch.cuda.max_memory_allocated")
        elif not self._mem.cpu_allocator_installed():
            self._mem.install_cpu_allocator()
            self._installed_here = True
        self._start_system_count()

    @property
    def capped(self):
        """Whether actpack's allocator serves the budget's device, so that the budget is a cap
        (on the CPU and on the GPU alike; until 2026-11-27 a CUDA budget set no cap at all: the
        first GPU run of the planner's test found every batch it tried "fits")."""
        return not self._cuda or self._actpack_cuda

    def _start_system_count(self):
        # The allocator counts against its cap what the system holds outside it (checked when
        # it reserves memory), and each step's peak as the system counts it is measured.
        if not self._cuda:
            self._counting = _HOST
            _C._count_system_memory(_HOST, self.outside_allowance)
            self._resident = _C.ResidentPeakMeter()
            self._resident.start()
            self.system_memory = "resident set above its size at enter (VmHWM)"
            return
        try:
            device = torch.cuda.current_device()
            self._driver_start = _C._device_used_bytes(device)
            # The driver's count is taken above its value at enter; so is the pool's, which
            # the driver's count holds (weights, optimizer state reserved before the run).
            self._pool_start = self._reserved_now()
            self.system_memory = "CUDA driver's used memory above its value at enter " \
                                 "(cudaMemGetInfo, at step ends)"
            if self._actpack_cuda:
                self._counting = device
                _C._count_system_memory(device)
        except (RuntimeError, NotImplementedError):
            self._driver_start = None  # this build has no CUDA of its own

    def resume_counting(self):
        """Counts the system's memory against the cap again, from now, after a budget nested
        inside this one stopped that count (there is one per device)."""
        if self._counting is not None:
            try:
                _C._count_system_memory(self._counting, self.outside_allowance)
            except (RuntimeError, NotImplementedError):
                self._counting = None  # the system's count cannot be read now: the pool's alone

    def _system_peak(self, reserved_peak):
        """The step's peak as the system counts it, above its value at start (0: unknown)."""
        if self._resident is not None:
            return self._resident.take_peak()
        if self._driver_start is None:
            return 0
        # The driver only says what is in use now: the pool's peak plus what is in use outside
        # the pool at the step's end (the context, workspaces, other allocators).
        used = _C._device_used_bytes(torch.cuda.current_device()) - self._driver_start
        outside = used - (self._reserved_now() - self._pool_start)
        return reserved_peak + max(0, outside)

    def _reserved_now(self):
        return (self._mem.memory_reserved(self._device()) if self._actpack_cuda
                else torch.cuda.memory_reserved())

    def _device(self):
        return "cuda" if self._cuda else "cpu"

    def _torchs(self):
        """Whether torch's own CUDA allocator serves the device (measured, not capped)."""
        return self._cuda and not self._actpack_cuda

    # ---- runtime::BudgetMemory ----

    def take_peaks(self):
        """(allocated, reserved, system) peaks since the last call; restarts measuring. Reserved
        bytes are what the budget caps, fragmentation included; `system` is the operating
        system's or the driver's count (0: unknown)."""
        if self._torchs():
            allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
            torch.cuda.reset_peak_memory_stats()
        else:
            device = self._device()
            allocated = self._mem.max_memory_allocated(device)
            reserved = self._mem.max_memory_reserved(device)
            self._mem.reset_peak_memory_stats(device)
        return allocated, reserved, self._system_peak(reserved)

    def release_cache(self):
        if self._torchs():
            torch.cuda.empty_cache()
        else:
            self._mem.empty_cache(self._device())

    def cap(self):
        """The cap of the pool the budget is on (None: none)."""
        return self._mem.memory_budget(self._device())

    def set_cap(self, budget_bytes):
        """Caps the pool the budget is on (None: none): the host's, or actpack's CUDA
        allocator's for the current device."""
        if self._cuda:
            _C._set_device_budget(torch.cuda.current_device(), budget_bytes)
        else:
            self._mem.set_cpu_budget(budget_bytes)

    # ----

    def watch_pressure(self, relieve):
        """Calls relieve(needed_bytes) when an allocation would cross the budget (actpack's
        allocator only: torch's has no such hook)."""
        if self.capped:
            device = self._device() if not self._cuda else torch.cuda.current_device()
            self._pressure_id = self._mem.add_pressure_callback(relieve, device)

    def stop_watching(self):
        """No more pressure callbacks, and no more counting of the system's memory."""
        if self._pressure_id is not None:
            self._mem.remove_pressure_callback(self._pressure_id)
            self._pressure_id = None
        if self._counting is not None:
            _C._stop_counting_system_memory(self._counting)
            self._counting = None

    def stop(self, snapshot, run_peaks):
        """The report's allocator section, with the run's (allocated, reserved, system) peaks;
        the allocator as start() found it (the run put its cap back)."""
        try:
            device = self._device()
            # backend: the device; allocator: whose allocator served it (the CLI's schema).
            ours = self.capped
            stats = self._mem.memory_stats(device) if ours else dict(torch.cuda.memory_stats())
            section = _C.allocator_section(
                device, ours, self.budget_bytes, stats, run_peaks[0], run_peaks[1],
                self._mem.memory_snapshot(device) if snapshot and ours else None)
        finally:
            if self._installed_here:
                self._mem.uninstall_cpu_allocator()
                self._installed_here = False
        return section
