"""fastbert: a BERT-family encoder whose hot paths are Triton kernels.

>>> import fastbert
>>> model = fastbert.BertModel.from_pretrained("path/to/checkpoint")  # or an HF model instance
>>> out = model(input_ids, attention_mask)  # .last_hidden_state, .pooler_output
>>> fastbert.optimize(hf_or_sentence_transformers_model)  # in place; returns the model
>>> fastbert.embed(["a text", "another"], model="path/to/model")  # numpy [2, hidden]
>>> model = fastbert.load("path/to/model")  # loaded once: model.embed(texts), thread-safe

The package is built in rooms, one per package folder (this module is the façade). Besides its
own modules, a room imports only the rooms its row below names, at any depth, inside functions
too: imports point down the layers, or sideways among the jobs of layer 4 (one row: each may
import the others).

    layer  room          modules                          may import
    5      commands      fastbert.commands, fastbert.cli  façade, accuracy, bench, embedding,
                                                          serve, integrations, model, execution,
                                                          kernels, settings, version
    5      façade        fastbert                         integrations, model, execution,
                                                          kernels, settings, version; accuracy,
                                                          bench, embedding only inside functions
    4      accuracy      fastbert.accuracy                each other, integrations, model,
           bench         fastbert.bench                   execution, kernels, settings, version
           embedding     fastbert.embedding
           serve         fastbert.serve
    3      integrations  fastbert.integrations            model, execution, kernels, settings,
                                                          version
    2      model         fastbert.model                   execution, kernels, settings, version
    1      execution     fastbert.execution               kernels, settings, version
    0      kernels       fastbert.kernels                 settings; outside fastbert only torch,
                                                          triton, numpy and the standard library
    0      settings      fastbert.settings                only the standard library
    0      version       fastbert.version                 nothing

A module imports a name from the room that defines it (``from fastbert.model.encoder import
BertModel``, ``from fastbert.version import __version__``), not from this façade, which only
the commands and the cli import; it imports no private name (``_name``) from another room; and
no modules import each other, directly or round a cycle. tests/test_architecture.py holds this
table as data, checks every import in the package against it, and checks this picture too.
"""

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from fastbert.integrations import registration as _registration
from fastbert.version import __version__

if TYPE_CHECKING:  # what __getattr__ returns, for type checkers and the API reference
    from fastbert.embedding.api import embed
    from fastbert.embedding.loading import load
    from fastbert.embedding.text_model import TextModel
    from fastbert.integrations.optimize import optimize
    from fastbert.model.config import BertConfig
    from fastbert.model.encoder import BertModel
    from fastbert.model.heads import (
        BertForMaskedLM,
        BertForNextSentencePrediction,
        BertForPreTraining,
        BertForSequenceClassification,
    )

# Nothing heavy is imported here: each name loads its module on first use (so that
# ``fastbert --help`` and ``import fastbert`` import neither torch nor triton).
_NAMES = {
    "BertConfig": "fastbert.model.config",
    "BertModel": "fastbert.model.encoder",
    "BertForMaskedLM": "fastbert.model.heads",
    "BertForNextSentencePrediction": "fastbert.model.heads",
    "BertForPreTraining": "fastbert.model.heads",
    "BertForSequenceClassification": "fastbert.model.heads",
    "optimize": "fastbert.integrations.optimize",
    # fastbert.embed, fastbert.load and the TextModel it returns live in the embedding job
    # (loaded on first use: importing fastbert imports neither pyarrow nor the tokenizer stack).
    "embed": "fastbert.embedding.api",
    "load": "fastbert.embedding.loading",
    "TextModel": "fastbert.embedding.text_model",
}
# The rooms, reachable as attributes as they were when this module imported them eagerly.
_ROOMS = ("kernels", "execution", "model", "integrations")


def _attention_entries() -> ModuleType:
    from fastbert.integrations import attention

    return attention


# attn_implementation="fastbert" for Hugging Face models: registered with transformers now if it
# is loaded, else when it loads (fastbert never imports transformers itself; see
# fastbert.integrations.registration).
_registration.register_on_import(_attention_entries)


def __getattr__(name: str) -> object:
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    if name in _ROOMS:
        return importlib.import_module(f"fastbert.{name}")
    raise AttributeError(f"module 'fastbert' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_ROOMS})


__all__ = [
    "BertConfig",
    "BertForMaskedLM",
    "BertForNextSentencePrediction",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertModel",
    "TextModel",
    "__version__",
    "embed",
    "load",
    "optimize",
]
