"""benchmarks/pass_profile.py: how it splits a profiled pass into parts, a short run end to end
(each part is found where the CPU runs it; the figures are the benchmark's, not a test's), and
its usage errors."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from benchmarks import pass_profile
from fastbert.embedding import batching, run
from fastbert.kernels import cpu_attention, cpu_gelu, cpu_int8_product, cpu_layer_norm, torch_ops
from fastbert.kernels.cpu_library import cpu_flags, has_avx512
from tests.cli_usage import usage_error_test


def _event(name: str, seconds: float, parent: object | None = None) -> SimpleNamespace:
    return SimpleNamespace(name=name, cpu_time_total=seconds * 1e6, cpu_parent=parent)


def test_each_outermost_event_counts_once_with_its_callees() -> None:
    linear = _event("mkldnn::_linear_pointwise", 0.5)
    int8 = _event("fastbert::int8_linear", 0.25)
    events = [
        linear,
        int8,
        _event("aten::zeros", 0.125, parent=int8),  # inside the int8 linear: not counted again
        _event("fastbert::cpu_attention", 0.25),
        _event("fastbert::gelu_table", 0.125),  # bfloat16's GELU after the product: linear's
        _event("aten::layer_norm", 0.0625),
        _event("aten::native_layer_norm", 0.0625, parent=linear),
        _event("aten::add", 0.03125),
        _event("aten::index_select", 0.03125),
        _event("fastbert::cpu_embeddings", 0.0625),
    ]
    parts = pass_profile.split(events, wall=1.4375)
    assert list(parts) == list(pass_profile.ORDER)
    assert parts["linear"] == 0.875
    assert parts["attention"] == 0.25
    assert parts["LayerNorm"] == 0.0625
    assert parts["residual add"] == 0.03125
    assert parts["embeddings"] == 0.0625
    assert parts["other ops"] == 0.03125
    assert parts["outside ops"] == pytest.approx(1.4375 - 1.3125)


def test_a_short_run_finds_each_part_and_writes_both_files(tmp_path) -> None:
    out = tmp_path / "results"
    argv = ["--out", str(out), "--docs", "24", "--rounds", "1", "--gemm-seconds", "0.05"]
    assert pass_profile.main([*argv, "--precisions", "float32,int8"]) == 0
    report = json.loads((out / "pass-profile.json").read_text())
    # Where the compiled attention runs, each precision runs with it off too.
    off = [pass_profile.ATTENTION_UNCOMPILED.format(p) for p in ("float32", "int8")]
    padded = [pass_profile.PADDED_BUDGET.format(p) for p in ("float32", "int8")]
    # Where a build of the byte product runs, int8 runs with the products of a CPU without
    # int8 dot products too (a build's row only where it is not int8's own product).
    builds = [b for b in cpu_int8_product.BUILDS if cpu_int8_product.available(b)]
    int8_products = [
        pass_profile.INT8_BYTES.format(cpu_int8_product.REGISTERS[b])
        for b in builds
        if b != cpu_int8_product.chosen()
    ]
    int8_products += [pass_profile.INT8_FLOAT32] if builds else []
    with cpu_attention.taken("avx2"):  # float32 on the attention's AVX2 build, where not its own
        avx2 = cpu_attention.available() and cpu_attention.chosen() != "avx2"
    assert list(report["results"]) == [
        "float32",
        "int8",
        *(off if cpu_attention.available() else []),
        *([pass_profile.ATTENTION_AVX2] if avx2 else []),
        *int8_products,
        *padded,
    ]
    assert has_avx512() == ("avx512f" in cpu_flags())  # switched back
    for name, row in report["results"].items():
        precision = name.split(",")[0]
        assert row["precision"] == precision
        parts = row["parts"]
        assert sum(parts.values()) == pytest.approx(row["wall_s"], rel=1e-6), precision
        # The linears are found in each row (the int8 one through its labelled range): a
        # fifth of the pass or more in a precision's own row. The other rows' times are not
        # compared: on a host busy with other work (CI's second worker compiling), rows one
        # second apart ran 7-44x apart (the per-length attention 68% of a pass, the same
        # linears 0.086 s in one row and 1.088 s in the next).
        assert parts["linear"] > 0, (name, parts)
        if name == precision:
            assert parts["linear"] > 0.2 * row["wall_s"], (precision, parts)
        assert parts["LayerNorm"] > 0 and parts["embeddings"] > 0, (precision, parts)
        if cpu_attention.available():
            assert parts["attention"] > 0, (precision, parts)
        assert len(row["linear_share_of_limit"]) == 2
    # The labels are taken off again.
    assert cpu_attention.attention_sequences.__module__ == "fastbert.kernels.cpu_attention"
    assert cpu_layer_norm.layer_norm.__module__ == "fastbert.kernels.cpu_layer_norm"
    assert cpu_layer_norm.embeddings_layer_norm.__module__ == "fastbert.kernels.cpu_layer_norm"
    assert torch_ops.embeddings_layer_norm_unchecked.__module__ == "fastbert.kernels.torch_ops"
    assert cpu_gelu.gelu_.__module__ == "fastbert.kernels.cpu_gelu"
    assert torch_ops.linear_quantized_unchecked.__module__ == "fastbert.kernels.torch_ops"
    assert run.token_batches is batching.token_batches
    table = (out / "pass-profile.md").read_text()
    assert "| float32 |" in table and "| int8 |" in table
    assert "GEMM limit" in table


def test_a_gated_model_is_profiled_without_int8(monkeypatch, capsys, tmp_path) -> None:
    """``--model`` takes the corpus benchmark's models; one with a gated FFN (ModernBERT) has
    no int8 linears, so asking for int8 is a usage error that says so."""
    from fastbert.bench.shapes import model_config
    from fastbert.embedding import model as embed_model

    monkeypatch.setattr(pass_profile.embed_bench, "model_folder", lambda model: tmp_path)
    monkeypatch.setattr(embed_model, "read_config", lambda folder: model_config("modernbert-base"))
    argv = ["--out", str(tmp_path), "--model", "modernbert-base", "--precisions", "bfloat16,int8"]
    with pytest.raises(SystemExit) as exit_:
        pass_profile.main(argv)
    assert exit_.value.code == 2 and "gated FFN has no int8" in capsys.readouterr().err


class _PackedEncoder:
    """An encoder on the packed path that gives nothing: only its batches matter."""

    packed = True

    def __call__(self, tokens: list[list[int]]) -> list:
        return [None] * len(tokens)


def test_the_padded_budget_row_cuts_batches_as_the_padded_route() -> None:
    """Inside ``padded_budget`` a packed encoder's batches are rows x longest row within the
    budget (the padded route's); outside, its tokens."""
    lengths = [40, 30, 30, 20, 10, 10]
    tokens = [[1] * n for n in lengths]

    def batches() -> list[list[int]]:
        cut = run.embed_sorted(_PackedEncoder(), tokens, 80)
        return [[lengths[i] for i in batch] for batch, _ in cut]

    with pass_profile.padded_budget():
        assert batches() == [[40, 30], [30, 20], [10, 10]]
    assert batches() == [[40, 30], [30, 20, 10, 10]]
    assert run.token_batches is batching.token_batches


test_usage_errors_exit_2 = usage_error_test(
    pass_profile.main,
    [["--precisions", "float64"], ["--precisions", ","], ["--rounds", "0"], []],
)


@pytest.mark.skipif(not cpu_attention.tiles(), reason="no AMX tiles for the attention here")
def test_bfloat16_runs_with_the_attention_tiles_off_too(tmp_path) -> None:
    """Where the compiled attention has AMX's tiles, bfloat16 also runs with them off: a row
    of its own, the tiles back on after the run; so with the compiled LayerNorm off and with
    GELU as oneDNN's post-op."""
    out = tmp_path / "results"
    argv = ["--out", str(out), "--docs", "24", "--rounds", "1", "--gemm-seconds", "0.05"]
    assert pass_profile.main([*argv, "--precisions", "bfloat16"]) == 0
    results = json.loads((out / "pass-profile.json").read_text())["results"]
    off = pass_profile.ATTENTION_UNCOMPILED.format("bfloat16")
    rows = [
        pass_profile.UNTILED,
        pass_profile.NORM_UNCOMPILED,
        pass_profile.EMBEDDINGS_UNCOMPILED,
        pass_profile.GELU_POST_OP,
        pass_profile.PADDED_BUDGET.format("bfloat16"),
    ]
    assert list(results) == ["bfloat16", off, *rows]
    assert results[pass_profile.UNTILED]["precision"] == "bfloat16"
    # The table's GELU counts as linear's time; with the post-op it is inside the product.
    assert results["bfloat16"]["parts"]["linear"] > 0.2 * results["bfloat16"]["wall_s"]
    assert all(row["parts"]["attention"] > 0 for row in results.values())
    assert not cpu_attention._tiles_paused and cpu_gelu.available()
    assert not cpu_layer_norm._paused_ops
    # The embeddings are timed in every row, compiled or on PyTorch's ops.
    assert all(row["parts"]["embeddings"] > 0 for row in results.values())
