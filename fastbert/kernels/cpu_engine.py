"""The CPU engine: the ops the torch backend runs on a CPU in place of the plain ones.

``backend="torch"`` (and ``"auto"`` off CUDA) runs the plain torch backend
(fastbert.kernels.torch_ops, PyTorch's primitives only) on any device; on a CPU,
fastbert.execution.backends takes the ops of :data:`OPS` from here instead. Each takes the
plain op's signature and semantics and hands a call it does not take to the plain op, so the
results are those of the plain backend within its tolerance:

- attention / attention_varlen (fastbert.kernels.cpu_engine_attention): the compiled
  attention of cpu_attention.cpp where it is built (float32 on any CPU with AVX2, bfloat16
  too with AVX512_BF16), one SDPA call per run of equal-length sequences, and in bfloat16 a
  float32 math path for short runs;
- linear (fastbert.kernels.cpu_engine_linear): one oneDNN call with GELU or the residual add
  as its post-op, reading the weights' packed copies (fastbert.kernels.packed_weights) when
  the caller passes ``packs``; in bfloat16, GELU by table on the rounded product
  (fastbert.kernels.cpu_gelu) where the CPU has AVX512BW; on a CPU without what oneDNN's
  bfloat16 needs, the product of the bfloat16 values in float32, rounded once to bfloat16.

- linear_int8 (fastbert.kernels.cpu_engine_int8): the plain op with the rows' quantisation and
  the dequantising epilogue compiled for this CPU (fastbert.kernels.cpu_int8), the same bits as
  its PyTorch passes; the integer product on oneDNN's quantised linear reading the weights'
  packed copies where the caller passes ``packs`` and the CPU has AMX-INT8, on
  ``torch._int_mm`` where it has VNNI, and without int8 dot products as exact float32 GEMMs
  on the weights' kept float32 copies (docs/cpu.md, "int8").
- layer_norm (fastbert.kernels.cpu_layer_norm): the residual add and the LayerNorm in one
  compiled pass over each row (float32 and bfloat16, no dropout);
- embeddings_layer_norm (the same module): the three table lookups, their float32 sum and the
  LayerNorm in one compiled pass over each token.

The other ops (the softmax, the fp8 linear, the SPLADE head) are the plain backend's on a CPU
too. :func:`status` says what the engine runs here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import (
    cpu_attention,
    cpu_engine_attention,
    cpu_engine_int8,
    cpu_engine_linear,
    cpu_gelu,
    cpu_int8,
    cpu_int8_product,
    cpu_layer_norm,
    packed_weights,
)
from .cpu_engine_attention import attention
from .cpu_library import has_int8_dot_products

# The engine's op for each op name of fastbert.kernels.OPS it replaces, with the signature of
# that op's plain torch implementation (``Op.torch``: unchecked).
OPS: dict[str, Callable[..., torch.Tensor]] = {
    "attention": cpu_engine_attention.attention_unchecked,
    "attention_varlen": cpu_engine_attention.attention_varlen_unchecked,
    "linear": cpu_engine_linear.linear_unchecked,
    "linear_int8": cpu_engine_int8.linear_int8_unchecked,
    "layer_norm": cpu_layer_norm.layer_norm_unchecked,
    "embeddings_layer_norm": cpu_layer_norm.embeddings_layer_norm_unchecked,
}


def serves(device: torch.device | str) -> bool:
    """Whether the engine runs the torch backend's ops for tensors on ``device`` (a CPU)."""
    return torch.device(device).type == "cpu"


def attention_status() -> str:
    """The compiled attention's build and dtypes here, or why it does not run."""
    if not cpu_attention.available():
        return cpu_attention.status()
    dtypes = " and ".join(str(d).removeprefix("torch.") for d in cpu_attention.dtypes())
    tiles = "; bfloat16 q k^T and P @ V on AMX tiles" if cpu_attention.tiles() else ""
    return f"{dtypes}, the {cpu_attention.running()} build: {cpu_attention.status()}{tiles}"


def status() -> dict[str, str]:
    """What the engine runs on this machine, by part, in words (for ``fastbert info``); builds
    the compiled attention if it is not built yet."""
    onednn = cpu_engine_linear.has_onednn_linear()
    return {
        "compiled attention": attention_status(),
        "linear": linear_status(onednn),
        "packed weights": "available" if packed_weights.available() else "unavailable",
        "int8 linear": int8_status(),
        "LayerNorm": "residual add and LayerNorm compiled in one pass, and the embeddings' "
        "lookups, sum and LayerNorm"
        if cpu_layer_norm.available()
        else f"PyTorch's ops (compiled pass {cpu_layer_norm.status()})",
    }


def linear_status(onednn: bool) -> str:
    """The float linear here, in words."""
    if not onednn:
        return "F.linear (no oneDNN in this torch)"
    if cpu_gelu.available():
        return "oneDNN with post-ops; bfloat16 GELU by table on the rounded product"
    if not packed_weights.onednn_serves(torch.bfloat16):
        return "oneDNN with post-ops; bfloat16 as float32 products rounded to bfloat16"
    return "oneDNN with post-ops"


def int8_status() -> str:
    """The int8 linear's product and passes here, in words."""
    if packed_weights.int8_available():
        product = (
            "oneDNN's quantised linear on packed weights (AMX-INT8) from "
            f"{cpu_engine_int8.ONEDNN_MIN_ROWS} tokens, torch._int_mm below"
        )
    elif has_int8_dot_products():
        product = "torch._int_mm"
    elif (build := cpu_int8_product.chosen()) is not None:
        registers = cpu_int8_product.REGISTERS[build]
        product = (
            f"{registers}'s byte multiply-adds on packed weights, exact (no int8 dot products)"
        )
    else:
        product = "exact float32 GEMMs on the weights' float32 copies (no int8 dot products)"
    if cpu_int8.available():
        return f"{product}, its quantisation and epilogue compiled"
    return f"{product} and PyTorch's ops (compiled passes {cpu_int8.status()})"


__all__ = ["OPS", "attention", "serves", "status"]
