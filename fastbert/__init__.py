"""fastbert: a BERT-family encoder whose hot paths are Triton kernels.

>>> import fastbert
>>> model = fastbert.BertModel.from_pretrained("path/to/checkpoint")  # or an HF model instance
>>> out = model(input_ids, attention_mask)  # .last_hidden_state, .pooler_output
>>> fastbert.optimize(hf_or_sentence_transformers_model)  # in place; returns the model
>>> fastbert.embed(["a text", "another"], model="path/to/model")  # numpy [2, hidden]
"""

from fastbert import hf as _hf
from fastbert.config import BertConfig
from fastbert.integrations.optimize import optimize
from fastbert.modeling import (
    BertForMaskedLM,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
)

__version__ = "0.1.0"

# attn_implementation="fastbert" for Hugging Face models: registered with transformers now if it
# is loaded, else when it loads (fastbert never imports transformers itself; see fastbert.hf).
_hf.register_on_import()


def __getattr__(name: str) -> object:
    # fastbert.embed (the package, callable as the function) loads on first use, so importing
    # fastbert imports neither pyarrow nor the tokenizer stack.
    if name == "embed":
        import fastbert.embed

        return fastbert.embed
    raise AttributeError(f"module 'fastbert' has no attribute {name!r}")


__all__ = [
    "BertConfig",
    "BertForMaskedLM",
    "BertForNextSentencePrediction",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertModel",
    "__version__",
    "embed",
    "optimize",
]
