"""The plain ``torch`` backend: every hot op on PyTorch's primitives, any device and dtype.

Same signatures and semantics as fastbert.kernels.reference (the tests' float64 oracle), built
for speed instead of exactness, and nothing but PyTorch's own operators: what
``backend="torch"`` runs on a GPU, and what the CPU engine (fastbert.kernels.cpu_engine) falls
back to for the calls it does not take:

- attention: ``F.scaled_dot_product_attention`` (PyTorch's flash kernels on CPU and CUDA) with
  the key-padding mask broadcast as a boolean [B, 1, 1, S_k] mask. A relative position bias
  (MPNet) is expanded to its [H, S_q, S_k] float tensor and passed as SDPA's additive mask,
  -inf at masked keys (the simple way: this backend is not the fast path for it). Masked keys
  have no influence, NaN and Inf included: with a mask, K and V are zeroed there first (SDPA
  would otherwise compute 0 * NaN), so pass no mask for a batch without padding (the encoder
  does). A query row whose keys are all masked returns zeros.
- attention_varlen: the packed tokens gathered into a dense [B, max_seqlen] batch by index
  tensors (no loop over the sequences, no host read; a padded slot repeats a token of its own
  sequence, so no other sequence's values, NaN included, enter a row), run through SDPA with
  the padding mask, and gathered back to [T, H, D].
- linear: ``F.linear`` (one addmm with the bias), GELU (times the gate when gated) and the
  residual add in place on its fresh output (:func:`finish_linear`).
- linear_int8 / linear_fp8: x quantised per token (:func:`quantize_rows`), the integer
  product on ``torch._int_mm`` (int8) or the e4m3 operands' float32 product (fp8, an
  emulation), the dequantisation, bias, GELU and residual in place in float32.
- splade_max (the fused SPLADE head): fastbert.kernels.sparse_head_torch, the decoder's
  logits reduced to a max per sequence one chunk of the vocabulary at a time.
- layer_norm: ``F.layer_norm`` on the input dtype (PyTorch accumulates the statistics of half
  inputs in float32 itself), in float32 for a float16 call on a CPU that records gradients.
- embeddings_layer_norm: ``F.embedding`` lookups summed in place (in float32 for half tables,
  as the reference does), then ``F.layer_norm``.

Each public op validates its inputs (fastbert.kernels.checks) as the other backends do;
the public ``attention_varlen`` also reads the longest sequence on the host to check
``max_seqlen``. The encoder builds its ops' inputs itself after validating the model's inputs,
so it runs the ``*_unchecked`` functions (each op's ``Op.torch``), the same ops without the
per-call checks (microseconds each, dozens of calls a forward). Unchecked, no op reads a value
on the host (but the embeddings' id-range check when asked for), so a forward keeps to its one
host read and the ops trace under ``torch.compile`` and capture into CUDA graphs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import checks, reference
from .checks import as_index
from .cpu_library import has_int8_dot_products
from .dropout import check_dropout_p
from .op import checked, implements

HALF_DTYPES = (torch.float16, torch.bfloat16)


def _sdpa_masked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor,
    scale: float | None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """SDPA of q [B, H, S_q, D] over the keys ``keep`` (bool [B, S_k]) marks real; k and v
    [B, H, S_k, D] must hold zeros at masked keys.

    A batch row without a real key attends to all of its (zero) values instead, so it returns
    exact zeros on every SDPA backend, with no host read to find such rows."""
    attend = keep | keep.any(1, keepdim=True).logical_not()
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=attend[:, None, None, :], dropout_p=dropout_p, scale=scale
    )


def _bias_mask(
    relative_bias: torch.Tensor, attend: torch.Tensor | None, seq_q: int, seq_k: int, dtype
) -> torch.Tensor:
    """SDPA's additive float mask: the [H, S_q, S_k] relative position bias in ``dtype``, and
    with ``attend`` (bool [B, S_k], True = a key to attend) -inf at the other keys
    ([B, H, S_q, S_k])."""
    bias = reference.relative_position_bias(relative_bias, seq_q, seq_k).to(dtype)
    if attend is None:
        return bias
    return bias.masked_fill(attend.logical_not()[:, None, None, :], float("-inf"))


def _sdpa_windowed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    window: int,
    scale: float | None,
    dropout_p: float,
    relative_bias: torch.Tensor | None,
) -> torch.Tensor:
    """SDPA with a sliding window: one boolean (or, with a relative bias, additive)
    [B or 1, 1 or H, S_q, S_k] mask of the keys each query attends. A query row with no real
    key in its window attends to all of its (zeroed) keys instead: zeros, never NaN."""
    seq_q, seq_k = q.shape[2], k.shape[2]
    keep = reference.keep_mask(key_padding_mask, window, seq_q, seq_k, q.device)
    if key_padding_mask is not None:
        dropped = key_padding_mask.bool().logical_not()[:, None, :, None]
        k, v = k.masked_fill(dropped, 0.0), v.masked_fill(dropped, 0.0)
    attend = keep | keep.any(-1, keepdim=True).logical_not()
    mask = attend
    if relative_bias is not None:
        bias = reference.relative_position_bias(relative_bias, seq_q, seq_k).to(q.dtype)
        mask = bias.masked_fill(attend.logical_not(), float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


@implements(reference.attention)
def attention_unchecked(
    q, k, v, key_padding_mask, scale, dropout_p, relative_bias, *, rotary, window
):
    """:func:`fastbert.kernels.reference.attention` on ``F.scaled_dot_product_attention``
    (its own attention dropout)."""
    scale = None if scale is None else float(scale)
    if rotary is not None:
        q, k = reference.rotary_positions(q, rotary), reference.rotary_positions(k, rotary)
    if window is not None:
        return _sdpa_windowed(q, k, v, key_padding_mask, window, scale, dropout_p, relative_bias)
    if relative_bias is not None:
        seq_q, seq_k = q.shape[2], k.shape[2]
        if key_padding_mask is None:
            bias = _bias_mask(relative_bias, None, seq_q, seq_k, q.dtype)
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale
            )
        keep = key_padding_mask if key_padding_mask.dtype == torch.bool else key_padding_mask != 0
        dropped = keep.logical_not()[:, None, :, None]
        # A row without a real key attends to all of its (zeroed) values: zeros, as below.
        attend = keep | keep.any(1, keepdim=True).logical_not()
        return F.scaled_dot_product_attention(
            q,
            k.masked_fill(dropped, 0.0),
            v.masked_fill(dropped, 0.0),
            attn_mask=_bias_mask(relative_bias, attend, seq_q, seq_k, q.dtype),
            dropout_p=dropout_p,
            scale=scale,
        )
    if key_padding_mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
    keep = key_padding_mask if key_padding_mask.dtype == torch.bool else key_padding_mask != 0
    # Zeros at masked keys: SDPA would compute 0 * NaN there. The encoder passes no mask
    # for a batch without padding, which skips these copies.
    dropped = keep.logical_not()[:, None, :, None]
    return _sdpa_masked(
        q, k.masked_fill(dropped, 0.0), v.masked_fill(dropped, 0.0), keep, scale, dropout_p
    )


# The checks of a public attention call, the same on the CPU engine.
ATTENTION_CHECKS = (
    checks.check_attention,
    checks.check_relative_bias,
    checks.check_rotary,
    check_dropout_p,
)
attention = checked(attention_unchecked, *ATTENTION_CHECKS)
""":func:`attention_unchecked`, inputs checked."""


def _unpack_index(
    cu_seqlens: torch.Tensor, max_seqlen: int, tokens: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where T packed tokens sit in a dense [B, max_seqlen] batch (max_seqlen >= every length).

    Returns (gather: int64 [B * max_seqlen], each dense slot's token: a padded slot repeats the
    last token of its own sequence, so no other sequence's values enter its row; keep: bool
    [B, max_seqlen], True at real slots; scatter: int64 [T], each token's slot). No host read.
    """
    device = cu_seqlens.device
    starts = cu_seqlens[:-1].long()
    lengths = cu_seqlens[1:].long() - starts
    slots = torch.arange(max_seqlen, device=device)
    keep = slots[None, :] < lengths[:, None]
    own = torch.minimum(slots[None, :], (lengths[:, None] - 1).clamp_(min=0))
    gather = (starts[:, None] + own).clamp_(max=tokens - 1).reshape(-1)
    sequence = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=device), lengths, output_size=tokens
    )
    scatter = sequence * max_seqlen + (torch.arange(tokens, device=device) - starts[sequence])
    return gather, keep, scatter


@implements(reference.attention_varlen)
def attention_varlen_unchecked(
    q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, relative_bias, *, rotary, window
):
    """:func:`fastbert.kernels.reference.attention_varlen` as one masked SDPA call over a
    dense [B, max_seqlen] batch; ``max_seqlen`` must be at least the longest sequence."""
    tokens, heads, head_dim = q.shape
    if tokens == 0 or max_seqlen == 0:
        return torch.zeros_like(q)
    scale = None if scale is None else float(scale)
    gather, keep, scatter = _unpack_index(cu_seqlens, max_seqlen, tokens)
    batch = keep.shape[0]
    # Padded slots hold their own sequence's values (masked out; a NaN there is one the
    # sequence's real tokens carry too): no zeroing copies. An empty sequence's row is
    # garbage, and never gathered back.
    q, k, v = (
        t[gather].view(batch, max_seqlen, heads, head_dim).transpose(1, 2) for t in (q, k, v)
    )
    if rotary is not None:  # slot positions are each sequence's own token positions
        q, k = reference.rotary_positions(q, rotary), reference.rotary_positions(k, rotary)
    if window is not None:
        out = _sdpa_windowed(q, k, v, keep, window, scale, dropout_p, relative_bias)
        return out.transpose(1, 2).reshape(batch * max_seqlen, heads, head_dim)[scatter]
    mask = keep[:, None, None, :]
    if relative_bias is not None:
        # Slot positions are each sequence's own token positions.
        mask = _bias_mask(relative_bias, keep, max_seqlen, max_seqlen, q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    return out.transpose(1, 2).reshape(batch * max_seqlen, heads, head_dim)[scatter]


def _check_max_seqlen(cu_seqlens: torch.Tensor, max_seqlen: int) -> None:
    """ValueError when a sequence of ``cu_seqlens`` is longer than ``max_seqlen`` (the torch
    backend sizes its dense batch by it). Reads the longest length on the host."""
    if cu_seqlens.numel() < 2:
        return
    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    if longest > max_seqlen:
        raise ValueError(
            f"max_seqlen is {max_seqlen} but cu_seqlens holds a sequence of {longest} tokens; "
            "the torch backend's attention_varlen needs max_seqlen >= every sequence length"
        )


def on_covered_tokens(varlen, q, k, v, cu_seqlens, max_seqlen, scale, *rest, **positions):
    """``varlen(q, k, v, cu_seqlens, max_seqlen, scale, *rest, **positions)`` (an
    attention_varlen implementation, which computes the tokens of its sequences only) with the
    bounds of ``cu_seqlens`` read on the host: ValueError for bounds outside q's T tokens or a
    decrease; where the sequences cover less than the T tokens, ``varlen`` runs on those they
    cover and the others get zeros. No read while torch.compile traces or a CUDA graph
    captures: the bounds are then the caller's contract."""
    checks.check_attention_varlen(q, k, v, cu_seqlens, max_seqlen, scale)
    tokens = q.shape[0]
    if checks.values_readable(cu_seqlens):
        first, last = checks.cu_seqlens_span(cu_seqlens, tokens)
        if first > 0 or last < tokens:
            inner = (t[first:last] for t in (q, k, v))
            out = varlen(*inner, cu_seqlens - first, max_seqlen, scale, *rest, **positions)
            return F.pad(out, (0, 0, 0, 0, first, tokens - last))
    return varlen(q, k, v, cu_seqlens, max_seqlen, scale, *rest, **positions)


_attention_varlen_checked = checked(
    attention_varlen_unchecked,
    checks.check_attention_varlen,
    checks.check_relative_bias,
    checks.check_rotary,
    check_dropout_p,
    _check_max_seqlen,
)


@implements(reference.attention_varlen)
def attention_varlen(
    q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, relative_bias, *, rotary, window
):
    """:func:`attention_varlen_unchecked` with its inputs checked (the longest sequence read on
    the host: ValueError when ``max_seqlen`` is shorter), on the tokens its sequences cover
    (:func:`on_covered_tokens`)."""
    arguments = (q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, relative_bias)
    return on_covered_tokens(_attention_varlen_checked, *arguments, rotary=rotary, window=window)


# Not on the encoder's path: the reference's softmax (fp32 statistics, masked keys excluded
# whatever their scores) is already what this backend would run.
scaled_masked_softmax = reference.scaled_masked_softmax


@implements(reference.linear)
def linear_unchecked(x, weight, bias, activation, residual, *, gated):
    """:func:`fastbert.kernels.reference.linear` on ``F.linear``, GELU (times the gate when
    ``gated``) and the residual added in place (:func:`finish_linear`)."""
    return finish_linear(F.linear(x, weight, bias), activation, residual, gated)


def finish_linear(
    y: torch.Tensor, activation: str | None, residual: torch.Tensor | None, gated: bool
) -> torch.Tensor:
    """The rest of linear on the fresh product ``y`` [..., N] (or [..., 2N] when ``gated``,
    the gate its second half): GELU, times the gate, plus ``residual``, each in place on the
    product unless autograd records it (in-place GELU has no derivative there)."""
    in_place = not y.requires_grad
    gate = None
    if gated:
        y, gate = y.chunk(2, dim=-1)
        in_place = False  # y is a view of the product the gate shares
    if activation is not None:
        approximate = "tanh" if activation == "gelu_tanh" else "none"
        gelu = torch._C._nn.gelu_ if in_place else F.gelu
        y = gelu(y, approximate=approximate)
    if gate is not None:
        y = y * gate
        in_place = not y.requires_grad
    if residual is None:
        return y
    return y.add_(residual) if in_place else y + residual


linear = checked(linear_unchecked, checks.check_linear)
""":func:`linear_unchecked`, inputs checked."""


def int_product(q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """int8 [M, K] @ int8 [N, K]^T -> the exact int32 [M, N], or on a CPU without int8 dot
    products its float32 conversion (what ``acc.float()`` makes of it, as the callers do):
    ``torch._int_mm`` (oneDNN's VNNI or AMX kernels on a CPU, cuBLASLt on CUDA), on a CPU
    without them :func:`int_product_in_float32`; where cuBLASLt does not take the shape
    (M <= 16, K or N not a multiple of 8), the same integers from a float64 product, exact
    below 2**53."""
    m, k = q.shape
    n = weight.shape[0]
    if q.device.type == "cpu":
        if has_int8_dot_products():
            # One column: weight.t() has strides (1, 1), which the CPU's _int_mm misreads
            # (other memory in the product); the same [1, N] contiguous reads right.
            return torch._int_mm(q, weight.t() if k > 1 else weight.reshape(1, n))
        return int_product_in_float32(q, weight)
    if m > 16 and k % 8 == 0 and n % 8 == 0:
        return torch._int_mm(q, weight.t())
    return torch.matmul(q.double(), weight.double().t()).to(torch.int32)


# |q| <= 127 (the rows' quantisation) and |w| <= 128: a sum of at most this many products
# stays within 2**24 in magnitude (127 * 128 * 1024 < 2**24), so float32 holds every partial
# sum exactly, in any order.
FLOAT32_EXACT_TERMS = 1024


def int_product_in_float32(
    q: torch.Tensor,
    weight: torch.Tensor,
    product: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The int8 product ``q`` [M, K] @ ``weight`` [N, K]^T by float32 GEMMs: exact, as fast as
    float32 (an int8 GEMM without int8 dot products is not faster). Each GEMM sums at most
    :data:`FLOAT32_EXACT_TERMS` products, so it is exact; one GEMM's float32 result holds the
    exact integers, several are added in int32. Returns float32 (one GEMM) or int32 [M, N].
    ``product(q_block, start)``: the float32 product of ``q``'s columns from ``start`` (a
    contiguous float32 [M, <= FLOAT32_EXACT_TERMS] block) with the same columns of the weight
    (the CPU engine's reads a packed copy); by default ``F.linear`` on the weight converted
    here."""
    if product is None:

        def product(block: torch.Tensor, start: int) -> torch.Tensor:
            columns = weight[:, start : start + block.shape[1]]
            return F.linear(block, columns.float())

    k = q.shape[1]
    if k <= FLOAT32_EXACT_TERMS:
        return product(q.float(), 0)
    acc = None
    for start in range(0, k, FLOAT32_EXACT_TERMS):
        # A column block widened in one pass: float() of a strided slice is contiguous.
        block = q[:, start : start + FLOAT32_EXACT_TERMS].float()
        part = product(block, start).to(torch.int32)
        acc = part if acc is None else acc.add_(part)
    return acc


def _fp8_product(q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn [M, K] @ float8_e4m3fn [N, K]^T -> float32 [M, N], an emulation: the e4m3
    values widened to float32 (exactly) and multiplied by a float32 matmul (each product exact,
    the sums rounded in float32, as the FP8 tensor cores' float32 accumulator does). It gives
    the accuracy of the quantisation, not the speed of FP8 hardware."""
    return torch.matmul(q.float(), weight.float().t())


def quantize_rows(
    x: torch.Tensor, input_scale: torch.Tensor | None = None, quantize: str = "int8"
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fastbert.kernels.reference.quantize_rows` of [M, K] float ``x`` with the same
    bits, the product rounded in place. The row's largest magnitude is max(amax, -amin): two
    reductions that write nothing, faster on a CPU than ``abs().amax()`` and than
    ``torch.aminmax`` over rows (docs/results.md, "Measurements behind the code's choices")."""
    q_dtype = torch.int8 if quantize == "int8" else torch.float8_e4m3fn
    q_max = 127.0 if quantize == "int8" else reference.FP8_E4M3_MAX
    x32 = x.float() if input_scale is None else x.float() * input_scale
    if x32.shape[-1] == 0:
        zeros = x32.new_zeros(x32.shape[:-1])
        return torch.zeros(x32.shape, dtype=q_dtype, device=x.device), zeros
    absmax = torch.maximum(x32.amax(dim=-1), x32.amin(dim=-1).neg_())
    inv = torch.where(absmax > 0, absmax.new_tensor(q_max) / absmax, 0.0)
    y = torch.mul(x32, inv[:, None])
    y = y.round_() if quantize == "int8" else y.clamp_(-q_max, q_max)
    return y.to(q_dtype), absmax.div_(absmax.new_tensor(q_max))


@implements(reference.linear_int8)
def linear_quantized_unchecked(
    quantize: str, x, weight, weight_scale, bias, activation, residual, input_scale, passes=None
):
    """:func:`linear_int8_unchecked` (``quantize="int8"``) or :func:`linear_fp8_unchecked`
    (``"fp8"``). ``passes``: where the rows' quantisation with the integer product, and the
    product's dequantising epilogue, run when ``passes.takes(x, weight_scale, bias, residual,
    input_scale)`` (``passes.product`` and ``passes.dequantize``, the same bits as PyTorch's
    ops here: the CPU engine's compiled ones, fastbert.kernels.cpu_int8); None runs
    PyTorch's."""
    n, k = weight.shape
    lead = x.shape[:-1]
    m = x.numel() // k if k else int(torch.Size(lead).numel())
    compiled = bool(m and n and k) and passes is not None
    compiled = compiled and passes.takes(x, weight_scale, bias, residual, input_scale)
    if m == 0 or n == 0 or k == 0:
        acc = torch.zeros((m, n), dtype=torch.float32, device=x.device)
        scale = torch.zeros(m, dtype=torch.float32, device=x.device)
    elif compiled:
        acc, scale = passes.product(x.reshape(m, k), weight, input_scale)
    else:
        q, scale = quantize_rows(x.reshape(m, k), input_scale, quantize)
        acc = int_product(q, weight) if quantize == "int8" else _fp8_product(q, weight)
    if compiled:
        # The compiled epilogue adds the residual too when no activation comes between.
        fused = None if residual is None or activation is not None else residual.reshape(m, n)
        y = passes.dequantize(acc, scale, weight_scale, bias, fused)
        residual = None if fused is not None else residual
    else:
        # Passes over the [M, N] product: int32 to float32 (a no-op for fp8's float32), times
        # the row scales in place, then times the column scales plus the bias in place. On a
        # CPU the mixed-dtype torch.mul(int32, float32) is a strided, unvectorised loop, slower
        # than the conversion and the float32 product together (docs/results.md,
        # "Measurements behind the code's choices").
        y = acc.float().mul_(scale[:, None])
        if bias is not None:
            torch.addcmul(bias.float(), y, weight_scale, out=y)
        else:
            y.mul_(weight_scale)
    if activation is not None:
        torch._C._nn.gelu_(y, approximate="tanh" if activation == "gelu_tanh" else "none")
    if residual is not None:
        y.add_(residual.reshape(m, n))
    return y.view(*lead, n).to(x.dtype)


@implements(reference.linear_int8)
def linear_int8_unchecked(x, weight, weight_scale, bias, activation, residual, input_scale):
    """:func:`fastbert.kernels.reference.linear_int8` on ``torch._int_mm`` (int8 x int8 ->
    int32), x quantised per token, the dequantisation, bias, GELU and residual applied in
    place in float32."""
    return linear_quantized_unchecked(
        "int8", x, weight, weight_scale, bias, activation, residual, input_scale
    )


@implements(reference.linear_fp8)
def linear_fp8_unchecked(x, weight, weight_scale, bias, activation, residual, input_scale):
    """:func:`fastbert.kernels.reference.linear_fp8` emulated on any device: x quantised per
    token to the same e4m3 bits, the e4m3 operands multiplied in float32 (see
    :func:`_fp8_product`: the quantisation's accuracy, not FP8 hardware's speed), then the
    dequantisation, bias, GELU and residual in place in float32."""
    return linear_quantized_unchecked(
        "fp8", x, weight, weight_scale, bias, activation, residual, input_scale
    )


linear_int8 = checked(
    linear_int8_unchecked, functools.partial(checks.check_linear_quantized_call, "int8")
)
""":func:`linear_int8_unchecked`, inputs checked, gradients refused."""

linear_fp8 = checked(
    linear_fp8_unchecked, functools.partial(checks.check_linear_quantized_call, "fp8")
)
""":func:`linear_fp8_unchecked`, inputs checked, gradients refused."""


@implements(reference.layer_norm)
def layer_norm_unchecked(x, weight, bias, eps, residual, dropout_p):
    """:func:`fastbert.kernels.reference.layer_norm` on ``F.layer_norm`` in the input dtype.

    A float16 call on a CPU that records gradients runs in float32: PyTorch's CPU kernel keeps
    float16 inputs' 1/std in float16 for the backward, where a constant row's (a padded
    position's zeros) overflows to inf and its gradients become NaN."""
    if dropout_p:
        x = F.dropout(x, dropout_p)
    s = x if residual is None else x + residual
    if s.dtype == torch.float16 and s.device.type == "cpu" and _records_grad(s, weight, bias):
        out = F.layer_norm(s.float(), (x.shape[-1],), _float(weight), _float(bias), float(eps))
        return out.to(torch.float16)
    return F.layer_norm(s, (x.shape[-1],), weight, bias, float(eps))


def _records_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _float(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


layer_norm = checked(layer_norm_unchecked, checks.check_layer_norm, check_dropout_p)
""":func:`layer_norm_unchecked`, inputs checked."""


@implements(reference.embeddings_layer_norm)
def embeddings_layer_norm_unchecked(
    input_ids,
    token_type_ids,
    position_ids,
    word_emb,
    pos_emb,
    type_emb,
    weight,
    bias,
    eps,
    *,
    check_ids,
    dropout_p,
    padding_idx,
    position_padding_idx,
):
    """:func:`fastbert.kernels.reference.embeddings_layer_norm` on ``F.embedding`` lookups
    and ``F.layer_norm``; the id ranges checked unless ``check_ids=False`` (one host
    synchronisation). ``padding_idx`` / ``position_padding_idx``: the word / position row
    that gets no gradient, as ``nn.Embedding(padding_idx=...)`` (Hugging Face's tables)."""
    if check_ids:
        checks.check_embedding_ids(
            input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb
        )
    wide = torch.float32 if word_emb.dtype in HALF_DTYPES else word_emb.dtype
    summed = F.embedding(as_index(input_ids), word_emb, padding_idx).to(wide)
    if position_ids is None:
        summed += pos_emb[: input_ids.shape[1]]
    else:
        summed += F.embedding(as_index(position_ids), pos_emb, position_padding_idx)
    if token_type_ids is None:
        summed += type_emb[0]
    else:
        summed += F.embedding(as_index(token_type_ids), type_emb)
    hidden = word_emb.shape[1]
    out = F.layer_norm(summed, (hidden,), weight.to(wide), bias.to(wide), float(eps))
    out = out.to(word_emb.dtype)
    return F.dropout(out, dropout_p) if dropout_p else out


embeddings_layer_norm = checked(
    embeddings_layer_norm_unchecked, checks.check_embeddings, check_dropout_p
)
""":func:`embeddings_layer_norm_unchecked`, inputs checked."""
