"""Byte sizes and budgets as users write them ("6GiB", "512MiB", "1.5e9", "80%").

A size is an int of bytes or a str: a positive number and a unit (none or B: bytes; K, KiB,
M, MiB, G, GiB, T, TiB: powers of 1024; KB, MB, GB, TB: powers of 1000; case does not
matter). The number may be written in scientific notation: "1e9" and "1.5e9B" are bytes,
"2e3MiB" is 2000 MiB. Sizes run from 1 byte to MAX_BYTES (9.2e18 bytes, the C++ parser's
limit, runtime/config.h), as an int too. A budget is a size or a share of the device
("80%", in (0%, 100%]). Anything else raises ValueError (TypeError for a value that is
neither a str nor an int) with one line naming the value and what is expected.
"""
import math
import numbers

from actpack import _C
from actpack._args import is_int, kind

# The largest size runtime/config.h's ParseByteSize takes; ints are held to it too.
MAX_BYTES = _C.MAX_SIZE_BYTES
# What the C++ parser strips around a size (absl's ASCII whitespace).
_WHITESPACE = " \t\n\v\f\r"
_EXPECTED = "expected a positive number with a unit, e.g. '6GiB', '512MiB', '1.5GB' or '80%'"


def _parse_text(text, parse):
    """parse(text) by the C++ parser (runtime/config.cc: units, scientific notation, the
    range), after the checks it cannot make: it quotes the text it is given, which must be
    one printable line."""
    stripped = text.strip(_WHITESPACE)
    if not stripped:
        raise ValueError(f"actpack: invalid memory size {text!r}: no number; {_EXPECTED}")
    if not stripped.isprintable():
        raise ValueError(f"actpack: invalid memory size {text!r}: it holds a control character "
                         f"or line break; {_EXPECTED}")
    return parse(stripped)


def parse_size(text, what="memory size"):
    """Bytes in a size such as "6GiB", "1.5GB", "1e9" or an int; ValueError naming the text
    otherwise (`what` names the argument in the message of a wrong type)."""
    if is_int(text):  # the C++ parser's range and messages for ints too: one rule
        return _C.parse_size(str(int(text)))
    if not isinstance(text, str):
        raise TypeError(f"actpack: a {what} is a str like '6GiB' or '1.5e9', or an int of bytes, "
                        f"got {kind(text)}")
    return _parse_text(text, _C.parse_size)


def parse_budget(text):
    """{"bytes": int, "fraction": float, "text": str} for "6GiB" or 6442450944 (bytes) or "80%"
    (fraction)."""
    if is_int(text):
        return _C.parse_budget(str(int(text)))
    if not isinstance(text, str):
        raise TypeError(f"actpack: a budget is a str like '6GiB', '1.5e9' or '80%', or an int of "
                        f"bytes, got {kind(text)}")
    return _parse_text(text, _C.parse_budget)


def format_bytes(n):
    """"1.50 GiB" for 1610612736; "-1.00 MiB" for a negative difference or model intercept."""
    if isinstance(n, bool) or not isinstance(n, numbers.Real):
        raise TypeError(f"actpack: format_bytes takes a number of bytes, got {kind(n)}")
    if not is_int(n) and not math.isfinite(n):
        raise ValueError(f"actpack: format_bytes takes a finite number of bytes, got {n!r}")
    n = int(n)
    if abs(n) > 2**64 - 1:
        raise ValueError(f"actpack: format_bytes takes a number of bytes from -(2**64-1) to "
                         f"2**64-1, got {n}")
    return "-" + _C.format_bytes(-n) if n < 0 else _C.format_bytes(n)
