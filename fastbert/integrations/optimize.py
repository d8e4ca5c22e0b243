"""``fastbert.optimize``: fastbert's encoder inside an existing Hugging Face or
sentence-transformers model, in place.

The model keeps every module, head and parameter it had. Only its base model (``model.bert``,
``model.roberta``, ``model.electra``, ``model.distilbert``, ``model.mpnet``, ``model.model``
(ModernBERT), the model itself when it is the
base model, or a SentenceTransformer's ``auto_model``) gets a new ``forward``: a
:class:`FastbertForward`, which takes Hugging Face's arguments, runs a fastbert
:class:`~fastbert.model.encoder.BertModel` and returns the output class the heads expect.

No second copy of the weights: the fastbert encoder's parameters *are* the Hugging Face
tensors, except the fused [3H, H] QKV weight (and [3H] bias) of each layer, which is built once;
the Hugging Face query / key / value parameters then become row views of it. ``state_dict``,
``save_pretrained`` and the heads see the same tensors as before. Every call checks that this
still holds and rebuilds the binding when it does not: after the model is moved or cast
(``.to()``, ``.half()``), a parameter is replaced (``load_state_dict(..., assign=True)``, a
module swapped, as PEFT's merge does) or a query / key / value ``.data`` is replaced. Values
changed in place (``.data.copy_()``, an optimizer step) need nothing: the storage is shared.

The optimized model trains: in ``model.train()`` mode the encoder applies the config's
dropout, and gradients reach the Hugging Face parameters themselves (the query, key and value
parameters each get their own: while a call records gradients, each layer reads their
concatenation instead of the fused tensor), so a Hugging Face ``Trainer`` or a plain PyTorch
loop trains the optimized model unchanged and ``save_pretrained`` saves what it learned.

A sentence-transformers model runs its own modules (pooling, Dense, SPLADE pooling, MaxSim
masks, a cross-encoder's head) on the encoder's outputs as before. One of them reads outputs
at masked positions: ColBERT query expansion that does not attend to the expansion tokens
(``query_expansion={..., "attend": False}``), whose outputs MaxSim scores; while a model's
Transformer expands so, its encoder runs dense (``padding_free="auto"`` becomes False), which
computes every position as Hugging Face does.

The differences between families are data (fastbert.model.families). transformers is imported only
when ``optimize`` runs (for the output classes), never at ``import fastbert``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import inspect
import threading
from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any

import torch
from torch import nn

from fastbert.execution import padded_positions, runtime, validation
from fastbert.execution.backends import check_backend, check_head_dim
from fastbert.integrations import hooks, training_modes
from fastbert.integrations.binding import (
    bind_encoder,
    config_as_built,
    config_as_run,
    fused_views,
    positions_counted_as_built,
)
from fastbert.model.config import BertConfig
from fastbert.model.encoder import BertModel
from fastbert.model.families import (
    Family,
    family_of_class,
    family_of_model_type,
    supported_classes,
)
from fastbert.model.loading import PretrainedMixin, is_sentence_transformer
from fastbert.model.outputs import BaseModelOutputWithPooling
from fastbert.model.weights import registration_generation

# Base-model arguments fastbert cannot honour -> why (any value but None / False raises).
_UNSUPPORTED = {
    "inputs_embeds": "fastbert embeds input_ids itself; pass input_ids",
    "position_ids": "positions are computed from input_ids as the model family does",
    "head_mask": "fastbert does not mask attention heads",
    "output_attentions": "the fused attention never forms the attention probabilities",
    "output_hidden_states": "fastbert returns the last hidden state only",
    "encoder_hidden_states": "fastbert runs encoders, not cross-attention",
    "encoder_attention_mask": "fastbert runs encoders, not cross-attention",
    "past_key_values": "fastbert runs encoders, without a key/value cache",
}


# What sentence-transformers' modules write into a features dict: a loss that runs the dict
# through the model again (CachedGISTEmbedLoss, ContrastiveTensionLossInBatchNegatives) passes
# them back as keyword arguments, which Hugging Face's forward takes in **kwargs and ignores.
_SENTENCE_OUTPUTS = ("token_embeddings", "sentence_embedding", "all_layer_embeddings", "scores")


def optimize(
    model: Any,
    *,
    dtype: torch.dtype | None = None,
    backend: str = "auto",
    padding_free: str | bool = "auto",
    cuda_graphs: str | bool = "auto",
    quantize: str | None = None,
    packed_weights: bool = False,
) -> Any:
    """Swap fastbert's encoder into ``model`` in place and return ``model``.

    model: a transformers BERT, RoBERTa, XLM-RoBERTa, ELECTRA, DistilBERT, MPNet or ModernBERT
    base model or one
    of their supported heads (:func:`fastbert.model.families.supported_classes`), or a
    sentence-transformers model whose first module is a Transformer holding one (or a Router
    with one Transformer among its routes: inference-free SPLADE).
    dtype: float16, bfloat16 or float32 to cast the whole model to first (None keeps its dtype).
    backend: "auto" (Triton on CUDA, PyTorch elsewhere), "torch" or "triton".
    padding_free, cuda_graphs: "auto", True or False, as for fastbert.BertModel (a
    sentence-transformers model with query expansion that does not attend to its expansion
    tokens runs dense: see the module docstring; padding_free=True raises for it).
    packed_weights: True to have the CPU linears read packed copies of the weights (faster,
    the same results; see fastbert.execution.runtime.Runner). Leave it False when the
    model's weights may be written through ``.data`` (``p.data.copy_(...)``), which the
    packed copies do not see.
    quantize: None (exact), "int8" or "fp8": the encoder layers' linears on int8 (or float8
    e4m3) weights (per output channel) and activations (per token), for inference only
    (fastbert.model.quantization): the encoder's parameters are frozen
    (``requires_grad=False``) and a call in training mode or recording gradients raises. The
    model's float weights stay its parameters (``state_dict`` and ``save_pretrained``
    unchanged); the quantised copies follow their changes, except writes through ``.data``
    (as packed_weights). On the CPU it needs float32 (fp8
    there is an emulation, for its accuracy), on CUDA sm_80 (int8) or sm_89 (fp8) or newer.

    The model runs inference and training (see the module docstring); any argument fastbert
    cannot honour raises
    (inputs_embeds, position_ids, head_mask, output_attentions, output_hidden_states, caches,
    cross-attention inputs), each with a message naming it. token_type_ids given to a family
    without token types (DistilBERT, MPNet, ModernBERT) are ignored, as Hugging Face ignores
    them.
    Raises TypeError for an unsupported model class or a dtype other than float16, bfloat16 or
    float32 (float32 only with quantize on the CPU), and ValueError for an unsupported config
    (relative position embeddings, a decoder, an unknown activation) or quantize value, before
    changing anything.
    """
    check_backend(backend)
    runtime.check_setting("padding_free", padding_free)
    runtime.check_setting("cuda_graphs", cuda_graphs)
    runtime.check_flag("packed_weights", packed_weights)
    if dtype is not None:
        validation.check_dtype(dtype)
    validation.check_quantize(quantize)
    hf_model = _transformers_model(model)
    family, base = base_model(hf_model)
    config = config_as_built(hf_model.config, family, base.get_submodule(family.layer_prefix))
    if backend == "triton":
        check_head_dim(config.head_dim)
    masked_outputs_read = _masked_outputs_read(model)
    if padding_free is True and masked_outputs_read is not None and masked_outputs_read():
        raise ValueError(_PADDING_FREE_EXPANSION)
    first = next(base.parameters())
    validation.check_quantize(quantize, dtype or first.dtype, first.device)
    if dtype is not None and dtype != first.dtype:
        model.to(dtype)
    settings = {
        "backend": backend,
        "padding_free": padding_free,
        "cuda_graphs": cuda_graphs,
        "quantize": quantize,
        "packed_weights": packed_weights,
    }
    base.forward = FastbertForward(base, family, config, settings, masked_outputs_read)
    if hf_model is not base and not is_sentence_transformer(model):
        _compute_padding_where_losses_read_it(hf_model)
    return model


def _loss_reads_padding(arguments: dict[str, Any]) -> bool:
    """Whether a head's loss, for these forward arguments, reads the encoder's outputs at
    padded positions: a question-answering head's (its softmax spans every position), or a
    token-level head's whose labels hold a target (not -100) at a padded position."""
    mask = arguments.get("attention_mask")
    if not isinstance(mask, torch.Tensor):
        return False
    if arguments.get("start_positions") is not None or arguments.get("end_positions") is not None:
        return True
    return padded_positions.labels_at_padding(mask, arguments.get("labels"))


def _compute_padding_where_losses_read_it(head: nn.Module) -> None:
    """Hooks on the head ``head``: a call whose loss reads padded positions
    (:func:`_loss_reads_padding`) or whose backward does (:func:`_backward_reads_padding`)
    runs its encoder dense, as Hugging Face computes them. The
    hooks are module-level functions, so that the model pickles."""
    if not {"labels", "start_positions"} & set(_forward_signature(type(head)).parameters):
        return
    head.register_forward_pre_hook(_before_head, with_kwargs=True)
    head.register_forward_hook(_after_head, with_kwargs=True, always_call=True)


@functools.cache
def _forward_signature(cls: type) -> inspect.Signature:
    return inspect.signature(cls.forward)


# Per thread: padded_positions.want_every_position's values before each head call in progress.
_HEAD_CALLS = threading.local()


def _backward_reads_padding(head: nn.Module, arguments: dict[str, Any]) -> bool:
    """Whether a call of ``head`` records gradients through padded positions that a
    padding-free call would leave constant: a float16 head on a CPU, whose LayerNorm
    backward (PyTorch's, in float16 on a CPU) gives NaN for a constant row (its 1/std
    overflows float16), where Hugging Face's padded rows are never constant."""
    mask = arguments.get("attention_mask")
    if not torch.is_grad_enabled() or not isinstance(mask, torch.Tensor):
        return False
    weight = next(head.parameters(), None)
    if weight is None or weight.dtype != torch.float16 or weight.device.type != "cpu":
        return False
    return bool((mask == 0).any())  # a host read, in float16 CPU training only


def _before_head(module: nn.Module, args: tuple, kwargs: dict) -> None:
    arguments = _forward_signature(type(module)).bind_partial(module, *args, **kwargs).arguments
    dense = _loss_reads_padding(arguments) or _backward_reads_padding(module, arguments)
    stack = _HEAD_CALLS.__dict__.setdefault("stack", [])
    stack.append(padded_positions.want_every_position(dense))


def _after_head(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
    padded_positions.want_every_position(_HEAD_CALLS.stack.pop())


_SWAPPED = (
    "the model's parameters were swapped for other tensors without registering them "
    "(torch.func.functional_call, torch.nn.utils.stateless) or made computed ones "
    "(torch.nn.utils.parametrize, weight_norm, torch.nn.utils.prune's masks): a "
    "fastbert-optimized model reads the parameters it was bound to, so it would compute with "
    "those; call the model itself, or fastbert.optimize a model holding the parameters to use "
    "(after parametrize.remove_parametrizations / prune.remove)"
)
_PADDING_FREE_EXPANSION = (
    "padding_free=True cannot run a sentence-transformers model whose Transformer expands "
    "queries without attending to the expansion (query_expansion attend=False): MaxSim scores "
    "the outputs at those masked positions, which a padding-free call does not compute; use "
    'padding_free="auto" (such a model then runs dense) or False'
)


class _ReadsMaskedOutputs:
    """Called, whether a sentence-transformers model's modules read the encoder's outputs at
    masked positions now: its Transformer ``first`` with ColBERT query expansion that does not
    attend to the expansion tokens (``query_expansion={..., "attend": False}``) gives them
    ``attention_mask`` 0 and MaxSim scores their outputs, as Hugging Face computes them (each a
    query over the real tokens). The Transformer is an attribute, not a closure's, so that a
    pickled or deep-copied model asks its own Transformer."""

    def __init__(self, first: nn.Module):
        self.first = first

    def __call__(self) -> bool:
        expansion = getattr(self.first, "query_expansion", None)
        return isinstance(expansion, dict) and not expansion.get("attend", False)


def _masked_outputs_read(model: Any) -> Callable[[], bool] | None:
    """For a sentence-transformers model, whether its modules read the encoder's outputs at
    masked positions now (:class:`_ReadsMaskedOutputs`); None for other models (their modules
    read real tokens only)."""
    if not is_sentence_transformer(model):
        return None
    return _ReadsMaskedOutputs(_transformer_module(model))


def _transformer_module(model: Any) -> nn.Module:
    """A sentence-transformers model's Transformer module: its first module, or the one
    Transformer among a first Router's routes (inference-free SPLADE's documents: its other
    route needs no encoder). TypeError when there is none."""
    first = model[0]
    routes = getattr(first, "sub_modules", None)
    if isinstance(routes, nn.ModuleDict):
        found = [m for route in routes.values() for m in route if hasattr(m, "auto_model")]
        if len(found) == 1:
            return found[0]
    if not hasattr(first, "auto_model"):
        raise TypeError(
            "the sentence-transformers model's first module is "
            f"{type(first).__name__}, not a Transformer module holding a transformers model "
            "(nor a Router with one Transformer among its routes)"
        )
    return first


def _transformers_model(model: Any) -> nn.Module:
    """The transformers model inside ``model`` (itself unless it is a sentence-transformers
    model)."""
    if not is_sentence_transformer(model):
        return model
    return _transformer_module(model).auto_model


def base_model(model: Any) -> tuple[Family, nn.Module]:
    """(family, base model) of a supported transformers model; TypeError otherwise."""
    if isinstance(model, PretrainedMixin):  # fastbert's own classes share the names
        raise TypeError(
            f"{type(model).__name__} is already fastbert's model: it runs fastbert's kernels "
            "without fastbert.optimize"
        )
    found = family_of_class([c.__name__ for c in type(model).__mro__])
    if found is None or not isinstance(model, nn.Module):
        raise TypeError(
            "fastbert.optimize takes a transformers BERT-family model or a sentence-transformers "
            f"model, got {type(model).__name__}. Supported classes: {supported_classes()}"
        )
    family, name = found
    base = model if name == family.classes[0] else getattr(model, family.base_attr)
    return family, base


class FastbertForward:
    """The forward of an optimized base model: Hugging Face's signature and output class,
    computed by a fastbert encoder sharing the model's tensors (``self.encoder``).

    Inputs: input_ids [B, S] integers, attention_mask [B, S] (1 = real token), token_type_ids
    [B, S] (families with token types). Output: the family's transformers output class with
    last_hidden_state [B, S, H] (and pooler_output [B, H] where the model has a pooler), in
    the model's dtype, or its tuple when return_dict is False.
    """

    def __init__(
        self,
        base: nn.Module,
        family: Family,
        config: BertConfig,
        settings: dict,
        masked_outputs_read: Callable[[], bool] | None = None,
    ):
        self.base = base
        self.family = family
        self.config = config
        # The Hugging Face config as the modules were built: what every rebinding reads (an
        # edit since changes nothing Hugging Face's modules compute; read afresh, a head count
        # edited after optimize gave other logits without a word).
        self._config_as_built = copy.deepcopy(base.config)
        self.settings = settings
        self._masked_outputs_read = masked_outputs_read
        signature = inspect.signature(type(base).forward)
        self._signature = signature
        self.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
        outputs = importlib.import_module("transformers.modeling_outputs")
        self._output_class = getattr(outputs, family.output_class)
        self._lock = threading.Lock()
        self._given = threading.local()
        self._bind()

    # Bound again at the first call after unpickling or copy.deepcopy (a teacher for
    # distillation, an averaged copy): to the copy's tensors, with its own lock and threads'
    # state. The family travels by its model type.
    _UNPICKLED = ("_lock", "_given", "encoder", "family", "_bypassed")

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in self._UNPICKLED}
        state["model_type"] = self.family.model_type
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.family = family_of_model_type(state.pop("model_type"))
        # A model saved before the config was kept as built: taken at its first binding.
        state.setdefault("_config_as_built", None)
        self.__dict__.update(state)
        self._lock, self._given, self.encoder = threading.Lock(), threading.local(), None

    def _bind(self) -> None:
        """(Re)build ``self.encoder`` on the model's current tensors (and config: a resized
        vocabulary changes it) and record what it reads. Outside inference mode whatever the
        caller's: a fused QKV made under it would be an inference tensor, and so would the
        query, key and value parameters made its views (never trained after)."""
        with torch.inference_mode(False):
            self._bind_now()

    def _bind_now(self) -> None:
        on_meta = next((n for n, p in self.base.named_parameters() if p.is_meta), None)
        if on_meta is not None:
            raise ValueError(
                f"{on_meta} is on the meta device (accelerate's offload, init_empty_weights or a "
                "device_map leave parameters there until a hook loads them): fastbert's encoder "
                "reads the parameters themselves; load the model with its weights in memory "
                "(one device, no offload) and optimize that"
            )
        self._layers = self.base.get_submodule(self.family.layer_prefix)
        self._bypassed = hooks.BypassedModules(self.base)
        self._norms = [m for m in self.base.modules() if isinstance(m, nn.LayerNorm)]
        self.config = positions_counted_as_built(
            self.base,
            self.family,
            config_as_run(self._config_now(), self._layers, self._norms),
        )
        self._layer_count = len(self._layers)
        self._norm_eps = [m.eps for m in self._norms]
        self._window = _window_of(self.base.config)
        self.encoder = bind_encoder(self.base, self.family, self.config, **self.settings)
        with_pooler = self.encoder.pooler is not None
        with_projection = self.config.embedding_width != self.config.hidden_size
        names = self.family.weight_names(
            self.config.num_hidden_layers, with_pooler, with_projection
        )
        self._source_names = [t for theirs in names.values() for t in theirs]
        self._sources = [self.base.get_parameter(t) for t in self._source_names]
        # A cast or move of a model without fused views (ModernBERT's QKV is its own) changes
        # no parameter object: the first one's dtype and device tell it.
        self._placement = (self._sources[0].dtype, self._sources[0].device)
        # Where each lives (its module's parameter dict and name): checked at every call, as
        # a swap that registers nothing (torch.func.functional_call) moves no generation.
        self._slots = [
            (self.base.get_submodule(owner)._parameters, name, source)
            for (owner, _, name), source in zip(
                (t.rpartition(".") for t in self._source_names), self._sources
            )
        ]
        # The paths of the modules holding those parameters (a linear there may be replaced by
        # another: BypassedModules.refuse_replaced).
        self._owners = {name.rpartition(".")[0] for name in self._source_names}
        self._views = fused_views(self.base, self.encoder, names)
        # Listed once here: dropout_now reads their p at each training call.
        self._dropouts = training_modes.dropout_modules(self.base, self.family)
        self._generation = registration_generation()

    @property
    def __code__(self) -> CodeType:
        # torch.export reads the forward's code object before calling it: given this one, an
        # export of the base model itself reaches the refusal below (without it, torch's own
        # AttributeError named neither fastbert nor what to do).
        return type(self).__call__.__code__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_exporting():
            raise RuntimeError(
                "torch.export cannot export a fastbert-optimized model (each call checks the "
                "model's parameters on the host, which export's fake tensors do not hold); use "
                "torch.compile, or export the model without fastbert.optimize"
            )
        arguments = self._arguments(args, kwargs)
        input_ids = arguments.pop("input_ids", None)
        attention_mask = arguments.pop("attention_mask", None)
        token_type_ids = arguments.pop("token_type_ids", None)
        if not self.config.type_vocab_size:
            # DistilBERT, MPNet, ModernBERT: their forward takes token_type_ids only through
            # **kwargs and ignores them (sentence-transformers passes what the tokenizer gives).
            token_type_ids = None
        return_dict = arguments.pop("return_dict", None)
        arguments.pop("use_cache", None)  # an encoder ignores it, as in Hugging Face
        # The Trainer's token count for the heads' loss, passed down through **kwargs.
        arguments.pop("num_items_in_batch", None)
        for name in _SENTENCE_OUTPUTS:  # a features dict run again (Hugging Face ignores them)
            arguments.pop(name, None)
        self._refuse(arguments)
        if input_ids is None:
            raise ValueError("input_ids is required by a fastbert-optimized model")
        encoder = self.current_encoder()
        self._bypassed.refuse_skipped_hooks()
        given = getattr(self._given, "hidden", None)
        if given is not None:
            pooled = encoder.pooler(encoder.ops(), given) if encoder.pooler is not None else None
            out = BaseModelOutputWithPooling(given, pooled)
        else:
            if self._masked_outputs_read is not None and self._masked_outputs_read():
                if encoder.padding_free is True:
                    raise ValueError(_PADDING_FREE_EXPANSION)
                if encoder.padding_free == "auto":
                    encoder.padding_free = False  # every position computed, as in Hugging Face
            out = encoder(input_ids, attention_mask, token_type_ids)
        fields = {"last_hidden_state": out.last_hidden_state}
        if "pooler_output" in self._output_class.__dataclass_fields__:
            fields["pooler_output"] = out.pooler_output
        result = self._output_class(**fields)
        if return_dict is None:
            return_dict = getattr(self.base.config, "return_dict", True)
        return result if return_dict else result.to_tuple()

    def _config_now(self) -> BertConfig:
        """The config as built, with what Hugging Face reads from the live config at each call
        (ModernBERT's window) and the vocabulary the word embeddings hold now (as
        ``resize_token_embeddings`` leaves them)."""
        if self._config_as_built is None:  # unpickled from a file saved without it
            self._config_as_built = copy.deepcopy(self.base.config)
        built = config_as_built(self._config_as_built, self.family, self._layers)
        words = self.base.get_parameter(self.family.embeddings["embeddings.word"][0])
        window = getattr(self.base.config, "local_attention", built.local_attention)
        return dataclasses.replace(built, vocab_size=words.shape[0], local_attention=window)

    def current_encoder(self) -> BertModel:
        """The encoder, rebound first if the model's tensors changed, in the model's train or
        eval mode (dropout follows ``model.train()`` / ``.eval()``, and the model's dropout
        modules put in training mode in an eval-mode model: Monte Carlo dropout)."""
        with self._lock:  # threads calling at once rebind once
            if not self._bound():
                self._bind()
            encoder = self.encoder
        training = self.base.training or training_modes.dropout_applies(self._dropouts)
        if encoder.training != training:
            encoder.train(training)
        if encoder.training:
            encoder.dropout_probabilities = self.dropout_now()
        if encoder.training and torch.is_grad_enabled():
            training_modes.follow_checkpointing(self.base, encoder)
        return encoder

    def dropout_now(self) -> tuple[float, float]:
        """:func:`fastbert.integrations.training_modes.dropout_now` of this model."""
        return training_modes.dropout_now(self._dropouts, self.family, self.config, self._layers)

    @contextlib.contextmanager
    def returning(self, hidden: torch.Tensor) -> Iterator[None]:
        """While in the block, this thread's calls return ``hidden`` [B, S, H] (in the model's
        dtype) as the last hidden state, with the pooler's output of it, in place of running
        the encoder: the model's heads then run on hidden states computed otherwise
        (fastbert.integrations.packed_classifier). Other threads' calls are not affected."""
        before = getattr(self._given, "hidden", None)
        self._given.hidden = hidden
        try:
            yield
        finally:
            self._given.hidden = before

    def _arguments(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """Hugging Face's forward arguments by name, ``**kwargs`` flattened in."""
        arguments = dict(self._signature.bind(self.base, *args, **kwargs).arguments)
        for name, param in self._signature.parameters.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(arguments.pop(name, {}))
        del arguments[next(iter(self._signature.parameters))]  # self
        return arguments

    def _refuse(self, arguments: dict[str, Any]) -> None:
        """Raise for any argument (config defaults included) fastbert cannot honour, and for a
        config made a decoder's since ``optimize`` (Hugging Face reads it at every call)."""
        config = self.base.config
        if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
            raise ValueError(
                "the model's config is now a decoder's (is_decoder / add_cross_attention); "
                "fastbert's encoder attends both ways: set them back, or call the model "
                "without fastbert"
            )
        for name in ("output_attentions", "output_hidden_states"):
            if arguments.get(name) is None:
                arguments[name] = getattr(self.base.config, name, False)
        for name, value in arguments.items():
            if value is None or value is False:
                continue
            reason = _UNSUPPORTED.get(name, "fastbert does not implement it")
            raise ValueError(
                f"{name}={_describe(value)} is not supported by a fastbert-optimized "
                f"{self.family.name} model ({reason}); call the model without "
                "fastbert.optimize for this"
            )

    def _bound(self) -> bool:
        """Whether the encoder still reads the model's tensors.

        The parameter objects in their modules are compared at every call (RuntimeError for
        tensors swapped in without registering, as torch.func.functional_call does), their
        owners after some parameter was registered anywhere (a replaced parameter or module
        registers one: a wrapped linear raises); the query, key and value parameters
        must still be views of their fused tensor (``.to()``, ``.half()`` or a replaced
        ``.data`` give them new storage), and the first parameter keeps its dtype and device.
        Other parameters are the encoder's own objects, so a new ``.data`` of theirs is read as
        it is.
        """
        if self.encoder is None:  # a copy's forward, not bound yet
            return False
        if (self._sources[0].dtype, self._sources[0].device) != self._placement:
            return False
        if any(slots.get(name) is not source for slots, name, source in self._slots):
            if not all(isinstance(slots.get(name), nn.Parameter) for slots, name, _ in self._slots):
                raise RuntimeError(_SWAPPED)
            return False
        # A layer taken out of the list in place (del, pop) registers nothing; a LayerNorm's
        # eps is read at each of its calls.
        if len(self._layers) != self._layer_count:
            return False
        if any(m.eps != eps for m, eps in zip(self._norms, self._norm_eps)):
            return False
        if _window_of(self.base.config) != self._window:
            return False
        if self._generation != registration_generation():
            self._bypassed.refuse_replaced(self.base, self._owners)
            try:
                current = [self.base.get_parameter(t) for t in self._source_names]
            except AttributeError:  # a layer or module gone
                return False
            if any(a is not b for a, b in zip(current, self._sources)):
                return False
            if self.base.get_submodule(self.family.layer_prefix) is not self._layers:
                return False
            # Modules registered since (a dropout replaced by another): listed anew.
            self._bypassed = hooks.BypassedModules(self.base)
            self._dropouts = training_modes.dropout_modules(self.base, self.family)
            self._generation = registration_generation()
        return all(p.data_ptr() == ptr for p, ptr in self._views)


def _window_of(config: Any) -> tuple:
    """The sliding window of ``config`` (ModernBERT's), which Hugging Face reads at each call
    (a model's other settings are its modules', read when they were built)."""
    return (getattr(config, "local_attention", None), getattr(config, "sliding_window", None))


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"<tensor {tuple(value.shape)}>"
    return repr(value)
