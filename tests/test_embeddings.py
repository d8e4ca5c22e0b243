"""K.embeddings_layer_norm (three gathers + sum + LayerNorm) against the float64 reference.

CPU (Triton interpreter): fp32, fp16 and bf16 tables, small vocabularies.
GPU (``gpu`` mark): BERT-base / large tables and batches.
"""

from __future__ import annotations

import pytest
import torch

from fastbert import kernels as K
from fastbert.kernels import reference as R
from tests.bad_inputs import bad_input_test, float64_case, interpreter_needed_test
from tests.op_cases import ALL_DTYPES, ELEMENTWISE_DTYPES, check_op, dtype_params, randn


def tables(vocab, positions, types, hidden, dtype, device, seed=0):
    """word_emb [vocab, H], pos_emb [positions, H], type_emb [types, H], weight, bias [H]."""
    return (
        randn((vocab, hidden), dtype, device, seed),
        randn((positions, hidden), dtype, device, seed + 1, scale=0.5),
        randn((types, hidden), dtype, device, seed + 2, scale=0.5),
        (1.0 + randn((hidden,), torch.float32, device, seed + 3, scale=0.3)).to(dtype),
        randn((hidden,), dtype, device, seed + 4, scale=0.5),
    )


def ids(high, shape, device, seed, dtype=torch.int64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, tuple(shape), generator=gen).to(device=device, dtype=dtype)


def check_embeddings(input_ids, token_type_ids, position_ids, params, eps=1e-12):
    out = check_op(
        K.embeddings_layer_norm,
        R.embeddings_layer_norm,
        (input_ids, token_type_ids, position_ids, *params, eps),
    )
    assert out.is_contiguous()
    assert out.shape == (*input_ids.shape, params[0].shape[1])
    return out


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
@pytest.mark.parametrize("hidden", [8, 100, 384])
@pytest.mark.parametrize("with_types", [False, True], ids=["notypes", "types"])
@pytest.mark.parametrize("positions", ["none", "bs", "s"])
def test_matches_reference(device, dtype, hidden, with_types, positions) -> None:
    batch, seq = 3, 11
    params = tables(50, 40, 3, hidden, dtype, device, seed=hidden)
    input_ids = ids(50, (batch, seq), device, 1)
    token_type_ids = ids(3, (batch, seq), device, 2) if with_types else None
    position_ids = {
        "none": None,
        "bs": ids(40, (batch, seq), device, 3),
        "s": torch.arange(5, 5 + seq, device=device),
    }[positions]
    check_embeddings(input_ids, token_type_ids, position_ids, params)


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64, torch.int16, torch.uint8])
def test_id_dtypes(device, id_dtype) -> None:
    """Any integer id dtype gives the int64 ids' output exactly."""
    params = tables(50, 40, 2, 64, torch.float32, device, seed=4)
    input_ids, types, positions = ids(50, (2, 9), device, 5), ids(2, (2, 9), device, 6), None
    expected = check_embeddings(input_ids, types, positions, params)
    got = K.embeddings_layer_norm(
        input_ids.to(id_dtype),
        types.to(id_dtype),
        torch.arange(9, device=device).to(id_dtype),
        *params,
        1e-12,
    )
    assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
def test_strided_ids_and_tables(device, dtype) -> None:
    """Transposed id tensors and column-sliced tables are read through their strides."""
    word, pos, typ, weight, bias = tables(30, 20, 2, 96, dtype, device, seed=7)
    wide = randn((30, 192), dtype, device, 8)[:, ::2]
    params = (wide, pos.t().contiguous().t(), typ, weight, bias)
    input_ids = ids(30, (7, 3), device, 9).t()
    types = ids(2, (7, 3), device, 10, torch.int32).t()
    positions = ids(20, (7, 3), device, 11).t()
    assert not (input_ids.is_contiguous() or wide.is_contiguous() or params[1].is_contiguous())
    check_embeddings(input_ids, types, positions, params)


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
def test_large_table_offsets(device, dtype) -> None:
    """Rows whose sum sits far from zero: the variance must come from centred values."""
    word, pos, typ, weight, bias = tables(20, 16, 2, 384, dtype, device, seed=12)
    word = (word.float() + 300.0).to(dtype)
    check_embeddings(ids(20, (2, 16), device, 13), None, None, (word, pos, typ, weight, bias))


def test_empty_batch(device) -> None:
    params = tables(10, 8, 2, 32, torch.float32, device)
    input_ids = torch.zeros(0, 5, dtype=torch.int64, device=device)
    assert K.embeddings_layer_norm(input_ids, None, None, *params, 1e-12).shape == (0, 5, 32)


def _valid_args(device) -> dict:
    """Valid fp32 inputs (vocab 10, 8 positions, 2 types, H 16; ids [2, 4]): the keyword
    arguments of K.embeddings_layer_norm."""
    word, pos, typ, weight, bias = tables(10, 8, 2, 16, torch.float32, device)
    return {
        "input_ids": ids(10, (2, 4), device, 0),
        "token_type_ids": ids(2, (2, 4), device, 1),
        "position_ids": ids(8, (2, 4), device, 2),
        "word_emb": word,
        "pos_emb": pos,
        "type_emb": typ,
        "weight": weight,
        "bias": bias,
        "eps": 1e-12,
    }


def _set(name, index, value):
    """A change replacing element ``index`` of args[name] with ``value`` (on a copy)."""

    def make(args):
        t = args[name].clone()
        t[index] = value
        return t

    return make


BAD = {
    "input id too large": (
        dict(input_ids=_set("input_ids", (1, 2), 10)),
        ValueError,
        r"input_ids must lie in \[0, 9\] \(the table has 10 rows\), found values in \[\d+, 10\]",
    ),
    "negative input id": (dict(input_ids=_set("input_ids", (0, 0), -1)), ValueError, "input_ids"),
    "token type too large": (
        dict(token_type_ids=_set("token_type_ids", (0, 3), 2)),
        ValueError,
        r"token_type_ids must lie in \[0, 1\]",
    ),
    "position too large": (
        dict(position_ids=_set("position_ids", (1, 0), 8)),
        ValueError,
        r"position_ids must lie in \[0, 7\]",
    ),
    "sequence longer than pos_emb": (
        dict(
            input_ids=lambda a: a["input_ids"].new_zeros(2, 9),
            token_type_ids=lambda a: None,
            position_ids=lambda a: None,
        ),
        ValueError,
        "sequence length 9 is longer than the 8 rows of pos_emb",
    ),
    "float ids": (dict(input_ids=lambda a: a["input_ids"].float()), TypeError, "integer ids"),
    "bool token types": (
        dict(token_type_ids=lambda a: a["token_type_ids"].bool()),
        TypeError,
        "token_type_ids must hold integer ids",
    ),
    "1-d input ids": (dict(input_ids=lambda a: a["input_ids"][0]), ValueError, "2 dimensions"),
    "token type shape": (
        dict(token_type_ids=lambda a: a["token_type_ids"][:, :3]),
        ValueError,
        r"token_type_ids must have shape \(2, 4\)",
    ),
    "position shape": (
        dict(position_ids=lambda a: a["position_ids"][:, :3]),
        ValueError,
        r"position_ids must have shape \(2, 4\) or \(4,\)",
    ),
    "mixed table dtypes": (dict(pos_emb=lambda a: a["pos_emb"].half()), TypeError, "dtype mism"),
    "float64 tables": float64_case("word_emb", "pos_emb", "type_emb", "weight", "bias"),
    "table width": (
        dict(type_emb=lambda a: a["type_emb"][:, :8]),
        ValueError,
        "type_emb has width 8 but word_emb has width 16",
    ),
    "weight shape": (dict(weight=lambda a: a["weight"][:8]), ValueError, r"weight must have sh"),
    "ids on meta": (dict(input_ids=lambda a: a["input_ids"].to("meta")), ValueError, "device"),
    "bias on meta": (dict(bias=lambda a: a["bias"].to("meta")), ValueError, "device mismatch"),
    "negative eps": (dict(eps=lambda a: -1.0), ValueError, "eps must be a non-negative"),
    "nan eps": (dict(eps=lambda a: float("nan")), ValueError, "eps must be a non-negative"),
}


test_bad_input_raises = bad_input_test(K.embeddings_layer_norm, _valid_args, BAD)


test_cpu_without_interpreter_says_so = interpreter_needed_test(K.embeddings_layer_norm, _valid_args)


# --- GPU: BERT-base / large tables --------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtype_params((), ALL_DTYPES))
@pytest.mark.parametrize("hidden", [128, 384, 768, 1024, 4096])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_gpu_bert_tables(dtype, hidden, id_dtype) -> None:
    params = tables(30522, 512, 2, hidden, dtype, "cuda", seed=hidden)
    batch, seq = (32, 512) if hidden <= 1024 else (4, 512)
    input_ids = ids(30522, (batch, seq), "cuda", 1, id_dtype)
    types = ids(2, (batch, seq), "cuda", 2, id_dtype)
    check_embeddings(input_ids, types, None, params)
    positions = ids(512, (batch, seq), "cuda", 3, id_dtype)
    check_embeddings(input_ids, None, positions, params)
