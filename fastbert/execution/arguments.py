"""Checks of the integer arguments the public API takes (sizes, widths, counts), shared by the
rooms that take them. Only the standard library: the commands' parsers import it."""

from __future__ import annotations

import operator


def positive_integer(name: str, value: object, minimum: int = 1) -> int:
    """``value`` as a Python int >= ``minimum``: an int, or an integer scalar of another
    library (a NumPy integer, a one-element integer tensor: whatever ``operator.index`` takes,
    as PyTorch's own size arguments do). ValueError naming ``name`` for a bool (True would
    read as 1; NumPy's and PyTorch's booleans too), a float, a string, or a value below
    ``minimum``."""
    dtype = getattr(value, "dtype", None)  # NumPy's bool_ and a bool tensor have __index__
    boolean = isinstance(value, bool) or (dtype is not None and "bool" in str(dtype))
    try:
        number = None if boolean else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < minimum:
        wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return number
