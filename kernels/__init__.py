"""fastbert.kernels: Triton kernels for BERT's hot ops, and their pure-PyTorch references.

The public ops have the signatures of :mod:`fastbert.kernels.reference` (the pure-PyTorch
backend and test oracle); each runs on CUDA tensors, or on CPU tensors under the Triton
interpreter (``TRITON_INTERPRET=1`` set before import).
"""

from . import reference
from .flash_attention import attention, attention_varlen
from .fused_embeddings import embeddings_layer_norm
from .fused_layer_norm import layer_norm
from .fused_linear import linear
from .masked_softmax import scaled_masked_softmax

__all__ = [
    "attention",
    "attention_varlen",
    "embeddings_layer_norm",
    "layer_norm",
    "linear",
    "reference",
    "scaled_masked_softmax",
]
