"""Start ``fastbert serve`` as a real process on a free loopback port, for the tests that call
it with real clients. ``faulty=True`` runs it through tests/serve_faulty.py, which can slow or
break the model's forward pass from the test (see there)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Served:
    process: subprocess.Popen
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def rss_bytes(self) -> int:
        """The server's resident memory."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stop(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


@contextlib.contextmanager
def serving(
    model: str | Path,
    *arguments: str,
    tmp_path: Path,
    faulty: bool = False,
    env: dict[str, str] | None = None,
    ready_timeout: float = 120,
) -> Iterator[Served]:
    """A running server for ``model`` with extra command-line ``arguments``; stopped (SIGTERM,
    then killed) at the end."""
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    entry = [str(REPO / "tests" / "serve_faulty.py")] if faulty else ["-m", "fastbert.cli"]
    command = [sys.executable, *entry, "serve", "--model", str(model), "--port", str(port)]
    command += list(arguments)
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=environment, cwd=REPO
        )
    served = Served(process, f"http://127.0.0.1:{port}", log)
    try:
        _wait_ready(served, ready_timeout)
        yield served
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(served: Served, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if served.process.poll() is not None:
            raise AssertionError(f"the server exited early:\n{served.output()}")
        try:
            if httpx.get(served.url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the server did not become ready:\n{served.output()}")
