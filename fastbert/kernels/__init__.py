"""fastbert.kernels: BERT's hot ops, each declared once, on Triton kernels and on PyTorch.

Each op is one :class:`~fastbert.kernels.op.Op` declaration (at the end of its kernel's
module) holding its semantics (:mod:`fastbert.kernels.reference`, the float64 oracle), its
torch backend (:mod:`fastbert.kernels.torch_ops`), its Triton forward and backward launchers
with their fake implementations, and its autograd formula; op.py wires every op into a
``torch.ops.fastbert`` custom op, an autograd Function and the public call. :data:`OPS` lists
them by name; fastbert.execution.backends dispatches through it.

The public functions below have the signatures of :mod:`fastbert.kernels.reference`; each runs
on CUDA tensors, or on CPU tensors under the Triton interpreter (``TRITON_INTERPRET=1`` set
before import). Shared helpers are public modules too: :mod:`~fastbert.kernels.checks` (input
validation), :mod:`~fastbert.kernels.dropout` (the kernels' dropout masks),
:mod:`~fastbert.kernels.launch` (where kernels run, autotuning, launch helpers),
:mod:`~fastbert.kernels.cpu_engine` (the torch backend's ops on a CPU: the compiled attention,
oneDNN's linear) and :mod:`~fastbert.kernels.packed_weights` (oneDNN's packed copies of the
CPU linears' weights).
"""

from . import (
    checks,
    cpu_engine,
    dropout,
    launch,
    packed_weights,
    reference,
    sparse_head_torch,
    torch_ops,
)
from .flash_attention import ATTENTION, ATTENTION_VARLEN, attention, attention_varlen
from .fused_embeddings import EMBEDDINGS_LAYER_NORM, embeddings_layer_norm
from .fused_layer_norm import LAYER_NORM, layer_norm
from .fused_linear import LINEAR, linear
from .masked_softmax import SCALED_MASKED_SOFTMAX, scaled_masked_softmax
from .op import Kernel, Op
from .quantized_linear import LINEAR_FP8, LINEAR_INT8, linear_fp8, linear_int8
from .sparse_head import SPLADE_MAX, splade_max

# Every op, by name: what the backends dispatch over.
OPS: dict[str, Op] = {
    op.name: op
    for op in (
        ATTENTION,
        ATTENTION_VARLEN,
        SCALED_MASKED_SOFTMAX,
        LINEAR,
        LINEAR_INT8,
        LINEAR_FP8,
        LAYER_NORM,
        EMBEDDINGS_LAYER_NORM,
        SPLADE_MAX,
    )
}

__all__ = [
    "OPS",
    "Kernel",
    "Op",
    "attention",
    "attention_varlen",
    "checks",
    "cpu_engine",
    "dropout",
    "embeddings_layer_norm",
    "launch",
    "layer_norm",
    "linear",
    "linear_fp8",
    "linear_int8",
    "packed_weights",
    "reference",
    "scaled_masked_softmax",
    "sparse_head_torch",
    "splade_max",
    "torch_ops",
]
