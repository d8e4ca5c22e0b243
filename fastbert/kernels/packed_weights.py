"""oneDNN's blocked copies of linear weights, for the torch backend's linear on a CPU.

``torch.ops.mkldnn._linear_pointwise`` (the torch backend's CPU linear in float32 and
bfloat16) reorders a plain [N, K] weight into oneDNN's blocked layout on every call. A weight
reordered once (``torch.ops.mkldnn._reorder_linear_weight``, what ``torch.compile`` does to a
frozen model's weights) skips that pass: the products are the same bits (one oneDNN kernel
either way, for M > 1), a little faster, most at few rows (measured by
``python -m benchmarks.packed_weights``; docs/results.md, "Packed weights on a CPU").

:class:`PackedWeights` holds one such copy per weight, made at the weight's first use and
made again whenever the weight's address, dtype, shape or PyTorch version counter changed
(every in-place write through autograd's view of it bumps the counter: ``load_state_dict``,
``copy_`` under ``no_grad``, an optimizer step, and a fused optimizer's step, which bumps none,
is counted apart: fastbert.kernels.optimizer_steps; new memory assigned to ``weight.data`` is at
another address, since each copy holds the memory it was made from). A write through
``weight.data`` bypasses the counter, and the copy would then hold the old values: the owner
of the model decides that its weights are not written so (fastbert's own loaders for
inference do; see ``packed_weights`` in fastbert.execution.runtime). Only ``nn.Parameter``
weights are packed (a fresh tensor per call, such as a QKV weight concatenated for autograd,
would be packed on every call for nothing), and not inference tensors (they have no version
counter). A packed copy is an opaque oneDNN tensor: it is a second copy of the linear weights
in memory.

On a CPU with AMX-INT8, :meth:`PackedWeights.int8_weight_for` keeps, the same way, the copies
of int8 weights (a quantised model's, which are not parameters) that oneDNN's quantised linear
reads (``torch.ops.onednn.qlinear_prepack``; fastbert.kernels.cpu_engine_int8). On a CPU
without bfloat16 or int8 instructions for oneDNN, :meth:`PackedWeights.widened_for` keeps
float32 copies of bfloat16 and int8 weights instead, for the float32 products that stand in
for theirs (each a second copy, the size of a float32 model's weights), and
:meth:`PackedWeights.int8_panels_for` the int8 weights' panels for the byte product
(fastbert.kernels.cpu_int8_product; a second copy the size of the int8 weight).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TypeVar

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import cpu_int8_product
from .cpu_library import cpu_flags
from .optimizer_steps import values_version

# The first PyTorch release whose packed products were checked to be the plain linear's bits
# at every row count the tests try: with torch 2.11's oneDNN, three rows of float32 took
# another kernel packed than plain (a last-bit difference), so packing is off before this.
SAME_BITS_FROM = "2.13"

Copy = TypeVar("Copy")


@functools.cache
def openmp_dynamic() -> bool:
    """Whether OpenMP may give a parallel region fewer threads than it asks for
    (``OMP_DYNAMIC=true``, read once): oneDNN's primitives then return garbage on a busy host
    (NaN, values of 1e19, where F.linear is exact: torch 2.13), so the CPU engine leaves
    oneDNN out (:func:`available`, cpu_engine_linear.has_onednn_linear)."""
    return os.environ.get("OMP_DYNAMIC", "").strip().lower() == "true"


@functools.cache
def available() -> bool:
    """Whether this PyTorch build reorders linear weights for oneDNN (a CPU build with it, of
    release SAME_BITS_FROM or newer) and OpenMP threads are not dynamic."""
    mkldnn = torch.ops.mkldnn
    return (
        not openmp_dynamic()
        and torch.torch_version.TorchVersion(torch.__version__) >= SAME_BITS_FROM
        and torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_reorder_linear_weight")
        and hasattr(mkldnn, "_linear_pointwise")
    )


# What oneDNN's bfloat16 linear needs of the CPU (its own check says so): AVX-512 with byte,
# vector-length and doubleword instructions, or AVX-NE-CONVERT. Without them, packing a
# bfloat16 weight and the bfloat16 linear raise (an AVX2-only CPU).
ONEDNN_BF16_FLAGS = (frozenset({"avx512bw", "avx512vl", "avx512dq"}), frozenset({"avx_ne_convert"}))


@functools.cache
def onednn_serves(dtype: torch.dtype) -> bool:
    """Whether oneDNN's linear takes ``dtype`` on this CPU (and its weights are packed):
    float32 anywhere, bfloat16 where the CPU has :data:`ONEDNN_BF16_FLAGS`, nothing else."""
    if dtype == torch.float32:
        return True
    flags = cpu_flags()
    return dtype == torch.bfloat16 and any(needed <= flags for needed in ONEDNN_BF16_FLAGS)


@functools.cache
def int8_available() -> bool:
    """Whether int8 weights are packed for oneDNN's quantised linear here: a PyTorch build with
    it, of release SAME_BITS_FROM or newer, on a CPU with AMX-INT8 (elsewhere it was not
    faster than ``torch._int_mm``: docs/results.md, "int8 on oneDNN's quantised linear")."""
    onednn = torch.ops.onednn
    return (
        "amx_int8" in cpu_flags()
        and torch.torch_version.TorchVersion(torch.__version__) >= SAME_BITS_FROM
        and torch.backends.mkldnn.is_available()
        and hasattr(onednn, "qlinear_prepack")
        and hasattr(onednn, "qlinear_pointwise")
    )


def _identity(weight: torch.Tensor) -> tuple:
    """What the packed copy of ``weight`` was made from: its address, dtype, shape and version
    (fastbert.kernels.optimizer_steps: the version counter and the fused optimizer steps that
    write without it)."""
    return (weight.data_ptr(), weight.dtype, tuple(weight.shape), values_version(weight))


def _int8_weight(weight: torch.Tensor) -> bool:
    """Whether ``weight`` is an int8 [N, K] CPU tensor whose copies can follow its writes (an
    inference tensor has no version counter)."""
    return (
        weight.dtype == torch.int8
        and weight.device.type == "cpu"
        and not weight.is_inference()
        and weight.dim() == 2
    )


class PackedWeights:
    """The oneDNN-blocked copies of the linear weights one model reads on a CPU, kept current
    (see the module docstring). Safe to share between threads: two threads packing one weight
    at once each make the same copy, and one of them is kept."""

    def __init__(self) -> None:
        self._copies: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def __len__(self) -> int:
        return len(self._copies)

    def clear(self) -> None:
        """Drop every packed copy (each weight is packed again at its next use)."""
        self._copies = WeakIdKeyDictionary()

    def weight_for(self, weight: torch.Tensor) -> torch.Tensor:
        """The weight (float32 or bfloat16 [N, K] on a CPU) that ``_linear_pointwise`` should
        read for ``weight``: its packed copy, or ``weight`` itself where it is not packed."""
        if (
            not isinstance(weight, torch.nn.Parameter)
            or weight.is_inference()
            or weight.device.type != "cpu"
            or not onednn_serves(weight.dtype)
            or weight.dim() != 2
            or not weight.is_contiguous()
            or not available()
        ):
            return weight
        return self._copy(weight, "onednn", torch.ops.mkldnn._reorder_linear_weight)

    def int8_weight_for(self, weight: torch.Tensor) -> torch.Tensor | None:
        """oneDNN's packed copy of an int8 [N, K] weight on a CPU (a quantised model's, held
        across calls) for ``torch.ops.onednn.qlinear_pointwise``, or None where it is not
        packed (see :func:`int8_available`; an inference tensor has no version counter)."""
        if not _int8_weight(weight) or not weight.is_contiguous() or not int8_available():
            return None
        return self._copy(
            weight, "onednn int8", lambda w: torch.ops.onednn.qlinear_prepack(w, None)
        )

    def int8_panels_for(self, weight: torch.Tensor, build: str) -> cpu_int8_product.Panels | None:
        """An int8 [N, K] weight on a CPU packed for ``build`` of the byte product of a CPU
        without int8 dot products (fastbert.kernels.cpu_int8_product), or None where it is not
        packed (that build is not available, the weight holds -128, an inference tensor)."""
        if not _int8_weight(weight) or not cpu_int8_product.available(build):
            return None
        return self._copy(weight, f"panels {build}", lambda w: cpu_int8_product.pack(w, build))

    def widened_for(self, weight: torch.Tensor, columns: int) -> tuple[torch.Tensor, ...] | None:
        """float32 copies of a bfloat16 (``nn.Parameter``) or int8 [N, K] weight on a CPU,
        ``columns`` of its columns each, in oneDNN's blocked layout where :func:`available`:
        what the float32 GEMMs read that stand in for bfloat16's and int8's products on a CPU
        without their instructions (fastbert.kernels.cpu_engine_linear, cpu_engine_int8).
        Kept and made again as the packed copies are; None for a weight that is not kept
        (another dtype or device, a bfloat16 tensor that is not a parameter, an inference
        tensor)."""
        if (
            weight.dtype not in (torch.bfloat16, torch.int8)
            or (weight.dtype == torch.bfloat16 and not isinstance(weight, torch.nn.Parameter))
            or weight.device.type != "cpu"
            or weight.is_inference()
            or weight.dim() != 2
        ):
            return None
        reorder = torch.ops.mkldnn._reorder_linear_weight if available() else None

        def widen(w: torch.Tensor) -> tuple[torch.Tensor, ...]:
            parts = (
                w[:, s : s + columns].float().contiguous() for s in range(0, w.shape[1], columns)
            )
            return tuple(part if reorder is None else reorder(part) for part in parts)

        return self._copy(weight, f"float32 in {columns} columns", widen)

    def _copy(self, weight: torch.Tensor, kind: str, pack: Callable[[torch.Tensor], Copy]) -> Copy:
        """``pack(weight)``, the copy of this ``kind``, made again when the weight's identity
        changed since it was made (one weight may have copies of several kinds)."""
        identity = _identity(weight)
        kinds = self._copies.get(weight, {})
        entry = kinds.get(kind)
        if entry is None or entry[0] != identity:
            with torch.no_grad():
                # The entry holds the memory it was made from: a weight given new memory
                # (``weight.data = ...``) cannot be handed the old address while the copy
                # lives, so the address tells the two apart.
                entry = (identity, pack(weight.detach()), weight.untyped_storage())
            # A new dict, never one another thread may be reading, replaced whole.
            self._copies[weight] = {**kinds, kind: entry}
        return entry[1]
