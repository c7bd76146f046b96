"""Byte sizes and budgets as users write them ("6GiB", "512MiB", "80%")."""

from actpack import _C


def parse_size(text):
    """Bytes in a size such as "6GiB" or "1.5GB"; ValueError naming the text otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ValueError(f"actpack: invalid memory size {text!r}: the size must be positive")
        return text
    if not isinstance(text, str):
        raise TypeError(f"actpack: a memory size is a str like '6GiB' or an int, got {type(text).__name__}")
    return _C.parse_size(text)


def parse_budget(text):
    """{"bytes": int, "fraction": float, "text": str} for "6GiB" (bytes) or "80%" (fraction)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return {"bytes": parse_size(text), "fraction": 0.0, "text": format_bytes(text)}
    if not isinstance(text, str):
        raise TypeError(f"actpack: a budget is a str like '6GiB' or '80%', or an int, got {type(text).__name__}")
    return _C.parse_budget(text)


def format_bytes(n):
    """"1.50 GiB" for 1610612736; "-1.00 MiB" for a negative difference or model intercept."""
    n = int(n)
    return "-" + _C.format_bytes(-n) if n < 0 else _C.format_bytes(n)
