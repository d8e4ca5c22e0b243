"""Running the stages within the budget: each gets at most its cap and what the budget leaves
after the floors of the stages still to come; at its limit it is interrupted as Ctrl-C would
(so that it reports what it measured), and the next stage starts.

Interrupting: SIGINT to the stage's process group at the limit, a second SIGINT 10 s later
(the first can land where Python ignores it), SIGKILL 25 s after the first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.gpu_run.plan import Stage

SECOND_SIGINT_S = 10
KILL_S = 25
MIN_STAGE_S = 10  # a stage offered less is not started
MIN_LEFTOVER_S = 30  # nor a leftover stage offered less
FINAL_S = 10  # kept for the summary and the archive
STAGES_JSON = "stages.json"


@dataclasses.dataclass
class Outcome:
    """What became of one stage."""

    name: str
    status: str  # "ok", "failed", "timed out", "skipped"
    exit_code: int | None
    seconds: float
    cap_s: int
    limit_s: int | None
    command: list[str]
    log: str | None
    note: str = ""
    leftover: bool = False


def limit_for(stage: Stage, later: Sequence[Stage], left_s: float) -> int:
    """Seconds ``stage`` may run with ``left_s`` seconds of the budget left: its cap, cut
    where it would eat into the grace of an interruption or the floors of ``later`` stages."""
    kept = KILL_S + sum(s.floor_s for s in later if not s.leftover)
    return int(min(stage.cap_s, left_s - kept))


def run_stage(stage: Stage, limit_s: int, log: Path, cwd: Path) -> Outcome:
    """Run ``stage`` for at most ``limit_s`` seconds, its output to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    timed_out = False
    with open(log, "wb") as out:
        out.write(f"$ {' '.join(stage.command)}\n".encode())
        out.flush()
        try:
            process = subprocess.Popen(
                stage.command,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_default_sigint,
            )
        except OSError as exc:
            return _outcome(stage, "failed", None, start, limit_s, log, f"could not start: {exc}")
        try:
            code = process.wait(limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            code = _interrupt(process)
    status = "timed out" if timed_out else ("ok" if code == 0 else "failed")
    return _outcome(stage, status, code, start, limit_s, log)


def _default_sigint() -> None:
    """In the stage's process before it starts: SIGINT back to its default. A run started in
    the background of a non-interactive shell inherits SIGINT ignored, and Python then never
    raises KeyboardInterrupt: the stage would lose the output it writes when interrupted."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(process: subprocess.Popen) -> int:
    """SIGINT, SIGINT again, then SIGKILL to the process group until it exits."""
    for signum, wait_s in (
        (signal.SIGINT, SECOND_SIGINT_S),
        (signal.SIGINT, KILL_S - SECOND_SIGINT_S),
        (signal.SIGKILL, None),
    ):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            pass
        try:
            return process.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
    return process.wait()


def _outcome(
    stage: Stage,
    status: str,
    code: int | None,
    start: float,
    limit_s: int | None,
    log: Path | None,
    note: str = "",
) -> Outcome:
    return Outcome(
        stage.name,
        status,
        code,
        round(time.monotonic() - start, 1),
        stage.cap_s,
        limit_s,
        list(stage.command),
        None if log is None else log.name,
        note,
        stage.leftover,
    )


def skipped(stage: Stage, why: str) -> Outcome:
    return _outcome(stage, "skipped", None, time.monotonic(), None, None, why)


def run_all(
    stages: Sequence[Stage],
    results: Path,
    cwd: Path,
    deadline: float,
    report: Callable[[str], None] = print,
) -> list[Outcome]:
    """Run ``stages`` in order until ``deadline`` (time.monotonic()); write stages.json into
    ``results`` after each one (so an interrupted run still says how far it got)."""
    outcomes: list[Outcome] = []
    for i, stage in enumerate(stages):
        left = deadline - FINAL_S - time.monotonic()
        limit = limit_for(stage, stages[i + 1 :], left)
        least = MIN_LEFTOVER_S if stage.leftover else MIN_STAGE_S
        done = {o.name for o in outcomes if o.status == "ok"}
        missing = [name for name in stage.after if name not in done]
        if missing:
            outcome = skipped(stage, f"needs {', '.join(missing)}, which did not finish")
        elif limit < least:
            outcome = skipped(stage, f"no time left ({max(limit, 0)} s)")
        else:
            report(f"== {stage.name} (at most {limit} s): {stage.what}")
            outcome = run_stage(stage, limit, results / "logs" / f"{stage.name}.log", cwd)
        report(f"== {stage.name}: {outcome.status}, exit {outcome.exit_code}, {outcome.seconds} s")
        outcomes.append(outcome)
        write_outcomes(outcomes, results / STAGES_JSON)
    return outcomes


def write_outcomes(outcomes: Sequence[Outcome], path: Path) -> None:
    path.write_text(json.dumps([dataclasses.asdict(o) for o in outcomes], indent=1) + "\n")


def read_outcomes(path: Path) -> list[dict]:
    """The stages' outcomes as written by :func:`write_outcomes` ([] when absent)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []
