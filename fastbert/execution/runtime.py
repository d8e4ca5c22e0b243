"""How an encoder runs a call: dense, padding-free, or replayed from a CUDA graph.

:class:`Runner` holds a model's run settings (``backend``, ``padding_free``, ``cuda_graphs``)
and its graphs, and runs each call of the model's :class:`Stack` (its embeddings and layers,
which the model defines) as follows:

- Dense: every op runs on the padded [B, S, H] batch; attention excludes padded keys through
  the key-padding mask. Padded positions cost as much as real ones.
- Padding-free: the real tokens of the batch are packed into [T, H] (T = number of real
  tokens), every op runs on them only, attention runs per sequence over cu_seqlens (the
  torch backend runs one SDPA call per run of equal-length sequences on a CPU, and elsewhere
  unpacks each layer's Q, K, V to [B, longest] for one masked SDPA call), and the
  result is scattered back to [B, S, H] with zeros at padded positions. The number of real
  tokens sizes the packed tensors: it comes from the one host read a forward makes
  (fastbert.execution.validation.read_batch), together with the id-range check.
- Packed input (``BertModel.forward_packed``): the caller gives the sequences already packed
  (ids [T] and cu_seqlens [B + 1], built on the host), and the padding-free path runs on them
  as they are: no mask to read, nothing gathered or scattered, [T, H] out.
- Row buckets on a CPU: where the CPU engine's linears run in a dtype of CPU_BUCKETED_DTYPES
  (bfloat16), a padding-free call's T rows are padded to ``token_bucket(T, CPU_BUCKET_MIN_STEP)``
  after the embeddings, the filler rows forming sequences of at most FILLER_SEQUENCE tokens,
  and the layers' output cut back to T rows. oneDNN makes a primitive per linear for each new
  row count, and on a CPU with AMX a bfloat16 one took longer to make than to run: a corpus
  job, whose every batch has a new token count, spent much of its bfloat16 time making them
  (docs/cpu.md, "Row buckets", has the figures). With the buckets, a few dozen row counts
  cover every batch of up to 4,096 tokens, and each linear's primitives are made once per
  bucket.
- CUDA graphs: the encoder (embeddings and layers) is captured once per key and replayed,
  which removes the per-kernel launch cost (85 launches for BERT-base). A dense call's
  key is its (batch, seq, optional inputs); a padding-free call's is its size bucket: the T
  real tokens are padded to ``token_bucket(T)`` rows that form one extra filler sequence, and
  the B sequences with empty ones to ``sequence_bucket(B + 1)``, so batches of nearby sizes
  replay one graph (only the packing and the scatter run eagerly). The sequence count and
  the longest sequence (rounded up to a power of two) stay in the key because they size the
  attention kernel's grid: a grid sized for the most sequences a bucket could hold would be
  almost all programs that exit at once.

Each is chosen per call by the model's ``padding_free`` and ``cuda_graphs`` settings, each
"auto", True or False:

- ``padding_free="auto"`` packs when at least PACK_MIN_PADDING of the batch is padding
  (PACK_MIN_PADDING_CPU on a CPU): on a CPU the torch backend's packed attention runs each
  sequence's keys only, on views of the packed tensors, so a packed batch already runs faster
  than the dense one at a few per cent of padding (docs/results.md, "Measurements behind the
  code's choices"); True packs whenever a mask has padding; False never. A batch with a
  left-padded row (the pooler reads its padded first position), or a call of a thread that
  wants every position (fastbert.execution.padded_positions), runs dense whatever the
  setting. A batch without padding always runs dense, and unmasked.
- ``cuda_graphs`` chooses when a call replays a graph of its key (fastbert.execution.graphs
  holds the rule, the bounds and the thread and weight safety). For a padding-free call, the
  key is its size bucket and its tokens the bucket's rows.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Hashable
from typing import Protocol

import torch
import torch.nn.functional as F

from fastbert.execution import graphs, padded_positions, validation
from fastbert.execution.backends import Ops, check_backend, check_head_dim, get_ops
from fastbert.execution.validation import RowLengths
from fastbert.kernels.launch import cdiv, next_power_of_2
from fastbert.kernels.packed_weights import PackedWeights

SETTINGS = ("auto", True, False)
# "auto" packs when at least this fraction of the batch is padding: below it, the gather and
# scatter cost more than the padded rows they save.
PACK_MIN_PADDING = 0.1
PACK_MIN_PADDING_CPU = 0.03
# A graphed padding-free call runs token_bucket(T) rows: T rounded up to a multiple of an
# eighth of the power of two at or below T, and of at least this many rows (so fewer than
# T / 8 or 64 extra rows, and eight buckets per doubling of T).
TOKEN_BUCKET_MIN_STEP = 64
# On a CPU, rows are bucketed for these dtypes only: float32 primitives cost less to make than
# the bucket's extra rows cost to run (docs/cpu.md, "Row buckets"); steps of at least 16
# rows (one AMX tile's rows), so that a short request runs at most 15 extra rows.
CPU_BUCKETED_DTYPES = (torch.bfloat16,)
CPU_BUCKET_MIN_STEP = 16
# The filler rows of a bucketed CPU call form sequences of at most this many tokens (their
# attention then costs little).
FILLER_SEQUENCE = 16
# ... and its B sequences, with the filler, are padded with empty sequences to a power of two
# of at least this many (a batch of up to 7 sequences runs an 8-sequence grid).
SEQUENCE_BUCKET_MIN = 8


# Fused QKV -> attention context; takes the attention ops' position keywords too:
# ``relative_bias=`` (an [H, 32] table), ``rotary=`` (RoPE's inverse frequencies), ``window=``.
Attend = Callable[..., torch.Tensor]


def check_setting(name: str, value: object) -> None:
    """``value`` must be "auto", True or False (not 0/1: they would pass ``in SETTINGS``)."""
    if not (value is True or value is False or value == "auto"):
        raise ValueError(f"{name} must be 'auto', True or False, got {value!r}")


def check_flag(name: str, value: object) -> None:
    """``value`` must be True or False (not 0/1)."""
    if not (value is True or value is False):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def dense_attention(
    ops: Ops, heads: int, key_padding_mask: torch.Tensor | None, dropout_p: float = 0.0
) -> Attend:
    """Attention over a padded batch: fused QKV [B, S, 3H] -> context [B, S, H], with
    ``dropout_p`` dropout on the attention probabilities and the attention ops' position
    keywords (a relative position bias table, RoPE frequencies, a sliding window)."""

    def attend(qkv: torch.Tensor, **positions: object) -> torch.Tensor:
        batch, seq, three_width = qkv.shape
        width = three_width // 3
        # [B, S, 3, heads, D] viewed as three [B, heads, S, D] tensors: strides, no copies.
        q, k, v = qkv.view(batch, seq, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
        context = ops.attention(q, k, v, key_padding_mask, dropout_p=dropout_p, **positions)
        # The Triton kernel writes [B, S, heads, D] memory, so this reshape is a free view.
        return context.transpose(1, 2).reshape(batch, seq, width)

    return attend


def packed_attention(
    ops: Ops, heads: int, cu_seqlens: torch.Tensor, max_seqlen: int, dropout_p: float = 0.0
) -> Attend:
    """Attention over packed sequences: fused QKV [T, 3H] -> context [T, H], with
    ``dropout_p`` dropout on the attention probabilities and the attention ops' position
    keywords (positions and distances are a sequence's own tokens')."""

    def attend(qkv: torch.Tensor, **positions: object) -> torch.Tensor:
        tokens, three_width = qkv.shape
        width = three_width // 3
        q, k, v = qkv.view(tokens, 3, heads, width // heads).unbind(1)
        context = ops.attention_varlen(
            q, k, v, cu_seqlens, max_seqlen, dropout_p=dropout_p, **positions
        )
        return context.reshape(tokens, width)

    return attend


@dataclasses.dataclass(frozen=True)
class PackedBatch:
    """Where the real tokens of a padded [B, S] batch sit once packed into [T].

    indices: int64 [T], each token's position in the flattened [B * S] batch, in order;
    cu_seqlens: int32 [B + 1], prefix sums of the per-row token counts; max_seqlen: the
    longest row.
    """

    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    batch: int
    seq: int

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """[B, S, ...] -> [T, ...]: the real tokens' rows."""
        return t.reshape(self.batch * self.seq, *t.shape[2:])[self.indices]

    def positions(self) -> torch.Tensor:
        """int64 [T]: each real token's position in its row (0..S-1), as in the dense batch."""
        return self.indices % self.seq

    def scatter(self, packed: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [B, S, H], zeros at padded positions."""
        out = packed.new_zeros(self.batch * self.seq, packed.shape[-1])
        out[self.indices] = packed
        return out.view(self.batch, self.seq, packed.shape[-1])


def bucketed_inputs(
    cu_seqlens: torch.Tensor, max_seqlen: int, *token_inputs: torch.Tensor | None
) -> tuple[tuple[torch.Tensor | None, ...], torch.Tensor, int]:
    """The inputs of a graph for the size bucket of T packed tokens.

    Each [T] input (None stays None) padded with zeros (a valid id, position and token type)
    to ``token_bucket(T)`` rows; cu_seqlens int32 [sequence_bucket(B + 1) + 1], whose
    sequence B is the padding rows and whose later ones are empty, so every row is computed
    and attends only to its own sequence; and ``max_seqlen``
    rounded up to a power of two (it sizes the attention grid; the kernel loops over a longer
    filler sequence).
    """
    tokens = token_inputs[0].numel()
    bucket = token_bucket(tokens)
    padded = tuple(None if t is None else F.pad(t, (0, bucket - tokens)) for t in token_inputs)
    added = sequence_bucket(cu_seqlens.numel()) + 1 - cu_seqlens.numel()
    return padded, F.pad(cu_seqlens, (0, added), value=bucket), next_power_of_2(max_seqlen)


def token_bucket(tokens: int, min_step: int = TOKEN_BUCKET_MIN_STEP) -> int:
    """The rows a graphed (or bucketed CPU) padding-free call of ``tokens`` real tokens runs
    (>= tokens): a multiple of an eighth of the power of two at or below ``tokens``, and of
    ``min_step``."""
    step = max(min_step, (1 << max(tokens, 1).bit_length()) // 16)
    return cdiv(tokens, step) * step


def cpu_row_buckets_status() -> str:
    """Which CPU calls run a row bucket, in words (for ``fastbert info``)."""
    dtypes = ", ".join(str(d).removeprefix("torch.") for d in CPU_BUCKETED_DTYPES) or "none"
    return (
        f"{dtypes} padding-free calls, rounded up to a multiple of {CPU_BUCKET_MIN_STEP} rows "
        "or of an eighth of the power of two below (oneDNN makes primitives once per bucket)"
    )


def cpu_filler_rows(ops: Ops, hidden: torch.Tensor, call: Call) -> int:
    """The filler rows a padding-free call of ``hidden`` [T, H] runs on a CPU to reach its row
    bucket (see the module docstring): 0 unless the CPU engine runs its linears on oneDNN in a
    dtype of CPU_BUCKETED_DTYPES (the torch backend on a CPU, no gradients or dropout, nothing
    tracing)."""
    if ops.name != "torch" or hidden.device.type != "cpu":
        return 0
    if hidden.dtype not in CPU_BUCKETED_DTYPES or torch.compiler.is_compiling():
        return 0
    if call.records_grad():
        return 0
    tokens = hidden.shape[0]
    return token_bucket(tokens, CPU_BUCKET_MIN_STEP) - tokens if tokens else 0


def with_filler(
    hidden: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, filler: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``hidden`` [T, H] with ``filler`` zero rows after it, ``cu_seqlens`` [B + 1] with the
    filler's sequences (FILLER_SEQUENCE tokens each, the last one shorter) after it, and the
    longest sequence: each real row still attends to its own sequence only."""
    tokens = hidden.shape[0]
    ends = [*range(tokens + FILLER_SEQUENCE, tokens + filler, FILLER_SEQUENCE), tokens + filler]
    added = torch.tensor(ends, dtype=cu_seqlens.dtype, device=cu_seqlens.device)
    longest = max(max_seqlen, min(filler, FILLER_SEQUENCE))
    return F.pad(hidden, (0, 0, 0, filler)), torch.cat([cu_seqlens, added]), longest


def sequence_bucket(sequences: int) -> int:
    """The sequences a graphed padding-free call of ``sequences`` sequences (the filler
    included) runs: a power of two, at least SEQUENCE_BUCKET_MIN."""
    return max(SEQUENCE_BUCKET_MIN, next_power_of_2(sequences))


def pack(
    key_padding_mask: torch.Tensor, rows: RowLengths, min_padding: float = 0.0
) -> PackedBatch | None:
    """The packing of a bool [B, S] mask (True = real token), or None if too little padding.

    ``rows`` are the mask's row lengths (:func:`fastbert.execution.validation.read_batch`),
    already on the host, so packing does not synchronise. None when the padding fraction is below
    ``min_padding`` (0: pack any padded batch; a batch without padding is never packed).
    """
    batch, seq = key_padding_mask.shape
    padding = 1.0 - rows.total / max(1, batch * seq)
    if padding == 0.0 or padding < min_padding:
        return None
    # A stable sort puts the real tokens (key 0) first, in order: their flat positions are the
    # first ``total`` entries. Unlike nonzero(), this needs no read of the count.
    is_padding = key_padding_mask.reshape(-1).logical_not().to(torch.int8)
    indices = torch.argsort(is_padding, stable=True)[: rows.total]
    cu_seqlens = F.pad(rows.lengths.cumsum(0, dtype=torch.int32), (1, 0))
    return PackedBatch(indices, cu_seqlens, rows.longest, batch, seq)


def packing_threshold(setting: str | bool, key_padding_mask: torch.Tensor | None) -> float | None:
    """The least padding fraction at which a call under ``padding_free=setting`` packs, or
    None when it runs dense whatever its padding."""
    if setting is False or key_padding_mask is None:
        return None
    if setting is True:
        return 0.0
    return PACK_MIN_PADDING_CPU if key_padding_mask.device.type == "cpu" else PACK_MIN_PADDING


class Stack(Protocol):
    """What the runtime runs of an encoder: its embeddings and its layers (the model defines
    them; fastbert.model.encoder.BertModel is one).

    ``heads``: attention heads per layer. ``relative_positions``: whether the attention
    depends on the distance between tokens (a relative position bias, rotary positions, a
    sliding window): a batch with padding
    amid a row's real tokens then runs dense, where the distances are the padded batch's (as
    in Hugging Face), not the packed ones. ``table_rows()``: (word rows, token-type rows), the
    ranges the ids must lie in. ``position_ids(input_ids)``: [B, S] -> int64 [B, S] positions,
    or None for 0..S-1 in every row. ``embed(ops, ids, types, positions, check_ids,
    dropout_p)``: [B, S] ids -> [B, S, H]. ``run_layers(ops, hidden, attend, dropout_p)``: the
    layers on [..., H] tokens, attending through ``attend``.
    """

    heads: int
    relative_positions: bool

    def table_rows(self) -> tuple[int, int]: ...

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor | None: ...

    embed: Callable[
        [Ops, torch.Tensor, torch.Tensor | None, torch.Tensor | None, bool, float], torch.Tensor
    ]

    def run_layers(
        self, ops: Ops, hidden: torch.Tensor, attend: Attend, dropout_p: float
    ) -> torch.Tensor: ...


@dataclasses.dataclass(frozen=True)
class Call:
    """What a call of the model asks of the runtime beyond its inputs.

    ``hidden_dropout`` / ``attention_dropout``: the call's dropout probabilities (zeros in
    eval mode). ``records_grad()``: whether the call records gradients or applies dropout, so
    that it never replays a graph (a graph records no autograd, and would replay its capture's
    dropout masks); asked only when a graph could replay. ``weights()``: the key of the
    parameters' storage, read when a graph may replay (a graph reads the addresses it was
    captured with).
    """

    hidden_dropout: float
    attention_dropout: float
    records_grad: Callable[[], bool]
    weights: Callable[[], Hashable]


class Runner:
    """One model's run settings and CUDA graphs; runs its calls (see the module docstring).

    ``backend`` ("auto", "torch", "triton"), ``padding_free`` and ``cuda_graphs`` ("auto",
    True or False) and ``packed_weights`` (True or False) may be changed between calls, and
    are validated when set: ``backend="triton"`` raises at once for a ``head_dim`` the Triton
    attention kernel does not run (with "auto", that model's attention runs on the torch
    backend, with one warning).

    ``packed_weights=True``: on a CPU, the torch backend's float32 and bfloat16 linears read
    a copy of each weight parameter in oneDNN's blocked layout (fastbert.kernels.
    packed_weights), made at its first use and again after any write that bumps its version
    counter; the same results, faster, for a second copy of the linear weights in memory. A
    write through ``weight.data`` is not seen: for models whose weights are not written so
    (fastbert.load and the commands built on it set it).
    """

    def __init__(
        self,
        head_dim: int,
        backend: str = "auto",
        padding_free: str | bool = "auto",
        cuda_graphs: str | bool = "auto",
        packed_weights: bool = False,
    ):
        self.head_dim = head_dim
        self.backend = backend
        self.padding_free = padding_free
        self.cuda_graphs = cuda_graphs
        self._packs: PackedWeights | None = None
        self._packed_ops: tuple[Ops, Ops] | None = None
        self._packed_key: Hashable = None
        self.packed_weights = packed_weights
        self.warned_head_dim = False

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        check_backend(value)
        if value == "triton":
            check_head_dim(self.head_dim)
        self._backend = value

    @property
    def padding_free(self) -> str | bool:
        return self._padding_free

    @padding_free.setter
    def padding_free(self, value: str | bool) -> None:
        check_setting("padding_free", value)
        self._padding_free = value

    @property
    def cuda_graphs(self) -> str | bool:
        return self.graphs.setting

    @cuda_graphs.setter
    def cuda_graphs(self, value: str | bool) -> None:
        check_setting("cuda_graphs", value)
        self.graphs = graphs.EncoderGraphs(value)

    @property
    def packed_weights(self) -> bool:
        return self._packs is not None

    @packed_weights.setter
    def packed_weights(self, value: bool) -> None:
        check_flag("packed_weights", value)
        if value != self.packed_weights:
            self._packs = PackedWeights() if value else None
            self._packed_ops = None

    def refresh_packed_weights(
        self, device: torch.device, views_key: Callable[[], Hashable]
    ) -> None:
        """Before a call on ``device``: drop the packed copies when ``views_key()`` changed
        since the last call: the addresses and version counters of the parameters that
        write the weights through views the packed copy's own check cannot see (the separate
        query, key and value parameters of fastbert.optimize), so that the weight is packed
        again. Every other write reaches a weight's own version counter or address, which
        its packed copy is checked against at each use."""
        if self._packs is None or device.type != "cpu" or torch.compiler.is_compiling():
            return
        key = views_key()
        if key != self._packed_key:
            self._packs.clear()
            self._packed_key = key

    def ops(self, device: torch.device) -> Ops:
        """The hot ops for tensors on ``device``, given the backend and the head dim; with
        ``packed_weights``, the torch backend's linear and int8 linear on a CPU read the
        weights' packed copies (not while ``torch.compile`` traces: the copies' lookup does
        not trace, and with freezing inductor packs the weights itself)."""
        ops = get_ops(self.backend, device, self.head_dim)
        if ops.attention_fallback and not self.warned_head_dim:
            self.warned_head_dim = True
            warnings.warn(
                f"head dim {self.head_dim} is not one the Triton attention kernel runs; "
                "this model's attention runs on the torch backend, its other ops on Triton",
                stacklevel=4,
            )
        packs = self._packs
        if packs is None or ops.name != "torch" or torch.device(device).type != "cpu":
            return ops
        if torch.compiler.is_compiling():
            return ops
        cached = self._packed_ops
        if cached is None or cached[0] is not ops:
            reading_packs = {
                name: functools.partial(getattr(ops, name), packs=packs)
                for name in ("linear", "linear_int8")
            }
            cached = (ops, Ops(ops.name, {**ops.by_name(), **reading_packs}))
            self._packed_ops = cached
        return cached[1]

    def encode(
        self,
        stack: Stack,
        ops: Ops,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        call: Call,
    ) -> torch.Tensor:
        """Validated [B, S] inputs (fastbert.execution.validation.check_model_inputs) -> the
        last hidden state [B, S, H]: packed when the batch's padding and ``padding_free`` say
        so, else dense; replayed from a CUDA graph when ``cuda_graphs`` wants it."""
        self.graphs.check_device(input_ids.device)
        ids_checked, packed, key_padding_mask = self.read_batch(
            stack, input_ids, token_type_ids, key_padding_mask
        )
        if packed is not None:
            return self._encode_packed(stack, ops, packed, input_ids, token_type_ids, call)

        def encode_dense(
            ids: torch.Tensor, types: torch.Tensor | None, mask: torch.Tensor | None
        ) -> torch.Tensor:
            hidden = stack.embed(ops, ids, types, None, not ids_checked, call.hidden_dropout)
            attend = dense_attention(ops, stack.heads, mask, call.attention_dropout)
            return stack.run_layers(ops, hidden, attend, call.hidden_dropout)

        inputs = (input_ids, token_type_ids, key_padding_mask)
        if ids_checked and self.graphable(call, input_ids.device, input_ids.numel()):
            return self.graphs.run(encode_dense, *inputs, weights=call.weights())
        return encode_dense(*inputs)

    def graphable(self, call: Call, device: torch.device, tokens: int) -> bool:
        """Whether ``call`` replays a CUDA graph of ``tokens`` rows: the settings want one and
        the call records no gradients and applies no dropout."""
        return not call.records_grad() and self.graphs.wants(device, tokens)

    def read_batch(
        self,
        stack: Stack,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
    ) -> tuple[bool, PackedBatch | None, torch.Tensor | None]:
        """The call's one host read: (whether it checked the ids, the packing or None, the
        key-padding mask the dense layers need: None when the batch has no padding).

        It checks the ids and measures the mask's rows (to pack them, and to run a batch
        without padding unmasked). Under torch.compile a call that cannot pack skips it (the
        embeddings op then checks the ids inside the graph), so a dense model compiles
        without a graph break.
        """
        min_padding = packing_threshold(self.padding_free, key_padding_mask)
        if min_padding is None and torch.compiler.is_compiling():
            return False, None, key_padding_mask
        count_holes = min_padding is not None and stack.relative_positions
        rows = validation.read_batch(
            input_ids, token_type_ids, key_padding_mask, *stack.table_rows(), count_holes
        )
        if rows is None or rows.total == key_padding_mask.numel():
            return True, None, None
        if rows.holes:
            min_padding = None  # packing would change the distances between tokens
        if rows.padded_first or padded_positions.wanted():
            # A pooler (and a classifier reading the first token) reads a left-padded row's
            # padded first position; a head's loss may read every padded one: compute them as
            # Hugging Face does, which packing (zeros at padding) would not.
            min_padding = None
        packed = None if min_padding is None else pack(key_padding_mask, rows, min_padding)
        return True, packed, key_padding_mask

    def _encode_packed(
        self,
        stack: Stack,
        ops: Ops,
        packed: PackedBatch,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        call: Call,
    ) -> torch.Tensor:
        """The layers on the real tokens only: [B, S] ids -> [B, S, H], zeros at padding
        (gathered into packed rows, run by :meth:`encode_packed`, scattered back)."""
        types = packed.gather(token_type_ids) if token_type_ids is not None else None
        positions = stack.position_ids(input_ids)
        positions = packed.positions() if positions is None else packed.gather(positions)
        ids = packed.gather(input_ids)
        hidden = self.encode_packed(
            stack, ops, ids, types, positions, packed.cu_seqlens, packed.max_seqlen, call
        )
        return packed.scatter(hidden)

    def encode_packed(
        self,
        stack: Stack,
        ops: Ops,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        call: Call,
    ) -> torch.Tensor:
        """Packed sequences -> the last hidden state of their tokens [T, H].

        ``input_ids``, ``token_type_ids`` (or None) and ``position_ids``: [T] integers on the
        model's device, checked against their tables; ``cu_seqlens``: int32 [B + 1] on the
        same device, the sequences' boundaries; ``max_seqlen``: the longest sequence, known on
        the host. Replayed from the CUDA graph of the size bucket of T when ``cuda_graphs``
        wants it.
        """
        self.graphs.check_device(input_ids.device)

        def encode(
            max_seqlen: int,
            ids: torch.Tensor,
            types: torch.Tensor | None,
            positions: torch.Tensor,
            cu_seqlens: torch.Tensor,
        ) -> torch.Tensor:
            types = types[None] if types is not None else None
            hidden = stack.embed(
                ops, ids[None], types, positions[None], False, call.hidden_dropout
            )[0]
            real = hidden.shape[0]
            filler = cpu_filler_rows(ops, hidden, call)
            if filler:
                hidden, cu_seqlens, max_seqlen = with_filler(hidden, cu_seqlens, max_seqlen, filler)
            attend = packed_attention(
                ops, stack.heads, cu_seqlens, max_seqlen, call.attention_dropout
            )
            out = stack.run_layers(ops, hidden, attend, call.hidden_dropout)
            return out[:real] if filler else out

        tokens = input_ids.numel()
        # Only the Triton attention_varlen runs the bucket's filler sequence (longer than
        # max_seqlen); the torch backend's sizes its dense batch by max_seqlen.
        graphable = ops.attention_backend == "triton"
        if tokens and graphable and self.graphable(call, input_ids.device, token_bucket(tokens)):
            bucketed, bucket_cu_seqlens, bucket_max = bucketed_inputs(
                cu_seqlens, max_seqlen, input_ids, token_type_ids, position_ids
            )
            return self.graphs.run(
                functools.partial(encode, bucket_max),
                *bucketed,
                bucket_cu_seqlens,
                host_key=bucket_max,
                weights=call.weights(),
                finish=lambda hidden: hidden[:tokens].clone(),  # the graph's buffer is reused
            )
        return encode(max_seqlen, input_ids, token_type_ids, position_ids, cu_seqlens)
