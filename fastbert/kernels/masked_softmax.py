"""Scaled, masked softmax over the keys: ``probs = softmax(scale * scores, masked keys excluded)``.

Math, per row (b, h, i) of S_k scores, in float32::

    z_j      = scale * scores[b, h, i, j]            (-inf where key j is masked)
    probs_ij = exp(z_j - max_j z_j) / sum_j exp(z_j - max_j z_j)

and rounded once to the scores' dtype. A row whose keys are all masked returns zeros, never
NaN, as :func:`kernels.reference.scaled_masked_softmax` does (a row whose real keys all score
-inf is NaN, as in ``torch.softmax``). Scores at masked keys are never
read: a NaN or Inf there gets probability 0 and leaves the other keys' probabilities as they
are. This is the classic one-pass fused op (one read of the scores, one write of the
probabilities) for when the probabilities themselves are wanted (``output_attentions``,
analysis); the encoder's attention never materialises them (see flash_attention.py).

Backward, per row, from the probabilities the forward returned (saved, nothing else)::

    dscores_ij = scale * probs_ij * (dprobs_ij - sum_j dprobs_ij * probs_ij)

in float32, rounded once to the scores' dtype; masked keys and fully masked rows have
probability 0 and so gradient 0.

Shapes and layouts: scores [B, H, S_q, S_k] with any strides (read in place);
key_padding_mask [B, S_k], bool or integer, nonzero = a real token, any strides. The output and
the scores' gradient are new contiguous [B, H, S_q, S_k] tensors.

Dtypes: float16, bfloat16 and float32 scores; the arithmetic is float32.

Limits: one program per row holds the whole row (BLOCK = next power of two of S_k), so S_k may
be at most MAX_KEYS = 16384 (a longer row raises ValueError). Row offsets are int64. An empty
input returns an empty output without a launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import checks, reference, torch_ops
from .launch import FUSED, UNFUSED, check_triton_device, next_power_of_2
from .op import Kernel, Op, implements

MAX_KEYS = 16384
MIN_BLOCK = 16


def block_size(seq_k: int) -> int:
    """The row tile: the next power of two of ``seq_k``, at least MIN_BLOCK."""
    return max(MIN_BLOCK, next_power_of_2(seq_k))


def num_warps(block: int) -> int:
    """Warps per row: about 512 elements per warp, between 1 and 16."""
    return min(16, max(1, block // 512))


@triton.jit
def _scaled_masked_softmax_fwd_kernel(
    scores_ptr,  # [B, H, S_q, S_k] scores, any strides
    mask_ptr,  # [B, S_k] key-padding mask, nonzero = real token (None unless HAS_MASK)
    out_ptr,  # [B, H, S_q, S_k] contiguous probabilities, the scores' dtype
    H,
    S_q,
    S_k,
    scale,
    stride_scores_b,
    stride_scores_h,
    stride_scores_q,
    stride_scores_k,
    stride_mask_b,
    stride_mask_k,
    HAS_MASK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # = (b * H + h) * S_q + i
    i = row % S_q
    h = (row // S_q) % H
    b = row // (S_q * H)
    cols = tl.arange(0, BLOCK)
    real = cols < S_k
    if HAS_MASK:
        token = tl.load(mask_ptr + b * stride_mask_b + cols * stride_mask_k, mask=real, other=0)
        real = real & (token != 0)
    base = scores_ptr + b * stride_scores_b + h * stride_scores_h + i * stride_scores_q
    z = tl.load(base + cols * stride_scores_k, mask=real, other=0.0).to(tl.float32) * scale
    z = tl.where(real, z, float("-inf"))
    z_max = tl.max(z, axis=0)
    # A row with no real key: shift by 0 so every exp is 0 and the sum 0, not NaN. A row whose
    # real keys all score -inf stays NaN, as in torch.softmax.
    any_real = tl.max(real.to(tl.int32), axis=0) > 0
    e = tl.exp(z - tl.where(any_real, z_max, 0.0))
    total = tl.sum(e, axis=0)
    probs = tl.math.div_rn(e, tl.where(total == 0.0, 1.0, total))
    tl.store(out_ptr + row * S_k + cols, probs.to(out_ptr.dtype.element_ty), mask=cols < S_k)


@triton.jit
def _scaled_masked_softmax_bwd_kernel(
    probs_ptr,  # [rows, S_k] contiguous probabilities of the forward
    dprobs_ptr,  # [rows, S_k] gradient of the probabilities, any row stride, unit key stride
    dscores_ptr,  # [rows, S_k] contiguous gradient of the scores, the scores' dtype
    S_k,
    scale,
    stride_dprobs_row,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < S_k
    p = tl.load(probs_ptr + row * S_k + cols, mask=mask, other=0.0).to(tl.float32)
    dp = tl.load(dprobs_ptr + row * stride_dprobs_row + cols, mask=mask, other=0.0)
    dp = dp.to(tl.float32)
    dot = tl.sum(dp * p, axis=0)
    ds = scale * p * (dp - dot)
    tl.store(dscores_ptr + row * S_k + cols, ds.to(dscores_ptr.dtype.element_ty), mask=mask)


def scaled_masked_softmax_forward(
    scores: torch.Tensor, key_padding_mask: torch.Tensor | None, scale: float, save: bool
) -> torch.Tensor:
    """Launch the forward: contiguous probabilities (all the backward needs, so ``save``
    changes nothing). Inputs are checked by the caller."""
    batch, heads, seq_q, seq_k = scores.shape
    out = torch.empty(scores.shape, dtype=scores.dtype, device=scores.device)
    if out.numel() == 0:
        return out
    mask = key_padding_mask
    block = block_size(seq_k)
    _scaled_masked_softmax_fwd_kernel[(batch * heads * seq_q,)](
        scores,
        mask,
        out,
        heads,
        seq_q,
        seq_k,
        float(scale),
        *scores.stride(),
        mask.stride(0) if mask is not None else 0,
        mask.stride(1) if mask is not None else 0,
        HAS_MASK=mask is not None,
        BLOCK=block,
        num_warps=num_warps(block),
        **UNFUSED,
    )
    return out


def scaled_masked_softmax_backward(
    probs: torch.Tensor, dprobs: torch.Tensor, scale: float
) -> torch.Tensor:
    """Launch the backward: the contiguous gradient of the scores from the forward's
    probabilities ``probs`` and their gradient ``dprobs`` (both [B, H, S_q, S_k])."""
    seq_k = probs.shape[-1]
    dscores = torch.empty_like(probs)
    if probs.numel() == 0:
        return dscores
    dprobs2 = dprobs.reshape(-1, seq_k)
    if dprobs2.stride(1) != 1:
        dprobs2 = dprobs2.contiguous()
    block = block_size(seq_k)
    _scaled_masked_softmax_bwd_kernel[(dprobs2.shape[0],)](
        probs,
        dprobs2,
        dscores,
        seq_k,
        float(scale),
        dprobs2.stride(0),
        BLOCK=block,
        num_warps=num_warps(block),
        **FUSED,
    )
    return dscores


def _prepare(scores, key_padding_mask=None, scale=1.0) -> tuple:
    """Raise as :func:`scaled_masked_softmax` documents, before anything runs; the forward's
    arguments."""
    checks.check_softmax(scores, key_padding_mask, scale)
    check_triton_device("scores", scores)
    seq_k = scores.shape[-1]
    if seq_k > MAX_KEYS:
        raise ValueError(
            f"scores have {seq_k} keys per row, more than the {MAX_KEYS} the fused softmax "
            "kernel holds (one row per program); use backend='torch' for longer rows"
        )
    return scores, key_padding_mask, float(scale)


def _forward_fake(scores, key_padding_mask, scale, save):
    checks.check_softmax(scores, key_padding_mask, scale)
    return scores.new_empty(scores.shape)


def _backward_fake(probs, dprobs, scale):
    return probs.new_empty(probs.shape)


def _save(ctx, inputs, outputs) -> None:
    ctx.save_for_backward(outputs[0])
    ctx.scale = inputs[2]


def _gradients(ctx, backward, dprobs):
    (probs,) = ctx.saved_tensors
    (dscores,) = backward(probs, dprobs, ctx.scale)
    return dscores, None, None


SCALED_MASKED_SOFTMAX = Op(
    name="scaled_masked_softmax",
    reference=reference.scaled_masked_softmax,
    torch=torch_ops.scaled_masked_softmax,
    prepare=_prepare,
    forward=Kernel(
        scaled_masked_softmax_forward,
        "(Tensor scores, Tensor? key_padding_mask, float scale, bool save) -> Tensor",
        _forward_fake,
    ),
    backward=Kernel(
        scaled_masked_softmax_backward,
        "(Tensor probs, Tensor dprobs, float scale) -> Tensor",
        _backward_fake,
    ),
    save=_save,
    gradients=_gradients,
)


@implements(reference.scaled_masked_softmax)
def scaled_masked_softmax(scores, key_padding_mask, scale):
    """``softmax(scale * scores)`` over the last dim with masked keys excluded, in one pass
    (:func:`fastbert.kernels.reference.scaled_masked_softmax`).

    Args:
        scores: [B, H, S_q, S_k], float16 / bfloat16 / float32, any strides; S_k <= 16384.
        key_padding_mask: optional [B, S_k] bool or integer, True / nonzero = a real token.
        scale: the Python number the scores are multiplied by before the softmax.

    Returns:
        A new contiguous [B, H, S_q, S_k] tensor of probabilities in the scores' dtype (float32
        math, one rounding); rows whose keys are all masked are zeros. When grad mode is on and
        the scores require grad, it carries their gradient (a Triton backward kernel).

    Raises:
        TypeError: a non-tensor argument, an unsupported dtype, a float mask or a non-number
            scale.
        ValueError: mismatched shapes or devices, S_k > 16384, or tensors the Triton kernels
            cannot reach (not CUDA, and not the CPU under TRITON_INTERPRET=1).
    """
    return SCALED_MASKED_SOFTMAX(scores, key_padding_mask, scale)
