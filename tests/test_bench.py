"""The benchmark library and ``fastbert bench`` on the CPU: FLOP/byte counts against hand
formulas, timing statistics on a fake clock, reports, targets, the generator of the results
sections of docs/results.md and README.md (on files in a temporary folder, and a check of the
committed ones) and a quick end-to-end run of the command. Nothing here asserts
a speed."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks import readme
from fastbert.bench import (
    analysis,
    ceilings,
    counts,
    document,
    environment,
    hardware,
    peers,
    report,
    runner,
    shapes,
    targets,
    timing,
)
from fastbert.bench.models import Reference
from fastbert.cli import main
from fastbert.integrations import models as hf_models
from fastbert.model.config import BertConfig
from tests.cli_usage import BAD_MODEL_FOLDERS, bad_model_folder
from tests.hf_models import encoder_shape

TINY = BertConfig(vocab_size=50, max_position_embeddings=16, **encoder_shape(8, 2, 2, 16))
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


# --- counts -------------------------------------------------------------------------------


def test_op_counts_match_hand_formulas() -> None:
    assert counts.linear(3, 5, 7, 2) == counts.OpCount(
        "linear", 2 * 3 * 5 * 7, 2 * (3 * 7 + 5 * 7 + 3 * 5 + 5)
    )
    assert counts.linear(3, 5, 7, 2, bias=False, residual=True).bytes == 2 * (21 + 35 + 15 + 15)
    att = counts.attention(2, 3, 4, 5, 8, 2)
    assert att.flops == 4 * 2 * 3 * 4 * 5 * 8
    assert att.bytes == 2 * 2 * 3 * 8 * (2 * 4 + 2 * 5) + 2 * 5
    varlen = counts.attention_varlen([3, 1], 2, 4, 2)
    assert varlen.flops == 4 * 2 * 4 * (9 + 1)
    assert varlen.bytes == 2 * 4 * 4 * 2 * 4 + 4 * 3
    assert counts.layer_norm(10, 8, 2).bytes == 2 * (3 * 10 * 8 + 2 * 8)
    assert counts.softmax(1, 2, 3, 4, 2).bytes == 2 * 2 * 24 + 4


def _tiny_forward_flops(tokens: int, batch: int, attention_flops: float) -> float:
    h, i, layers = 8, 16, 2
    gemms = 2 * tokens * (3 * h * h + h * h + h * i + i * h)
    norms = 2 * 8 * tokens * h
    return 8 * tokens * h + layers * (gemms + attention_flops + norms) + 2 * batch * h * h


def test_bert_forward_dense_counts_every_position() -> None:
    ops = counts.bert_forward(TINY, batch=2, seq=4, elem=2)
    assert len(ops) == 1 + 2 * 7 + 1
    attention = 4 * 2 * 2 * 4 * 4 * 4  # 4 B heads S S D
    assert counts.total_flops(ops) == _tiny_forward_flops(8, 2, attention)


def test_bert_forward_padding_free_counts_real_tokens_only() -> None:
    ops = counts.bert_forward(TINY, batch=2, seq=4, elem=2, lengths=[3, 1])
    attention = 4 * 2 * 4 * (3 * 3 + 1 * 1)  # 4 heads D sum(len^2)
    assert counts.total_flops(ops) == _tiny_forward_flops(4, 2, attention)
    assert counts.total_bytes(ops) < counts.total_bytes(counts.bert_forward(TINY, 2, 4, 2))
    with pytest.raises(ValueError, match="lengths"):
        counts.bert_forward(TINY, batch=2, seq=4, elem=2, lengths=[5, 1])


@pytest.mark.parametrize("length", [1, 2, 5, 9, 40])
@pytest.mark.parametrize("window", [None, 0, 1, 3, 8, 64])
def test_window_pairs_count_the_pairs_a_window_keeps(length, window) -> None:
    within = sum(
        1 for i in range(length) for j in range(length) if window is None or abs(i - j) <= window
    )
    assert counts.window_pairs(length, window) == within


def test_modernbert_base_counts_its_variants() -> None:
    """The modernbert-base shape: GeGLU's input projection twice the intermediate width,
    8 global and 14 sliding-window layers (keys within 64 of a query), no biases, one table,
    a final LayerNorm, no pooler."""
    config = shapes.model_config("modernbert-base")
    assert (config.glu, config.norm_position, config.position_scheme) == (True, "pre", "rotary")
    types = [config.layer_type(i) for i in range(config.num_hidden_layers)]
    assert types.count("full_attention") == 8 and types.count("sliding_attention") == 14
    assert (config.window, config.intermediate_size, config.num_hidden_layers) == (64, 1152, 22)
    batch, seq, h, i, heads, d = 2, 300, 768, 1152, 12, 64
    ops = counts.bert_forward(config, batch, seq, 4, pooler=False)
    tokens = batch * seq
    gemms = 2 * tokens * (3 * h * h + h * h + h * 2 * i + i * h)
    local_pairs = seq * 129 - 64 * 65  # each query sees 129 keys, less those past the ends
    attention = 4 * batch * heads * d * (8 * seq * seq + 14 * local_pairs)
    norms = 8 * tokens * h * (2 * 22 + 1)  # two per layer and the final one
    embeddings = 8 * tokens * h
    assert counts.total_flops(ops) == 22 * gemms + attention + norms + embeddings
    assert [op.name for op in ops].count("pooler") == 0
    assert not any(
        op.name == "qkv" and op.bytes != 4 * (tokens * h + 3 * h * h + tokens * 3 * h) for op in ops
    )


def test_roofline_takes_the_binding_limit_of_each_op() -> None:
    compute = counts.OpCount("gemm", flops=8e12, bytes=1e9)  # 10 ms at 800 TFLOP/s
    memory = counts.OpCount("norm", flops=1e6, bytes=3e9)  # 1 ms at 3 TB/s
    assert counts.roofline_ms([compute, memory], 800, 3.0) == pytest.approx(11.0)


def test_bert_base_roofline_is_about_a_millisecond_at_32x128() -> None:
    ops = counts.bert_forward(shapes.model_config("bert-base"), 32, 128, 2)
    gemm_flops = 12 * 2 * 4096 * (4 * 768**2 + 2 * 768 * 3072)
    assert counts.total_flops(ops) == pytest.approx(gemm_flops, rel=0.03)
    assert 0.9 < counts.roofline_ms(ops, 800, 3.0) < 1.3


# --- timing -------------------------------------------------------------------------------


def test_time_cpu_statistics_on_a_fake_clock() -> None:
    durations = iter([0.005, 0.001, 0.002, 0.003, 0.004])
    now = [0.0]
    calls = []

    def clock() -> float:
        return now[0]

    def fn() -> None:
        calls.append(1)
        if len(calls) > 2:  # the two warm-up calls take no time on this clock
            now[0] += next(durations)

    result = timing.time_cpu(fn, warmup=2, reps=5, clock=clock)
    assert len(calls) == 7
    assert result.reps == 5
    assert result.median_ms == pytest.approx(3.0)
    assert result.p20_ms == pytest.approx(1.8)  # sorted 1..5 ms, rank 0.8
    assert result.p80_ms == pytest.approx(4.2)


def test_percentile_and_summary_edges() -> None:
    assert timing.percentile([7.0], 20) == 7.0
    assert timing.summarize([2.0, 1.0]).median_ms == 1.5
    with pytest.raises(ValueError):
        timing.percentile([], 50)
    with pytest.raises(ValueError):
        timing.time_cpu(lambda: None, warmup=0, reps=0)


def test_time_fn_on_cpu_uses_the_wall_clock() -> None:
    result = timing.time_fn(lambda: time.sleep(0.001), "cpu", warmup=0, reps=3)
    assert result.reps == 3 and result.p20_ms <= result.median_ms <= result.p80_ms
    assert result.median_ms >= 0.9


# --- hardware, environment, shapes, peers -------------------------------------------------


@pytest.mark.parametrize(
    "name, gpu",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 PCIe", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA A100-SXM4-80GB", None),
        (None, None),
    ],
)
def test_peaks_known_gpus_only(name, gpu) -> None:
    peaks = hardware.peaks_for(name)
    assert (peaks.gpu if peaks else None) == gpu
    assert hardware.peaks_here("cpu") is None


def test_environment_names_versions_commit_and_date() -> None:
    env = environment.capture()
    for key in ("date", "commit", "python", "torch", "triton", "transformers", "gpu"):
        assert key in env
    assert env["torch"] == torch.__version__.split("+")[0] or env["torch"] == torch.__version__


def test_caps_on_the_cpu_libraries_instruction_sets_are_recorded(monkeypatch) -> None:
    """A run with oneDNN held to an older instruction set says so in its environment and in
    its results' CPU line; a run without a cap names none."""
    from benchmarks import reporting

    for name in environment.ISA_CAPS:
        monkeypatch.delenv(name, raising=False)
    assert not set(environment.ISA_CAPS) & set(environment.capture())
    assert "ONEDNN" not in reporting.cpu_line(environment.capture())
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2_VNNI")
    env = environment.capture()
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2_VNNI"
    assert "; ONEDNN_MAX_CPU_ISA=AVX2_VNNI); torch " in reporting.cpu_line(env)


def test_cpu_name_carries_family_and_model() -> None:
    # Two EPYC generations a virtual machine names alike: only the numbers tell them apart.
    cpuinfo = (
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
        "model name\t: AMD EPYC\n\nprocessor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\n"
    )
    assert environment.cpu_name(cpuinfo) == "AMD EPYC (family 25, model 17)"
    assert environment.cpu_name("model name\t: Some CPU\n") == "Some CPU"
    assert environment.cpu_name() == environment.capture()["cpu"]


def test_shapes_parse_and_batches() -> None:
    assert shapes.parse_shapes("1x128, 64x512p") == [
        shapes.Shape(1, 128),
        shapes.Shape(64, 512, True),
    ]
    assert shapes.parse_shape("2x16", padded=True).label == "2x16 padded"
    with pytest.raises(ValueError, match="BATCHxSEQ"):
        shapes.parse_shape("32-128")
    batch = shapes.make_batch(shapes.Shape(6, 40, True), vocab_size=50, device="cpu")
    assert all(16 <= n <= 40 for n in batch.lengths)
    assert batch.attention_mask.sum(1).tolist() == list(batch.lengths)
    assert (batch.input_ids[batch.attention_mask == 0] == 0).all()
    assert batch.input_ids.shape == batch.token_type_ids.shape == (6, 40)
    assert shapes.make_batch(shapes.Shape(2, 8), 50, "cpu").real_tokens == 16


@pytest.mark.parametrize("seq", [1, 8, 15])
def test_a_padded_shape_is_at_least_the_shortest_padded_length(seq: int) -> None:
    """Padded lengths are uniform in [16, seq] (docs/benchmarks.md): a padded shape shorter
    than 16 is refused (it held no padding at all: every length was seq); from 16 on, its
    lengths are in [16, seq]."""
    with pytest.raises(ValueError, match=f"seq must be at least 16, got 2x{seq} padded"):
        shapes.Shape(2, seq, padded=True)
    with pytest.raises(ValueError, match="at least 16"):
        shapes.parse_shape(f"2x{seq}p")
    assert shapes.Shape(2, seq).label == f"2x{seq}"  # dense: any length
    assert shapes.sequence_lengths(shapes.Shape(3, 16, padded=True)) == (16, 16, 16)
    lengths = shapes.sequence_lengths(shapes.Shape(64, 17, padded=True))
    assert set(lengths) == {16, 17}


@pytest.mark.parametrize("text, entry", [("2x32,,", 2), (",2x32", 1), ("2x32, ,4x8", 2)])
def test_shapes_with_an_empty_entry_are_refused(text: str, entry: int) -> None:
    with pytest.raises(ValueError, match=f"entry {entry} is empty"):
        shapes.parse_shapes(text)
    with pytest.raises(ValueError, match="names none"):
        shapes.parse_shapes(" ")


def test_peer_selection_and_availability(monkeypatch) -> None:
    cpu = torch.device("cpu")
    assert [p.name for p in peers.select(None, cpu)] == list(peers.DEFAULT_CPU_PEERS)
    every = [p.name for p in peers.select("all", cpu)]  # but max-autotune (docs/benchmarks.md)
    assert every == [name for name in peers.PEERS if name != "hf-compile-max"]
    with pytest.raises(ValueError, match="unknown peer"):
        peers.select("hf-eager,nope", cpu)
    with pytest.raises(ValueError, match="names none"):
        peers.select("", cpu)
    with pytest.raises(ValueError, match="entry 2 is empty"):
        peers.select("hf-eager,,fastbert", cpu)
    assert peers.unavailable_reason(peers.PEERS["fastbert-graphs"], cpu) == "needs a CUDA GPU"
    monkeypatch.setattr(peers, "fastbert_keywords", lambda: frozenset({"dtype"}))
    reason = peers.unavailable_reason(peers.PEERS["fastbert-padfree"], cpu)
    assert "padding_free" in reason
    assert peers.unavailable_reason(peers.PEERS["fastbert"], cpu) is None


class _NoTokenTypes(torch.nn.Module):
    """A model whose forward has no token_type_ids (transformers 4.x's ModernBERT): the
    keyword would raise TypeError."""

    def forward(self, input_ids, attention_mask):
        return input_ids + attention_mask


class _TokenTypes(torch.nn.Module):
    def forward(self, input_ids, attention_mask, token_type_ids=None):
        return input_ids + attention_mask + 10 * token_type_ids


def test_hf_peers_pass_token_types_only_to_models_that_name_them() -> None:
    batch = shapes.make_batch(shapes.Shape(2, 24, padded=True), 50, "cpu")
    batch = dataclasses.replace(batch, token_type_ids=torch.ones_like(batch.input_ids))
    plain, typed = _NoTokenTypes(), _TokenTypes()
    assert not hf_models.takes_token_types(plain) and hf_models.takes_token_types(typed)
    out = peers._hf_forward(plain, hf_models.takes_token_types(plain))(batch)
    assert torch.equal(out, batch.input_ids + batch.attention_mask)
    out = peers._hf_forward(typed, hf_models.takes_token_types(typed))(batch)
    assert torch.equal(out, batch.input_ids + batch.attention_mask + 10)


def test_hf_peers_run_modernbert_and_mpnet_like_their_models() -> None:
    """The hf-eager / hf-sdpa peers of the families without token types compute what the
    Hugging Face model computes from ids and mask; BERT's keep its token types."""

    tiny = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    shaped = {
        "bert": {**tiny, "intermediate_size": 64, "vocab_size": 50},
        "mpnet": {**tiny, "intermediate_size": 64, "vocab_size": 50},
        "modernbert": {**tiny, "intermediate_size": 48, "vocab_size": 64, "pad_token_id": 0},
    }
    batch = shapes.make_batch(shapes.Shape(2, 24, padded=True), 50, "cpu")
    for model_type, shape in shaped.items():
        model = hf_models.random_model(model_type, shape)
        assert hf_models.takes_token_types(model) == (model_type == "bert")
        reference = Reference(model_type, model, None)
        with torch.inference_mode():
            expected = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
            # Hugging Face's MPNet has no sdpa attention: its hf-sdpa peer fails to build.
            for name in ("hf-eager",) if model_type == "mpnet" else ("hf-eager", "hf-sdpa"):
                forward = peers.PEERS[name].build(reference, torch.float32, torch.device("cpu"), "")
                got = forward(batch).last_hidden_state
                real = batch.attention_mask.bool()
                torch.testing.assert_close(got[real], expected.last_hidden_state[real])


def test_model_like_never_compiles_the_models_own_parts() -> None:
    """transformers 4.x's ModernBERT compiles its MLP on a GPU unless reference_compile is
    False: the copy sets it, the reference's config is left as it was."""

    model = hf_models.random_bert(
        {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 30}
    )
    model.config.reference_compile = True
    copy = hf_models.model_like(model, "eager", torch.float32, torch.device("cpu"))
    assert copy.config.reference_compile is False and model.config.reference_compile is True
    for a, b in zip(copy.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


# --- runner -------------------------------------------------------------------------------


def _fake_peer(name: str, build) -> peers.Peer:
    return peers.Peer(name, f"fake {name}", build)


def test_runner_records_failures_and_goes_on() -> None:
    def broken_build(*args):
        raise RuntimeError("no compiler\nmore detail")

    def fails_on_long(*args):
        def forward(batch):
            if batch.input_ids.shape[1] > 4:
                raise RuntimeError("too long")
            return batch.input_ids.sum()

        return forward

    reference = Reference("tiny", None, TINY)
    contenders = [
        _fake_peer("broken", broken_build),
        _fake_peer("fastbert", fails_on_long),
        _fake_peer("fastbert-graphs", fails_on_long),
    ]
    grid = [shapes.Shape(2, 4), shapes.Shape(2, 8), shapes.Shape(1, 4)]
    settings = runner.Settings(torch.float32, torch.device("cpu"), warmup=1, reps=2)
    records = list(runner.run(reference, grid, contenders, settings, peaks=None))
    status = {(r["peer"], r["shape"]): r.get("reason", "ok") for r in records}
    assert status[("broken", "2x4")] == "could not be built: RuntimeError: no compiler"
    assert status[("fastbert", "2x4")] == "ok"
    assert status[("fastbert", "2x8")] == "RuntimeError: too long"
    assert status[("fastbert", "1x4")] == "not run: failed at 2x8"
    ok = next(r for r in records if r["peer"] == "fastbert" and r["shape"] == "2x4")
    # The fake reference has no Hugging Face model, so no pooler to count.
    assert ok["flops"] == counts.total_flops(counts.bert_forward(TINY, 2, 4, 4, pooler=False))
    assert ok["roofline_ms"] is None and ok["peak_mib"] is None and ok["reps"] == 2


# --- report -------------------------------------------------------------------------------


def _record(peer: str, shape: str, ms: float, **extra) -> dict:
    batch, seq = (int(x) for x in shape.split()[0].split("x"))
    return {
        "peer": peer,
        "description": peer,
        "shape": shape,
        "batch": batch,
        "seq": seq,
        "padded": "padded" in shape,
        "real_tokens": batch * seq,
        "status": "ok",
        "median_ms": ms,
        "p20_ms": 0.9 * ms,
        "p80_ms": 1.1 * ms,
        "reps": 100,
        "first_call_s": 0.1,
        "peak_mib": extra.pop("peak_mib", 100.0),
        "flops": extra.pop("flops", 1e12),
        "bytes": 1e9,
        "roofline_ms": extra.pop("roofline_ms", 1.0),
        **extra,
    }


def _document(records, model="bert-base", dtype="float16", device="cuda", gpu="NVIDIA H100"):
    env = {
        "gpu": gpu if device == "cuda" else None,
        "driver": "999.1",
        "cuda": "12.8",
        "torch": "2.11.0",
        "triton": "3.6.0",
        "transformers": "5.0.0",
        "commit": "0123456789abcdef",
        "date": "2026-01-01T00:00:00+00:00",
        "cpu": "some cpu",
        "cpu_threads": 2,
    }
    settings = {
        "model": model,
        "dtype": dtype,
        "device": device,
        "backend": "auto",
        "warmup": 10,
        "reps": 100,
        "seed": 0,
        "peaks": {"gpu": "H100 SXM", "tflops": 800.0, "tbps": 3.0},
        "note": None,
    }
    return document.new_document(env, settings, records)


def _target_records() -> list[dict]:
    return [
        _record("hf-eager", "32x128", 4.0),
        _record("hf-compile-max", "32x128", 1.2),
        _record("hf-sdpa", "32x128", 2.0, peak_mib=120.0),
        _record("fastbert", "32x128", 1.0, roofline_ms=0.8),
        _record("hf-sdpa", "1x128", 0.5, peak_mib=10.0),
        _record("fastbert", "1x128", 0.25, peak_mib=12.0),
        _record("hf-sdpa", "64x512 padded", 20.0),
        _record("fastbert", "64x512 padded", 12.0, peak_mib=90.0),
        _record("fastbert-padfree", "64x512 padded", 10.0, peak_mib=80.0),
        {
            "peer": "hf-compile",
            "shape": "32x128",
            "batch": 32,
            "seq": 128,
            "padded": False,
            "real_tokens": 4096,
            "status": "skipped",
            "reason": "could not be built: boom",
        },
    ]


def test_markdown_table_rows_speedups_and_skips() -> None:
    table = report.markdown_table(_target_records())
    lines = table.splitlines()
    assert lines[0].startswith("| shape | contender | median ms")
    eager = next(line for line in lines if "| hf-eager |" in line)
    cells = [c.strip() for c in eager.strip("|").split("|")]
    assert cells[:6] == ["32x128", "hf-eager", "4.000", "-", "3.600-4.400", "4.00x"]
    assert cells[6] == "1,024,000" and cells[7] == "250.0" and cells[8] == "25"
    assert "| skipped: could not be built: boom |" in table
    padded = next(line for line in lines if "| 64x512 padded | hf-sdpa |" in line)
    assert "| 2.00x |" in padded  # the fastest fastbert variant (padding-free, 10 ms)


def test_json_round_trip_merge_and_markdown(tmp_path) -> None:
    doc = _document(_target_records())
    report.write_json(doc, tmp_path / "results.json")
    assert report.read_document(tmp_path / "results.json") == doc
    (tmp_path / "other.json").write_text(json.dumps({"benchmarks": []}))
    with pytest.raises(ValueError, match="not a fastbert results file"):
        report.read_document(tmp_path / "other.json")
    newer = _document([_record("fastbert", "32x128", 0.9), _record("fastbert", "8x512", 3.0)])
    merged = report.merge(doc, newer)
    fastbert = {r["shape"]: r["median_ms"] for r in merged["results"] if r["peer"] == "fastbert"}
    assert fastbert == {"32x128": 0.9, "1x128": 0.25, "64x512 padded": 12.0, "8x512": 3.0}
    with pytest.raises(ValueError, match="same model"):
        report.merge(doc, _document([], model="bert-large"))
    text = report.markdown(doc)
    assert "NVIDIA H100" in text and "driver 999.1" in text and "## Targets" in text
    # Rows from the later invocation are marked, and the note says they were not timed in
    # turns with the others; a run merged with an interrupted one says so.
    table = report.markdown(merged)
    assert "| 32x128 | fastbert on auto † | 0.900 |" in table
    assert "| 32x128 | hf-eager | 4.000 |" in table
    assert "(fastbert 0.900 ms vs 4.000 ms, timed by different invocations †)" in table
    assert report.APPENDED_NOTE in table and report.INTERRUPTED_NOTE not in table
    again = report.merge(
        merged, {**_document([_record("hf-sdpa", "8x512", 4.0)]), "complete": False}
    )
    assert {r["peer"]: r.get("run", 1) for r in again["results"] if r["shape"] == "8x512"} == {
        "fastbert": 2,
        "hf-sdpa": 3,
    }
    assert report.INTERRUPTED_NOTE in report.markdown(again)
    assert report.INTERRUPTED_NOTE in readme.subsection(tmp_path, again, tmp_path)


def test_measured_ceilings_arithmetic_and_report_line(monkeypatch) -> None:
    fixed = timing.Timing(median_ms=2.0, p20_ms=2.0, p80_ms=2.0, reps=1)
    monkeypatch.setattr(timing, "time_fn", lambda fn, device, warmup, reps: (fn(), fixed)[1])
    cpu = torch.device("cpu")
    # 1 MiB read and 1 MiB written in 2 ms; 2 * 64^3 FLOPs in 2 ms.
    assert ceilings.copy_tbps(cpu, torch.float16, 1 << 20, 1) == pytest.approx(2**21 / 2e-3 / 1e12)
    assert ceilings.gemm_tflops(cpu, torch.float32, 64, 1) == pytest.approx(2 * 64**3 / 2e-3 / 1e12)
    assert ceilings.measure("cpu", torch.float16) is None
    doc = _document([])
    assert "Measured" not in report.roofline_line(doc)
    doc["settings"]["measured_ceilings"] = {
        "copy_tbps": 2.91,
        "gemm_tflops": 702.4,
        "copy_bytes": 1 << 30,
        "gemm_size": 8192,
        "dtype": "float16",
    }
    line = report.roofline_line(doc)
    assert "800 TFLOP/s" in line and "2.91 TB/s (device-to-device copy, 1024 MiB)" in line
    assert "702 TFLOP/s (float16 torch.matmul, n = 8192)" in line


def test_write_reports_writes_files_and_plot_when_possible(tmp_path) -> None:
    messages = report.write_reports(tmp_path / "out", _document(_target_records()))
    assert (tmp_path / "out" / "results.json").exists()
    assert (tmp_path / "out" / "results.md").read_text().startswith("# fastbert bench")
    if HAS_MATPLOTLIB:
        assert messages == []
        assert (tmp_path / "out" / "results.png").read_bytes()[:4] == b"\x89PNG"
    else:
        assert "matplotlib" in messages[0]


def test_plot_says_so_without_matplotlib(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    message = report.plot(_document(_target_records()), tmp_path / "p.png")
    assert "matplotlib is not installed" in message and not (tmp_path / "p.png").exists()


# --- targets ------------------------------------------------------------------------------


def _kernel_json() -> dict:
    def bench(op, impl, batch, seq, ms, tbps=1.0, padded=False):
        return {
            "extra_info": {
                "op": op,
                "impl": impl,
                "model": "bert-base",
                "dtype": "float16",
                "batch": batch,
                "seq": seq,
                "padded": padded,
                "median_ms": ms,
                "tbps": tbps,
            }
        }

    return {
        "benchmarks": [
            bench("attention", "fastbert", 8, 512, 1.0),
            bench("attention", "sdpa-efficient", 8, 512, 1.1),
            bench("attention", "sdpa-math", 8, 512, 3.0),
            bench("attention", "fastbert", 64, 512, 8.0),
            bench("attention", "sdpa-cudnn", 64, 512, 7.2),
            bench("attention", "fastbert", 64, 512, 1.0, padded=True),
            bench("layer_norm", "fastbert", 1, 128, 0.01, tbps=0.5),
            bench("layer_norm", "fastbert", 64, 512, 0.1, tbps=2.6),
            bench("linear_gelu", "fastbert", 32, 128, 1.0),
            bench("linear_gelu", "eager", 32, 128, 1.1),
            bench("linear_gelu", "fastbert", 1, 128, 1.0),
            bench("linear_gelu", "eager", 1, 128, 9.0),
        ]
    }


def test_targets_met_missed_and_by_how_much() -> None:
    outcomes = {o.target: o for o in targets.evaluate(_document(_target_records()), _kernel_json())}
    status = {t: o.status for t, o in outcomes.items()}
    assert status["32x128: fastbert >= 1.3x faster than hf-compile-max"] == "missed by 8% (short)"
    assert status["32x128: fastbert >= 3.0x faster than hf-eager"] == "met"
    assert status["32x128: fastbert >= 70% of the roofline"] == "met"
    assert status["1x128: fastbert <= 0.2 ms"] == "missed by 25% (over)"
    assert status["64x512 padded: fastbert >= 1.8x faster than hf-sdpa"] == "met"
    assert (
        "fastbert-padfree"
        in outcomes["64x512 padded: fastbert >= 1.8x faster than hf-sdpa"].measured
    )
    assert status["peak memory <= hf-sdpa's (every shape)"] == "missed by 20% (over)"
    assert status["attention, seq 512: >= torch's best sdpa"] == "missed by 10% (short)"
    assert "64x512, vs sdpa-cudnn" in outcomes["attention, seq 512: >= torch's best sdpa"].measured
    assert status["layer_norm (x + r): >= 2.5 TB/s"] == "met"
    assert status["linear+GELU: >= 1.15x nn.Linear + F.gelu"] == "missed by 4% (short)"


def test_targets_not_measured_says_why() -> None:
    outcomes = targets.evaluate(_document([_record("fastbert", "2x32", 1.0)], model="bert-tiny"))
    assert outcomes[0].status == targets.NOT_MEASURED and "bert-tiny" in outcomes[0].measured
    assert all(o.status == targets.NOT_MEASURED for o in outcomes)
    assert "| target | status | measured |" in targets.markdown(outcomes)


# --- results sections generator (docs/results.md and the README's headline) ---------------

PAGE = f"""# results

intro text

## GPU

{readme.START}
old generated text
{readme.END}

## After
kept
"""
README = f"""# project

## Results

{readme.HEADLINE_START}
old headline
{readme.HEADLINE_END}

## After
kept
"""


def _files(tmp_path) -> tuple[Path, Path]:
    (tmp_path / "docs").mkdir()
    page, front = tmp_path / "docs" / "results.md", tmp_path / "README.md"
    page.write_text(PAGE)
    front.write_text(README)
    return page, front


def test_results_sections_without_results_say_so(tmp_path) -> None:
    page, front = _files(tmp_path)
    cpu_run = tmp_path / "results" / "cpu-run"  # CPU figures are not GPU measurements
    cpu_run.mkdir(parents=True)
    report.write_json(
        _document([_record("fastbert", "2x32", 1.0)], device="cpu"), cpu_run / "results.json"
    )
    assert readme.update(page, tmp_path / "results", front) == [page, front]
    text = page.read_text()
    assert readme.NO_RESULTS in text and "old generated text" not in text
    assert text.startswith("# results\n\nintro text") and text.endswith("## After\nkept\n")
    headline = front.read_text()
    assert "No GPU measurements have been committed yet" in headline
    assert "(docs/results.md#gpu)" in headline and "old headline" not in headline
    assert headline.endswith("## After\nkept\n")
    assert not readme.update(page, tmp_path / "results", front)


def test_results_sections_from_a_gpu_results_file(tmp_path) -> None:
    page, front = _files(tmp_path)
    run = tmp_path / "results" / "h100-2026-01-01"
    run.mkdir(parents=True)
    report.write_json(_document(_target_records()), run / "results.json")
    (run / "kernels-bench.json").write_text(json.dumps(_kernel_json()))
    (run / "results.png").write_bytes(b"png")
    args = ["--page", str(page), "--readme", str(front), "--results", str(tmp_path / "results")]
    assert readme.main([*args, "--check"]) == 1
    assert readme.main(args) == 0
    text = page.read_text()
    assert "#### NVIDIA H100: bert-base, float16" in text
    assert "| 32x128 | hf-eager | 4.000 |" in text
    assert "layer_norm (x + r): >= 2.5 TB/s | met" in text
    # The page lives in docs/: its links reach the results folder with ../ and resolve.
    assert "![bert-base on NVIDIA H100](../results/h100-2026-01-01/results.png)" in text
    assert (page.parent / "../results/h100-2026-01-01/results.png").exists()
    assert "`../results/h100-2026-01-01/`" in text
    assert text.endswith("## After\nkept\n") and readme.NO_RESULTS not in text
    headline = front.read_text()
    assert "- NVIDIA H100, bert-base float16 (commit " in headline
    assert " targets met; [table, plot and conditions](docs/results.md#gpu)" in headline
    assert "results/h100-2026-01-01/" in headline
    assert readme.main([*args, "--check"]) == 0
    front.write_text(README)  # a stale headline alone fails the check
    assert readme.main([*args, "--check"]) == 1


def test_results_file_without_markers_is_an_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="markers"):
        readme.replace_section("# no markers\n", "x")
    page, front = _files(tmp_path)
    front.write_text("# no headline markers\n")
    with pytest.raises(ValueError, match="fastbert-headline"):
        readme.update(page, tmp_path / "results", front)


def test_the_committed_results_sections_are_up_to_date() -> None:
    assert readme.main(["--check"]) == 0


# --- the command --------------------------------------------------------------------------


def bench_quick(out, *options: str) -> int:
    """The exit code of ``fastbert bench --quick --out OUT OPTIONS``."""
    return main(["bench", "--quick", "--out", str(out), *options])


def test_bench_quick_on_cpu_writes_its_files(tmp_path, capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("the CPU path of fastbert bench")
    assert bench_quick(tmp_path / "out") == 0
    out = capsys.readouterr().out
    assert "No CUDA GPU here" in out and "Triton kernels need a CUDA GPU" in out
    doc = report.read_document(tmp_path / "out" / "results.json")
    assert doc["complete"] and doc["settings"]["device"] == "cpu"
    measured = {(r["peer"], r["shape"]) for r in doc["results"] if analysis.ok(r)}
    for peer in ("hf-eager", "hf-sdpa", "fastbert"):
        assert {(peer, "2x32"), (peer, "2x32 padded")} <= measured
    assert all(math.isfinite(r["median_ms"]) for r in doc["results"] if analysis.ok(r))
    assert (tmp_path / "out" / "results.md").read_text().count("| 2x32 |") >= 3
    assert (tmp_path / "out" / "results.png").exists() == HAS_MATPLOTLIB


@pytest.mark.parametrize(
    "options, message",
    [
        (["--peers", "nope"], "unknown peer 'nope'"),
        (["--batch", "2", "--shapes", "2x8"], "either --batch/--seq or --shapes"),
        (["--shapes", "2-8"], "BATCHxSEQ"),
        (["--model", "no-such-model"], "'no-such-model' is not a model folder"),
        (["--seq", "1024"], "exceed the model's 512 positions"),
    ],
)
def test_bench_rejects_bad_options(tmp_path, capsys, options, message) -> None:
    assert bench_quick(tmp_path / "out", *options) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "options, message",
    [
        pytest.param(["--peers", ""], "--peers '': it names none; peers: all,", id="no-peers"),
        pytest.param(
            ["--peers", "fastbert,,hf-eager"],
            "--peers 'fastbert,,hf-eager': entry 2 is empty",
            id="empty-peer",
        ),
        pytest.param(
            ["--shapes", "2x32,,"], "--shapes '2x32,,': entry 2 is empty", id="empty-shape"
        ),
        pytest.param(["--shapes", ""], "--shapes '': it names none", id="no-shapes"),
        pytest.param(
            ["--shapes", "2x32,2x8p"],
            "--shapes '2x32,2x8p': a padded shape's lengths are uniform in [16, seq]: its seq "
            "must be at least 16, got 2x8 padded",
            id="short-padded-shape",
        ),
        pytest.param(
            ["--seq", "8", "--padded"],
            "--seq 8 with --padded: a padded shape's lengths are uniform in [16, seq]",
            id="short-padded-seq",
        ),
    ],
)
def test_bench_usage_errors_name_the_bad_value(tmp_path, capsys, options, message) -> None:
    """An empty --peers or --shapes (or an empty entry in one), and a padded shape too short
    to hold padding, are refused before anything runs: exit 2, one error line naming them."""
    assert bench_quick(tmp_path / "out", *options) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: fastbert bench")
    assert err.splitlines()[-1].startswith(f"fastbert bench: error: {message}"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("under", [False, True], ids=["a-file", "under-a-file"])
def test_bench_out_must_be_a_folder(tmp_path, capsys, under: bool) -> None:
    """--out naming a file, or a path under one: exit 2 naming it, before any measuring."""
    a_file = tmp_path / "results.txt"
    a_file.write_text("kept\n")
    out = a_file / "sub" if under else a_file
    assert bench_quick(out, "--peers", "fastbert", "--shapes", "1x8", "--reps", "1") == 2
    last = capsys.readouterr().err.splitlines()[-1]
    named = f"{out}: {a_file}" if under else f"{out}"
    assert last == f"fastbert bench: error: --out {named} exists and is not a folder"
    assert a_file.read_text() == "kept\n"


@pytest.mark.parametrize("problem", BAD_MODEL_FOLDERS)
def test_bench_refuses_a_bad_model_folder(tmp_path, capsys, problem: str) -> None:
    """A folder without weights or with a config.json that is not JSON: exit 2 and one line
    naming the folder (or its file) and what is wrong, as fastbert embed says it."""
    folder, message = bad_model_folder(tmp_path, problem)
    assert bench_quick(tmp_path / "out", "--model", str(folder)) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(f"fastbert bench: error: {message}"), err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "contents, problem",
    [
        ("{not json", "not valid JSON"),
        ('{"benchmarks": []}', "not a fastbert results file"),
        (json.dumps({"schema": document.SCHEMA}), "missing or malformed"),
    ],
    ids=["not-json", "another-schema", "no-records"],
)
def test_bench_append_names_a_results_file_it_cannot_read(
    tmp_path, capsys, contents: str, problem: str
) -> None:
    """--append to a results.json that is not one: exit 2 naming the file, left as it was."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(contents)
    options = ["--peers", "fastbert", "--shapes", "1x8", "--reps", "1", "--append"]
    assert bench_quick(out, *options) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    expected = f"--append: {out / 'results.json'} could not be read as fastbert results: "
    assert last.startswith(f"fastbert bench: error: {expected}") and problem in last, last
    assert (out / "results.json").read_text() == contents
    with pytest.raises(ValueError, match="could not be read as fastbert results"):
        report.read_document(out / "missing.json")


# mpnet-base and modernbert-base at a tiny size: each family's structure kept (MPNet's
# relative-position buckets; ModernBERT's layer alternation, window, RoPE bases and GeGLU).
TINY_FAMILY_SHAPES = {
    "mpnet-base": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 97,
    },
    "modernbert-base": {
        "hidden_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "intermediate_size": 96,
        "vocab_size": 97,
        "local_attention": 8,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "cls_token_id": 1,
        "eos_token_id": 2,
        "sep_token_id": 2,
    },
}


@pytest.mark.parametrize("model", sorted(TINY_FAMILY_SHAPES))
def test_bench_runs_another_family(tmp_path, capsys, monkeypatch, model: str) -> None:
    """--model mpnet-base / modernbert-base (scaled down): Hugging Face's peers and fastbert's
    measured on a dense and a padded shape, with the FLOPs of the family's forward (no pooler
    in ModernBERT); Hugging Face's MPNet has no sdpa, which its row says."""
    if torch.cuda.is_available():
        pytest.skip("the CPU path of fastbert bench")
    monkeypatch.setitem(
        shapes.MODEL_SHAPES, model, {**shapes.MODEL_SHAPES[model], **TINY_FAMILY_SHAPES[model]}
    )
    out = tmp_path / "out"
    options = ["--model", model, "--shapes", "1x16,2x24p", "--warmup", "0", "--reps", "1"]
    assert main(["bench", "--out", str(out), "--device", "cpu", *options]) == 0
    assert "no pooler" not in capsys.readouterr().err
    doc = report.read_document(out / "results.json")
    rows = {(r["peer"], r["shape"]): r for r in doc["results"]}
    measured = {key for key, r in rows.items() if analysis.ok(r)}
    has_sdpa = model != "mpnet-base"
    contenders = ("hf-eager", "fastbert", "fastbert-padfree") + (("hf-sdpa",) if has_sdpa else ())
    assert measured == {(p, s) for p in contenders for s in ("1x16", "2x24 padded")}
    if not has_sdpa:
        assert rows["hf-sdpa", "1x16"]["reason"].endswith("MPNetModel has no sdpa")
    config = shapes.model_config(model)
    dense = counts.bert_forward(config, 1, 16, 4, pooler=model == "mpnet-base")
    assert rows["fastbert", "1x16"]["flops"] == counts.total_flops(dense)
    assert rows["hf-eager", "1x16"]["flops"] == counts.total_flops(dense)


def test_bench_append_adds_to_the_results(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    base = ["--peers", "fastbert", "--reps", "1"]
    assert bench_quick(out, *base, "--shapes", "1x8") == 0
    assert bench_quick(out, *base, "--shapes", "2x8", "--append") == 0
    doc = report.read_document(out / "results.json")
    assert [r["shape"] for r in doc["results"]] == ["1x8", "2x8"] and doc["complete"]
    assert bench_quick(out, *base, "--shapes", "2x8", "--append", "--dtype", "bfloat16") == 2
    assert "same model, dtype, device and fastbert backend" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert bench_quick(out, *base, "--device", "cuda") == 2


def test_bench_fails_when_no_fastbert_row_was_measured(tmp_path, capsys, monkeypatch) -> None:
    """--backend triton on a CPU without the interpreter: fastbert's rows are skipped, the
    Hugging Face rows still run and are written, and the command exits 1 saying why."""
    if torch.cuda.is_available():
        pytest.skip("the CPU without the interpreter")
    monkeypatch.delenv("TRITON_INTERPRET")
    out = tmp_path / "out"
    options = ["--backend", "triton", "--peers", "hf-eager,fastbert", "--shapes", "1x8"]
    assert bench_quick(out, *options, "--reps", "1") == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(
        "fastbert bench: error: no fastbert contender was measured: ValueError: "
        "backend='triton' needs CUDA tensors"
    ), err
    doc = report.read_document(out / "results.json")
    assert doc["settings"]["backend"] is None and doc["settings"]["backend_requested"] == "triton"
    assert [r["status"] for r in doc["results"]] == ["ok", "skipped"]
    assert "fastbert backend triton (cannot run here" in (out / "results.md").read_text()


def test_bench_names_the_interpreter_backend(tmp_path, capsys) -> None:
    """Under TRITON_INTERPRET=1 on a CPU fastbert's rows ran the Triton kernels under the
    interpreter: the note, table, JSON and the printed line say so."""
    if torch.cuda.is_available():
        pytest.skip("the CPU interpreter")
    out = tmp_path / "out"
    options = ["--backend", "triton", "--peers", "fastbert", "--shapes", "1x8"]
    assert bench_quick(out, *options, "--warmup", "0", "--reps", "1") == 0
    printed = capsys.readouterr().out
    assert "fastbert's Triton kernels emulated by the Triton interpreter" in printed
    assert "pure-PyTorch" not in printed
    assert "| 1x8 | fastbert on triton (interpreter) |" in printed
    doc = report.read_document(out / "results.json")
    assert doc["settings"]["backend"] == "triton (interpreter)"
    assert "Triton interpreter" in doc["settings"]["note"]
    assert "fastbert backend triton (interpreter)" in (out / "results.md").read_text()


def test_bench_auto_on_a_cpu_names_the_torch_backend(tmp_path, capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("the CPU path of fastbert bench")
    out = tmp_path / "out"
    assert bench_quick(out, "--peers", "fastbert", "--shapes", "1x8", "--reps", "1") == 0
    printed = capsys.readouterr().out
    assert "fastbert's pure-PyTorch backend" in printed
    assert "| 1x8 | fastbert on torch |" in printed
    doc = report.read_document(out / "results.json")
    assert (doc["settings"]["backend"], doc["settings"]["backend_requested"]) == ("torch", "auto")


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="needs matplotlib")
def test_plot_names_the_fastbert_backend(tmp_path, monkeypatch) -> None:
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    doc = _document(_target_records())
    doc["settings"]["backend"] = "triton (interpreter)"
    assert report.plot(doc, tmp_path / "plot.png") is None
    assert "fastbert backend: triton (interpreter)" in figures[0].axes[0].get_title()
    monkeypatch.undo()
    plt.close(figures[0])
