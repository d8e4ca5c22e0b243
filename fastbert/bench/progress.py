"""A progress bar: tqdm on a terminal when it is installed, plain numbered lines otherwise
(a log file gets one line per step, not carriage-return redraws). Inside a long step,
:meth:`Progress.within` tells how far it is and the time left at the rate so far."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


def format_seconds(seconds: float) -> str:
    """``seconds`` for a person: "8 s", "3 min 05 s", "1 h 02 min"."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Progress:
    """``total`` steps; :meth:`step` names the one starting, :meth:`advance` ends it.

    ``every_s``: off a terminal, the least time between two lines of :meth:`within`;
    ``clock``: seconds (``time.monotonic``; tests pass a fake).
    """

    def __init__(
        self,
        total: int,
        description: str = "",
        stream: TextIO | None = None,
        use_tqdm: bool = True,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total = total
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self.clock = clock
        self._step_text = ""
        self._step_start = self._last_line = clock()
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
        self._step_text = text
        self._step_start = self._last_line = self.clock()
        if self._bar is not None:
            self._bar.set_postfix_str(text)
        else:
            print(f"[{self.done + 1}/{self.total}] {text}", file=self.stream, flush=True)

    def step_elapsed(self) -> float:
        """Seconds since the current step began."""
        return self.clock() - self._step_start

    def within(
        self, done: float, total: float, unit: str = "", fraction: float | None = None
    ) -> None:
        """The current step has done ``done`` of ``total`` units: show it with the time it has
        taken and, at the rate so far, the time left (off a terminal, a line at most every
        ``every_s`` seconds, and none once done). ``fraction``: the share of the step's work
        done, where units differ in size (default ``done / total``)."""
        now = self.clock()
        elapsed = now - self._step_start
        share = done / total if fraction is None else fraction
        text = f"{done:g}/{total:g}{' ' + unit if unit else ''}, {format_seconds(elapsed)}"
        if 0 < share < 1:
            text += f", about {format_seconds(elapsed * (1 - share) / share)} left"
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self._step_text}: {text}")
        elif done < total and now - self._last_line >= self.every_s:
            self._last_line = now
            print(f"      {text}", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """A line of its own (above the bar on a terminal)."""
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

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
