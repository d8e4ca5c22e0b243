"""The names users import: the façade's names (one meaning each: fastbert.embed is the function)
and the kernels' public ops; and fastbert.kernels is loaded, and its custom ops registered,
once."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest

import fastbert
from fastbert import kernels as K

# What users import from fastbert and from fastbert.kernels.
FACADE = "BertConfig BertModel BertForMaskedLM BertForNextSentencePrediction BertForPreTraining"
FACADE = (*FACADE.split(), "BertForSequenceClassification", "embed", "optimize")
KERNEL_OPS = "attention attention_varlen scaled_masked_softmax linear layer_norm".split()
KERNEL_OPS = (*KERNEL_OPS, "embeddings_layer_norm", "linear_int8")


@pytest.mark.parametrize("name", FACADE)
def test_the_facade_names(name: str) -> None:
    assert name in fastbert.__all__
    assert callable(getattr(fastbert, name))


def test_version() -> None:
    from fastbert.version import __version__

    assert fastbert.__version__ == __version__


@pytest.mark.parametrize("name", KERNEL_OPS)
def test_kernel_ops_have_the_reference_signature(name: str) -> None:
    """K.<op>, the torch backend's public <op> and the reference take the same leading
    arguments (the reference adds only keyword-only test hooks such as dropout_mask)."""
    public = inspect.signature(getattr(K, name)).parameters
    reference = inspect.signature(getattr(K.reference, name)).parameters
    torch_op = inspect.signature(getattr(K.torch_ops, name)).parameters
    positional = [p for p, v in reference.items() if v.kind is not v.KEYWORD_ONLY]
    assert list(public)[: len(positional)] == positional
    assert list(torch_op)[: len(positional)] == positional
    assert K.OPS[name].reference is getattr(K.reference, name)


def test_fastbert_embed_is_a_function_and_old_names_are_gone() -> None:
    """One meaning per name: fastbert.embed is the function (the job's package is
    fastbert.embedding), and the modules' old names are not kept as aliases."""
    import types

    from fastbert.embedding.api import embed

    assert fastbert.embed is embed and isinstance(fastbert.embed, types.FunctionType)
    for gone in ("hf", "torch_ops", "nope"):
        with pytest.raises(AttributeError, match=f"no attribute '{gone}'"):
            getattr(fastbert, gone)


LAZY_FACADE = """
import sys
import fastbert
assert "torch" not in sys.modules, "import fastbert imported torch"
import transformers.masking_utils, transformers.modeling_utils
assert "fastbert" in transformers.modeling_utils.AttentionInterface._global_mapping
assert "fastbert" in transformers.masking_utils.AttentionMaskInterface._global_mapping
from fastbert.model.encoder import BertModel
assert fastbert.BertModel is BertModel and "BertModel" in dir(fastbert)
assert fastbert.kernels.attention is not None
"""


def test_import_fastbert_is_light_and_still_registers_with_transformers() -> None:
    """``import fastbert`` imports no torch (its names load on first use), yet registers
    attn_implementation="fastbert" with transformers when that loads afterwards."""
    result = subprocess.run(
        [sys.executable, "-c", LAZY_FACADE], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr


def test_an_op_registers_once() -> None:
    """A second declaration of an op's name raises instead of replacing the registered custom
    op under the first declaration's feet."""
    with pytest.raises(RuntimeError, match="fastbert::linear is registered already"):
        dataclasses.replace(K.LINEAR)
