"""Pure-PyTorch reference of every fastbert op: each op's semantics, the ``reference`` of its
declaration (op.py), whose signature and docstring the op's other implementations
share.

It is the oracle of the tests (called with float32 or float64 inputs; it runs on any device and
dtype), not a backend: the torch backend is torch_ops.py. It follows what eager PyTorch
/ Hugging Face do in the input dtype: matrix products in the input dtype, softmax and LayerNorm
statistics in float32 (in float64 for float64 inputs, so that the float64 oracle is float64
throughout). Masked keys are excluded from the softmax; a query row whose keys are all masked
gets zeros, never NaN. Masked keys have no influence whatever K, V or the scores hold there, NaN
and Inf included (the semantics of FlashAttention and xformers): their scores are replaced
before the softmax and their values zeroed before the product with the probabilities. In
``attention_varlen`` a sequence never sees another's tokens.

Relative position bias (MPNet): ``relative_bias`` is a per-head table [H, RELATIVE_BUCKETS];
the score of query i and key j gains ``relative_bias[h, relative_position_bucket(j - i)]``
after scaling, before the softmax (T5-style log-spaced buckets of the key - query distance,
computed with Hugging Face MPNet's float math, :func:`relative_position_bucket`). Positions are
counted inside each sequence (0..S-1 of the dense batch; a packed sequence's own tokens).

Rotary position embeddings (RoPE, ModernBERT): ``rotary`` holds the float32 inverse frequencies
[D / 2]; before the scores, the query and key at position p are rotated as Hugging Face's
``apply_rotary_pos_emb`` does (the two halves of the head dim form the pairs, "rotate half"):
``x1' = x1 cos - x2 sin``, ``x2' = x2 cos + x1 sin`` with the angle ``p * rotary[i]`` rounded to
float32 (Hugging Face's product), cos and sin in the statistics' precision, the rotated values
cast back to the input dtype. Sliding window (ModernBERT's local layers): with ``window`` w,
query i attends only to keys j with ``|i - j| <= w`` (Hugging Face's bidirectional sliding
window, w = local_attention // 2); positions as above.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import checks, dropout
from .checks import RELATIVE_BUCKETS
from .op import implements

# Hugging Face MPNet's bucketing: log-spaced up to this distance, the last bucket beyond.
RELATIVE_MAX_DISTANCE = 128


def relative_position_bucket(
    relative_position: torch.Tensor,
    num_buckets: int = RELATIVE_BUCKETS,
    max_distance: int = RELATIVE_MAX_DISTANCE,
) -> torch.Tensor:
    """The bucket (int64, same shape) of each key - query distance, bidirectional and
    log-spaced as in T5 / Hugging Face MPNet, with its float32 rounding: half the buckets for
    keys after the query; inside a half, distances below a quarter of the buckets get one each,
    the rest share log-spaced buckets up to ``max_distance`` and the last bucket beyond."""
    n = -relative_position.long()
    half = num_buckets // 2
    bucket = (n < 0).long() * half
    n = n.abs()
    max_exact = half // 2
    is_small = n < max_exact
    large = (
        max_exact
        + (
            torch.log(n.float() / max_exact)
            / math.log(max_distance / max_exact)
            * (half - max_exact)
        ).long()
    )
    large = torch.clamp(large, max=half - 1)
    return bucket + torch.where(is_small, n, large)


def relative_position_bias(table: torch.Tensor, seq_q: int, seq_k: int) -> torch.Tensor:
    """The [H, S_q, S_k] bias of a [H, RELATIVE_BUCKETS] table: table[h, bucket(j - i)]."""
    device = table.device
    distance = (
        torch.arange(seq_k, device=device)[None, :] - torch.arange(seq_q, device=device)[:, None]
    )
    return table[:, relative_position_bucket(distance)]


def rotary_angles(positions: torch.Tensor, rotary: torch.Tensor) -> torch.Tensor:
    """float32 [S, D / 2]: the angles of RoPE at ``positions`` (int [S]) for the inverse
    frequencies ``rotary`` [D / 2], in float32 as Hugging Face computes them."""
    return positions.float()[:, None] * rotary.float()[None, :]


def rotary_positions(
    x: torch.Tensor, rotary: torch.Tensor, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """x: [..., S, D] rotated by RoPE at ``positions`` (int [S], default 0..S-1) with the float32
    inverse frequencies ``rotary`` [D / 2] (see the module docstring). Returns x's dtype."""
    seq, dim = x.shape[-2], x.shape[-1]
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    angle = rotary_angles(positions, rotary)
    wide = _wide(x)
    angle = angle.to(wide.dtype)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = wide[..., : dim // 2], wide[..., dim // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def keep_mask(
    key_padding_mask: torch.Tensor | None, window: int | None, seq_q: int, seq_k: int, device
) -> torch.Tensor | None:
    """bool [B or 1, 1, S_q, S_k], True where query i may attend key j (a real key, inside
    the window when there is one), or None when every key may be attended."""
    keep = None
    if key_padding_mask is not None:
        keep = key_padding_mask.bool()[:, None, None, :]
    if window is not None:
        distance = (
            torch.arange(seq_k, device=device)[None, :]
            - torch.arange(seq_q, device=device)[:, None]
        )
        inside = (distance.abs() <= window)[None, None]
        keep = inside if keep is None else keep & inside
    return keep


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or left in float64: the precision of softmax and LayerNorm statistics."""
    return t if t.dtype == torch.float64 else t.float()


def _mask_logits(scores: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """scores: float32 / float64 [B, H, S_q, S_k] -> probabilities (keys outside ``keep``, a
    bool mask broadcasting to the scores, excluded; empty rows zero). Scores at excluded keys
    are replaced, so a NaN or Inf there changes nothing."""
    if keep is None:
        return torch.softmax(scores, dim=-1)
    probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return probs.masked_fill(~keep.any(dim=-1, keepdim=True), 0.0)


def _drop_probs(
    probs: torch.Tensor, dropout_p: float, dropout_mask: torch.Tensor | None
) -> torch.Tensor:
    """dropout(probs): ``dropout_mask`` (bool, True = kept) when given, else a fresh one."""
    if dropout_mask is None:
        return F.dropout(probs, dropout_p) if dropout_p > 0.0 else probs
    checks.check_shape("dropout_mask", dropout_mask, tuple(probs.shape))
    return torch.where(dropout_mask, probs / (1.0 - dropout_p), 0.0)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    relative_bias: torch.Tensor | None = None,
    *,
    rotary: torch.Tensor | None = None,
    window: int | None = None,
    dropout_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """dropout(softmax(scale * rope(q) @ rope(k)^T + bias, masked keys excluded)) @ v.

    q: [B, H, S_q, D]; k, v: [B, H, S_k, D]; key_padding_mask: [B, S_k] bool or 0/1 int
    (True/1 = real token). Masked keys have no influence, even when K or V hold NaN or Inf
    there; a query row with no real key returns zeros. dropout_p: each probability is dropped
    with this probability, the kept ones scaled by 1 / (1 - p) (the softmax normaliser is taken
    before dropout). dropout_mask: bool [B, H, S_q, S_k], True = kept, to apply a given mask
    (the tests pass the Triton kernel's) instead of drawing one. relative_bias: [H,
    RELATIVE_BUCKETS] float table; bias_ij = relative_bias[h, relative_position_bucket(j - i)]
    (none when None). rotary: float32 [D / 2] RoPE inverse frequencies, positions 0..S-1;
    window: keys farther than ``window`` positions from the query are excluded (see the module
    docstring). Returns [B, H, S_q, D] in q's dtype.
    """
    checks.check_attention(q, k, v, key_padding_mask, scale)
    checks.check_relative_bias(relative_bias, q)
    checks.check_rotary(rotary, window, q)
    dropout_p = dropout.check_dropout_p(dropout_p)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if rotary is not None:
        q, k = rotary_positions(q, rotary), rotary_positions(k, rotary)
    scores = _wide(torch.matmul(q, k.transpose(-1, -2))) * scale
    if relative_bias is not None:
        scores = scores + _wide(relative_position_bias(relative_bias, q.shape[2], k.shape[2]))
    keep = keep_mask(key_padding_mask, window, q.shape[2], k.shape[2], q.device)
    probs = _drop_probs(_mask_logits(scores, keep), dropout_p, dropout_mask)
    if key_padding_mask is not None:
        # Masked keys have probability 0, but 0 times a NaN or Inf in V would still be NaN.
        v = v.masked_fill(~key_padding_mask.bool()[:, None, :, None], 0.0)
    return torch.matmul(probs.to(v.dtype), v)


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float | None = None,
    dropout_p: float = 0.0,
    relative_bias: torch.Tensor | None = None,
    *,
    rotary: torch.Tensor | None = None,
    window: int | None = None,
    dropout_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention over packed sequences: tokens cu_seqlens[i]:cu_seqlens[i+1] attend each other.

    q, k, v: [T, H, D]; cu_seqlens: int32 [B + 1] prefix sums of the lengths; dropout_p,
    relative_bias, rotary and window as in :func:`attention` (positions and distances are a
    sequence's own: its first token is at position 0);
    dropout_mask: bool [H, T, T] indexed by global token positions, True = kept. Returns
    [T, H, D]; tokens outside every sequence get zeros.
    """
    checks.check_attention_varlen(q, k, v, cu_seqlens, max_seqlen, scale)
    checks.check_relative_bias(relative_bias, q)
    checks.check_rotary(rotary, window, q)
    out = torch.zeros_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            seq = [t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
            mask = None if dropout_mask is None else dropout_mask[None, :, start:end, start:end]
            attended = attention(
                *seq,
                scale=scale,
                dropout_p=dropout_p,
                relative_bias=relative_bias,
                rotary=rotary,
                window=window,
                dropout_mask=mask,
            )
            out[start:end] = attended[0].transpose(0, 1)
    return out


def scaled_masked_softmax(
    scores: torch.Tensor, key_padding_mask: torch.Tensor | None = None, scale: float = 1.0
) -> torch.Tensor:
    """softmax(scale * scores) over the last dim with masked keys excluded (fp32 math).

    scores: [B, H, S_q, S_k]; key_padding_mask: [B, S_k]. Returns probabilities in scores' dtype;
    masked keys get exactly 0 (whatever their scores, NaN and Inf included), and rows whose keys
    are all masked are zeros.
    """
    checks.check_softmax(scores, key_padding_mask, scale)
    keep = None if key_padding_mask is None else key_padding_mask.bool()[:, None, None, :]
    return _mask_logits(_wide(scores) * float(scale), keep).to(scores.dtype)


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation == "gelu":
        return F.gelu(y)
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    return y


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    *,
    gated: bool = False,
) -> torch.Tensor:
    """act(x @ weight^T + bias) + residual; gated: act(input) * gate + residual (a GLU).

    x: [..., K]; weight: [N, K] (nn.Linear layout); bias: [N]; residual: [..., N] ([..., N / 2]
    when gated); activation: None, "gelu" (exact erf) or "gelu_tanh". ``gated``: the product's
    first N / 2 columns are the input and the last N / 2 the gate, as Hugging Face's
    ``Wi(x).chunk(2, dim=-1)`` (ModernBERT's GeGLU with activation "gelu"). Returns [..., N]
    ([..., N / 2] when gated) in x's dtype.
    """
    checks.check_linear(x, weight, bias, activation, residual, gated)
    y = F.linear(x, weight, bias)
    if gated:
        value, gate = y.chunk(2, dim=-1)
        y = _activate(value, activation) * gate
    else:
        y = _activate(y, activation)
    return y if residual is None else y + residual


INT8_MAX = 127
# The largest finite float8 e4m3 value (torch.float8_e4m3fn: no infinities).
FP8_E4M3_MAX = 448.0
QUANTIZATIONS = ("int8", "fp8")


def quantize_rows(
    x: torch.Tensor, input_scale: torch.Tensor | None = None, quantize: str = "int8"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric quantisation of each row (the last dim) of ``x``, in float32: to int8
    (``quantize="int8"``) or to float8 e4m3 (``"fp8"``, torch.float8_e4m3fn).

    ``input_scale`` (float32 [K], optional) multiplies x's columns first (row = x * input_scale,
    one float32 product). With a = max |row|, Q = 127 (int8) or 448 (e4m3's largest value) and
    inv = Q / a (0 for a row of zeros)::

        int8:  q = round(row * inv)   (half to even; |q| <= 127)         scale = a / 127
        fp8:   q = e4m3(row * inv)    (nearest e4m3, ties to even;       scale = a / 448
                                       |q| <= 448, saturating)

    so that row ~= q * scale. Returns (q: int8 or float8_e4m3fn [..., K], scale: float32 [...]).
    The weights (one row per output channel) and the activations (one row per token) of
    :func:`linear_int8` and :func:`linear_fp8` are quantised so. The Triton kernel computes the
    same float32 operations (IEEE division and products, round half to even) and gets the same
    bits; here the e4m3 rounding is PyTorch's own conversion.
    """
    checks.check_tensor("x", x, min_ndim=1)
    checks.check_float("x", x)
    if quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {QUANTIZATIONS}, got {quantize!r}")
    q_max = float(INT8_MAX) if quantize == "int8" else FP8_E4M3_MAX
    x32 = x.float()
    if input_scale is not None:
        x32 = x32 * input_scale
    if x32.shape[-1] == 0:
        absmax = x32.new_zeros(x32.shape[:-1])
    else:
        absmax = x32.abs().amax(dim=-1)
    # A tensor numerator: a Python number over a tensor is a reciprocal and a product (two
    # roundings), not the one IEEE division the kernel makes.
    inv = torch.where(absmax > 0, absmax.new_tensor(q_max) / absmax, 0.0)
    y = x32 * inv[..., None]
    if quantize == "int8":
        q = torch.round(y).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    else:
        q = y.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, absmax / absmax.new_tensor(q_max)


def quantize_weight(
    weight: torch.Tensor, quantize: str = "int8"
) -> tuple[torch.Tensor, torch.Tensor]:
    """An nn.Linear weight [N, K] -> (int8 or float8_e4m3fn [N, K], float32 [N] scales), one
    scale per output channel (:func:`quantize_rows` of its rows): what :func:`linear_int8`
    (``quantize="int8"``) and :func:`linear_fp8` (``"fp8"``) take."""
    checks.check_tensor("weight", weight, ndim=2)
    return quantize_rows(weight.detach(), quantize=quantize)


def linear_int8(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """act(dequantised int8 product + bias) + residual: :func:`linear` with int8 operands.

    x: [..., K] float, quantised per token (:func:`quantize_rows`: int8 q_x, float32 s_x);
    weight: int8 [N, K] and weight_scale: float32 [N], one scale per output channel (from
    :func:`quantize_weight`); bias: [N] and residual: [..., N] in x's dtype; input_scale:
    optional float32 [K] multiplying x's columns before the quantisation (SmoothQuant's
    migration of activation outliers into the weight, whose columns were divided by it before
    :func:`quantize_weight`: the product is unchanged, its activations easier to quantise).
    Per element::

        acc[m, n] = sum_k q_x[m, k] * weight[n, k]               (exact integers)
        out[m, n] = act(acc[m, n] * (s_x[m] * weight_scale[n]) + bias[n]) + residual[m, n]

    computed here in float64 from the int8 operands; returns x's dtype. Inference only.
    """
    return _dequantised_linear(
        "int8", x, weight, weight_scale, bias, activation, residual, input_scale
    )


@implements(linear_int8)
def linear_fp8(x, weight, weight_scale, bias, activation, residual, input_scale):
    """act(dequantised e4m3 product + bias) + residual: :func:`linear` with float8 e4m3
    operands.

    x: [..., K] float, quantised per token (:func:`quantize_rows` with ``quantize="fp8"``:
    float8_e4m3fn q_x, float32 s_x = max |row| / 448); weight: float8_e4m3fn [N, K] and
    weight_scale: float32 [N], one scale per output channel (from :func:`quantize_weight`);
    bias, residual and input_scale as in :func:`linear_int8`. Per element::

        acc[m, n] = sum_k q_x[m, k] * weight[n, k]       (each product exact in float32)
        out[m, n] = act(acc[m, n] * (s_x[m] * weight_scale[n]) + bias[n]) + residual[m, n]

    computed here in float64 from the e4m3 operands; returns x's dtype. Inference only.
    """
    return _dequantised_linear(
        "fp8", x, weight, weight_scale, bias, activation, residual, input_scale
    )


def _dequantised_linear(
    quantize, x, weight, weight_scale, bias, activation, residual, input_scale
) -> torch.Tensor:
    """:func:`linear_int8` (``quantize="int8"``) or :func:`linear_fp8` (``"fp8"``): the format's
    input check, then the product of the quantised operands in float64 (int8 sums are integers
    below 2**53: exact), dequantised, then the bias, activation and residual in float64;
    returns x's dtype."""
    checks.LINEAR_QUANTIZED_CHECKS[quantize](
        x, weight, weight_scale, bias, activation, residual, input_scale
    )
    q, scale = quantize_rows(x, input_scale, quantize)
    acc = torch.matmul(q.double(), weight.double().T)
    y = acc * (scale.double()[..., None] * weight_scale.double())
    if bias is not None:
        y = y + bias.double()
    y = _activate(y, activation)
    if residual is not None:
        y = y + residual.double()
    return y.to(x.dtype)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """LayerNorm(dropout(x) + residual) over the last dim, statistics in float32.

    x, residual: [..., N]; weight, bias: [N]. ``dropout_p``: ``F.dropout`` of x (PyTorch's
    own mask, not the kernels'). Returns x's shape and dtype.
    """
    checks.check_layer_norm(x, weight, bias, eps, residual)
    dropout_p = dropout.check_dropout_p(dropout_p)
    if dropout_p > 0.0:
        x = F.dropout(x, dropout_p)
    s = x if residual is None else x + residual
    n = x.shape[-1]
    return F.layer_norm(_wide(s), (n,), _wide(weight), _wide(bias), float(eps)).to(x.dtype)


def embeddings_layer_norm(
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    word_emb: torch.Tensor,
    pos_emb: torch.Tensor,
    type_emb: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    *,
    check_ids: bool = True,
    dropout_p: float = 0.0,
    padding_idx: int | None = None,
    position_padding_idx: int | None = None,
) -> torch.Tensor:
    """dropout(LayerNorm(word_emb[ids] + pos_emb[position_ids] + type_emb[token_type_ids])).

    input_ids, token_type_ids: [B, S] integers (token types default to 0); position_ids:
    [B, S] or [S] (default 0..S-1); tables: [rows, H]; weight, bias: [H]. Returns [B, S, H]
    in the tables' dtype. Ids outside their table raise ValueError (``check_ids=False``: the
    caller has checked them, and this skips the host synchronisation the check costs).
    ``dropout_p``: ``F.dropout`` of the output (PyTorch's own mask, not the kernels').
    ``padding_idx`` / ``position_padding_idx``: the word / position row that gets no gradient,
    as with ``nn.Embedding(padding_idx=...)`` (Hugging Face's tables); None: every row gets its
    gradient. The output does not depend on them.
    """
    checks.check_embeddings(
        input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb, weight, bias, eps
    )
    dropout_p = dropout.check_dropout_p(dropout_p)
    if check_ids:
        checks.check_embedding_ids(
            input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb
        )
    seq = input_ids.shape[1]
    if position_ids is None:
        position_ids = torch.arange(seq, device=input_ids.device)
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    input_ids, token_type_ids, position_ids = map(
        checks.as_index, (input_ids, token_type_ids, position_ids)
    )
    summed = (
        _wide(F.embedding(input_ids, word_emb, padding_idx))
        + _wide(F.embedding(position_ids, pos_emb, position_padding_idx))
        + _wide(type_emb[token_type_ids])
    )
    hidden = word_emb.shape[1]
    out = F.layer_norm(summed, (hidden,), _wide(weight), _wide(bias), float(eps))
    out = out.to(word_emb.dtype)
    return F.dropout(out, dropout_p) if dropout_p > 0.0 else out


def splade_activation(
    z: torch.Tensor, log_steps: int = 1, *, in_place: bool = False
) -> torch.Tensor:
    """SPLADE's activation of logits ``z``: ``log1p(relu(z))`` (``log_steps=1``, SPLADE's and
    sentence-transformers' "relu") or ``log1p(log1p(relu(z)))`` (``log_steps=2``,
    "log1p_relu"). A new tensor of z's shape and dtype, or ``z`` itself, overwritten, when
    ``in_place``."""
    out = torch.relu_(z) if in_place else torch.relu(z)
    for _ in range(log_steps):
        out = out.log1p_() if in_place else torch.log1p(out)
    return out


def splade_max(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    log_steps: int = 1,
) -> torch.Tensor:
    """SPLADE pooling of the masked-LM decoder: per sequence, the max over its tokens of
    :func:`splade_activation` of each vocabulary logit, unfused (sentence-transformers' order).

    x: [T, K] packed token rows; weight: [V, K] (nn.Linear layout: the decoder, or the tied
    word embeddings); bias: [V] or None; cu_seqlens: int32 [B + 1] prefix sums of the sequences'
    lengths (0 first, T last; None: one sequence of all T rows). The [T, V] logits
    ``x @ weight^T + bias`` are formed in x's dtype, then activated and reduced in float32
    (float64 for float64 inputs)::

        out[b, v] = max over t in [cu_seqlens[b], cu_seqlens[b + 1]) of g(logits[t, v])

    with g(z) = log1p(relu(z)) (``log_steps=1``) or log1p(log1p(relu(z))) (``log_steps=2``).
    An empty sequence gives zeros. Returns [B, V], float32 (float64 for float64 inputs).
    """
    checks.check_splade_max(x, weight, bias, cu_seqlens, log_steps)
    tokens = x.shape[0]
    if cu_seqlens is not None:
        checks.check_cu_seqlens_values(cu_seqlens, tokens)
    bounds = [0, tokens] if cu_seqlens is None else cu_seqlens.tolist()
    activated = splade_activation(_wide(F.linear(x, weight, bias)), log_steps)
    out = activated.new_zeros((len(bounds) - 1, weight.shape[0]))
    for b, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end > start:
            out[b] = activated[start:end].amax(dim=0)
    return out
