"""Checks of what users pass to actpack's entry points, made before anything reaches the C++
bindings: a wrong type or an out-of-range value raises TypeError or ValueError with one line
that names the entry point, the argument, the value and what is accepted (pybind's own
"incompatible function arguments" error lists every overload over several lines and names
none of that).

    seed = integer(seed, "seed", "actpack.budget", 0, UINT64_MAX)
    # ValueError: actpack.budget: seed=-1 is out of range; expected an int from 0 to 2**64-1
"""
import math
import numbers
import os

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
_NAMED = {INT64_MAX: "2**63-1", UINT64_MAX: "2**64-1", -INT64_MAX - 1: "-2**63"}


def show(value, limit=200):
    """repr(value) on one line (a tensor's or an array's repr spans several), shortened past
    `limit` characters."""
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the error being reported
        text = f"<{type(value).__name__} object>"
    if not text.isprintable():
        text = " ".join(text.split())
        text = text.encode("ascii", "backslashreplace").decode("ascii")
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return text


def kind(value):
    """`value`'s repr and type, for a message about a wrong type: "[1, 2] (list)"."""
    return f"{show(value)} ({type(value).__name__})"


def _bound(n):
    return _NAMED.get(n, str(n))


def is_int(value):
    """An int (numpy's too), and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer(value, name, where, low=0, high=INT64_MAX):
    """`value` as an int in [low, high]; a bool, a float or a str is a TypeError."""
    if not is_int(value):
        raise TypeError(f"{where}: {name} must be an int from {_bound(low)} to {_bound(high)}, "
                        f"got {kind(value)}")
    value = int(value)
    if not low <= value <= high:
        raise ValueError(f"{where}: {name}={value} is out of range; expected an int from "
                         f"{_bound(low)} to {_bound(high)}")
    return value


def real(value, name, where, expected="a finite number", finite=True):
    """`value` (an int or a float, not a bool) as a float, finite unless `finite` is False
    (where the range is checked in C++, which names a NaN or an infinity itself)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: {name} must be {expected}, got {kind(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{where}: {name}={show(value)} is not finite; expected "
                         f"{expected}") from None
    if is_int(value) and math.isfinite(number) and int(number) != value:
        # The C++ check would name the float, not the int given.
        raise ValueError(f"{where}: {name}={value} has no exact float; expected {expected}")
    if finite and not math.isfinite(number):
        raise ValueError(f"{where}: {name}={show(value)} is not finite; expected {expected}")
    return number


def flag(value, name, where):
    """True or False (a numpy bool, or the int 0 or 1, counts as one)."""
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_" or (is_int(value) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{where}: {name} must be True or False, got {kind(value)}")


def printable(text, name, where, example):
    """`text` when it is a str holding no control character or line break (the C++ side
    quotes what it is given, and a message must stay on one line)."""
    if not isinstance(text, str):
        raise TypeError(f"{where}: {name} must be a str such as {example}, got {kind(text)}")
    if not text.isprintable():
        raise ValueError(f"{where}: {name} {text!r} holds a control character or line break; "
                         f"expected a str such as {example}")
    return text


def path(value, name, where):
    """A file path (str, bytes or os.PathLike) as a str; neither empty nor holding a NUL."""
    try:
        text = os.fspath(value)
    except TypeError:
        raise TypeError(f"{where}: {name} must be a path (a str or os.PathLike), "
                        f"got {kind(value)}") from None
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text or "\0" in text:
        raise ValueError(f"{where}: {name} path {text!r} is not a usable path; expected a file "
                         "name such as 'run.json'")
    return text
