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

KEYS = ["budget", "codec", "report", "min_bytes", "seed", "enabled", "allocator",
        "allowed_loss_increase", "recompute", "max_rel_rms", "device"]
_RECOMPUTE = {"true": True, "1": True, "false": False, "0": False, "auto": "auto"}
_ALLOCATORS = ("auto", "cpu", "cuda", "none")
_active = None


def _parse(text):
    from actpack import _C
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
    options = dict(_C.parse_key_values(text, KEYS, "ACTPACK_CONF"))
    if "budget" not in options:
        raise ValueError("actpack: ACTPACK_CONF: key 'budget' is required, e.g. "
                         "ACTPACK_CONF=\"budget=6GiB,codec=quant2\"")
    allocator = options.get("allocator", "auto")
    if allocator not in _ALLOCATORS:
        raise ValueError(f"actpack: ACTPACK_CONF: key 'allocator' is {allocator!r}; expected one "
                         f"of {', '.join(_ALLOCATORS)}")
    for key, kind in (("seed", int), ("enabled", bool)):
        if key in options:
            value = options[key]
            if kind is bool:
                if value not in ("0", "1", "true", "false"):
                    raise ValueError(f"actpack: ACTPACK_CONF: key 'enabled' is {value!r}; "
                                     "expected true or false")
                options[key] = value in ("1", "true")
            else:
                try:
                    options[key] = int(value)
                except ValueError:
                    raise ValueError(f"actpack: ACTPACK_CONF: key 'seed' is {value!r}; expected "
                                     "an integer") from None
    if "recompute" in options:
        value = options["recompute"]
        if value not in _RECOMPUTE:
            raise ValueError(f"actpack: ACTPACK_CONF: key 'recompute' is {value!r}; expected "
                             "true, false or auto")
        options["recompute"] = _RECOMPUTE[value]
    if "allowed_loss_increase" in options:
        value = options["allowed_loss_increase"]
        try:
            options["allowed_loss_increase"] = float(value)
        except ValueError:
            raise ValueError("actpack: ACTPACK_CONF: key 'allowed_loss_increase' is "
                             f"{value!r}; expected a fraction such as 0.01") from None
    if "max_rel_rms" in options:
        value = options["max_rel_rms"]
        try:
            options["max_rel_rms"] = None if value == "none" else float(value)
        except ValueError:
            raise ValueError("actpack: ACTPACK_CONF: key 'max_rel_rms' is "
                             f"{value!r}; expected a number such as 0.2, or none") from None
    if options.get("min_bytes") == "0":
        options["min_bytes"] = 0  # as budget(min_bytes=0): pack every saved tensor
    return options


def activate(text):
    """Parses `text` like ACTPACK_CONF and enters a budget for the rest of the process."""
    global _active
    import torch

    import actpack

    options = _parse(text)
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
