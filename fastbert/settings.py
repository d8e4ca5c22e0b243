"""fastbert's environment settings, declared once: every ``FASTBERT_*`` variable the library,
its commands and its benchmarks read, with its type, default and what it does.

Every reader goes through :func:`read` (or the helpers below), so each variable has one
spelling of its values: an unset or empty variable means its default; a value the variable
does not take raises ValueError naming the variable. ``fastbert info`` lists them with the
values in effect, and docs/settings.md's table is generated from :data:`SETTINGS`
(``python -m benchmarks.readme --check`` keeps it current). This module imports only the
standard library, so that every room, kernels included, may read it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

ON = ("1", "true", "on", "yes")
OFF = ("0", "false", "off", "no")


def _flag(name: str, text: str) -> bool:
    if text in ON:
        return True
    if text in OFF:
        return False
    raise ValueError(f"${name} must be 1 or 0 (on / off), got {text!r}")


def _path(name: str, text: str) -> Path:
    return Path(text).expanduser()


def _config_index(name: str, text: str) -> int | None:
    if text == "all":
        return None
    if not (text.isascii() and text.isdigit()):  # "²".isdigit() holds, int("²") fails
        raise ValueError(f"${name} must be 'all' or a config index, got {text!r}")
    return int(text)


def _text(name: str, text: str) -> str:
    return text


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment variable: ``name``; ``kind`` ("on/off", "path", "config index" or
    "text"), which decides how its text is read; ``default`` (what unset or empty means);
    ``scope`` (who reads it: "library", "serve", "benchmarks"); ``what`` it does;
    ``default_text``: the default in words, where its value (None) does not say it."""

    name: str
    kind: str
    default: Any
    scope: str
    what: str
    default_text: str | None = None

    def shown_default(self) -> str:
        """The default as ``fastbert info`` and docs/settings.md give it."""
        if self.default_text is not None:
            return self.default_text
        return self.shown(self.default)

    def shown(self, value: Any) -> str:
        """A value of this setting in the words its variable takes (1 / 0, not True / False;
        a config index's None is 'all')."""
        if isinstance(value, bool):
            return "1" if value else "0"
        if value is None:
            return "all" if self.kind == "config index" else "unset"
        return str(value)

    def read(self, environ: dict[str, str] | None = None) -> Any:
        """The value in ``environ`` (default: this process's environment)."""
        text = (os.environ if environ is None else environ).get(self.name, "").strip()
        if text == "":
            return self.default
        parse: Callable[[str, str], Any] = _PARSERS[self.kind]
        return parse(self.name, text.lower() if self.kind == "on/off" else text)


_PARSERS = {"on/off": _flag, "path": _path, "config index": _config_index, "text": _text}

CACHE = Setting(
    "FASTBERT_CACHE",
    "path",
    Path.home() / ".cache" / "fastbert",
    "library",
    "Where fastbert keeps what it makes once: the compiled CPU attention, the reassembled "
    "packaged all-mpnet-base-v2, the benchmarks' peer models and random folders.",
)
KEEP_CPU_MEMORY = Setting(
    "FASTBERT_KEEP_CPU_MEMORY",
    "on/off",
    True,
    "library",
    "CPU forwards keep the memory they free for the next one (glibc's malloc thresholds, set "
    "once per process); 0 leaves malloc as it was.",
)
CPU_ATTENTION = Setting(
    "FASTBERT_CPU_ATTENTION",
    "on/off",
    True,
    "library",
    "The compiled CPU attention (fastbert/kernels/cpu_attention.cpp) where the CPU and compiler "
    "allow it; 0 keeps the torch path.",
)
AUTOTUNE = Setting(
    "FASTBERT_AUTOTUNE",
    "config index",
    None,
    "library",
    "Triton autotuning: 'all' (or unset) times every config a kernel keeps; a number pins "
    "that config index instead.",
    default_text="all",
)
SERVE_OMP_SPIN = Setting(
    "FASTBERT_SERVE_OMP_SPIN",
    "on/off",
    True,
    "serve",
    "fastbert serve's default for --omp-spin: on a CPU, every torch op of the server runs on "
    "the model thread, so its OpenMP threads spin-wait as in a program calling the model; "
    "off for a host shared with other busy work.",
)
API_KEY = Setting(
    "FASTBERT_API_KEY",
    "text",
    None,
    "serve",
    "fastbert serve's default for --api-key: the bearer token every route but /health and "
    "/metrics asks for (a command line is visible to other users of the host).",
)
INFINITY_VENV = Setting(
    "FASTBERT_INFINITY_VENV",
    "path",
    None,
    "benchmarks",
    "The virtual environment of infinity-emb, the serving benchmark's peer.",
    default_text="$FASTBERT_CACHE/infinity-emb-<version>",
)

SETTINGS = (CACHE, KEEP_CPU_MEMORY, CPU_ATTENTION, AUTOTUNE, SERVE_OMP_SPIN, API_KEY, INFINITY_VENV)


def read(setting: Setting) -> Any:
    """``setting``'s value in this process's environment."""
    return setting.read()


def check() -> None:
    """ValueError naming the first ``FASTBERT_*`` variable whose value it does not take (the
    commands say so before they start)."""
    for setting in SETTINGS:
        setting.read()


def cache_dir() -> Path:
    """``$FASTBERT_CACHE``, else ``~/.cache/fastbert``."""
    return CACHE.read()


def current() -> dict[str, str]:
    """Every setting's value in effect, as text (``fastbert info``): the variable's value, or
    "(default: ...)" when it is unset; an unreadable value says so instead of raising."""
    shown = {}
    for setting in SETTINGS:
        raw = os.environ.get(setting.name, "").strip()
        try:
            value = setting.read()
        except ValueError as error:
            shown[setting.name] = f"{raw!r}: {error}"
            continue
        if setting is API_KEY and value is not None:
            value = "(set)"
        shown[setting.name] = (
            setting.shown(value) if raw else f"(default: {setting.shown_default()})"
        )
    return shown


def markdown_table() -> str:
    """docs/settings.md's table of :data:`SETTINGS`."""
    lines = ["| variable | values | default | read by | what it does |", "|---|---|---|---|---|"]
    home = str(Path.home())
    for s in SETTINGS:
        default = s.shown_default().replace(home, "~")
        lines.append(f"| `{s.name}` | {s.kind} | {default} | {s.scope} | {s.what} |")
    return "\n".join(lines) + "\n"
