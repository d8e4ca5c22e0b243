"""FLOPs and bytes moved per op and per BERT forward, for throughput and roofline figures.

Conventions (the ones used by FlashAttention and cuBLAS papers):

- A multiply-add is 2 FLOPs: a GEMM [m, k] x [k, n] is ``2 m n k``; attention is
  ``4 B H S_q S_k D`` (Q K^T and P V; the softmax is not counted).
- Bytes are the unavoidable HBM traffic of the fused op: each input read once, each output
  written once (weights included), ``elem`` bytes per element of the activation dtype, 1 byte
  per mask element, 8 bytes per int64 id. Intermediates a fused kernel keeps on chip (the
  attention scores, the GEMM before its GELU) are not counted.
- Elementwise FLOPs of memory-bound ops (LayerNorm, softmax) are counted as a small constant
  per element; they never decide the roofline.
- The forward counted is fastbert's: fused QKV GEMM, attention, output GEMM, residual
  LayerNorm, GELU FFN (GELU fused into the first GEMM), residual LayerNorm; embeddings with
  their LayerNorm first and the pooler last (when the model has one). A dense forward counts
  every one of the B x S positions; a padding-free forward counts the real tokens only (pass
  ``lengths``).
- The config's variants count as they run: a gated FFN (GeGLU) has an input projection of
  twice the intermediate width; a sliding-window layer's attention counts only the (query,
  key) pairs within the window; linears without bias read none; a pre-norm model ends with
  one more LayerNorm; the embeddings gather one row per table the model has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from fastbert.model.config import BertConfig

MASK_BYTES = 1
ID_BYTES = 8
LAYER_NORM_FLOPS_PER_ELEMENT = 8
SOFTMAX_FLOPS_PER_ELEMENT = 5


@dataclasses.dataclass(frozen=True)
class OpCount:
    """One op's work: ``flops`` (FLOPs) and ``bytes`` (bytes of HBM traffic)."""

    name: str
    flops: float
    bytes: float


def linear(
    m: int,
    n: int,
    k: int,
    elem: int,
    *,
    bias: bool = True,
    residual: bool = False,
    name: str = "linear",
) -> OpCount:
    """x [m, k] @ W^T [k, n] (+ bias [n]) (+ residual [m, n]) -> [m, n]."""
    elements = m * k + n * k + m * n + (n if bias else 0) + (m * n if residual else 0)
    return OpCount(name, 2.0 * m * n * k, float(elements * elem))


def window_pairs(length: int, window: int | None) -> int:
    """(query, key) pairs of a sequence of ``length`` tokens whose keys are at most ``window``
    positions from their query (None: every pair)."""
    if window is None or window >= length:
        return length * length
    # Each query sees 2 * window + 1 keys, less those past either end of the sequence.
    cut = window * (window + 1)
    return length * (2 * window + 1) - cut


def attention(
    batch: int,
    heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    elem: int,
    *,
    masked: bool = True,
    window: int | None = None,
) -> OpCount:
    """q [B, H, S_q, D], k and v [B, H, S_k, D], a [B, S_k] key-padding mask -> [B, H, S_q, D];
    ``window``: each query attends to the keys at most that far from it (S_q = S_k)."""
    pairs = seq_q * seq_k if window is None else window_pairs(seq_q, window)
    flops = 4.0 * batch * heads * pairs * head_dim
    elements = batch * heads * head_dim * (2 * seq_q + 2 * seq_k)
    mask = batch * seq_k * MASK_BYTES if masked else 0
    return OpCount("attention", flops, float(elements * elem + mask))


def attention_varlen(
    lengths: Sequence[int], heads: int, head_dim: int, elem: int, window: int | None = None
) -> OpCount:
    """Packed q, k, v [T, H, D] (T = sum of lengths), each sequence attending to itself (within
    ``window`` of each query when given)."""
    flops = 4.0 * heads * head_dim * sum(window_pairs(n, window) for n in lengths)
    elements = 4 * sum(lengths) * heads * head_dim
    return OpCount("attention", flops, float(elements * elem + 4 * (len(lengths) + 1)))


def softmax(batch: int, heads: int, seq_q: int, seq_k: int, elem: int) -> OpCount:
    """Masked softmax of scores [B, H, S_q, S_k] (read once, probabilities written once)."""
    elements = batch * heads * seq_q * seq_k
    return OpCount(
        "softmax",
        float(SOFTMAX_FLOPS_PER_ELEMENT * elements),
        float(2 * elements * elem + batch * seq_k * MASK_BYTES),
    )


def layer_norm(rows: int, hidden: int, elem: int, *, residual: bool = True) -> OpCount:
    """LayerNorm(x + residual) of [rows, hidden] with weight and bias [hidden]."""
    elements = rows * hidden * (3 if residual else 2) + 2 * hidden
    return OpCount(
        "layer_norm", float(LAYER_NORM_FLOPS_PER_ELEMENT * rows * hidden), float(elements * elem)
    )


def embeddings(tokens: int, hidden: int, elem: int, tables: int = 3) -> OpCount:
    """``tables`` table rows gathered per token (word, position, token type), summed and
    layer-normed -> [tokens, hidden]."""
    elements = (tables + 1) * tokens * hidden + 2 * hidden
    return OpCount(
        "embeddings",
        float(LAYER_NORM_FLOPS_PER_ELEMENT * tokens * hidden),
        float(elements * elem + 2 * tokens * ID_BYTES),
    )


def bert_layer(config: BertConfig, tokens: int, attention_op: OpCount, elem: int) -> list[OpCount]:
    """One encoder layer over ``tokens`` positions; ``attention_op`` is its attention."""
    h, i = config.hidden_size, config.intermediate_size
    bias = config.linear_bias
    return [
        linear(tokens, 3 * h, h, elem, bias=bias, name="qkv"),
        attention_op,
        linear(tokens, h, h, elem, bias=bias, name="attn_out"),
        layer_norm(tokens, h, elem),
        linear(tokens, 2 * i if config.glu else i, h, elem, bias=bias, name="ffn_in_gelu"),
        linear(tokens, h, i, elem, bias=bias, name="ffn_out"),
        layer_norm(tokens, h, elem),
    ]


def bert_forward(
    config: BertConfig,
    batch: int,
    seq: int,
    elem: int,
    lengths: Sequence[int] | None = None,
    *,
    pooler: bool = True,
) -> list[OpCount]:
    """Every op of one BertModel forward (the pooler too, with ``pooler``).

    Dense (``lengths`` None): all ``batch * seq`` positions. Padding-free: ``lengths`` (one per
    sequence, each <= seq) gives the real tokens, and only they are counted.
    """
    heads, head_dim, h = config.num_attention_heads, config.head_dim, config.hidden_size
    if lengths is not None and (len(lengths) != batch or any(n < 0 or n > seq for n in lengths)):
        raise ValueError(f"need {batch} lengths in [0, {seq}], got {list(lengths)}")
    tokens = batch * seq if lengths is None else sum(lengths)

    def attention_op(window: int | None) -> OpCount:
        if lengths is None:
            return attention(batch, heads, seq, seq, head_dim, elem, window=window)
        return attention_varlen(lengths, heads, head_dim, elem, window)

    tables = 1 + (config.position_scheme != "rotary") + (config.type_vocab_size > 0)
    ops = [embeddings(tokens, h, elem, tables)]
    for index in range(config.num_hidden_layers):
        sliding = config.layer_type(index) == "sliding_attention"
        ops += bert_layer(config, tokens, attention_op(config.window if sliding else None), elem)
    if config.norm_position == "pre":
        ops.append(layer_norm(tokens, h, elem, residual=False))
    if pooler:
        ops.append(linear(batch, h, h, elem, name="pooler"))
    return ops


def total_flops(ops: Iterable[OpCount]) -> float:
    return sum(op.flops for op in ops)


def total_bytes(ops: Iterable[OpCount]) -> float:
    return sum(op.bytes for op in ops)


def roofline_ms(ops: Iterable[OpCount], peak_tflops: float, peak_tbps: float) -> float:
    """The least time (ms) the ops can take: each op bound by compute or by memory, summed."""
    return (
        sum(max(op.flops / (peak_tflops * 1e12), op.bytes / (peak_tbps * 1e12)) for op in ops) * 1e3
    )
