"""The BERT encoder (embeddings, layers, pooler), running every hot op through one backend's ops.

The modules it stacks, and their parameters in fastbert's own fused layout, live in
fastbert/model/layers.py; the mapping from Hugging Face names lives in
fastbert/model/loading.py. The models train as PyTorch modules do:
parameters require grad, every op has a backward, ``model.train()`` turns on the config's
dropout and ``model.eval()`` (the state ``from_pretrained`` returns) turns it off; the heads
take ``labels`` and return ``loss`` as Hugging Face's do (fastbert/model/losses.py). CUDA graphs
replay only calls that need no gradients and no dropout. Activations are [batch, seq, hidden]
in the model's dtype.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence

import torch
import torch.utils.checkpoint
from torch import nn

from fastbert.execution import runtime, validation
from fastbert.execution.backends import Ops
from fastbert.execution.runtime import Attend
from fastbert.kernels.checks import RELATIVE_BUCKETS, check_id_ranges
from fastbert.model.config import BertConfig
from fastbert.model.layers import (
    BertEmbeddings,
    BertLayer,
    BertPooler,
    calibrating,
    new_parameter,
    norm_bias,
)
from fastbert.model.loading import PretrainedMixin
from fastbert.model.outputs import BaseModelOutputWithPooling
from fastbert.model.quantization import (
    QuantizedWeights,
    calibration_ids,
    parameters_key,
    tensors_key,
)
from fastbert.model.weights import ParameterWatch

# How a checkpointed layer runs by default: PyTorch's checkpoint, not re-entrant (the variant
# PyTorch recommends; it keeps working when a layer's input needs no gradient).
CHECKPOINT = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)


@torch.no_grad()
def init_weights(model: nn.Module, config: BertConfig) -> None:
    """Initialise ``model``'s parameters for training from scratch, as Hugging Face's BERT
    does: weight matrices and embedding tables normal(0, config.initializer_range) (the pad
    token's word row zero), biases zero, LayerNorm weights one."""
    for name, p in model.named_parameters():
        leaf = name.rpartition(".")[2]
        if leaf.endswith("ln_weight"):
            p.fill_(1.0)
        elif leaf.endswith("bias") and leaf != "relative_bias":  # the table is an embedding
            p.zero_()
        else:
            p.normal_(0.0, config.initializer_range)
    for module in model.modules():
        if isinstance(module, BertEmbeddings) and module.padding_rows()["padding_idx"] is not None:
            module.word[module.padding_rows()["padding_idx"]] = 0.0


def rotary_frequencies(theta: float, head_dim: int, device: torch.device) -> torch.Tensor:
    """RoPE's float32 inverse frequencies [head_dim / 2] for the base ``theta``, computed as
    Hugging Face's default RoPE does (the same float32 operations, so the same bits)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim
    return 1.0 / (theta**exponents)


# Held while a quantised model calibrates and quantises again (rare: after a weight change).
_QUANTIZING = threading.RLock()


def _quantize_again(model: nn.Module, incompatible_keys: object) -> None:
    """After ``load_state_dict``: quantise at the next call whatever the parameters' keys say
    (a parameter made under torch.inference_mode has no version counter to tell of a load
    into it there)."""
    model._quantized_key = None


class RunSetting:
    """A model's run setting (``backend``, ``padding_free``, ``cuda_graphs``, ...) as an attribute
    read and set on the object that holds it: the encoder's runner, or a head's encoder."""

    def __init__(self, holder: str):
        self.holder = holder

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, model: object, owner: type | None = None) -> object:
        return self if model is None else getattr(getattr(model, self.holder), self.name)

    def __set__(self, model: object, value: object) -> None:
        setattr(getattr(model, self.holder), self.name, value)


class BertModel(PretrainedMixin, nn.Module):
    """The BERT encoder: embeddings, ``num_hidden_layers`` layers and (optionally) the pooler.

    ``forward(input_ids, attention_mask=None, token_type_ids=None)`` takes [B, S] integer ids,
    a [B, S] 0/1 (or bool) mask with 1 = real token, and [B, S] token types; it returns
    ``last_hidden_state`` [B, S, H] and ``pooler_output`` [B, H] in the model's dtype.
    Positions where attention_mask is 0 hold unspecified (finite) values, as in Hugging Face
    (zeros when the batch ran padding-free).

    ``dtype`` is float16, bfloat16 or float32 (TypeError otherwise); ``device`` must exist on
    this machine (ValueError for CUDA without a GPU). ``padding_free`` and ``cuda_graphs``
    ("auto", True or False) choose how the layers run, ``backend`` ("auto", "torch",
    "triton") which ops run them: the model's :class:`~fastbert.execution.runtime.Runner`
    (``model.runner``) holds them and runs each call. Each may be changed on the model between
    calls, and is validated when set. A head dim the Triton attention kernel does not run
    raises at once with ``backend="triton"``; with ``"auto"`` the attention alone runs on the
    torch backend (one warning) and every other op on Triton. ``packed_weights`` (True or
    False, the default) makes the CPU linears read packed copies of their weights: the same
    results, faster, for models whose weights are not written through ``.data`` (see the
    Runner). ``gradient_checkpointing`` (False by default; Hugging Face's name): a call that
    records gradients in training mode keeps a checkpointed layer's input only and runs the
    layer again in the backward, for activations' memory. Which layers: every one, or where
    ``checkpointed_layers`` (a bool per layer) says; how: ``checkpoint_function(layer,
    *inputs)``, ``torch.utils.checkpoint.checkpoint`` without re-entrancy by default (under
    fastbert.optimize both follow the Hugging Face model's ``activation_checkpointing_enable``:
    its ``every_n_layers``, ``offload`` and checkpoint arguments).
    """

    def __init__(
        self,
        config: BertConfig,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        backend: str = "auto",
        add_pooling_layer: bool = True,
        padding_free: str | bool = "auto",
        cuda_graphs: str | bool = "auto",
        quantize: str | None = None,
        packed_weights: bool = False,
    ):
        super().__init__()
        validation.check_dtype(dtype)
        device = validation.check_device(device)
        validation.check_quantize(quantize, dtype, device)
        self.config = config
        self.runner = runtime.Runner(
            config.head_dim, backend, padding_free, cuda_graphs, packed_weights
        )
        self.embeddings = BertEmbeddings(config, dtype, device)
        self.layers = nn.ModuleList(
            BertLayer(config, dtype, device, first=i == 0) for i in range(config.num_hidden_layers)
        )
        # Pre-LayerNorm encoders (ModernBERT) end with a LayerNorm.
        pre_norm = config.norm_position == "pre"
        self.final_ln_weight = (
            new_parameter(config.hidden_size, dtype=dtype, device=device) if pre_norm else None
        )
        self.final_ln_bias = (
            new_parameter(config.hidden_size, dtype=dtype, device=device)
            if pre_norm and config.norm_bias
            else None
        )
        self.pooler = BertPooler(config, dtype, device) if add_pooling_layer else None
        # MPNet: one [buckets, heads] relative position bias table read by every layer (Hugging
        # Face's nn.Embedding layout).
        buckets = config.relative_attention_num_buckets
        self.relative_bias = (
            new_parameter(buckets, config.num_attention_heads, dtype=dtype, device=device)
            if buckets
            else None
        )
        self._rotary_cache: dict[tuple[float, torch.device], torch.Tensor] = {}
        self._watch = ParameterWatch(self)
        self._quantize: str | None = None
        self._quantized_key: tuple | None = None
        self.gradient_checkpointing = False
        self._checkpointed_layers: tuple[bool, ...] | None = None
        self.checkpoint_function: Callable[..., torch.Tensor] = CHECKPOINT
        # (hidden, attention) dropout in training mode in place of the config's: the
        # probabilities a Hugging Face model's own modules hold (fastbert.optimize sets it).
        self.dropout_probabilities: tuple[float, float] | None = None
        self.register_load_state_dict_post_hook(_quantize_again)
        self.quantize = quantize
        self.resolve_ops_early()

    # The run settings live on the runner, which validates them when set.
    backend = RunSetting("runner")
    padding_free = RunSetting("runner")
    cuda_graphs = RunSetting("runner")
    packed_weights = RunSetting("runner")

    @property
    def checkpointed_layers(self) -> tuple[bool, ...] | None:
        """Which layers ``gradient_checkpointing`` checkpoints: a bool per layer, or None for
        every one. Set a sequence of as many bools as the model has layers (ValueError
        otherwise)."""
        return self._checkpointed_layers

    @checkpointed_layers.setter
    def checkpointed_layers(self, value: Sequence[bool] | None) -> None:
        if value is not None:
            value = tuple(value)
            if len(value) != len(self.layers) or not all(isinstance(v, bool) for v in value):
                raise ValueError(
                    f"checkpointed_layers takes a bool for each of the model's {len(self.layers)}"
                    f" layers (or None for every layer), got {value!r}"
                )
        self._checkpointed_layers = value

    @property
    def quantize(self) -> str | None:
        """None (the exact floating-point linears), "int8" or "fp8" (see
        fastbert.model.quantization). Setting "int8" or "fp8" quantises the layers' weights and
        freezes every parameter (quantised models run inference only); setting None drops the
        quantised copies (the parameters stay frozen until you ``requires_grad_()`` them)."""
        return self._quantize

    @quantize.setter
    def quantize(self, value: str | None) -> None:
        validation.check_quantize(value, self.dtype, self.device)
        if value is not None and self.config.glu:
            raise ValueError(f"quantize={value!r} does not run gated (GeGLU) FFNs; use None")
        self._quantize = value
        self._quantized_key = None
        for layer in self.layers:
            layer.quantized = None
        if value is not None:
            self.requires_grad_(False)
            self.refresh_quantized()

    def refresh_quantized(self) -> None:
        """Calibrate and quantise again when a parameter changed since the model was
        quantised (see fastbert.model.quantization; a no-op for a model that runs
        quantize=None, or whose weights are not bound yet)."""
        if self._quantize is None or self.device.type == "meta":
            return
        if self.weights_key() == self._quantized_key:
            return
        with _QUANTIZING:  # one calibration at a time: threads that call meanwhile wait for it
            key = self.weights_key()
            if key == self._quantized_key:
                return
            maxima = self.activation_maxima()
            for layer, activation_max in zip(self.layers, maxima):
                if layer.quantized is None:
                    layer.quantized = QuantizedWeights(self._quantize)
                layer.quantized.quantize(layer, activation_max)
            self._quantized_key = key

    @torch.no_grad()
    def activation_maxima(self) -> list[dict[str, torch.Tensor]]:
        """Each layer's linear inputs' maxima per channel (float32 [K] by weight name), from a
        float forward of the seeded calibration ids
        (:func:`fastbert.model.quantization.calibration_ids`)."""
        config = self.config
        ids = calibration_ids(config.vocab_size, config.max_sequence_length, self.device)
        maxima = [{} for _ in self.layers]
        with calibrating(self.layers, maxima):
            ops = self.ops()
            hidden = self.embed(ops, ids, None, None, True, 0.0)
            self.run_layers(ops, hidden, runtime.dense_attention(ops, self.heads, None), 0.0)
        return maxima

    def check_quantized_call(self) -> None:
        """RuntimeError when a call of a quantised model would record gradients or run in
        training mode: int8 and fp8 run inference only."""
        if self._quantize is None:
            return
        if self.training:
            reason = "the model (or a dropout module of it) is in training mode"
        elif self.needs_grad():
            reason = f"grad mode is on and {self._watch.first_requiring_grad()} requires grad"
        else:
            return
        raise RuntimeError(
            f"quantize={self._quantize!r} runs inference only, but {reason}: call model.eval() "
            "and keep the parameters frozen (or run under torch.no_grad()), or train with "
            "quantize=None and quantise afterwards"
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.embeddings.word.dtype

    @property
    def device(self) -> torch.device:
        return self.embeddings.word.device

    def ops(self) -> Ops:
        """The hot ops this model runs with, given its backend, device and head dim."""
        return self.runner.ops(self.device)

    def init_weights(self) -> BertModel:
        """Initialise every parameter for training from scratch (see :func:`init_weights`);
        returns the model."""
        init_weights(self, self.config)
        return self

    def resolve_ops_early(self) -> None:
        """On CUDA, resolve the ops now, so an unsupported head dim warns when the model is
        built or bound, not at its first call."""
        if self.device.type == "cuda":
            self.ops()

    # What the runtime runs (fastbert.execution.runtime.Stack): the embeddings and the layers.
    @property
    def heads(self) -> int:
        return self.config.num_attention_heads

    @property
    def relative_positions(self) -> bool:
        config = self.config
        return (
            self.relative_bias is not None
            or config.position_scheme == "rotary"
            or config.layer_types is not None
            and "sliding_attention" in config.layer_types
        )

    def attention_positions(self, index: int, device: torch.device) -> dict[str, object]:
        """The attention ops' position keywords of layer ``index``: RoPE's inverse frequencies
        (the layer type's base) and, for a sliding-window layer, the window."""
        config = self.config
        sliding = config.layer_type(index) == "sliding_attention"
        kwargs: dict[str, object] = {}
        if config.position_scheme == "rotary":
            theta = config.local_rope_theta if sliding else config.rope_theta
            key = (theta, device)
            if key not in self._rotary_cache:
                self._rotary_cache[key] = rotary_frequencies(theta, config.head_dim, device)
            kwargs["rotary"] = self._rotary_cache[key]
        if sliding:
            kwargs["window"] = config.window
        return kwargs

    def table_rows(self) -> tuple[int, int]:
        return self.embeddings.table_rows()

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        return self.embeddings.position_ids(input_ids)

    def embed(
        self,
        ops: Ops,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        check_ids: bool,
        dropout_p: float,
    ) -> torch.Tensor:
        return self.embeddings(ops, input_ids, token_type_ids, position_ids, check_ids, dropout_p)

    def layers_train(self) -> bool:
        """Whether any parameter of the layers takes a gradient."""
        return any(p.requires_grad for p in self.layers.parameters())

    def run_layers(
        self, ops: Ops, hidden: torch.Tensor, attend: Attend, dropout_p: float
    ) -> torch.Tensor:
        if self.relative_bias is not None:
            # The attention ops take the table per head: [H, RELATIVE_BUCKETS], a view.
            attend = functools.partial(
                attend, relative_bias=self.relative_bias[:RELATIVE_BUCKETS].t()
            )
        checkpointed = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        if checkpointed and not hidden.requires_grad and self.layers_train():
            # Frozen embeddings: a reentrant checkpoint of layers whose input needs no
            # gradient gives their parameters none (Hugging Face's enable_input_require_grads
            # marks the embeddings' output so, from a hook that fastbert's embeddings never run).
            hidden = hidden.requires_grad_()
        for index, layer in enumerate(self.layers):
            positions = self.attention_positions(index, hidden.device)
            layer_attend = functools.partial(attend, **positions) if positions else attend
            if checkpointed and (
                self.checkpointed_layers is None or self.checkpointed_layers[index]
            ):  # the layer runs again in the backward (its dropout alike)
                hidden = self.checkpoint_function(layer, ops, hidden, layer_attend, dropout_p)
            else:
                hidden = layer(ops, hidden, layer_attend, dropout_p)
        if self.final_ln_weight is not None:
            bias = norm_bias(self.final_ln_bias, self.final_ln_weight)
            hidden = ops.layer_norm(hidden, self.final_ln_weight, bias, self.config.layer_norm_eps)
        return hidden

    def encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[Ops, torch.Tensor]:
        """Validated inputs -> (ops, last hidden state [B, S, H])."""
        input_ids, token_type_ids, key_padding_mask = self.check_inputs(
            input_ids, attention_mask, token_type_ids
        )
        ops = self.prepare_call()
        hidden = self.runner.encode(
            self, ops, input_ids, token_type_ids, key_padding_mask, self.call()
        )
        return ops, hidden

    def prepare_call(self) -> Ops:
        """Before a call: refuse one a quantised model cannot run, quantise and pack the
        weights again where they changed; returns the ops the call runs with."""
        validation.refuse_jit_trace()
        self.check_quantized_call()
        self.refresh_quantized()
        self.runner.refresh_packed_weights(self.device, self.qkv_parts_key)
        return self.ops()

    def check_inputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The inputs' shapes, dtypes and devices checked against this model (an empty batch's
        too): (input ids, token types, bool key-padding mask or None), as
        :func:`fastbert.execution.validation.check_model_inputs` returns them."""
        return validation.check_model_inputs(
            self._longest_row(padded=True),
            self.device,
            input_ids,
            attention_mask,
            token_type_ids,
        )

    def _longest_row(self, padded: bool) -> int | None:
        """The longest row an input may have (a padded batch's width, or a packed sequence),
        or None for any: rotary positions read no table (Hugging Face runs any length), and
        padding-offset positions count a row's non-pad tokens, so a batch padded past the
        table fits where its rows do (Embeddings.position_ids checks them)."""
        scheme = self.config.position_scheme
        if scheme == "rotary" or padded and scheme == "padding_offset":
            return None
        return self.config.max_sequence_length

    def call(self) -> runtime.Call:
        """What a call made now asks of the runtime: its dropout (the config's in training
        mode, or ``dropout_probabilities`` when set; none in eval mode), whether it records
        gradients, and the weights' key."""
        hidden_p, attention_p = (0.0, 0.0)
        if self.training:
            hidden_p = self.config.hidden_dropout_prob
            attention_p = self.config.attention_probs_dropout_prob
            if self.dropout_probabilities is not None:
                hidden_p, attention_p = self.dropout_probabilities
        return runtime.Call(hidden_p, attention_p, self._records_grad, self._watch.storage_key)

    def _records_grad(self) -> bool:
        return self.training or self.needs_grad()

    def needs_grad(self) -> bool:
        """Whether a call now records gradients: grad mode on and a parameter requiring grad
        (the layers' separate query / key / value parameters of fastbert.optimize included)."""
        if not torch.is_grad_enabled():
            return False
        if self._watch.first_requiring_grad() is not None:
            return True
        return any(p.requires_grad for p in self.qkv_part_parameters())

    def qkv_part_parameters(self) -> list[nn.Parameter]:
        """The separate query, key and value parameters (weights and biases) that the layers'
        fused QKV tensors hold as views (fastbert.optimize; empty otherwise)."""
        return [
            p
            for layer in self.layers
            if layer.qkv_parts is not None
            for p in layer.qkv_parts[0] + layer.qkv_parts[1]
        ]

    def qkv_parts_key(self) -> tuple:
        """What identifies the values of the query, key and value parameters of
        :meth:`qkv_part_parameters` (:func:`fastbert.model.quantization.tensors_key`; the same
        key for every call without them): a write through one of them reaches the fused QKV
        tensor the layers read without bumping its version counter, which the packed copies'
        own check reads."""
        return tensors_key(self.qkv_part_parameters())

    def weights_key(self) -> tuple:
        """What identifies the values the layers read
        (:func:`fastbert.model.quantization.parameters_key`): every parameter's address and
        version counter, the query, key and value parameters of :meth:`qkv_part_parameters`
        included (a write through one of them bumps its counter, not the fused tensor's)."""
        return parameters_key(self, self.qkv_part_parameters())

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> BaseModelOutputWithPooling:
        batch, seq = validation.batch_and_seq(input_ids)
        if batch == 0:
            self.check_inputs(input_ids, attention_mask, token_type_ids)
            return self._empty_output(seq)
        ops, hidden = self.encode(input_ids, attention_mask, token_type_ids)
        pooled = self.pooler(ops, hidden) if self.pooler is not None else None
        return BaseModelOutputWithPooling(hidden, pooled)

    def forward_packed(
        self,
        input_ids: torch.Tensor,
        cu_seqlens: torch.Tensor | Sequence[int],
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """B sequences packed end to end -> the last hidden state of their tokens [T, H], in
        the model's dtype.

        ``input_ids``: integer [T] on the model's device, sequence b being
        ``input_ids[cu_seqlens[b]:cu_seqlens[b + 1]]``; ``cu_seqlens``: [B + 1] integers from
        0 to T (a tensor or a list; build it on the host: one on a GPU is read back once);
        ``token_type_ids``: [T] or None. Row t of the result is what :meth:`forward` gives
        the same token in a padded batch (it runs the padding-free path, with nothing to
        pad, gather or scatter). The pooler is not run; pool per sequence with
        :func:`fastbert.model.pooling.pool_packed`.
        """
        inputs = validation.check_packed_inputs(
            self._longest_row(padded=False), self.device, input_ids, cu_seqlens, token_type_ids
        )
        ids, types = inputs.input_ids, inputs.token_type_ids
        if ids.numel() == 0:
            return torch.empty(0, self.config.hidden_size, dtype=self.dtype, device=self.device)
        check_id_ranges(ids, types, None, *self.table_rows(), 0)
        ops = self.prepare_call()
        positions = self.embeddings.packed_position_ids(ids, inputs.starts, inputs.lengths)
        return self.runner.encode_packed(
            self, ops, ids, types, positions, inputs.cu_seqlens, inputs.max_seqlen, self.call()
        )

    def _empty_output(self, seq: int) -> BaseModelOutputWithPooling:
        h = self.config.hidden_size
        empty = torch.empty(0, seq, h, dtype=self.dtype, device=self.device)
        pooled = empty.new_empty(0, h) if self.pooler is not None else None
        return BaseModelOutputWithPooling(empty, pooled)
