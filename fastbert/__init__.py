"""fastbert: a BERT-family encoder whose hot paths are Triton kernels.

>>> import fastbert
>>> model = fastbert.BertModel.from_pretrained("path/to/checkpoint")  # or an HF model instance
>>> out = model(input_ids, attention_mask)  # .last_hidden_state, .pooler_output
>>> fastbert.optimize(hf_or_sentence_transformers_model)  # in place; returns the model
"""

from fastbert import hf as _hf
from fastbert.config import BertConfig
from fastbert.integrations.optimize import optimize
from fastbert.modeling import (
    BertForMaskedLM,
    BertForNextSentencePrediction,
    BertForSequenceClassification,
    BertModel,
)

__version__ = "0.1.0"

# attn_implementation="fastbert" for Hugging Face models: registered with transformers now if it
# is loaded, else when it loads (fastbert never imports transformers itself; see fastbert.hf).
_hf.register_on_import()

__all__ = [
    "BertConfig",
    "BertForMaskedLM",
    "BertForNextSentencePrediction",
    "BertForSequenceClassification",
    "BertModel",
    "__version__",
    "optimize",
]
