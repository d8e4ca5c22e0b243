"""The compiled LayerNorm of the CPU engine (fastbert.kernels.cpu_layer_norm): LayerNorm of the
residual sum rounded to the dtype, held to float64 over that rounded sum (the reference's
definition) as tightly as PyTorch's own LayerNorm is; strided and batched rows; the calls it
leaves to the plain op."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fastbert.kernels import cpu_engine, cpu_layer_norm, torch_ops

pytestmark = pytest.mark.skipif(
    not cpu_layer_norm.available(), reason=f"compiled LayerNorm: {cpu_layer_norm.status()}"
)


def _inputs(shape, dtype, seed=0, bias=True, residual=True):
    gen = torch.Generator().manual_seed(seed)
    n = shape[-1]
    x = (torch.randn(shape, generator=gen) * 3 + 1).to(dtype)
    r = torch.randn(shape, generator=gen).to(dtype) if residual else None
    w = (1 + 0.2 * torch.randn(n, generator=gen)).to(dtype)
    b = (0.2 * torch.randn(n, generator=gen)).to(dtype) if bias else None
    return x, w, b, r


def _exact(x, w, b, r, eps):
    """float64 LayerNorm of the sum rounded to the dtype (the reference's definition)."""
    s = (x if r is None else x + r).double()
    return F.layer_norm(s, (x.shape[-1],), w.double(), None if b is None else b.double(), eps)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(300, 384), (5, 33), (2, 7, 768)])
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_as_accurate_as_pytorch_layer_norm(dtype, shape, residual, bias) -> None:
    x, w, b, r = _inputs(shape, dtype, bias=bias, residual=residual)
    got = cpu_layer_norm.layer_norm(x, w, b, 1e-5, r)
    plain = torch_ops.layer_norm_unchecked(x, w, b, 1e-5, r, 0.0)
    assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous()
    exact = _exact(x, w, b, r, 1e-5)
    error, plain_error = (got.double() - exact).abs(), (plain.double() - exact).abs()
    # float32 statistics summed in another order: a last-bit difference now and then.
    assert error.max() <= 1.25 * plain_error.max() + 1e-7, (error.max(), plain_error.max())
    if dtype == torch.bfloat16:
        # Rounded to bfloat16, the two differ only where a value lies next to a rounding tie.
        assert (got != plain).float().mean() < 0.01


def test_strided_rows_read_in_place() -> None:
    x, w, b, r = _inputs((64, 400), torch.bfloat16, seed=1)
    xs, rs = x[:, :384], r[:, 16:]  # rows 400 apart, unit column stride
    assert cpu_layer_norm.takes(xs, w[:384], b[:384], rs, 0.0)
    got = cpu_layer_norm.layer_norm(xs, w[:384], b[:384], 1e-12, rs)
    assert torch.equal(
        got, cpu_layer_norm.layer_norm(xs.contiguous(), w[:384], b[:384], 1e-12, rs.contiguous())
    )


def test_bfloat16_rounding_keeps_denormals_nans_and_infinities() -> None:
    """bfloat16 values at the edges of the rounding: float32 denormals (which a CPU's bfloat16
    conversion instruction flushes to zero) in the residual sum and the output, a NaN and an
    infinity: rounded as PyTorch rounds them, the denormals kept."""
    x, w, b, r = _inputs((64, 384), torch.bfloat16, seed=3, bias=False)
    tiny = torch.full((384,), 1e-39, dtype=torch.bfloat16)  # a float32 denormal
    x[1], r[1] = tiny * torch.arange(384).remainder(7).bfloat16(), tiny  # denormal sums
    x[2, 5], x[3, 7] = float("nan"), float("inf")
    got = cpu_layer_norm.layer_norm(x, tiny, None, 1e-5, r)  # outputs ~1e-39: denormal
    plain = torch_ops.layer_norm_unchecked(x, tiny, None, 1e-5, r, 0.0)
    assert got[2].isnan().all() and got[3].isnan().all()
    rows = [0, *range(4, 64)]
    assert (plain[rows] != 0).float().mean() > 0.9  # the outputs are denormal, not zero
    # One bfloat16 denormal step apart at most (float32 statistics summed in another order).
    assert (got[rows].float() - plain[rows].float()).abs().max() <= 2.0**-133
    # Row 1's sums are denormal, their variance below eps: normalised, they are normal values.
    ones = torch.ones_like(tiny)
    got = cpu_layer_norm.layer_norm(x[1:2], ones, None, 1e-5, r[1:2])
    plain = torch_ops.layer_norm_unchecked(x[1:2], ones, None, 1e-5, r[1:2], 0.0)
    assert plain.abs().max() > 1e-37
    assert torch.allclose(got.float(), plain.float(), rtol=2**-8, atol=0)


def test_calls_it_leaves_to_the_plain_op() -> None:
    x, w, b, r = _inputs((8, 64), torch.bfloat16, seed=2)
    assert cpu_layer_norm.takes(x, w, b, r, 0.0)
    assert not cpu_layer_norm.takes(x, w, b, r, 0.1)  # dropout
    assert not cpu_layer_norm.takes(x, None, b, r, 0.0)  # no weight
    assert not cpu_layer_norm.takes(x.half(), w.half(), b.half(), r.half(), 0.0)
    assert not cpu_layer_norm.takes(x, w.float(), b, r, 0.0)  # mixed dtypes
    assert not cpu_layer_norm.takes(x.t(), w[:8], b[:8], None, 0.0)  # column stride
    assert not cpu_layer_norm.takes(x, w, b, r[:1], 0.0)  # a broadcast residual
    leaf = x.float().requires_grad_()
    assert not cpu_layer_norm.takes(leaf, w.float(), None, None, 0.0)
    with cpu_layer_norm.turned_off():
        assert not cpu_layer_norm.takes(x, w, b, r, 0.0)
    # The engine's op gives the plain op's result where the kernel does not take the call.
    torch.manual_seed(0)
    got = cpu_engine.OPS["layer_norm"](leaf, w.float(), None, 1e-5, None, 0.0)
    assert torch.equal(got, F.layer_norm(leaf, (64,), w.float(), None, 1e-5))
    assert got.requires_grad


def test_the_engine_runs_it_for_the_torch_backend_on_a_cpu() -> None:
    from fastbert.execution import backends

    ops = backends.get_ops("torch", "cpu")
    assert ops.layer_norm is cpu_layer_norm.layer_norm_unchecked
    assert "compiled in one pass" in cpu_engine.status()["LayerNorm"]


def _embedding_inputs(dtype, seed=0, batch=3, seq=50, hidden=384):
    gen = torch.Generator().manual_seed(seed)
    tables = [
        (torch.randn(rows, hidden, generator=gen) * scale).to(dtype)
        for rows, scale in ((1000, 1.0), (512, 0.3), (2, 0.1))
    ]
    w = (1 + 0.2 * torch.randn(hidden, generator=gen)).to(dtype)
    b = (0.2 * torch.randn(hidden, generator=gen)).to(dtype)
    ids = torch.randint(0, 1000, (batch, seq), generator=gen)
    types = torch.randint(0, 2, (batch, seq), generator=gen)
    return tables, w, b, ids, types


EMBEDDING_FLAGS = dict(check_ids=True, dropout_p=0.0, padding_idx=0, position_padding_idx=None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("types", [True, False])
@pytest.mark.parametrize("positions", ["per row", "shared", "none"])
@pytest.mark.parametrize("hidden", [384, 40])
def test_embeddings_as_accurate_as_the_plain_op(dtype, types, positions, hidden) -> None:
    """Held to float64 of the three rows' sum (the reference's definition: nothing rounded
    before the LayerNorm) as tightly as the plain backend's lookups, adds and LayerNorm."""
    (word, pos, typ), w, b, ids, token_types = _embedding_inputs(dtype, hidden=hidden)
    token_types = token_types if types else None
    seq = ids.shape[1]
    position_ids = {
        "per row": torch.randint(0, 512, ids.shape),
        "shared": torch.arange(seq).int(),
        "none": None,
    }[positions]
    args = (ids, token_types, position_ids, word, pos, typ, w, b, 1e-12)
    assert cpu_layer_norm.embeddings_takes(
        ids, token_types, position_ids, (word, pos, typ), w, b, 0
    )
    got = cpu_layer_norm.embeddings_layer_norm_unchecked(*args, **EMBEDDING_FLAGS)
    plain = torch_ops.embeddings_layer_norm_unchecked(*args, **EMBEDDING_FLAGS)
    assert got.shape == (*ids.shape, hidden) and got.dtype == dtype and got.is_contiguous()
    p = torch.arange(seq) if position_ids is None else position_ids
    t = torch.zeros_like(ids) if token_types is None else token_types
    summed = word.double()[ids] + pos.double()[p.long()] + typ.double()[t]
    exact = F.layer_norm(summed, (hidden,), w.double(), b.double(), 1e-12)
    error, plain_error = (got.double() - exact).abs(), (plain.double() - exact).abs()
    assert error.max() <= 1.25 * plain_error.max() + 1e-7, (error.max(), plain_error.max())
    if dtype == torch.bfloat16:
        assert (got != plain).float().mean() < 0.01


@pytest.mark.parametrize(
    "layout", ["every other token", "a transposed batch", "rows of one token", "strided types"]
)
def test_embeddings_read_strided_ids_as_their_values(layout) -> None:
    """Ids that are views with other strides (every other token, columns of a transposed
    tensor, [S] positions spread over rows of one token: a stride-0 run) give the result of
    the same ids copied into contiguous memory, bit for bit."""
    (word, pos, typ), w, b, _, _ = _embedding_inputs(torch.float32, seed=6)
    gen = torch.Generator().manual_seed(6)
    wide = torch.randint(0, 1000, (4, 64), generator=gen)
    wide_types = torch.randint(0, 2, (4, 64), generator=gen)
    positions = None
    if layout == "every other token":
        ids, types = wide[:, ::2], wide_types[:, :32].contiguous()
    elif layout == "a transposed batch":
        ids, types = wide.t()[:1], wide_types.t()[:1]  # [1, 4], the tokens 64 apart
    elif layout == "rows of one token":
        ids, types, positions = wide[:, :1], wide_types[:, :1], torch.arange(1)
    else:
        ids, types = wide[:, :32].contiguous(), wide_types[:, ::2]
    strided = (ids, types, positions, word, pos, typ, w, b, 1e-12)
    copied = (ids.contiguous(), types.contiguous(), positions, word, pos, typ, w, b, 1e-12)
    assert cpu_layer_norm.embeddings_takes(ids, types, positions, (word, pos, typ), w, b, 0)
    got = cpu_layer_norm.embeddings_layer_norm_unchecked(*strided, **EMBEDDING_FLAGS)
    expected = cpu_layer_norm.embeddings_layer_norm_unchecked(*copied, **EMBEDDING_FLAGS)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("check_ids", [True, False])
@pytest.mark.parametrize("bad", ["word", "negative word", "position", "type"])
def test_embeddings_ids_outside_their_tables_raise(check_ids, bad) -> None:
    """An id outside its table raises the plain backend's ValueError, even where the caller
    says it has checked them (the kernel reads the rows they name)."""
    (word, pos, typ), w, b, ids, types = _embedding_inputs(torch.bfloat16, seed=1)
    positions = torch.arange(ids.shape[1])
    if bad == "word":
        ids[1, 3] = 1000
    elif bad == "negative word":
        ids[0, 0] = -1
    elif bad == "position":
        positions = positions + 500
    else:
        types[2, 7] = 2
    flags = {**EMBEDDING_FLAGS, "check_ids": check_ids}
    with pytest.raises(ValueError):
        cpu_layer_norm.embeddings_layer_norm_unchecked(
            ids, types, positions, word, pos, typ, w, b, 1e-12, **flags
        )


def test_embeddings_calls_it_leaves_to_the_plain_op() -> None:
    (word, pos, typ), w, b, ids, types = _embedding_inputs(torch.bfloat16, seed=2)
    positions = torch.arange(ids.shape[1])
    tables = (word, pos, typ)
    takes = cpu_layer_norm.embeddings_takes
    assert takes(ids, types, positions, tables, w, b, 0.0)
    assert not takes(ids, types, positions, tables, w, b, 0.1)  # dropout
    assert not takes(ids[0], None, positions, tables, w, b, 0.0)  # ids not [B, S]
    assert not takes(ids, types, positions, (word.half(), pos.half(), typ.half()), w, b, 0.0)
    assert not takes(ids, types, positions, (word, pos.float(), typ), w, b, 0.0)  # mixed
    assert not takes(ids, types, positions, (word.t(), pos, typ), w, b, 0.0)  # column stride
    assert not takes(ids.float(), types, positions, tables, w, b, 0.0)  # float ids
    assert not takes(ids, types[:, :3], positions, tables, w, b, 0.0)  # types' shape
    leaf = word.float().requires_grad_()
    floats = (leaf, pos.float(), typ.float())
    assert not takes(ids, types, positions, floats, w.float(), b.float(), 0.0)
    with cpu_layer_norm.turned_off():
        assert not takes(ids, types, positions, tables, w, b, 0.0)
    # The engine's op gives the plain op's result, gradient included, where it does not take it.
    got = cpu_engine.OPS["embeddings_layer_norm"](
        ids, types, positions, *floats, w.float(), b.float(), 1e-12, **EMBEDDING_FLAGS
    )
    plain = torch_ops.embeddings_layer_norm_unchecked(
        ids, types, positions, *floats, w.float(), b.float(), 1e-12, **EMBEDDING_FLAGS
    )
    assert torch.equal(got, plain) and got.requires_grad


def test_embeddings_keywords_left_out_take_the_references_defaults() -> None:
    """Called without the plain op's keywords: dropout 0, ids checked (as the reference)."""
    (word, pos, typ), w, b, ids, types = _embedding_inputs(torch.float32, seed=5)
    args = (ids, types, None, word, pos, typ, w, b, 1e-12)
    got = cpu_layer_norm.embeddings_layer_norm_unchecked(*args)
    assert torch.equal(
        got, cpu_layer_norm.embeddings_layer_norm_unchecked(*args, **EMBEDDING_FLAGS)
    )
    ids[0, 0] = 5000
    with pytest.raises(ValueError):
        cpu_layer_norm.embeddings_layer_norm_unchecked(*args)


def test_the_engine_runs_the_embeddings_for_the_torch_backend_on_a_cpu() -> None:
    from fastbert.execution import backends

    ops = backends.get_ops("torch", "cpu")
    assert ops.embeddings_layer_norm is cpu_layer_norm.embeddings_layer_norm_unchecked
    assert "embeddings' lookups" in cpu_engine.status()["LayerNorm"]


def test_each_compiled_op_turns_off_alone() -> None:
    x, w, b, r = _inputs((8, 64), torch.bfloat16, seed=4)
    (word, pos, typ), ew, eb, ids, types = _embedding_inputs(torch.bfloat16, seed=4)
    positions = torch.arange(ids.shape[1])

    def both() -> tuple[bool, bool]:
        return (
            cpu_layer_norm.takes(x, w, b, r, 0.0),
            cpu_layer_norm.embeddings_takes(ids, types, positions, (word, pos, typ), ew, eb, 0),
        )

    assert both() == (True, True)
    with cpu_layer_norm.op_turned_off("embeddings_layer_norm"):
        assert both() == (True, False)
        with cpu_layer_norm.op_turned_off("layer_norm"):
            assert both() == (False, False)
        assert both() == (True, False)
    with cpu_layer_norm.op_turned_off("layer_norm"):
        assert both() == (False, True)
    assert both() == (True, True)
    with pytest.raises(ValueError, match="embeddings_layer_norm"):
        with cpu_layer_norm.op_turned_off("gelu"):
            pass
