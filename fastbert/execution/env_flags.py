"""On / off settings read from environment variables (``FASTBERT_KEEP_CPU_MEMORY``,
``FASTBERT_SERVE_OMP_SPIN``, ...), one spelling for all of them."""

from __future__ import annotations

import os

ON = ("1", "true", "on", "yes")
OFF = ("0", "false", "off", "no")


def read_flag(variable: str, default: bool) -> bool:
    """``$variable`` as a bool: 1/true/on/yes or 0/false/off/no (any case), ``default`` when
    unset or empty; any other value raises ValueError naming the variable."""
    value = os.environ.get(variable, "").strip().lower()
    if value == "":
        return default
    if value in ON:
        return True
    if value in OFF:
        return False
    raise ValueError(f"${variable} must be 1 or 0 (on / off), got {value!r}")
