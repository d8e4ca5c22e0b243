"""fastbert.kernels: Triton kernels for BERT's hot ops, and their pure-PyTorch references."""

from . import reference

__all__ = ["reference"]
