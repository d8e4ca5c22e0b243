"""fastbert: a BERT-family encoder whose hot paths are Triton kernels.

>>> import fastbert
>>> model = fastbert.BertModel.from_pretrained("path/to/checkpoint")  # or an HF model instance
>>> out = model(input_ids, attention_mask)  # .last_hidden_state, .pooler_output
>>> fastbert.optimize(hf_or_sentence_transformers_model)  # in place; returns the model
>>> fastbert.embed(["a text", "another"], model="path/to/model")  # numpy [2, hidden]
>>> model = fastbert.load("path/to/model")  # loaded once: model.embed(texts), thread-safe

The package is built in rooms, one per package folder (fastbert.kernels is the kernels/ folder
at the repository root; this module is the façade). Besides its own modules, a room imports
only the rooms on its line below, at any depth, inside functions too: imports point down the
layers, or sideways among the jobs of layer 4.

    layer  room          modules                          may import
    5      commands      fastbert.commands, fastbert.cli  façade, accuracy, bench, embed, serve,
                                                          integrations, model, execution,
                                                          kernels, version
    5      façade        fastbert                         integrations, model, execution,
                                                          kernels, version; accuracy, bench,
                                                          embed only inside functions
    4      accuracy      fastbert.accuracy                bench, embed, serve, integrations,
                                                          model, execution, kernels, version
    4      bench         fastbert.bench                   accuracy, embed, serve, integrations,
                                                          model, execution, kernels, version
    4      embed         fastbert.embed                   accuracy, bench, serve, integrations,
                                                          model, execution, kernels, version
    4      serve         fastbert.serve                   accuracy, bench, embed, integrations,
                                                          model, execution, kernels, version
    3      integrations  fastbert.integrations            model, execution, kernels, version
    2      model         fastbert.model                   execution, kernels, version
    1      execution     fastbert.execution               kernels, version
    0      kernels       fastbert.kernels                 only torch, triton, numpy and the
                                                          standard library
    0      version       fastbert.version                 nothing

A module imports a name from the room that defines it (``from fastbert.model.encoder import
BertModel``, ``from fastbert.version import __version__``), not from this façade, which only
the commands and the cli import; it imports no private name (``_name``) from another room; and
no modules import each other, directly or round a cycle. tests/test_architecture.py holds this
table as data, checks every import in the package against it, and checks this picture too.
"""

import importlib

from fastbert.integrations import attention as _hf_attention
from fastbert.integrations.optimize import optimize
from fastbert.model.config import BertConfig
from fastbert.model.encoder import BertModel
from fastbert.model.heads import (
    BertForMaskedLM,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForSequenceClassification,
)
from fastbert.version import __version__

# attn_implementation="fastbert" for Hugging Face models: registered with transformers now if it
# is loaded, else when it loads (fastbert never imports transformers itself; see
# fastbert.integrations.attention).
_hf_attention.register_on_import()


# Modules that moved into the rooms, still reachable by their old names (fastbert.hf.register(),
# from fastbert import torch_ops).
# fastbert.load and the TextModel it returns live in the embed job, loaded on first use too.
_LOADING = ("load", "TextModel")
_MOVED = {"hf": "fastbert.integrations.attention", "torch_ops": "fastbert.kernels.torch_ops"}


def __getattr__(name: str) -> object:
    # fastbert.embed (the package, callable as the function) loads on first use, so importing
    # fastbert imports neither pyarrow nor the tokenizer stack.
    if name == "embed":
        import fastbert.embed

        return fastbert.embed
    if name in _LOADING:
        from fastbert.embed import text_model

        return getattr(text_model, name)
    if name in _MOVED:
        return importlib.import_module(_MOVED[name])
    raise AttributeError(f"module 'fastbert' has no attribute {name!r}")


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
