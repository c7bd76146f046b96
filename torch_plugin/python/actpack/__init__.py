"""actpack: train PyTorch models under a fixed memory budget.

    import actpack
    with actpack.budget("2GiB", codec="quant2", report="run.json") as run:
        for x, y in loader:
            loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
    print(run.report["activations"]["totals"]["ratio"])

Saved activations are packed by actpack's C++ codecs while autograd holds them and unpacked
for backward; the report says how many bytes were saved raw and stored.
"""
import torch  # loads LibTorch, which actpack._C links against

from actpack import _C
from actpack._budget import Run, budget
from actpack._codec import codec_names, decode, encode
from actpack._gradient_guard import GradientRunaway
from actpack._planner import Plan, plan
from actpack._recompute import recompute
from actpack._report_observers import on_report
from actpack._units import format_bytes, parse_budget, parse_size
from actpack import search
from actpack.memory import (
    cpu_allocator_installed,
    cuda_allocator_installed,
    dump_snapshot,
    empty_cache,
    install_allocator,
    install_cpu_allocator,
    last_allocator_error,
    max_memory_allocated,
    max_memory_reserved,
    mem_pool,
    memory_allocated,
    memory_budget,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_summary,
    reset_peak_memory_stats,
    set_cpu_budget,
    uninstall_cpu_allocator,
)

# Written once, in common/version.h; the compiled module carries it (as do the CLI and reports).
__version__ = _C.__version__

__all__ = [
    "Plan",
    "Run",
    "budget",
    "codec_names",
    "cpu_allocator_installed",
    "cuda_allocator_installed",
    "decode",
    "dump_snapshot",
    "empty_cache",
    "encode",
    "format_bytes",
    "install_allocator",
    "install_cpu_allocator",
    "last_allocator_error",
    "GradientRunaway",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_pool",
    "memory_allocated",
    "memory_budget",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_summary",
    "on_report",
    "parse_budget",
    "parse_size",
    "plan",
    "recompute",
    "reset_peak_memory_stats",
    "search",
    "set_cpu_budget",
    "uninstall_cpu_allocator",
]
