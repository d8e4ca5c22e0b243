"""``fastbert accuracy``: fastbert against the float32 reference, in each precision.

Two reports:

- :mod:`~fastbert.accuracy.stages` runs fastbert and Hugging Face's float32 model on the same
  weights and inputs and compares the hidden states after the embeddings and each layer, the
  masked-LM logits and the sentence embedding (see its docstring for what is measured);
- :mod:`~fastbert.accuracy.precision_report` (``--precisions``) runs ``fastbert.optimize`` in
  each precision against sentence-transformers float32 on a retrieval sample of real text:
  hidden-state errors, the sentence embeddings' cosine and the top-10 neighbour overlap.

:mod:`~fastbert.accuracy.precisions` is the table of precisions both read.
"""

from fastbert.accuracy.precision_report import (
    PrecisionReport,
    PrecisionResult,
    check_precisions,
    evaluate_precisions,
)
from fastbert.accuracy.precisions import PRECISION_NAMES, PRECISIONS, Precision, runnable
from fastbert.accuracy.retrieval import neighbours, overlap, retrieval_sample
from fastbert.accuracy.stages import (
    DTYPE_NAMES,
    TEXTS,
    Report,
    compare,
    evaluate,
    supported_dtypes,
    top_k_agreement,
)

__all__ = [
    "DTYPE_NAMES",
    "PRECISIONS",
    "PRECISION_NAMES",
    "TEXTS",
    "Precision",
    "PrecisionReport",
    "PrecisionResult",
    "Report",
    "check_precisions",
    "compare",
    "evaluate",
    "evaluate_precisions",
    "neighbours",
    "overlap",
    "retrieval_sample",
    "runnable",
    "supported_dtypes",
    "top_k_agreement",
]
