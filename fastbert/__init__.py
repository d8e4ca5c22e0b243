"""fastbert: a BERT-family encoder whose hot paths are Triton kernels.

>>> import fastbert
>>> model = fastbert.BertModel.from_pretrained("path/to/checkpoint")  # or an HF model instance
>>> out = model(input_ids, attention_mask)  # .last_hidden_state, .pooler_output
"""

from fastbert.config import BertConfig
from fastbert.modeling import (
    BertForMaskedLM,
    BertForNextSentencePrediction,
    BertForSequenceClassification,
    BertModel,
)

__version__ = "0.1.0"

__all__ = [
    "BertConfig",
    "BertForMaskedLM",
    "BertForNextSentencePrediction",
    "BertForSequenceClassification",
    "BertModel",
    "__version__",
]
