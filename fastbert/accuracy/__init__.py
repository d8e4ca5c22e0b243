"""``fastbert accuracy``: fastbert against Hugging Face float32, stage by stage, in each dtype.

:mod:`~fastbert.accuracy.stages` runs both models on the same weights and inputs and compares
the hidden states after the embeddings and each layer, the masked-LM logits and the sentence
embedding (see its docstring for what is measured).
"""

from fastbert.accuracy.stages import (
    DTYPE_NAMES,
    PRECISION_NAMES,
    TEXTS,
    Report,
    compare,
    evaluate,
    supported_dtypes,
    top_k_agreement,
)

__all__ = [
    "DTYPE_NAMES",
    "PRECISION_NAMES",
    "TEXTS",
    "Report",
    "compare",
    "evaluate",
    "supported_dtypes",
    "top_k_agreement",
]
