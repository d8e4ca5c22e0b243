"""The fused sparse (SPLADE) head: the masked-LM decoder GEMM whose epilogue keeps only each
sequence's max, so that the [T, V] vocabulary logits never reach memory.

Math. A SPLADE model (sentence-transformers' SparseEncoder: a masked-LM transformer, then
SpladePooling) turns the decoder's logits ``z[t, v] = x[t] . weight[v] + bias[v]`` of the
tokens t of sequence b into::

    out[b, v] = max over t in [cu_seqlens[b], cu_seqlens[b + 1]) of g(z[t, v])

with g(z) = log1p(relu(z)) (``log_steps=1``, SPLADE's "relu") or log1p(log1p(relu(z)))
(``log_steps=2``, the "log1p_relu" of OpenSearch's models). relu and log1p are monotone
non-decreasing, so g is, and ``max_t g(z_t) = g(max_t z_t)``: the kernel reduces the max of
the raw logits and g runs once, on [B, V]. Further, relu(max_t z_t) = max(0, max_t z_t) is
the max of the z_t and 0, so the kernel keeps ``max(0, z_t ...)``, a max over values >= 0.
An empty sequence gives zeros (g(0) = 0), as sentence-transformers' pooling of a fully masked
row does.

Programs. One [BLOCK_T rows, BLOCK_V vocabulary columns] tile of the logits per program,
ordered in groups of GROUP_T row tiles that share the weight's columns in L2 (the linear
kernel's ``_tile_position``): the product over K in float32 as in fused_linear.py
(``tl.dot``; IEEE float32 products for float32 inputs), plus the bias. The epilogue finds the
sequences the tile's rows overlap (a binary search of ``cu_seqlens`` for the first and the
last row, ``_segment_of``), and for each of them takes the max of its rows' logits in the
tile, floored at 0, and merges it into the float32 [B, V] output, zeros on entry, with an
atomic max. A sequence spread over several row tiles is so merged from each; a tile holding
many short sequences loops over them (one masked column max each). Empty sequences are passed
over. Why atomics rather than one program per column tile walking every row tile in order
(which could store each max once, with g applied): the grid stays two-dimensional, as
parallel as the plain GEMM's (7,648 tiles of 128 x 128 for 4,096 tokens and BERT's 30,522
words, against 239 column programs), while the atomics number BLOCK_V per sequence per row
tile (about a million for that batch, against 96 G multiply-adds). The max is exact and
commutative, so the result does not depend on the atomics' order, and running the kernel
again on the same output (the autotuner does) leaves it as it is.

The atomics are integer ones: the output is read as int32, and each max is merged as the bit
pattern of a float32 >= 0, whose integer order is the float order (a negative max, whose sign
bit makes it a negative integer, never passes the zeros it starts from). One integer
reduction per column (``RED.E.MAX.S32`` in the SASS of sm_80, ``REDG.E.MAX.S32`` on sm_90),
where a float atomic max would take a signed-max and an unsigned-min atomic, each under a
sign test. Then g runs in place on the [B, V] output: PyTorch elementwise passes over
B x V x 4 bytes (4 MB for 32 sequences of BERT's vocabulary, beside the 47 MB of a float16
decoder weight the kernel reads), not worth a kernel of their own.

Shapes and layouts: x [T, K] packed token rows and weight [V, K] (nn.Linear layout: the
decoder, or the tied word embeddings; V need not be a multiple of anything), both with unit
stride along K and any row stride; bias [V], any stride; cu_seqlens int32 [B + 1], 0 first and
T last, non-decreasing (None: one sequence of all T rows). The output is a new contiguous
float32 [B, V].

Dtypes: float16, bfloat16 and float32 x, weight and bias alike; float32 accumulation, float32
output whatever the input dtype.

Limits: inference only (no backward; an input that requires grad is refused: the torch
backend, fastbert.kernels.sparse_head_torch, has gradients). Row, column and output offsets
are int64. ``cu_seqlens``' values are read on the host to check them (one
transfer), except while ``torch.compile`` traces or a CUDA graph captures: the kernel then
trusts them, and stays inside its tensors whatever they hold (segment indices are clamped
to [0, B), rows to [0, T)). T == 0, V == 0 or B == 0 return zeros without a launch. A NaN
logit need not reach the output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import checks, reference, sparse_head_torch
from .checks import refuse_gradients
from .fused_linear import _tile_indices
from .launch import (
    FUSED,
    cdiv,
    check_triton_device,
    interpreting,
    launch_lock,
    launch_tuned,
    next_power_of_2,
    time_config,
    tuned,
)
from .linear_configs import FP32_MAX_BLOCK_K, SHARED_MEMORY_BUDGET
from .op import Kernel, Op, implements


def _config(block_t: int, block_v: int, block_k: int, stages: int, warps: int) -> triton.Config:
    meta = {"BLOCK_T": block_t, "BLOCK_V": block_v, "BLOCK_K": block_k, "GROUP_T": 8}
    return triton.Config(meta, num_stages=stages, num_warps=warps)


def gpu_configs() -> list[triton.Config]:
    """Tiles for a long, wide product (the linear kernel's, but one): 128-row tiles for
    batches of thousands of tokens, 64 to 16 rows for one or a few sentences; the ones with
    BLOCK_K = 32 also serve float32 (see :func:`keep`). None spills registers on sm_80 or
    sm_90; the linear kernel's 32 x 64 x 32 tile is 32 x 128 x 32 here, since in float32 the
    former spills 8 bytes on sm_80 under this epilogue (ptxas holds it at 72 registers)."""
    return [
        _config(128, 256, 64, stages=3, warps=8),
        _config(128, 128, 64, stages=4, warps=8),
        _config(128, 128, 32, stages=4, warps=8),
        _config(64, 128, 64, stages=4, warps=4),
        _config(64, 64, 32, stages=4, warps=4),
        _config(32, 128, 32, stages=4, warps=4),
        _config(16, 64, 32, stages=4, warps=4),
    ]


def configs() -> list[triton.Config]:
    """The autotune candidates: :func:`gpu_configs`, or one small tile under the interpreter
    (nothing is timed there)."""
    if interpreting():
        return [_config(32, 32, 32, stages=1, warps=4)]
    return gpu_configs()


def shared_memory_bytes(config: triton.Config, element_size: int) -> int:
    """Bytes of shared memory the software pipeline holds: num_stages x (x tile + weight
    tile)."""
    meta = config.kwargs
    tile = (meta["BLOCK_T"] + meta["BLOCK_V"]) * meta["BLOCK_K"]
    return config.num_stages * tile * element_size


def keep(config: triton.Config, element_size: int, t_bucket: int) -> bool:
    """Whether ``config`` is worth timing for inputs of ``element_size`` bytes and a T in
    ``t_bucket``: its pipeline fits the shared memory of both targets, float32 keeps its K tile
    narrow enough for the FMA loop's registers (as in the linear kernel), and its row tile is
    no taller than the bucket (those rows would only be masked work)."""
    meta = config.kwargs
    if shared_memory_bytes(config, element_size) > SHARED_MEMORY_BUDGET:
        return False
    if element_size == 4 and meta["BLOCK_K"] > FP32_MAX_BLOCK_K:
        return False
    return meta["BLOCK_T"] <= t_bucket


def _prune(candidates: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Autotuner hook: the configs :func:`keep` allows for this launch (the first candidate
    when none fits, e.g. the interpreter's tile over a short batch), or the one
    FASTBERT_AUTOTUNE names."""
    args = {**named_args, **kwargs}
    element_size = args["x_ptr"].element_size()
    kept = [c for c in candidates if keep(c, element_size, args["T_BUCKET"])]
    return tuned(kept or candidates[:1])


def t_bucket(tokens: int) -> int:
    """The autotune key for T: the next power of two, at least 16 (the smallest row tile)."""
    return max(16, next_power_of_2(tokens))


@triton.jit
def _segment_of(cu_seqlens_ptr, row, B):
    """The sequence b in [0, B) that holds ``row``: the last b with cu_seqlens[b] <= row
    (empty sequences before it are passed over), by a binary search of the B + 1 bounds.
    In [0, B) whatever the bounds hold."""
    lo = tl.load(cu_seqlens_ptr) * 0  # 0 as a scalar tensor: the loop carries tensors
    hi = lo + B
    while hi - lo > 1:
        mid = (lo + hi) // 2
        right = tl.load(cu_seqlens_ptr + mid) <= row
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    return lo


@triton.autotune(
    configs=configs(),
    key=["V", "K", "T_BUCKET", "HAS_BIAS"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=time_config,
)
@triton.jit
def _splade_max_fwd_kernel(
    x_ptr,  # [T, K] packed token rows, unit stride along K
    weight_ptr,  # [V, K] decoder weight (nn.Linear layout), unit stride along K
    bias_ptr,  # [V] decoder bias (None unless HAS_BIAS)
    cu_seqlens_ptr,  # int32 [B + 1] sequence bounds
    out_ptr,  # int32 view of contiguous float32 [B, V], zeros on entry: max(0, logits) bits
    T,
    V,
    K,
    B,
    T_BUCKET,  # autotune key only: power-of-two bucket of T
    stride_x_t,
    stride_x_k,
    stride_weight_v,
    stride_weight_k,
    stride_bias_v,
    HAS_BIAS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_T: tl.constexpr,
):
    # Rows past T / columns past V re-read valid ones (wrapped) so the loads need no mask; no
    # sequence holds those rows, and the atomics skip those columns.
    pid_t, _, offs_t, offs_v, rows, cols = _tile_indices(
        tl.program_id(0), T, V, BLOCK_T, BLOCK_V, GROUP_T
    )
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_x_t + offs_k[None, :] * stride_x_k
    w_ptrs = weight_ptr + offs_k[:, None] * stride_weight_k + cols[None, :] * stride_weight_v
    acc = tl.zeros((BLOCK_T, BLOCK_V), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        k_left = K - k_start
        a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if a.dtype == tl.float32:
            acc += tl.dot(a, b, input_precision="ieee")  # each K tile summed apart
        else:
            acc = tl.dot(a, b, acc)
        x_ptrs += BLOCK_K * stride_x_k
        w_ptrs += BLOCK_K * stride_weight_k
    v_mask = offs_v < V
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_v * stride_bias_v, mask=v_mask, other=0.0)
        acc += bias.to(tl.float32)[None, :]

    first_row = pid_t * BLOCK_T
    first = _segment_of(cu_seqlens_ptr, first_row, B)
    last = _segment_of(cu_seqlens_ptr, tl.minimum(first_row + BLOCK_T, T) - 1, B)
    out_ptrs = out_ptr + first.to(tl.int64) * V + offs_v
    for segment in range(first, last + 1):
        start = tl.load(cu_seqlens_ptr + segment)
        end = tl.minimum(tl.load(cu_seqlens_ptr + segment + 1), T)
        if end > start:
            inside = (offs_t >= start) & (offs_t < end)
            # relu's floor fills the other rows: the max is then max(0, the sequence's logits).
            best = tl.max(tl.where(inside[:, None], acc, 0.0), axis=0)
            tl.atomic_max(out_ptrs, best.to(tl.int32, bitcast=True), mask=v_mask, sem="relaxed")
        out_ptrs += V


# Where splade_max has gradients.
GRADIENTS_ELSEWHERE = "fastbert.kernels.sparse_head_torch.splade_max, on PyTorch ops, has them"

_LAUNCH_LOCK = launch_lock()  # one launch at a time across threads (the autotuner's nargs)


def splade_max_forward(x, weight, bias, cu_seqlens, log_steps, save):
    """Launch the kernel on a zeroed float32 [B, V] output, then apply g to it. Inputs are
    checked by the caller; ``save`` is the wiring's (there is no backward)."""
    tokens, k = x.shape
    vocab = weight.shape[0]
    if cu_seqlens is None:
        cu_seqlens = torch.arange(2, dtype=torch.int32, device=x.device) * tokens
    batch = cu_seqlens.shape[0] - 1
    out = torch.zeros((batch, vocab), dtype=torch.float32, device=x.device)
    if tokens == 0 or vocab == 0 or batch == 0:
        return out

    def grid(meta: dict) -> tuple[int]:
        return (cdiv(tokens, meta["BLOCK_T"]) * cdiv(vocab, meta["BLOCK_V"]),)

    with _LAUNCH_LOCK:
        launch_tuned(
            _splade_max_fwd_kernel,
            grid,
            x,
            weight,
            bias,
            cu_seqlens,
            out.view(torch.int32),
            tokens,
            vocab,
            k,
            batch,
            t_bucket(tokens),
            x.stride(0),
            x.stride(1),
            weight.stride(0),
            weight.stride(1),
            bias.stride(0) if bias is not None else 0,
            HAS_BIAS=bias is not None,
            **FUSED,
        )
    return reference.splade_activation(out, log_steps, in_place=True)


def _prepare(x, weight, bias=None, cu_seqlens=None, log_steps=1) -> tuple:
    """Raise as :func:`splade_max` documents, before anything runs; the forward's
    arguments."""
    checks.check_splade_max(x, weight, bias, cu_seqlens, log_steps)
    refuse_gradients("splade_max", x, weight, bias, instead=GRADIENTS_ELSEWHERE)
    check_triton_device("x", x)
    for name, t in (("x", x), ("weight", weight)):
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(
                f"{name} must have unit stride along K (its last dim), got strides "
                f"{tuple(t.stride())}: pass {name}.contiguous()"
            )
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.contiguous()  # the kernel reads it as contiguous
        if checks.values_readable(cu_seqlens):
            checks.check_cu_seqlens_values(cu_seqlens, x.shape[0])
    return x, weight, bias, cu_seqlens, log_steps


def _forward_fake(x, weight, bias, cu_seqlens, log_steps, save):
    checks.check_splade_max(x, weight, bias, cu_seqlens, log_steps)
    batch = 1 if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return x.new_empty((batch, weight.shape[0]), dtype=torch.float32)


SPLADE_MAX = Op(
    name="splade_max",
    reference=reference.splade_max,
    torch=sparse_head_torch.splade_max_unchecked,
    prepare=_prepare,
    forward=Kernel(
        splade_max_forward,
        "(Tensor x, Tensor weight, Tensor? bias, Tensor? cu_seqlens, int log_steps, bool save)"
        " -> Tensor",
        _forward_fake,
    ),
)


@implements(reference.splade_max)
def splade_max(x, weight, bias, cu_seqlens, log_steps):
    """SPLADE's sparse vectors from the masked-LM decoder in one Triton GEMM whose epilogue
    keeps each sequence's max (:func:`fastbert.kernels.reference.splade_max`): the [T, V]
    logits never reach memory.

    Args:
        x: [T, K] packed token rows (the transformed hidden states), float16 / bfloat16 /
            float32, unit stride along K.
        weight: [V, K] (nn.Linear layout: the decoder, or the tied word embeddings), x's
            dtype, unit stride along K.
        bias: optional [V], x's dtype.
        cu_seqlens: int32 [B + 1] prefix sums of the sequences' lengths (0 first, T last);
            None: one sequence of all T rows.
        log_steps: 1 for ``log1p(relu(logit))`` (SPLADE's), 2 for
            ``log1p(log1p(relu(logit)))``.

    Returns:
        A new float32 [B, V]: per sequence, the max over its tokens of the activated logits
        (zeros for an empty sequence). Float32 accumulation whatever the input dtype.
        Inference only.

    Raises:
        TypeError: a non-tensor argument or an unsupported / mismatched dtype.
        ValueError: mismatched shapes or devices, x or weight not unit-stride along K,
            cu_seqlens not rising from 0 to T, log_steps not 1 or 2, or tensors the Triton
            kernels cannot reach (not CUDA, and not the CPU under TRITON_INTERPRET=1).
        RuntimeError: grad mode is on and an input requires grad (there is no backward).
    """
    return SPLADE_MAX(x, weight, bias, cu_seqlens, log_steps)
