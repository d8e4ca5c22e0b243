"""K.attention and K.attention_varlen against the float64 reference (tests/accuracy.py rule).

CPU (Triton interpreter): fp32 and fp16 on small shapes. GPU (``gpu`` mark): bf16 too, long
sequences and BERT-base / large shapes.
"""

from __future__ import annotations

import pytest
import torch

from fastbert import kernels as K
from fastbert.kernels import flash_attention
from fastbert.kernels import reference as R
from fastbert.kernels import torch_ops as T
from tests.accuracy import assert_within_rule
from tests.bad_inputs import bad_input_test, float64_case
from tests.op_cases import DOT_DTYPES, check_op, dtype_params, lengths_for, padded_mask, randn

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
HEAD_DIMS = (32, 64, 80, 96, 128)


def qkv(b, h, s_q, s_k, d, dtype, device, seed=0, layout="bhsd"):
    """q [b, h, s_q, d] and k, v [b, h, s_k, d] with the strides of ``layout``.

    "bhsd": contiguous; "bshd": Hugging Face's [b, s, h, d] tensors viewed ``.transpose(1, 2)``;
    "fused": strided views of one [b, s, 3, h, d] QKV buffer (s_q == s_k).
    """
    if layout == "fused":
        assert s_q == s_k
        buf = randn((b, s_q, 3, h, d), dtype, device, seed)
        return tuple(buf[:, :, i].transpose(1, 2) for i in range(3))
    tensors = []
    for i, s in enumerate((s_q, s_k, s_k)):
        if layout == "bshd":
            tensors.append(randn((b, s, h, d), dtype, device, seed + i).transpose(1, 2))
        else:
            tensors.append(randn((b, h, s, d), dtype, device, seed + i))
    return tuple(tensors)


def check_attention(q, k, v, mask=None, scale=None) -> torch.Tensor:
    out = check_op(K.attention, R.attention, (q, k, v), {"key_padding_mask": mask, "scale": scale})
    # The output is the [B, H, S_q, D] view of a contiguous [B, S_q, H, D] buffer.
    assert out.transpose(1, 2).is_contiguous()
    return out


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize(
    "batch, heads, seq",
    [(2, 2, 1), (2, 2, 7), (2, 2, 33), (2, 2, 127), (2, 2, 129), (1, 1, 511), (1, 1, 512)],
)
def test_sequence_lengths(device, dtype, batch, heads, seq) -> None:
    q, k, v = qkv(batch, heads, seq, seq, 64, dtype, device, seed=seq)
    mask = padded_mask(lengths_for(batch, seq), seq, device=device)
    check_attention(q, k, v, mask)
    check_attention(q, k, v)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_head_dims(device, dtype, head_dim) -> None:
    q, k, v = qkv(2, 3, 33, 33, head_dim, dtype, device, seed=head_dim)
    check_attention(q, k, v, padded_mask([33, 20], 33, device=device))


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize(
    "seq_q, seq_k", [(7, 129), (129, 7), (129, 33), (1, 64), (65, 1), (1, 1024)]
)
def test_query_and_key_lengths_differ(device, dtype, seq_q, seq_k) -> None:
    heads = 1 if seq_k > 512 else 2  # keeps the 1024-key case quick under the interpreter
    q, k, v = qkv(2, heads, seq_q, seq_k, 32, dtype, device, seed=seq_q + seq_k)
    check_attention(q, k, v, padded_mask([seq_k, (seq_k + 1) // 2], seq_k, device=device))


class _GridRecorder:
    """Stands in for the autotuned kernel: records each launch grid, then launches the kernel."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.grids: list = []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("seq_q, seq_k", [(1, 1024), (7, 129), (129, 7), (65, 65)])
def test_grid_is_sized_by_the_queries(device, monkeypatch, seq_q, seq_k) -> None:
    """One program per BLOCK_M queries of each (batch, head): the keys do not size the grid."""
    recorder = _GridRecorder(flash_attention._attention_fwd_kernel)
    monkeypatch.setattr(flash_attention, "_attention_fwd_kernel", recorder)
    batch, heads = 2, 3
    q, k, v = qkv(batch, heads, seq_q, seq_k, 32, F32, device, seed=seq_q)
    check_attention(q, k, v, padded_mask([seq_k, 1], seq_k, device=device))
    (grid,) = recorder.grids
    for block_m in (16, 32, 64, 128):
        expected = (-(seq_q // -block_m), heads, batch)
        assert grid({"BLOCK_M": block_m, "BLOCK_N": 64}) == expected, f"BLOCK_M={block_m}"


@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_fully_padded_row_is_zero(device, dtype) -> None:
    q, k, v = qkv(3, 2, 40, 40, 64, dtype, device, seed=3)
    out = check_attention(q, k, v, padded_mask([40, 0, 9], 40, device=device))
    assert torch.isfinite(out).all()
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def assert_large_masked_keys_change_nothing(q, k, v, mask) -> None:
    """Large finite K and V at masked keys (1e4 in fp16, 1e30 otherwise; -big for V) leave
    every output bit of K.attention unchanged."""
    out = K.attention(q, k, v, mask)
    pad = ~mask[:, None, :, None]
    big = 1e4 if q.dtype == F16 else 1e30
    k2 = torch.where(pad, torch.full_like(k, big), k)
    v2 = torch.where(pad, torch.full_like(v, -big), v)
    assert torch.equal(K.attention(q, k2, v2, mask), out)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_padded_keys_have_no_influence(device, dtype) -> None:
    """Large finite K and V at masked keys leave every output bit unchanged."""
    q, k, v = qkv(3, 2, 70, 70, 64, dtype, device, seed=4)
    assert_large_masked_keys_change_nothing(q, k, v, padded_mask([70, 33, 1], 70, device=device))


# Non-finite values at masked keys: (value at masked K rows, value at masked V rows).
POISONS = {
    "nan": (float("nan"), float("nan")),
    "inf": (float("inf"), float("-inf")),
    "-inf": (float("-inf"), float("inf")),
}
# (batch lengths, S_q, S_k, head dim, layout): a padded batch with a one-key and a fully padded
# row; Hugging Face's transposed views with a padded head dim; seqlen 1 (the second row fully
# padded); more keys than queries.
POISON_SHAPES = {
    "padded": ([33, 17, 1, 0], 33, 33, 64, "bhsd"),
    "hf-views-d80": ([33, 17, 1, 0], 33, 33, 80, "bshd"),
    "seqlen1": ([1, 0], 1, 1, 32, "bhsd"),
    "sq7-sk129": ([129, 64], 7, 129, 32, "bshd"),
}


def poisoned(t: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
    """A copy of k or v [B, H, S_k, D], with t's strides, holding ``value`` at masked keys."""
    out = t.clone()
    out.masked_fill_(~mask[:, None, :, None], value)
    assert out.stride() == t.stride()
    return out


def _poisoned_case(shape, poison, dtype, device):
    """(q, k, v, mask) of ``shape`` and the same k, v with ``poison`` at every masked key."""
    lengths, seq_q, seq_k, head_dim, layout = POISON_SHAPES[shape]
    q, k, v = qkv(len(lengths), 2, seq_q, seq_k, head_dim, dtype, device, seed=12, layout=layout)
    mask = padded_mask(lengths, seq_k, device=device)
    k_value, v_value = POISONS[poison]
    return (q, k, v, mask), (poisoned(k, mask, k_value), poisoned(v, mask, v_value))


# The kernel's Q @ K^T meets the NaN / Inf of masked keys before the mask replaces those
# scores; numpy (the interpreter) warns about it.
IGNORE_NONFINITE = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@IGNORE_NONFINITE
@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("shape", POISON_SHAPES)
@pytest.mark.parametrize("poison", POISONS)
def test_nonfinite_masked_keys_have_no_influence(device, dtype, shape, poison) -> None:
    """NaN / Inf in K and V at masked keys: the output is the one of finite inputs, finite."""
    (q, k, v, mask), (k_bad, v_bad) = _poisoned_case(shape, poison, dtype, device)
    out = K.attention(q, k_bad, v_bad, mask)
    assert torch.isfinite(out).all()
    assert torch.equal(out, K.attention(q, k, v, mask))
    ref = R.attention(q.double(), k.double(), v.double(), mask)
    assert_within_rule(out, R.attention(q, k, v, mask), ref)
    empty = mask.sum(1) == 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))


@pytest.mark.parametrize("dtype", [torch.float64, F32, F16, BF16], ids=str)
@pytest.mark.parametrize("shape", POISON_SHAPES)
@pytest.mark.parametrize("poison", POISONS)
def test_reference_nonfinite_masked_keys_have_no_influence(dtype, shape, poison) -> None:
    """The reference (the torch backend and the oracle) ignores NaN / Inf at masked keys."""
    (q, k, v, mask), (k_bad, v_bad) = _poisoned_case(shape, poison, dtype, "cpu")
    out = R.attention(q, k_bad, v_bad, mask)
    assert torch.isfinite(out).all()
    assert torch.equal(out, R.attention(q, k, v, mask))


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("layout", ["bshd", "fused"])
def test_strided_views(device, dtype, layout) -> None:
    q, k, v = qkv(2, 3, 33, 33, 64, dtype, device, seed=5, layout=layout)
    assert not q.is_contiguous()
    check_attention(q, k, v, padded_mask([33, 17], 33, device=device))


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.int32, torch.uint8])
def test_mask_dtypes(device, mask_dtype) -> None:
    """Any 0/1 mask dtype, and a non-contiguous mask, give the bool mask's output exactly."""
    q, k, v = qkv(2, 2, 33, 33, 32, F32, device, seed=6)
    lengths = [30, 5]
    expected = check_attention(q, k, v, padded_mask(lengths, 33, device=device))
    mask = padded_mask(lengths, 33, mask_dtype, device)
    assert torch.equal(K.attention(q, k, v, mask), expected)
    strided = mask.t().contiguous().t()
    assert not strided.is_contiguous()
    assert torch.equal(K.attention(q, k, v, strided), expected)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("scale", [0.3, 1, 2.5])
def test_explicit_scale(device, dtype, scale) -> None:
    q, k, v = qkv(2, 2, 33, 33, 64, dtype, device, seed=7)
    check_attention(q, k, v, padded_mask([33, 12], 33, device=device), scale=scale)


# Masks that are not a prefix of real keys, over 200 keys (tiles of 64 keys on the interpreter,
# whole tiles of real keys run without masking): key index -> real, per row.
IRREGULAR_MASKS = {
    "holes": lambda j: (j != 70) & ((j < 130) | (j > 135)),
    "left-padded": lambda j: j >= 100,
    "prefix-of-whole-tiles": lambda j: j < 128,
    "hole-in-first-tile": lambda j: j != 3,
    "last-key-only": lambda j: j == 199,
    "every-other-key": lambda j: j % 2 == 0,
}


@IGNORE_NONFINITE
@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("pattern", IRREGULAR_MASKS)
def test_irregular_masks(device, dtype, pattern) -> None:
    """Holes, left padding and tile-aligned padding: right against the reference, and NaN at
    every masked key (K and V) changes nothing."""
    keys = torch.arange(200)
    mask = torch.stack([IRREGULAR_MASKS[pattern](keys), keys < 150]).to(device)
    q, k, v = qkv(2, 2, 9, 200, 32, dtype, device, seed=14)
    out = check_attention(q, k, v, mask)
    k_bad, v_bad = poisoned(k, mask, float("nan")), poisoned(v, mask, float("nan"))
    assert torch.equal(K.attention(q, k_bad, v_bad, mask), out)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_left_padding_with_very_negative_scores(device, dtype) -> None:
    """A whole tile of masked keys first, then real keys whose scaled scores are all about
    -320: the running maximum must stay -inf across the masked tile (a maximum of 0 would
    underflow every weight, giving zeros)."""
    q = torch.ones(1, 1, 3, 32, dtype=dtype, device=device)
    k = (-1.0 - 0.01 * randn((1, 1, 100, 32), F32, "cpu", 16)).to(device=device, dtype=dtype)
    v = randn((1, 1, 100, 32), dtype, device, 17)
    mask = (torch.arange(100) >= 70)[None].to(device)
    check_attention(q, k, v, mask, scale=10.0)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("scale", [-0.7, 0.0])
@pytest.mark.parametrize("masked", [True, False], ids=["mask", "no-mask"])
def test_negative_and_zero_scale(device, dtype, scale, masked) -> None:
    """A negative scale (the maximum of scale x score is then at the smallest score) and a zero
    scale (uniform weights), over whole and partial key tiles."""
    q, k, v = qkv(2, 2, 9, 130, 32, dtype, device, seed=15)
    mask = padded_mask([130, 70], 130, device=device) if masked else None
    check_attention(q, k, v, mask, scale=scale)


def test_empty_inputs(device) -> None:
    q, k, v = qkv(0, 2, 5, 5, 32, F32, device)
    assert K.attention(q, k, v).shape == (0, 2, 5, 32)
    q, k, v = qkv(1, 2, 0, 0, 32, F32, device)
    assert K.attention(q, k, v).shape == (1, 2, 0, 32)


def packed_qkv(lengths, heads, head_dim, dtype, device, seed=0):
    """q, k, v [T, H, D] as strided views of one packed [T, 3, H, D] buffer, and cu_seqlens."""
    buf = randn((sum(lengths), 3, heads, head_dim), dtype, device, seed)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return buf[:, 0], buf[:, 1], buf[:, 2], cu.to(device)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize("max_seqlen", [None, 8, 1], ids=["max", "max8", "max1"])
def test_varlen(device, dtype, head_dim, max_seqlen) -> None:
    """Packed sequences incl. a zero-length one; a too-small max_seqlen is still correct."""
    lengths = [5, 0, 70, 1, 17]
    q, k, v, cu = packed_qkv(lengths, 2, head_dim, dtype, device, seed=head_dim)
    max_len = max(lengths) if max_seqlen is None else max_seqlen
    out = check_op(K.attention_varlen, R.attention_varlen, (q, k, v, cu, max_len))
    assert out.is_contiguous()


@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_varlen_matches_dense_per_sequence(device, dtype, monkeypatch) -> None:
    """Each packed sequence gets what dense attention gives it alone, bit for bit, in one tile
    config (on a GPU each variant tunes its own, whose key blocks round the online softmax's
    rescaling differently: float32 then differed in 209 of 576 elements by up to 2.4e-7)."""
    tuner = flash_attention._attention_fwd_kernel
    monkeypatch.setattr(tuner, "configs", tuner.configs[:1])
    monkeypatch.setattr(tuner, "cache", {})
    lengths = [9, 33]
    q, k, v, cu = packed_qkv(lengths, 2, 32, dtype, device, seed=8)
    out = K.attention_varlen(q, k, v, cu, max(lengths), scale=0.2)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        dense = [t[start:end].transpose(0, 1)[None] for t in (q, k, v)]
        alone = K.attention(*dense, scale=0.2)[0].transpose(0, 1)
        torch.testing.assert_close(out[start:end], alone, rtol=0, atol=0)


@IGNORE_NONFINITE
@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("poison", ["nan", "inf"])
def test_varlen_other_sequences_never_leak(device, dtype, poison) -> None:
    """NaN / Inf in every token of one sequence: the others' outputs stay finite and exact."""
    lengths = [5, 33, 0, 1, 17]
    q, k, v, cu = packed_qkv(lengths, 2, 64, dtype, device, seed=13)
    start, end = cu[1].item(), cu[2].item()
    bad = [t.clone() for t in (q, k, v)]
    for t in bad:
        t[start:end] = float(poison)
    out = K.attention_varlen(*bad, cu, max(lengths))
    others = torch.ones(out.shape, dtype=torch.bool)
    others[start:end] = False
    assert torch.isfinite(out[others]).all()
    clean = K.attention_varlen(q, k, v, cu, max(lengths))
    assert torch.equal(out[others], clean[others])
    ref = R.attention_varlen(q.double(), k.double(), v.double(), cu, max(lengths))
    out_torch = R.attention_varlen(q, k, v, cu, max(lengths))
    assert_within_rule(out, out_torch, ref, where=others)
    assert torch.equal(R.attention_varlen(*bad, cu, max(lengths))[others], out_torch[others])


@pytest.mark.parametrize("implementation", [K.attention_varlen, T.attention_varlen])
@pytest.mark.parametrize("bounds", [[0, 5], [2, 5, 9], [3, 4, 4]], ids=str)
def test_varlen_tokens_outside_every_sequence_are_zeros(device, implementation, bounds) -> None:
    """cu_seqlens covering part of the T tokens: those outside every sequence are zeros and
    get zero gradients, as in the reference (the kernel writes only its sequences' tokens:
    they held whatever the new buffer held)."""
    torch.manual_seed(0)
    q, k, v = (randn((12, 2, 32), F32, device, seed=i).requires_grad_() for i in range(3))
    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    out = check_op(implementation, R.attention_varlen, (q, k, v, cu, 12))
    outside = torch.ones(12, dtype=torch.bool)
    outside[bounds[0] : bounds[-1]] = False
    assert torch.equal(out[outside], torch.zeros_like(out[outside]))
    out.sum().backward()
    for t in (q, k, v):
        assert torch.equal(t.grad[outside], torch.zeros_like(t.grad[outside]))


@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_varlen_cu_seqlens_of_any_stride(device, dtype) -> None:
    """cu_seqlens a strided view (a column of a wider buffer): its values, not the memory
    beside them (the kernels read it as contiguous)."""
    q, k, v, cu = packed_qkv([5, 9, 3], 2, 32, dtype, device, seed=3)
    strided = torch.stack([cu, cu.flip(0)], dim=1)[:, 0]
    assert not strided.is_contiguous()
    check_op(K.attention_varlen, R.attention_varlen, (q, k, v, strided, 9))


def test_varlen_empty(device) -> None:
    q = torch.zeros(0, 2, 32, device=device)
    cu = torch.zeros(1, dtype=torch.int32, device=device)
    assert K.attention_varlen(q, q, q, cu, 0).shape == (0, 2, 32)


def _dense_args(device) -> dict:
    """Valid fp32 dense inputs (B=2, H=2, S=8, D=32): the keyword arguments of K.attention."""
    q, k, v = qkv(2, 2, 8, 8, 32, F32, device)
    return {"q": q, "k": k, "v": v, "key_padding_mask": padded_mask([8, 3], 8, device=device)}


BAD_DENSE = {
    "mixed dtypes": (dict(k=lambda a: a["k"].half()), TypeError, "dtype mismatch"),
    "float64": float64_case("q", "k", "v"),
    "k shape": (dict(k=lambda a: a["k"][:, :, :, :16]), ValueError, "k must have shape"),
    "v shape": (dict(v=lambda a: a["v"][:, :1]), ValueError, "v must have shape"),
    "3-d q": (dict(q=lambda a: a["q"][0]), ValueError, "q must have 4 dimensions"),
    "k on meta": (dict(k=lambda a: a["k"].to("meta")), ValueError, "device mismatch"),
    "mask on meta": (
        dict(key_padding_mask=lambda a: a["key_padding_mask"].to("meta")),
        ValueError,
        "device mismatch",
    ),
    "float mask": (
        dict(key_padding_mask=lambda a: a["key_padding_mask"].float()),
        TypeError,
        "additive float masks",
    ),
    "mask shape": (
        dict(key_padding_mask=lambda a: a["key_padding_mask"][:, :5]),
        ValueError,
        r"key_padding_mask must have shape \(2, 8\)",
    ),
    "head dim 48": (
        {n: (lambda a: a["q"].new_zeros(2, 2, 8, 48)) for n in "qkv"},
        ValueError,
        "head dim 48 is not supported",
    ),
    "D stride 2": (
        dict(q=lambda a: a["q"].new_zeros(2, 2, 8, 64)[..., ::2]),
        ValueError,
        "q must have unit stride on the head dim",
    ),
}


test_bad_input_raises = bad_input_test(K.attention, _dense_args, BAD_DENSE)


def test_cpu_without_interpreter_says_so(interpreter_off) -> None:
    q, k, v = qkv(1, 1, 4, 4, 32, F32, "cpu")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        K.attention(q, k, v)
    q, k, v, cu = packed_qkv([4], 1, 32, F32, "cpu")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        K.attention_varlen(q, k, v, cu, 4)


def test_bad_scale_raises(device) -> None:
    q, k, v = qkv(1, 1, 4, 4, 32, F32, device)
    with pytest.raises(TypeError, match="scale must be a Python number"):
        K.attention(q, k, v, scale=torch.tensor(0.5))
    with pytest.raises(ValueError, match="scale must be a finite number"):
        K.attention(q, k, v, scale=float("inf"))


def _varlen_args(device) -> dict:
    """Valid fp32 packed inputs (lengths 3 and 7, H=2, D=32): the keyword arguments of
    K.attention_varlen."""
    q, k, v, cu_seqlens = packed_qkv([3, 7], 2, 32, F32, device)
    return {"q": q, "k": k, "v": v, "cu_seqlens": cu_seqlens, "max_seqlen": 7}


BAD_VARLEN = {
    "cu_seqlens int64": (
        dict(cu_seqlens=lambda a: a["cu_seqlens"].long()),
        TypeError,
        "cu_seqlens must be int32",
    ),
    "cu_seqlens on meta": (
        dict(cu_seqlens=lambda a: a["cu_seqlens"].to("meta")),
        ValueError,
        "device mismatch",
    ),
    "cu_seqlens past the tokens": (
        dict(cu_seqlens=lambda a: a["cu_seqlens"] + torch.tensor([0, 0, 4], dtype=torch.int32)),
        ValueError,
        r"cu_seqlens\[-1\] <= 10\), got 0 ... 14",
    ),
    "cu_seqlens decreasing": (
        dict(cu_seqlens=lambda a: a["cu_seqlens"][[0, 2, 1]]),
        ValueError,
        "never decreasing .* with 1 decrease",
    ),
    "negative max_seqlen": (dict(max_seqlen=lambda a: -1), ValueError, "max_seqlen must be"),
    "float max_seqlen": (dict(max_seqlen=lambda a: 7.0), ValueError, "max_seqlen must be"),
    "mixed dtypes": (dict(v=lambda a: a["v"].half()), TypeError, "dtype mismatch"),
    "float64": float64_case("q", "k", "v"),
    "k shape": (dict(k=lambda a: a["k"][:5]), ValueError, "k must have shape"),
    "head dim 48": (
        {n: (lambda a: a["q"].new_zeros(10, 2, 48)) for n in "qkv"},
        ValueError,
        "head dim 48 is not supported",
    ),
    "D stride 2": (
        dict(k=lambda a: a["k"].new_zeros(10, 2, 64)[..., ::2]),
        ValueError,
        "k must have unit stride on the head dim",
    ),
}


test_bad_varlen_input_raises = bad_input_test(K.attention_varlen, _varlen_args, BAD_VARLEN)


# --- GPU: the full grid, bf16 included, long sequences, BERT shapes -------------------------

GPU_DTYPES = dtype_params((), (F32, F16, BF16))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("seq", [1, 7, 33, 127, 129, 511, 512, 1024, 4096])
def test_gpu_grid(dtype, head_dim, seq) -> None:
    batch, heads = (2, 3) if seq <= 1024 else (1, 2)
    q, k, v = qkv(batch, heads, seq, seq, head_dim, dtype, "cuda", seed=seq + head_dim)
    mask = padded_mask([seq, max(1, seq // 3)], seq, device="cuda")[:batch]
    check_attention(q, k, v, mask)
    if seq <= 1024:
        check_attention(q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize(
    "batch, heads, seq, lengths",
    [
        (32, 12, 128, None),  # BERT-base, full
        (8, 12, 512, [512, 300, 1, 77, 511, 256, 0, 129]),  # BERT-base, padded
        (8, 16, 512, [512, 400, 200, 100, 50, 25, 12, 6]),  # BERT-large, padded
    ],
)
@pytest.mark.parametrize("layout", ["fused", "bshd"])
def test_gpu_bert_shapes(dtype, batch, heads, seq, lengths, layout) -> None:
    q, k, v = qkv(batch, heads, seq, seq, 64, dtype, "cuda", seed=batch, layout=layout)
    mask = None if lengths is None else padded_mask(lengths, seq, torch.int64, "cuda")
    out = check_attention(q, k, v, mask)
    if lengths is not None:
        for b, n in enumerate(lengths):
            if n == 0:
                assert torch.equal(out[b], torch.zeros_like(out[b]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("max_seqlen", [None, 64], ids=["max", "max64"])
def test_gpu_varlen(dtype, head_dim, max_seqlen) -> None:
    lengths = [512, 0, 1, 129, 77, 1024, 33, 300, 7]
    q, k, v, cu = packed_qkv(lengths, 12, head_dim, dtype, "cuda", seed=head_dim)
    max_len = max(lengths) if max_seqlen is None else max_seqlen
    check_op(K.attention_varlen, R.attention_varlen, (q, k, v, cu, max_len))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("poison", POISONS)
def test_gpu_nonfinite_masked_keys_have_no_influence(dtype, poison) -> None:
    """BERT-base shapes, fused QKV layout: NaN / Inf at masked K and V rows change nothing."""
    lengths = [512, 300, 1, 0]
    q, k, v = qkv(4, 12, 512, 512, 64, dtype, "cuda", seed=14, layout="fused")
    mask = padded_mask(lengths, 512, device="cuda")
    clean = K.attention(q, k, v, mask)
    k_value, v_value = POISONS[poison]
    pad = ~mask[:, None, :, None]
    k.masked_fill_(pad, k_value)  # in place: k and v stay views of the fused QKV buffer
    v.masked_fill_(pad, v_value)
    out = K.attention(q, k, v, mask)
    assert torch.isfinite(out).all()
    assert torch.equal(out, clean)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_gpu_padded_keys_have_no_influence(dtype) -> None:
    q, k, v = qkv(4, 12, 512, 512, 64, dtype, "cuda", seed=11, layout="fused")
    mask = padded_mask([512, 300, 1, 0], 512, device="cuda")
    assert_large_masked_keys_change_nothing(q, k, v, mask)
