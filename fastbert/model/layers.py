"""The modules BertModel stacks: the embeddings, the transformer layer and the pooler.

Each holds its parameters in fastbert's fused layout (one QKV weight per layer; the mapping
from Hugging Face names lives in fastbert/model/loading.py) and runs every hot op through the
backend's ops it is given. Activations are [batch, seq, hidden] (or packed [tokens, hidden])
in the model's dtype.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from fastbert.execution.backends import Ops
from fastbert.execution.runtime import Attend
from fastbert.kernels import checks
from fastbert.model.config import BertConfig
from fastbert.model.quantization import QuantizedWeights


def new_parameter(*shape: int, dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    """A zero-filled parameter of ``shape`` (loading or :func:`init_weights` fills it)."""
    return nn.Parameter(torch.zeros(shape, dtype=dtype, device=device))


def norm_bias(bias: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
    """A LayerNorm's bias, or zeros like its ``weight`` for a LayerNorm without one."""
    return bias if bias is not None else weight.new_zeros(weight.shape)


class BertEmbeddings(nn.Module):
    """word + position + token-type embeddings, then LayerNorm (one fused op).

    Without token types (``type_vocab_size`` 0) one zero row stands in for the table, and so
    for the position table with rotary positions (ModernBERT: the attention rotates queries and
    keys instead); without a LayerNorm bias (``norm_bias`` False) zeros stand in for it. With an
    ``embedding_size`` other than ``hidden_size`` (ELECTRA) the tables and LayerNorm have that
    width and a linear projection to ``hidden_size`` follows.
    """

    def __init__(self, config: BertConfig, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        e, h = config.embedding_width, config.hidden_size
        self.word = new_parameter(config.vocab_size, e, dtype=dtype, device=device)
        self.position = (
            new_parameter(config.max_position_embeddings, e, dtype=dtype, device=device)
            if config.position_scheme != "rotary"
            else None
        )
        self.token_type = (
            new_parameter(config.type_vocab_size, e, dtype=dtype, device=device)
            if config.type_vocab_size
            else None
        )
        self.ln_weight = new_parameter(e, dtype=dtype, device=device)
        self.ln_bias = new_parameter(e, dtype=dtype, device=device) if config.norm_bias else None
        self.project_weight = new_parameter(h, e, dtype=dtype, device=device) if e != h else None
        self.project_bias = new_parameter(h, dtype=dtype, device=device) if e != h else None
        self.eps = config.layer_norm_eps
        self.config = config
        # Bound to a Hugging Face model's tables: their nn.Embedding's padding_idx (set by
        # fastbert.integrations.binding), which decide the rows without gradient there.
        self.bound_padding_rows: dict[str, int | None] | None = None

    def table_rows(self) -> tuple[int, int]:
        """(word rows, token-type rows): the ranges word and token-type ids must lie in."""
        types = self.token_type.shape[0] if self.token_type is not None else 1
        return self.word.shape[0], types

    def padding_rows(self) -> dict[str, int | None]:
        """The table rows that get no gradient, as in Hugging Face's ``nn.Embedding``s: the
        pad token's word row, and (padding_offset positions) its position row; bound to a
        Hugging Face model's tables, the rows their modules hold (``bound_padding_rows``)."""
        if self.bound_padding_rows is not None:
            return self.bound_padding_rows
        pad = self.config.pad_token_id
        if pad is None or not 0 <= pad < self.word.shape[0]:
            pad = None
        offset = self.config.position_scheme == "padding_offset"
        return {"padding_idx": pad, "position_padding_idx": pad if offset else None}

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor | None:
        """The position ids of [B, S] ``input_ids`` under ``config.position_scheme``: int64
        [B, S], or None for 0..S-1 in every row (the ops' default; rotary positions read no
        table)."""
        config = self.config
        if config.position_scheme == "rotary":  # no table: any length, as in Hugging Face
            return None
        longest = config.max_sequence_length
        offset = config.position_scheme == "padding_offset"
        wider = input_ids.shape[1] > longest
        if wider and not (offset and checks.values_readable(input_ids)):
            raise ValueError(
                f"sequence length {input_ids.shape[1]} exceeds the {longest} "
                "positions this model has; truncate the input"
            )
        if not offset:
            return None
        real = (input_ids != config.pad_token_id).long()
        counted = torch.cumsum(real, dim=1)
        if wider:  # padded past the table: the rows' non-pad tokens must fit it
            most = int(counted[:, -1].max())
            if most > longest:
                raise ValueError(
                    f"a row of input_ids has {most} tokens other than padding "
                    f"(pad_token_id {config.pad_token_id}), more than the {longest} "
                    "positions this model has; truncate the input"
                )
        return counted * real + config.pad_token_id

    def packed_position_ids(
        self, input_ids: torch.Tensor, starts: np.ndarray, lengths: np.ndarray
    ) -> torch.Tensor:
        """The position ids of B sequences packed end to end in ``input_ids`` [T] (sequence b
        starts at row ``starts[b]`` and has ``lengths[b]`` tokens; numpy int64 [B], on the
        host): int64 [T], each token's :meth:`position_ids` in a padded row of its own."""
        device = input_ids.device
        sequence = np.repeat(np.arange(len(lengths)), lengths)  # each token's sequence
        place = np.arange(input_ids.numel(), dtype=np.int64) - starts[sequence]
        if self.config.position_scheme != "padding_offset":
            return torch.from_numpy(place).to(device, non_blocking=True)
        # Hugging Face's padding-offset positions count the non-pad tokens of a row.
        pad = self.config.pad_token_id
        real = (input_ids != pad).long()
        counted = torch.cumsum(real, dim=0)
        before = (counted - real)[torch.from_numpy(starts).to(device)]
        return (counted - before[torch.from_numpy(sequence).to(device)]) * real + pad

    def forward(
        self,
        ops: Ops,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None = None,
        check_ids: bool = True,
        dropout_p: float = 0.0,
    ) -> torch.Tensor:
        """input_ids, token_type_ids, position_ids: [B, S] integers -> [B, S, H].

        Positions default to :meth:`position_ids` of ``input_ids``. ``check_ids=False``: the
        caller has checked the word and token-type ids against :meth:`table_rows` (positions
        computed here are in range by construction). ``dropout_p``: dropout on the
        LayerNorm's output (before ELECTRA's projection), as in Hugging Face.
        """
        tables = (self.position, self.token_type, self.ln_weight, self.ln_bias)
        mixed = [t.dtype for t in tables if t is not None and t.dtype != self.word.dtype]
        if mixed:  # the ops would cast them (Hugging Face's LayerNorm raises)
            raise RuntimeError(
                f"the embeddings' tables and LayerNorm hold mixed dtypes ({self.word.dtype} "
                f"and {mixed[0]}): cast the whole model to one dtype"
            )
        zero_row = self.word.new_zeros(1, self.word.shape[1])
        position = self.position
        if position is None:  # rotary positions: every token reads the one zero row
            position, position_ids = zero_row, input_ids.new_zeros(input_ids.shape[1])
        elif position_ids is None:
            position_ids = self.position_ids(input_ids)
        token_type = self.token_type if self.token_type is not None else zero_row
        hidden = ops.embeddings_layer_norm(
            input_ids,
            token_type_ids,
            position_ids,
            self.word,
            position,
            token_type,
            self.ln_weight,
            norm_bias(self.ln_bias, self.ln_weight),
            self.eps,
            check_ids=check_ids,
            dropout_p=dropout_p,
            **self.padding_rows(),
        )
        if self.project_weight is not None:
            hidden = ops.linear(hidden, self.project_weight, self.project_bias)
        return hidden


# The calibration this thread runs: each layer's record (its linears' input maxima per
# channel, by weight name), by the layer's id. Per thread, so that a call of the same model
# from another thread meanwhile neither records into it nor leaves its quantised path.
_calibrating = threading.local()


@contextlib.contextmanager
def calibrating(layers: Sequence[nn.Module], records: Sequence[dict]) -> Iterator[None]:
    """Within the block, this thread's calls of ``layers`` run their float linears and record
    each linear's input maxima per channel into the layer's dict of ``records``."""
    _calibrating.records = {id(layer): record for layer, record in zip(layers, records)}
    try:
        yield
    finally:
        _calibrating.records = None


def _calibration_record(layer: nn.Module) -> dict | None:
    records = getattr(_calibrating, "records", None)
    return None if records is None else records.get(id(layer))


class BertLayer(nn.Module):
    """Self-attention (fused QKV) and a GELU FFN, each with a residual and a LayerNorm.

    ``config.norm_position`` "post" (BERT): LayerNorm(x + attention(x)), then LayerNorm(h +
    FFN(h)), the residual added inside the LayerNorm op. "pre" (ModernBERT): x + attention(
    LayerNorm(x)), then h + FFN(LayerNorm(h)), the residual added in the epilogue of the
    output projection; the first layer (``first``) has no attention LayerNorm (its input is
    the embeddings' LayerNorm). ``config.glu``: the FFN's input projection has 2 *
    intermediate_size rows (input, gate) and the FFN computes act(input) * gate in one gated
    linear. Without ``linear_bias`` / ``norm_bias`` the biases are None.
    """

    def __init__(
        self,
        config: BertConfig,
        dtype: torch.dtype,
        device: torch.device | str,
        first: bool = False,
    ):
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        kw = {"dtype": dtype, "device": device}

        def bias(n: int, present: bool) -> nn.Parameter | None:
            return new_parameter(n, **kw) if present else None

        linear_bias, ln_bias = config.linear_bias, config.norm_bias
        self.pre_norm = config.norm_position == "pre"
        self.glu = config.glu
        self.qkv_weight = new_parameter(3 * h, h, **kw)  # rows: query, key, value
        self.qkv_bias = bias(3 * h, linear_bias)
        self.attn_out_weight = new_parameter(h, h, **kw)
        self.attn_out_bias = bias(h, linear_bias)
        has_attn_ln = not (self.pre_norm and first)
        self.attn_ln_weight = new_parameter(h, **kw) if has_attn_ln else None
        self.attn_ln_bias = bias(h, ln_bias and has_attn_ln)
        self.ffn_in_weight = new_parameter(2 * i if self.glu else i, h, **kw)
        self.ffn_in_bias = bias(2 * i if self.glu else i, linear_bias)
        self.ffn_out_weight = new_parameter(h, i, **kw)
        self.ffn_out_bias = bias(h, linear_bias)
        self.ffn_ln_weight = new_parameter(h, **kw)
        self.ffn_ln_bias = bias(h, ln_bias)
        self.heads = config.num_attention_heads
        self.activation = config.activation
        self.eps = config.layer_norm_eps
        self.attention_output_dropout = config.attention_output_dropout
        # (query, key, value weights), (their biases): see fused_qkv.
        self.qkv_parts: tuple[tuple[nn.Parameter, ...], tuple[nn.Parameter, ...]] | None = None
        # The quantised copies of the linear weights when the model runs quantize="int8" or
        # "fp8".
        self.quantized: QuantizedWeights | None = None

    def forward(
        self, ops: Ops, hidden: torch.Tensor, attend: Attend, dropout_p: float = 0.0
    ) -> torch.Tensor:
        """hidden: tokens [..., H] (a padded [B, S, H] batch or packed [T, H]) -> same shape.

        ``attend`` maps the fused QKV projection [..., 3H] to the attention context [..., H]
        (see fastbert.execution.runtime: dense with a padding mask, or packed sequences).
        ``dropout_p``: the hidden dropout on the two projections that feed a residual (on the
        FFN's alone without ``attention_output_dropout``).
        """
        if self.pre_norm:
            return self.forward_pre_norm(ops, hidden, attend)
        qkv = self.project(ops, "qkv_weight", hidden, *self.fused_qkv())
        attn = self.project(
            ops, "attn_out_weight", attend(qkv), self.attn_out_weight, self.attn_out_bias
        )
        attn_p = dropout_p if self.attention_output_dropout else 0.0
        hidden = ops.layer_norm(
            attn, self.attn_ln_weight, self.attn_ln_bias, self.eps, hidden, dropout_p=attn_p
        )
        inner = self.project(
            ops, "ffn_in_weight", hidden, self.ffn_in_weight, self.ffn_in_bias, self.activation
        )
        out = self.project(ops, "ffn_out_weight", inner, self.ffn_out_weight, self.ffn_out_bias)
        return ops.layer_norm(
            out, self.ffn_ln_weight, self.ffn_ln_bias, self.eps, hidden, dropout_p=dropout_p
        )

    def forward_pre_norm(self, ops: Ops, hidden: torch.Tensor, attend: Attend) -> torch.Tensor:
        """The pre-LayerNorm layer (ModernBERT; no dropout): each residual added in the
        epilogue of the projection that feeds it."""
        x = hidden
        if self.attn_ln_weight is not None:
            x = ops.layer_norm(
                hidden,
                self.attn_ln_weight,
                norm_bias(self.attn_ln_bias, self.attn_ln_weight),
                self.eps,
            )
        qkv = self.project(ops, "qkv_weight", x, *self.fused_qkv())
        hidden = self.project(
            ops,
            "attn_out_weight",
            attend(qkv),
            self.attn_out_weight,
            self.attn_out_bias,
            residual=hidden,
        )
        x = ops.layer_norm(
            hidden, self.ffn_ln_weight, norm_bias(self.ffn_ln_bias, self.ffn_ln_weight), self.eps
        )
        inner = self.project(
            ops, "ffn_in_weight", x, self.ffn_in_weight, self.ffn_in_bias, self.activation
        )
        return self.project(
            ops, "ffn_out_weight", inner, self.ffn_out_weight, self.ffn_out_bias, residual=hidden
        )

    def project(
        self,
        ops: Ops,
        name: str,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The linear whose weight is ``name``: on ``weight``, or on its int8 / fp8 copy when
        the layer runs quantised (recording the input's maxima per channel while
        calibrating). The FFN's input projection of a GLU layer is gated."""
        record = _calibration_record(self)
        if record is not None:
            record[name] = x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
        if self.quantized is None or record is not None:
            gated = self.glu and name == "ffn_in_weight"
            return ops.linear(x, weight, bias, activation, residual, gated=gated)
        q, scale, input_scale = self.quantized[name]
        linear = ops.linear_int8 if self.quantized.format == "int8" else ops.linear_fp8
        return linear(x, q, scale, bias, activation, residual, input_scale)

    def fused_qkv(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The [3H, H] QKV weight and [3H] bias (None without biases) the layer reads: its
        fused parameters, or, when it is bound to separate query, key and value parameters
        (``qkv_parts``, set by fastbert.optimize) and one of them needs a gradient, their
        concatenation, through which autograd gives each its own gradient."""
        parts = self.qkv_parts
        if (
            parts is not None
            and torch.is_grad_enabled()
            and any(p.requires_grad for p in parts[0] + parts[1])
        ):
            return torch.cat(parts[0]), torch.cat(parts[1]) if parts[1] else None
        return self.qkv_weight, self.qkv_bias


class BertPooler(nn.Module):
    """tanh(dense(hidden[:, 0])): the [CLS] token's representation."""

    def __init__(self, config: BertConfig, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        h = config.hidden_size
        self.weight = new_parameter(h, h, dtype=dtype, device=device)
        self.bias = new_parameter(h, dtype=dtype, device=device)

    def forward(self, ops: Ops, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [B, S, H] -> [B, H]."""
        return torch.tanh(ops.linear(hidden[:, 0], self.weight, self.bias))
