"""A progress bar: tqdm on a terminal when it is installed, plain numbered lines otherwise
(a log file gets one line per step, not carriage-return redraws)."""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    """``total`` steps; :meth:`step` names the one starting, :meth:`advance` ends it."""

    def __init__(
        self, total: int, description: str = "", stream: TextIO | None = None, use_tqdm: bool = True
    ):
        self.total = total
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self._bar = None
        if use_tqdm and getattr(self.stream, "isatty", lambda: False)():
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(
                    total=total, desc=description, file=self.stream, dynamic_ncols=True, leave=True
                )
        if self._bar is None and description:
            print(description, file=self.stream, flush=True)

    def step(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text)
        else:
            print(f"[{self.done + 1}/{self.total}] {text}", file=self.stream, flush=True)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
