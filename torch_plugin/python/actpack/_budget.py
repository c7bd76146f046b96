"""The memory-budget context: saved_tensors_hooks backed by the C++ session."""
import json
import os
import platform
import time

import torch

from actpack import _C
from actpack._units import parse_budget, parse_size


class Run:
    """What a budget context knows about the run; `report` is set when the context exits."""

    def __init__(self, budget_spec, session):
        self.budget = budget_spec
        self._session = session
        self.report = None

    def totals(self):
        """Live byte counts of the session: packed raw/stored bytes, peaks, fallbacks."""
        return dict(self._session.totals())


class budget:
    """Pack the activations autograd saves while the context is active.

    Args:
        limit: the memory budget, "6GiB", "80%" (of the device) or bytes.
        codec: a codec spec: "quant2" (2-bit per-group quantization), "quant4", "quant8",
            "identity" (lossless), or "quant:bits=4,group=128".
        report: a path; on exit the run report (JSON) is written there.
        min_bytes: saved tensors smaller than this are kept as they are.
        seed: seed of the stochastic rounding.
        enabled: False keeps every saved tensor as it is (for parity runs).
    """

    def __init__(self, limit, codec="quant2", report=None, min_bytes="64KiB", seed=0,
                 enabled=True):
        self._budget = parse_budget(limit)
        if not isinstance(codec, str):
            raise TypeError(f"actpack.budget: codec must be a str such as 'quant2', got {type(codec).__name__}")
        # 0 packs every saved tensor, however small.
        if not (isinstance(min_bytes, int) and not isinstance(min_bytes, bool) and min_bytes == 0):
            min_bytes = parse_size(min_bytes)
        self._session = _C.Session(codec=codec, min_bytes=min_bytes, seed=int(seed),
                                   enabled=bool(enabled))
        self._codec = codec
        self._report_path = os.fspath(report) if report is not None else None
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._session.pack, self._unpack)
        self._end_of_backward_queued = False
        self.run = Run(self._budget, self._session)
        self._started = None

    def _unpack(self, handle):
        # The first unpack of a backward pass queues the end of the step for when that pass
        # finishes (the engine runs queued callbacks once all of its work is done).
        if not self._end_of_backward_queued:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self._end_step)
                self._end_of_backward_queued = True
            except RuntimeError:
                pass  # unpacked outside a backward pass (e.g. grad_fn._saved_self)
        return self._session.unpack(handle)

    def _end_step(self):
        self._end_of_backward_queued = False
        self._session.end_step()

    def __enter__(self):
        self._started = time.perf_counter()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()
        self._hooks.__enter__()
        return self.run

    def __exit__(self, exc_type, exc, tb):
        self._hooks.__exit__(exc_type, exc, tb)
        wall = time.perf_counter() - self._started
        self.run.report = json.loads(_C.build_report(json.dumps(self._run_metadata(wall)),
                                                     self._session))
        if self._report_path is not None:
            with open(self._report_path, "w") as f:
                json.dump(self.run.report, f, indent=2)
                f.write("\n")
        return False

    def _run_metadata(self, wall_seconds):
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        device_total = torch.cuda.get_device_properties(0).total_memory if cuda else None
        budget_bytes = (self._budget["bytes"] or
                        (int(self._budget["fraction"] * device_total) if device_total else None))
        peak = torch.cuda.max_memory_allocated() if cuda else None
        warnings = []
        if peak is not None and budget_bytes is not None and peak > budget_bytes:
            warnings.append(f"peak device memory {peak} B exceeded the budget {budget_bytes} B")
        return {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "device": torch.cuda.get_device_name(0) if cuda else "cpu",
            "budget": self._budget["text"],
            "budget_bytes": budget_bytes,
            "codec": self._codec,
            "peak_allocated_bytes": peak,
            "wall_seconds": wall_seconds,
            "warnings": warnings,
        }
