"""Activation from the environment: ACTPACK_CONF enables actpack for an unmodified script.

    ACTPACK_CONF="budget=6GiB,codec=quant2,report=run.json" python train.py
    ACTPACK_CONF="budget=6GiB,codec=eb,allowed_loss_increase=0.01" python train.py
    ACTPACK_CONF="budget=6GiB,recompute=auto" python train.py   # regions: actpack.recompute
    ACTPACK_CONF="budget=80%,device=cuda:1" python train.py     # 80% of cuda:1's memory

The file actpack-env.pth, installed beside the package, calls activate_from_env() at
interpreter start only when ACTPACK_CONF is set (otherwise it imports nothing). Activation
installs actpack's allocator under the budget (allocator=auto picks CUDA when a GPU is
present, the CPU otherwise; allocator=none leaves torch's) and the saved-tensor hooks on the
main thread, and writes the report when the interpreter exits. A malformed value stops the
interpreter at once with exit code 2 and a message naming the bad key.
"""
import atexit
import os
import sys

from actpack import _C

# ACTPACK_CONF's keys (runtime::BudgetConfKeys).
KEYS = list(_C.CONF_KEYS)
_active = None


def parse(text):
    """ACTPACK_CONF's text as actpack.budget's keyword arguments, with "budget" (the limit),
    "allocator" and "device" where given: each key's value parsed and the whole checked by
    runtime::ParseBudgetConf (C++), whose error names the key and the value."""
    if not isinstance(text, str):
        raise TypeError(f"actpack: ACTPACK_CONF is a str of key=value pairs, got "
                        f"{type(text).__name__}")
    for item in text.split(","):
        # The C++ parser quotes what it reads: a line break inside a pair would split its
        # message (whitespace around the pairs is fine; it is stripped).
        item = item.strip(" \t\n\v\f\r")
        if not item.isprintable():
            raise ValueError(f"actpack: ACTPACK_CONF: {item!r} holds a control character or "
                             "line break; expected key=value pairs such as budget=6GiB")
    return _C.parse_conf(text)


def activate(text):
    """Parses `text` like ACTPACK_CONF and enters a budget for the rest of the process."""
    global _active
    import torch

    import actpack

    options = parse(text)
    allocator = options.pop("allocator", "auto")
    if allocator == "auto":
        allocator = "cuda" if torch.cuda.is_available() else "cpu"
    limit = options.pop("budget")
    # The budget first, so that a bad option fails before anything is installed; making it
    # leaves torch's CUDA unstarted, as install_allocator needs.
    budget = actpack.budget(limit, **options)
    if allocator == "cuda":
        actpack.install_allocator(budget=limit)
    elif allocator == "cpu":
        actpack.install_cpu_allocator(budget=limit)
    budget.__enter__()
    _active = budget
    atexit.register(_finish)
    return budget


def _finish():
    deactivate()


def active():
    """The budget ACTPACK_CONF opened for this process, or None."""
    return _active


def deactivate():
    """Closes the budget ACTPACK_CONF opened (its report is written then, not at exit) and
    returns its Run; None when there is none."""
    global _active
    budget, _active = _active, None
    if budget is None:
        return None
    budget.__exit__(None, None, None)
    return budget.run


def activate_from_env():
    """Called by actpack-env.pth at interpreter start when ACTPACK_CONF is set."""
    text = os.environ.get("ACTPACK_CONF")
    if not text:
        return None
    try:
        return activate(text)
    except (ValueError, TypeError, RuntimeError) as error:
        print(str(error), file=sys.stderr, flush=True)
        # Nothing has run yet; exiting here (not raising SystemExit, which the site module turns
        # into a fatal error with a traceback) leaves the one line above as the whole message.
        os._exit(2)
