"""Input validation shared by the reference ops and the Triton launchers.

Every public op, whatever its backend, rejects bad input the same way: a ``TypeError`` for a
wrong kind of tensor (dtype, not a tensor) and a ``ValueError`` for a wrong shape, device or
value, each message naming the argument and what is wrong with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The reference ops also take float64: they are the tests' oracle.
REFERENCE_DTYPES = (*FLOAT_DTYPES, torch.float64)
ACTIVATIONS = (None, "gelu", "gelu_tanh")


# The buckets of a relative position bias table (Hugging Face MPNet's 32: 16 per direction).
RELATIVE_BUCKETS = 32


def check_tensor(
    name: str, t: object, ndim: int | None = None, min_ndim: int | None = None
) -> None:
    """Raise unless ``t`` is a tensor with ``ndim`` (or at least ``min_ndim``) dimensions."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(t.shape)}"
        )


def check_float(name: str, t: torch.Tensor) -> None:
    """float16, bfloat16 or float32 (float64 too: the reference runs it, the kernels refuse it)."""
    if t.dtype not in REFERENCE_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")


def check_integer(name: str, t: torch.Tensor) -> None:
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer ids, got {t.dtype}")


def _first_mismatch(attribute: str, tensors: dict[str, torch.Tensor | None]) -> tuple | None:
    """(first name, its value, name, value) of the first non-None tensor whose ``attribute``
    (dtype, device) differs from the first non-None tensor's, or None when all agree."""
    first_name = first = None
    for name, t in tensors.items():
        if t is None:
            continue
        value = getattr(t, attribute)
        if first_name is None:
            first_name, first = name, value
        elif value != first:
            return first_name, first, name, value
    return None


def check_same_dtype(**tensors: torch.Tensor | None) -> None:
    """All non-None tensors share one dtype."""
    mismatch = _first_mismatch("dtype", tensors)
    if mismatch:
        raise TypeError("dtype mismatch: {} is {} but {} is {}".format(*mismatch))


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """All non-None tensors live on one device."""
    mismatch = _first_mismatch("device", tensors)
    if mismatch:
        raise ValueError("device mismatch: {} is on {} but {} is on {}".format(*mismatch))


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {tuple(t.shape)}")


def check_key_padding_mask(mask: torch.Tensor | None, batch: int, seq_k: int) -> None:
    """A key-padding mask is [batch, seq_k], bool or integer, 1/True marking a real token."""
    if mask is None:
        return
    check_tensor("key_padding_mask", mask, ndim=2)
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise TypeError(
            "key_padding_mask must be bool or integer (True/1 = real token), got "
            f"{mask.dtype}; additive float masks are not accepted"
        )
    check_shape("key_padding_mask", mask, (batch, seq_k))


def check_scale(scale: object) -> None:
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a Python number or None, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale!r}")


def check_attention(q, k, v, key_padding_mask, scale) -> None:
    """q: [B, H, S_q, D]; k, v: [B, H, S_k, D]; mask: [B, S_k]."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=4)
        check_float(name, t)
    check_same_dtype(q=q, k=k, v=v)
    check_same_device(q=q, k=k, v=v, key_padding_mask=key_padding_mask)
    batch, heads, _, head_dim = q.shape
    seq_k = k.shape[2]
    check_shape("k", k, (batch, heads, seq_k, head_dim))
    check_shape("v", v, (batch, heads, seq_k, head_dim))
    check_key_padding_mask(key_padding_mask, batch, seq_k)
    check_scale(scale)


def check_relative_bias(relative_bias, q) -> None:
    """relative_bias: None or a float [H, RELATIVE_BUCKETS] table on q's device (q: [B, H, S,
    D] or [T, H, D])."""
    if relative_bias is None:
        return
    check_tensor("relative_bias", relative_bias, ndim=2)
    check_float("relative_bias", relative_bias)
    check_same_device(q=q, relative_bias=relative_bias)
    heads = q.shape[1]
    check_shape("relative_bias", relative_bias, (heads, RELATIVE_BUCKETS))


def check_rotary(rotary, window, q) -> None:
    """rotary: None or float32 [D / 2] inverse frequencies on q's device (q: [B, H, S, D] or
    [T, H, D]; D even); window: None or an integer >= 0."""
    if rotary is not None:
        check_tensor("rotary", rotary, ndim=1)
        if rotary.dtype != torch.float32:
            raise TypeError(f"rotary must be float32 inverse frequencies, got {rotary.dtype}")
        check_same_device(q=q, rotary=rotary)
        dim = q.shape[-1]
        if dim % 2:
            raise ValueError(f"rotary position embeddings need an even head dim, got {dim}")
        check_shape("rotary", rotary, (dim // 2,))
    if window is not None and (
        not isinstance(window, int) or isinstance(window, bool) or window < 0
    ):
        raise ValueError(f"window must be None or an integer >= 0, got {window!r}")


def check_cu_seqlens(cu_seqlens) -> None:
    """cu_seqlens: int32 [B + 1] prefix sums of the sequence lengths (shape and dtype only)."""
    check_tensor("cu_seqlens", cu_seqlens, ndim=1)
    if cu_seqlens.dtype != torch.int32:
        raise TypeError(f"cu_seqlens must be int32, got {cu_seqlens.dtype}")
    if cu_seqlens.numel() < 1:
        raise ValueError("cu_seqlens must hold at least one entry (0)")


def values_readable(t: torch.Tensor) -> bool:
    """Whether ``t``'s values may be read on the host now: not while torch.compile traces,
    nor while a CUDA graph captures."""
    if torch.compiler.is_compiling():
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def _cu_seqlens_bounds(cu_seqlens: torch.Tensor) -> tuple[int, int, int]:
    """(first, last, number of decreases) of ``cu_seqlens``: one host read."""
    bounds = cu_seqlens.long()
    falls = (bounds.diff() < 0).sum()
    first, last, decreasing = torch.stack([bounds[0], bounds[-1], falls]).tolist()
    return first, last, decreasing


def _decreases(decreasing: int) -> str:
    return f" with {decreasing} decrease(s)" if decreasing else ""


def cu_seqlens_span(cu_seqlens: torch.Tensor, tokens: int) -> tuple[int, int]:
    """(first, last) of ``cu_seqlens``: ValueError unless it never decreases and stays within
    the ``tokens`` rows it indexes (0 <= first, last <= tokens). Reads three numbers on the
    host (one transfer)."""
    first, last, decreasing = _cu_seqlens_bounds(cu_seqlens)
    if first < 0 or last > tokens or decreasing:
        raise ValueError(
            f"cu_seqlens must be the prefix sums of the sequence lengths, never decreasing and "
            f"within the {tokens} tokens (0 <= cu_seqlens[0], cu_seqlens[-1] <= {tokens}), got "
            f"{first} ... {last}{_decreases(decreasing)}"
        )
    return first, last


def check_cu_seqlens_values(cu_seqlens: torch.Tensor, tokens: int) -> None:
    """ValueError unless ``cu_seqlens`` starts at 0, never decreases and ends at ``tokens``.
    Reads three numbers on the host (one transfer)."""
    first, last, decreasing = _cu_seqlens_bounds(cu_seqlens)
    if first != 0 or last != tokens or decreasing:
        raise ValueError(
            f"cu_seqlens must rise from 0 to the {tokens} rows of x without decreasing (the "
            f"prefix sums of the sequence lengths), got {first} ... {last}"
            f"{_decreases(decreasing)}"
        )


def check_attention_varlen(q, k, v, cu_seqlens, max_seqlen, scale) -> None:
    """q, k, v: [T, H, D] packed tokens; cu_seqlens: int32 [B + 1]."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=3)
        check_float(name, t)
    check_same_dtype(q=q, k=k, v=v)
    check_same_device(q=q, k=k, v=v, cu_seqlens=cu_seqlens)
    check_shape("k", k, tuple(q.shape))
    check_shape("v", v, tuple(q.shape))
    check_cu_seqlens(cu_seqlens)
    if not isinstance(max_seqlen, int) or max_seqlen < 0:
        raise ValueError(f"max_seqlen must be a non-negative int, got {max_seqlen!r}")
    check_scale(scale)


def check_softmax(scores, key_padding_mask, scale) -> None:
    """scores: [B, H, S_q, S_k]; mask: [B, S_k]."""
    check_tensor("scores", scores, ndim=4)
    check_float("scores", scores)
    check_same_device(scores=scores, key_padding_mask=key_padding_mask)
    check_key_padding_mask(key_padding_mask, scores.shape[0], scores.shape[3])
    if scale is None:
        raise TypeError("scale must be a Python number, got NoneType")
    check_scale(scale)


def _check_operands(x, weight, bias, residual=None, x_ndim: int | None = None) -> None:
    """The kinds of a product's operands: x a float tensor of ``x_ndim`` (None: at least one)
    dimensions, weight a matrix, bias (optional) a vector, residual (optional) a tensor."""
    check_tensor("x", x, ndim=x_ndim, min_ndim=1)
    check_tensor("weight", weight, ndim=2)
    check_float("x", x)
    if bias is not None:
        check_tensor("bias", bias, ndim=1)
    if residual is not None:
        check_tensor("residual", residual)


def _check_product_shapes(x, weight, bias, rows: str = "out_features") -> tuple[int, int]:
    """x [..., K] against weight [N, K] (``rows`` names N in the message) and bias [N]:
    returns (N, K)."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(
            f"x has {x.shape[-1]} input features but weight has shape {tuple(weight.shape)} "
            f"(expects [{rows}, {x.shape[-1]}])"
        )
    if bias is not None:
        check_shape("bias", bias, (n,))
    return n, k


def check_linear(x, weight, bias, activation, residual, gated=False) -> None:
    """x: [..., K]; weight: [N, K]; bias: [N]; residual: [..., N] (gated: N even, residual
    [..., N / 2])."""
    _check_operands(x, weight, bias, residual)
    check_same_dtype(x=x, weight=weight, bias=bias, residual=residual)
    check_same_device(x=x, weight=weight, bias=bias, residual=residual)
    n, _ = _check_product_shapes(x, weight, bias)
    if not isinstance(gated, bool):
        raise TypeError(f"gated must be a bool, got {gated!r}")
    if gated and n % 2:
        raise ValueError(f"gated needs an even number of weight rows (input, gate), got {n}")
    if residual is not None:
        check_shape("residual", residual, (*x.shape[:-1], n // 2 if gated else n))
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def check_linear_int8(x, weight, weight_scale, bias, activation, residual, input_scale) -> None:
    """x: [..., K] float; weight: int8 [N, K]; weight_scale: float32 [N]; bias: [N] and
    residual: [..., N] in x's dtype; input_scale: float32 [K]."""
    _check_linear_quantized(
        torch.int8, x, weight, weight_scale, bias, activation, residual, input_scale
    )


def check_linear_fp8(x, weight, weight_scale, bias, activation, residual, input_scale) -> None:
    """As :func:`check_linear_int8`, with a float8_e4m3fn weight."""
    _check_linear_quantized(
        torch.float8_e4m3fn, x, weight, weight_scale, bias, activation, residual, input_scale
    )


# Each quantised format's input check (``quantize`` "int8" or "fp8"), the same on every backend.
LINEAR_QUANTIZED_CHECKS = {"int8": check_linear_int8, "fp8": check_linear_fp8}


# The CUDA compute capability of the FP8 tensor cores: sm_89 (Ada) and sm_90 (Hopper) on.
FP8_MIN_CAPABILITY = (8, 9)


def check_fp8_device(name: str, t: torch.Tensor) -> None:
    """ValueError when ``t`` is on a CUDA device older than sm_89, which has no float8
    tensor cores."""
    if t.device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(t.device)
    if capability < FP8_MIN_CAPABILITY:
        raise ValueError(
            f"{name} is on {torch.cuda.get_device_name(t.device)} (sm_{capability[0]}"
            f"{capability[1]}): float8 e4m3 products need the FP8 tensor cores of sm_89 "
            "(Ada) or sm_90 (Hopper) and newer; use int8 (sm_80 and newer) or float16 there"
        )


def _check_linear_quantized(
    weight_dtype, x, weight, weight_scale, bias, activation, residual, input_scale
) -> None:
    _check_operands(x, weight, bias, residual)
    if weight.dtype != weight_dtype:
        raise TypeError(
            f"weight must be {str(weight_dtype).removeprefix('torch.')} (quantised per output "
            f"channel, see quantize_weight), got {weight.dtype}"
        )
    for name, scale in (("weight_scale", weight_scale), ("input_scale", input_scale)):
        if scale is not None:
            check_tensor(name, scale, ndim=1)
            if scale.dtype != torch.float32:
                raise TypeError(f"{name} must be float32, got {scale.dtype}")
    check_same_dtype(x=x, bias=bias, residual=residual)
    check_same_device(
        x=x,
        weight=weight,
        weight_scale=weight_scale,
        bias=bias,
        residual=residual,
        input_scale=input_scale,
    )
    n, k = _check_product_shapes(x, weight, bias)
    check_shape("weight_scale", weight_scale, (n,))
    if input_scale is not None:
        check_shape("input_scale", input_scale, (k,))
    if residual is not None:
        check_shape("residual", residual, (*x.shape[:-1], n))
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


QUANTISED_TRAINING = "train in float32, float16 or bfloat16 and quantise afterwards"


def refuse_gradients(
    op: str, *tensors: torch.Tensor | None, instead: str = QUANTISED_TRAINING
) -> None:
    """RuntimeError when grad mode is on and one of ``tensors`` requires grad: ``op`` runs
    inference only (a quantised product has no useful gradient); ``instead`` says what to do
    for gradients."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError(
            f"{op} runs inference only and has no gradient: call it under torch.no_grad() / "
            f"torch.inference_mode(), on tensors that do not require grad ({instead})"
        )


def check_linear_quantized_call(
    quantize, x, weight, weight_scale, bias, activation, residual, input_scale
) -> None:
    """The checks of a public linear_int8 / linear_fp8 call (``quantize`` "int8" or "fp8") on
    every backend: the format's input check, then :func:`refuse_gradients` of its floating
    inputs."""
    LINEAR_QUANTIZED_CHECKS[quantize](
        x, weight, weight_scale, bias, activation, residual, input_scale
    )
    refuse_gradients(f"linear_{quantize}", x, weight_scale, bias, residual, input_scale)


# SPLADE's activations: log1p(relu(z)) ("relu", 1 step) or log1p(log1p(relu(z))) (2 steps).
SPLADE_LOG_STEPS = (1, 2)


def check_splade_max(x, weight, bias, cu_seqlens, log_steps) -> None:
    """x: [T, K]; weight: [V, K]; bias: [V]; cu_seqlens: int32 [B + 1] (shapes, dtypes and
    devices; :func:`check_cu_seqlens_values` reads its values); log_steps: 1 or 2."""
    _check_operands(x, weight, bias, x_ndim=2)
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens)
    check_same_dtype(x=x, weight=weight, bias=bias)
    check_same_device(x=x, weight=weight, bias=bias, cu_seqlens=cu_seqlens)
    _check_product_shapes(x, weight, bias, rows="vocabulary")
    if type(log_steps) is not int or log_steps not in SPLADE_LOG_STEPS:
        raise ValueError(f"log_steps must be 1 or 2, got {log_steps!r}")


def check_layer_norm(x, weight, bias, eps, residual) -> None:
    """x: [..., N]; weight, bias: [N]; residual: like x."""
    check_tensor("x", x, min_ndim=1)
    check_tensor("weight", weight, ndim=1)
    check_tensor("bias", bias, ndim=1)
    check_float("x", x)
    if residual is not None:
        check_tensor("residual", residual)
    check_same_dtype(x=x, weight=weight, bias=bias, residual=residual)
    check_same_device(x=x, weight=weight, bias=bias, residual=residual)
    n = x.shape[-1]
    check_shape("weight", weight, (n,))
    check_shape("bias", bias, (n,))
    if residual is not None:
        check_shape("residual", residual, tuple(x.shape))
    check_eps(eps)


def check_eps(eps: object) -> None:
    number = isinstance(eps, (int, float)) and not isinstance(eps, bool)
    if not (number and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a non-negative finite number, got {eps!r}")


def check_embeddings(
    input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb, weight, bias, eps
) -> None:
    """ids: [B, S] integer; tables: [rows, H]; weight, bias: [H]. Shapes only, no values."""
    check_tensor("input_ids", input_ids, ndim=2)
    check_integer("input_ids", input_ids)
    for name, t in (("token_type_ids", token_type_ids), ("position_ids", position_ids)):
        if t is not None:
            check_tensor(name, t)
            check_integer(name, t)
    if token_type_ids is not None:
        check_shape("token_type_ids", token_type_ids, tuple(input_ids.shape))
    if position_ids is not None and tuple(position_ids.shape) not in (
        tuple(input_ids.shape),
        (input_ids.shape[1],),
    ):
        raise ValueError(
            f"position_ids must have shape {tuple(input_ids.shape)} or ({input_ids.shape[1]},), "
            f"got {tuple(position_ids.shape)}"
        )
    for name, t in (("word_emb", word_emb), ("pos_emb", pos_emb), ("type_emb", type_emb)):
        check_tensor(name, t, ndim=2)
        check_float(name, t)
    check_tensor("weight", weight, ndim=1)
    check_tensor("bias", bias, ndim=1)
    check_same_dtype(
        word_emb=word_emb, pos_emb=pos_emb, type_emb=type_emb, weight=weight, bias=bias
    )
    check_same_device(
        input_ids=input_ids,
        token_type_ids=token_type_ids,
        position_ids=position_ids,
        word_emb=word_emb,
        pos_emb=pos_emb,
        type_emb=type_emb,
        weight=weight,
        bias=bias,
    )
    hidden = word_emb.shape[1]
    for name, t in (("pos_emb", pos_emb), ("type_emb", type_emb)):
        if t.shape[1] != hidden:
            raise ValueError(f"{name} has width {t.shape[1]} but word_emb has width {hidden}")
    check_shape("weight", weight, (hidden,))
    check_shape("bias", bias, (hidden,))
    check_eps(eps)


def id_bounds(ids: torch.Tensor) -> torch.Tensor:
    """int64 [2] on ``ids``' device: the smallest and the largest of a non-empty id tensor."""
    return torch.stack(ids.aminmax()).to(torch.int64)


def check_id_bounds(name: str, limit: int, lowest: int, highest: int) -> None:
    """Ids of ``name`` spanning [lowest, highest] must index a table of ``limit`` rows."""
    if lowest < 0 or highest >= limit:
        raise ValueError(f"{_id_range_message(name, limit)}, found values in [{lowest}, {highest}]")


def _id_range_message(name: str, limit: int) -> str:
    return f"{name} must lie in [0, {limit - 1}] (the table has {limit} rows)"


def check_id_ranges(
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    vocab_size: int,
    type_vocab_size: int,
    max_positions: int,
    *,
    also_read: Sequence[torch.Tensor] = (),
) -> list[list[int]]:
    """Every id indexes its table. One host synchronisation for all three tensors, which also
    reads ``also_read`` (int64 [2] tensors on the ids' device, for a caller that needs those
    values on the host too): returns their values, in order. Under ``torch.compile`` on a CPU,
    with nothing else to read, the graph asserts the ranges instead (a RuntimeError)."""
    tensors = [("input_ids", input_ids, vocab_size)]
    if token_type_ids is not None:
        tensors.append(("token_type_ids", token_type_ids, type_vocab_size))
    if position_ids is not None:
        tensors.append(("position_ids", position_ids, max_positions))
    if input_ids.numel() == 0:
        tensors = []
    if not tensors and not also_read:
        return []
    if torch.compiler.is_compiling() and not also_read and input_ids.device.type == "cpu":
        # No host read inside a graph (fullgraph=True could not trace one): the graph asserts,
        # raising a RuntimeError with the message. (On a GPU that would be a device-side
        # assert, which ends the process's CUDA context: there the read stays, a graph break.)
        for name, t, limit in tensors:
            torch._assert_async(((t >= 0) & (t < limit)).all(), _id_range_message(name, limit))
        return []
    read = torch.stack([id_bounds(t) for _, t, _ in tensors] + list(also_read)).tolist()
    for (name, _, limit), (lowest, highest) in zip(tensors, read):
        check_id_bounds(name, limit, lowest, highest)
    return read[len(tensors) :]


def check_embedding_ids(
    input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb
) -> None:
    """:func:`check_id_ranges` of the embeddings' ids against their tables' rows (one host
    synchronisation)."""
    tables = (word_emb.shape[0], type_emb.shape[0], pos_emb.shape[0])
    check_id_ranges(input_ids, token_type_ids, position_ids, *tables)


# Id dtypes every backend indexes with as they are; other integer ids are widened to int64
# (PyTorch indexing refuses int8 / int16 and takes uint8 as a boolean mask).
INDEX_DTYPES = (torch.int32, torch.int64)


def as_index(ids: torch.Tensor | None) -> torch.Tensor | None:
    """Integer ids in a dtype every backend indexes with (int32 / int64 kept, others int64)."""
    if ids is None or ids.dtype in INDEX_DTYPES:
        return ids
    return ids.to(torch.int64)
