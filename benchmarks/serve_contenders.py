"""The servers benchmarks/serve_bench.py compares, each started as a process of its own on a
free loopback port, waited for until ``GET /health`` answers 200, and stopped with SIGTERM (then
SIGKILL after a grace period):

- ``fastbert``: ``fastbert serve`` (TEI routes ``/embed``, ``/embed_sparse`` and ``/rerank``);
- ``infinity``: infinity-emb from PyPI, in a virtual environment of its own (it pins
  ``numpy<2`` and ``sentence-transformers<4``, which fastbert's environment does not share),
  made on demand by :func:`ensure_infinity` (OpenAI's ``/embeddings`` and Cohere's ``/rerank``);
- ``st``: plain sentence-transformers behind uvicorn (benchmarks/st_server.py, TEI routes, a
  SparseEncoder's ``/embed_sparse`` too).

The infinity-emb environment alone:

    python -m benchmarks.serve_contenders --infinity-venv PATH   # makes it if missing
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.serve_load import SHAPE_DATA, SHAPE_LIST, SHAPE_RESULTS, Call
from fastbert.settings import INFINITY_VENV, cache_dir

INFINITY_VERSION = "0.0.78"
# A CPU build of torch first: left to itself, pip would resolve infinity-emb's unpinned
# ``torch>=2.2.1`` to the newest CUDA build (gigabytes). Same release as fastbert's own.
INFINITY_TORCH = "torch==2.13.0"
DEFAULT_INFINITY_VENV = INFINITY_VENV.read() or cache_dir() / f"infinity-emb-{INFINITY_VERSION}"
REPO = Path(__file__).resolve().parents[1]
NAMES = ("fastbert", "infinity", "st", "fastbert-padded", "fastbert-no-spin")
# What each name starts: fastbert-padded is fastbert serve on the padded route (benchmarks/
# padded_route.py), to measure the packed path's gain in the same run; fastbert-no-spin is
# fastbert serve --no-omp-spin, to measure the default's spinning OpenMP threads.
FASTBERT_MODULES = {
    "fastbert": "fastbert.cli",
    "fastbert-padded": "benchmarks.padded_route",
    "fastbert-no-spin": "fastbert.cli",
}
FASTBERT_OPTIONS = {"fastbert-no-spin": ("--no-omp-spin",)}


class Unavailable(Exception):
    """A contender that cannot run here; the message says why."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- requests in each server's shapes -------------------------------------------------------


def embed_call(api: str, texts: list[str], tokens: int) -> Call:
    """A request embedding ``texts`` in the API's shape: TEI's ``/embed`` or OpenAI's
    ``/embeddings`` (infinity-emb's route)."""
    if api == "infinity":
        body = {"input": texts, "model": "model", "encoding_format": "float"}
        return Call("/embeddings", json.dumps(body).encode(), len(texts), tokens, SHAPE_DATA)
    body = {"inputs": texts, "normalize": True}
    return Call("/embed", json.dumps(body).encode(), len(texts), tokens, SHAPE_LIST)


def sparse_call(api: str, texts: list[str], tokens: int) -> Call:
    """A request for the sparse embeddings of ``texts``: TEI's ``/embed_sparse`` (infinity-emb
    has no sparse route: ValueError)."""
    if api == "infinity":
        raise ValueError("infinity-emb serves no sparse embeddings")
    body = {"inputs": texts}
    return Call("/embed_sparse", json.dumps(body).encode(), len(texts), tokens, SHAPE_LIST)


def rerank_call(api: str, query: str, texts: list[str], tokens: int) -> Call:
    """A request scoring ``texts`` against ``query``: TEI's ``/rerank`` (``texts``) or
    infinity-emb's Cohere-shaped ``/rerank`` (``documents``, answer under ``results``)."""
    if api == "infinity":
        body = {"query": query, "documents": texts, "model": "model"}
        return Call("/rerank", json.dumps(body).encode(), len(texts), tokens, SHAPE_RESULTS)
    body = {"query": query, "texts": texts}
    return Call("/rerank", json.dumps(body).encode(), len(texts), tokens, SHAPE_LIST)


# --- processes ------------------------------------------------------------------------------


@dataclass
class Server:
    """A server process in a session of its own (so its workers stop with it)."""

    name: str
    process: subprocess.Popen
    base_url: str
    log: Path

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise Unavailable(
                    f"{self.name} exited with {self.process.returncode} before answering "
                    f"/health; its log: {self.log}\n{tail(self.log)}"
                )
            if self.healthy():
                return
            time.sleep(0.25)
        self.stop()
        raise Unavailable(f"{self.name} did not answer /health in {timeout:.0f} s; log: {self.log}")

    def settle(self, call: Call, timeout: float = 600.0) -> None:
        """Send ``call`` until it is admitted (past 429s) and wait for its answer: behind a
        queue (what an open loop past capacity left), it answers when the queue is through, so
        the next cell starts on an idle server. Its outcome does not matter otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            request = urllib.request.Request(
                self.base_url + call.path, call.body, {"content-type": "application/json"}
            )
            try:
                urllib.request.urlopen(request, timeout=timeout).read()
                return
            except urllib.error.HTTPError as exc:
                if exc.code != 429:
                    return
                time.sleep(0.2)
            except (urllib.error.URLError, OSError):
                return

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``grace`` seconds (or at once
        when interrupted while waiting)."""
        if self.process.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait()
        except KeyboardInterrupt:
            self._signal(signal.SIGKILL)
            self.process.wait()
            raise

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def running(
    name: str, command: list[str], env: dict[str, str], log: Path, port: int, timeout: float
) -> Iterator[Server]:
    """Start ``command`` (which listens on ``port``), wait for /health, stop it at the end."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"$ {' '.join(command)}\n".encode())
        out.flush()
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = Server(name, process, f"http://127.0.0.1:{port}", log)
    try:
        server.wait_healthy(timeout)
        yield server
    finally:
        server.stop()


def base_env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        DO_NOT_TRACK="1",  # infinity-emb's telemetry
        INFINITY_ANONYMOUS_USAGE_STATS="0",
        INFINITY_HOME=str(workdir),  # its cache folder (else ./.infinity_cache)
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


@dataclass
class Contender:
    """How to start one server on a model folder, and the shape of its requests."""

    name: str
    api: str  # "tei" or "infinity": the routes and bodies of its requests
    startup_timeout: float = 300.0
    max_batch_tokens: int | None = None  # fastbert only
    device: str = "cpu"  # every server's --device
    infinity_python: Path | None = None  # infinity only
    extra: tuple[str, ...] = ()  # more options for the server's command line

    def check(self) -> None:
        """Raise Unavailable when this contender cannot run here."""
        if self.name in FASTBERT_MODULES:
            proc = subprocess.run(
                [sys.executable, "-m", FASTBERT_MODULES[self.name], "serve", "--help"],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise Unavailable(f"`fastbert serve --help` failed here ({last})")
        elif self.name == "infinity":
            if self.infinity_python is None or not has_infinity(self.infinity_python.parents[1]):
                raise Unavailable("no infinity-emb environment (see --infinity-venv)")
        elif self.name == "st":
            for module in ("uvicorn", "starlette", "sentence_transformers"):
                try:
                    __import__(module)
                except ImportError as exc:
                    raise Unavailable(f"{module} is not installed ({exc})") from exc

    def command(self, model: Path, port: int) -> list[str]:
        return self._command(model, port) + list(self.extra)

    def _command(self, model: Path, port: int) -> list[str]:
        where = ["--host", "127.0.0.1", "--port", str(port)]
        if self.name in FASTBERT_MODULES:
            extra = []
            if self.max_batch_tokens:
                extra = ["--max-batch-tokens", str(self.max_batch_tokens)]
            module = FASTBERT_MODULES[self.name]
            return [sys.executable, "-m", module, "serve", "--model", str(model)] + [
                *where,
                "--device",
                self.device,
                *extra,
                *FASTBERT_OPTIONS.get(self.name, ()),
                "--log-level",
                "warning",
            ]
        if self.name == "infinity":
            return [
                str(self.infinity_python.parent / "infinity_emb"),  # its console script
                "v2",
                "--model-id",
                str(model),
                "--served-model-name",
                "model",
                "--engine",
                "torch",
                "--device",
                self.device,
                *where,
                "--log-level",
                "warning",
            ]
        return [
            sys.executable,
            "-m",
            "benchmarks.st_server",
            "--model",
            str(model),
            *where,
            "--device",
            self.device,
        ]

    @contextlib.contextmanager
    def serve(self, model: Path, workdir: Path, label: str) -> Iterator[Server]:
        port = free_port()
        log = workdir / "logs" / f"{self.name}-{label}.log"
        with running(
            self.name,
            self.command(model, port),
            base_env(workdir),
            log,
            port,
            self.startup_timeout,
        ) as server:
            yield server


# --- the infinity-emb environment -----------------------------------------------------------


def infinity_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def has_infinity(venv: Path) -> bool:
    """Whether ``venv`` holds an installed infinity-emb (its console script is there)."""
    return (venv / "bin" / "infinity_emb").exists()


def ensure_infinity(venv: Path, log=sys.stderr) -> Path:
    """The python of a virtual environment holding infinity-emb (made if missing): torch
    first (a CPU build of fastbert's release), then ``infinity-emb[server,torch]``."""
    python = infinity_python(venv)
    check = [str(python), "-c", "import infinity_emb, torch; print(infinity_emb.__version__)"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f"making the infinity-emb environment in {venv} (a few minutes)", file=log, flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, INFINITY_TORCH], check=True)
    subprocess.run([*pip, f"infinity-emb[server,torch]=={INFINITY_VERSION}"], check=True)
    subprocess.run(check, check=True, capture_output=True)
    return python


def infinity_versions(python: Path) -> dict[str, str | None]:
    """Versions of the packages that matter inside the infinity-emb environment."""
    code = (
        "import importlib.metadata as m, json\n"
        "names = ['infinity-emb', 'torch', 'transformers', 'sentence-transformers', 'numpy',"
        " 'uvicorn', 'fastapi']\n"
        "out = {}\n"
        "for n in names:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: out[n] = None\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


# --- the reranker ---------------------------------------------------------------------------


def _under_random_head(cls, embedder: Path, seed: int, **settings):
    """``cls`` (a transformers BERT class with a head) from ``embedder``'s encoder weights, its
    head newly made with random weights (``seed``), without the warning that says so."""
    import torch
    from transformers.utils import logging

    torch.manual_seed(seed)
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # "newly initialized: ..." is the point here
    try:
        return cls.from_pretrained(str(embedder), **settings)
    finally:
        logging.set_verbosity(verbosity)


def make_reranker(embedder: Path, folder: Path, seed: int = 0) -> Path:
    """A cross-encoder folder: ``embedder``'s BERT encoder (all-MiniLM-L6-v2: the shape of the
    common MiniLM-L6 rerankers) under a one-logit classification head with random weights
    (``seed``), and ``embedder``'s tokenizer files. Its scores mean nothing; its work is a
    reranker's. One logit, so servers that tell rerankers from classifiers by the number of
    labels (infinity-emb) serve it as a reranker."""
    if (folder / "config.json").exists():
        return folder
    import shutil

    from transformers import BertForSequenceClassification

    model = _under_random_head(BertForSequenceClassification, embedder, seed, num_labels=1)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (embedder / name).exists():
            shutil.copy(embedder / name, folder / name)
    return folder


def make_sparse(embedder: Path, folder: Path, seed: int = 0, active: int = 150) -> Path:
    """A SparseEncoder (SPLADE) folder: ``embedder``'s BERT encoder (all-MiniLM-L6-v2: the
    dense mixes' very encoder, so the two differ by the sparse head alone) under a masked-LM
    head with random weights (``seed``), then SpladePooling (max, log1p of relu), with
    ``embedder``'s tokenizer. The decoder's bias is lowered so that a text has about
    ``active`` non-zero entries of 30,522, as trained SPLADE models give (100 to 300): with
    random logits nearly every entry is positive and each answer would be megabytes of JSON.
    The threshold: the quantile of the texts' max logits (64 sentences of Python's help texts)
    above which ``active`` per text remain. Its vectors mean nothing; its work is a SPLADE
    model's."""
    if (folder / "modules.json").exists():
        return folder
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from transformers import AutoTokenizer, BertForMaskedLM

    from fastbert.serve.calibration import help_sentences

    model = _under_random_head(BertForMaskedLM, embedder, seed).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(embedder))
    texts = help_sentences(64)
    maxima = []
    with torch.no_grad():
        for start in range(0, len(texts), 8):
            batch = tokenizer(
                texts[start : start + 8], padding=True, truncation=True, return_tensors="pt"
            )
            logits = model(**batch).logits
            padding = ~batch["attention_mask"].bool()[..., None]
            maxima.append(logits.masked_fill(padding, float("-inf")).amax(dim=1))
        maxima = torch.cat(maxima)
        threshold = torch.quantile(maxima.flatten(), 1 - active / maxima.shape[1])
        model.cls.predictions.bias -= threshold
    mlm = folder.with_name(folder.name + "-mlm")
    model.save_pretrained(str(mlm), safe_serialization=True)
    tokenizer.save_pretrained(str(mlm))
    head = Transformer(str(mlm), transformer_task="fill-mask", max_seq_length=256)
    SparseEncoder(modules=[head, SpladePooling("max")], device="cpu").save(str(folder))
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Make the infinity-emb environment if missing.")
    parser.add_argument("--infinity-venv", type=Path, default=DEFAULT_INFINITY_VENV)
    args = parser.parse_args(argv)
    python = ensure_infinity(args.infinity_venv)
    print(json.dumps({"python": str(python), **infinity_versions(python)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
