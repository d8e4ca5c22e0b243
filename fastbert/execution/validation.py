"""Checks on the model's inputs, done before any kernel runs.

:func:`check_model_inputs` looks at shapes, dtypes and devices only. :func:`read_batch` is the
one host synchronisation a forward makes: it checks the id ranges and, when the batch may run
padding-free, measures the rows, in a single read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from fastbert.kernels import checks
from fastbert.kernels.checks import as_index


def check_dtype(dtype: object) -> None:
    """A model's dtype must be torch.float16, torch.bfloat16 or torch.float32: TypeError
    otherwise (a string such as "float16", an integer or float64 dtype)."""
    if not isinstance(dtype, torch.dtype) or dtype not in checks.FLOAT_DTYPES:
        names = ", ".join(str(d) for d in checks.FLOAT_DTYPES)
        raise TypeError(f"dtype must be one of {names}, got {dtype!r}")


QUANTIZATIONS = (None, "int8", "fp8")
# The tensor cores each quantisation needs on CUDA, by compute capability: Triton's int8 tl.dot
# runs on sm_80 (Ampere) and newer, float8 e4m3 on sm_89 (Ada) and sm_90 (Hopper) and newer.
MIN_CAPABILITY = {"int8": (8, 0), "fp8": checks.FP8_MIN_CAPABILITY}
TENSOR_CORES = {"int8": "the integer tensor cores", "fp8": "the FP8 tensor cores"}


def check_quantize(
    quantize: object, dtype: torch.dtype | None = None, device: torch.device | None = None
) -> None:
    """``quantize`` must be None, "int8" or "fp8" (ValueError naming the choices); with either,
    a ``dtype`` other than float32 on a CPU (the quantised products dequantise into float32
    there) and a GPU without the tensor cores it needs (int8: sm_80, fp8: sm_89) are refused,
    each with what can run instead. On the CPU "fp8" is an emulation (the e4m3 operands
    multiplied in float32: its accuracy, not FP8 hardware's speed)."""
    if quantize is not None and (not isinstance(quantize, str) or quantize not in QUANTIZATIONS):
        raise ValueError(f"quantize must be None, 'int8' or 'fp8', got {quantize!r}")
    if quantize is None or device is None:
        return
    if device.type == "cpu" and dtype not in (None, torch.float32):
        raise TypeError(
            f"quantize={quantize!r} on the CPU runs with float32 activations (LayerNorm, "
            f"attention and the dequantised products in float32), got dtype={dtype}; use "
            f"dtype=torch.float32 with quantize={quantize!r}, or this dtype without quantize"
        )
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        needed = MIN_CAPABILITY[quantize]
        if capability < needed:
            name = torch.cuda.get_device_name(device)
            others = "quantize='int8' or " if quantize == "fp8" and capability >= (8, 0) else ""
            raise ValueError(
                f"quantize={quantize!r} needs {TENSOR_CORES[quantize]} of "
                f"sm_{needed[0]}{needed[1]} or newer; {name} is sm_{capability[0]}"
                f"{capability[1]}, which runs {others}quantize=None in float32, float16 or "
                "bfloat16"
            )


def check_device(device: object) -> torch.device:
    """``device`` (a torch.device, a string such as "cuda:0", or a CUDA index) as a
    torch.device. Raises TypeError for another kind of value and ValueError for a string
    torch cannot parse or a CUDA device this machine does not have."""
    if not isinstance(device, (torch.device, str, int)) or isinstance(device, bool):
        raise TypeError(f"device must be a torch.device or a string, got {device!r}")
    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device {device!r} is not a device torch knows: {error}") from error
    if parsed.type not in ("cpu", "cuda", "meta"):  # meta: a model built before its weights
        raise ValueError(f"device {device!r}: fastbert runs on cpu or cuda, not {parsed.type}")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {device!r} asks for CUDA, but CUDA is not available on this machine; "
                'use device="cpu"'
            )
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    return parsed


def batch_and_seq(input_ids: object) -> tuple[int, int]:
    """input_ids must be an integer tensor of shape [batch, seq]; returns (batch, seq)."""
    checks.check_tensor("input_ids", input_ids)
    checks.check_integer("input_ids", input_ids)
    if input_ids.dim() != 2:
        raise ValueError(
            f"input_ids must have shape [batch, seq], got {tuple(input_ids.shape)}; "
            "add a batch dimension with input_ids.unsqueeze(0)"
        )
    return input_ids.shape[0], input_ids.shape[1]


def check_ids_device(input_ids: torch.Tensor, device: torch.device) -> None:
    """``input_ids`` must be on the model's ``device``, one that holds values (not meta)."""
    if input_ids.device != device:
        raise ValueError(f"input_ids is on {input_ids.device} but the model is on {device}")
    if device.type == "meta":
        raise ValueError(
            "the model and input_ids are on the meta device: they have shapes but no values "
            "to run on; load the model on a real device"
        )


def refuse_jit_trace() -> None:
    """RuntimeError while torch.jit.trace records: a call decides on the host, from its
    inputs' values (whether and how to pack the padding, the rows' lengths), so a trace would
    replay the example's decisions on other inputs (0.1-0.4 off)."""
    if torch.jit.is_tracing():
        raise RuntimeError(
            "torch.jit.trace cannot record a fastbert model: each call decides from its "
            "inputs' values (the padding, the rows' lengths), which a trace would freeze to "
            "the example's; use torch.compile (it guards on them) or call the model as it is"
        )


def check_model_inputs(
    max_positions: int | None,
    device: torch.device,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Validate shapes, dtypes and devices (also of an empty batch); ``max_positions`` is the
    longest row the model's positions cover, or None where only the real tokens take positions
    (RoBERTa's count the non-pad tokens: the model checks them).

    Returns (input_ids, token_type_ids) as :func:`as_index` ids and the key-padding mask
    (bool [B, S], or None).
    """
    batch, seq = batch_and_seq(input_ids)
    if seq == 0 and batch > 0:
        raise ValueError("input_ids has sequence length 0; every sequence needs >= 1 token")
    if max_positions is not None and seq > max_positions:
        raise ValueError(
            f"sequence length {seq} exceeds max_position_embeddings "
            f"{max_positions}; truncate the input"
        )
    check_ids_device(input_ids, device)
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is None:
            continue
        checks.check_tensor(name, t)
        if tuple(t.shape) != (batch, seq):
            raise ValueError(
                f"{name} must have the shape of input_ids {(batch, seq)}, got {tuple(t.shape)}"
            )
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but the model is on {device}")
    if token_type_ids is not None:
        checks.check_integer("token_type_ids", token_type_ids)
    ids, types = as_index(input_ids), as_index(token_type_ids)
    if attention_mask is None:
        return ids, types, None
    if attention_mask.dtype.is_complex:
        raise TypeError(f"attention_mask must be 0/1 or bool, got {attention_mask.dtype}")
    # Hugging Face's attention_mask is 1 for real tokens, 0 for padding, in any dtype.
    mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask != 0
    return ids, types, mask


@dataclasses.dataclass(frozen=True)
class PackedInputs:
    """Checked packed inputs: ``input_ids`` and ``token_type_ids`` (or None) [T] index ids on
    the model's device; ``cu_seqlens`` int32 [B + 1] on the model's device; ``starts`` and
    ``lengths``: int64 numpy [B], each sequence's first row and token count, on the host;
    ``max_seqlen``: the longest sequence."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor | None
    cu_seqlens: torch.Tensor
    starts: np.ndarray
    lengths: np.ndarray
    max_seqlen: int


def check_packed_inputs(
    max_positions: int | None,
    device: torch.device,
    input_ids: torch.Tensor,
    cu_seqlens: torch.Tensor | Sequence[int],
    token_type_ids: torch.Tensor | None,
) -> PackedInputs:
    """Validate packed inputs: ``input_ids`` and ``token_type_ids`` integer [T] on ``device``;
    ``cu_seqlens`` [B + 1] integers from 0 to T, never decreasing (a tensor on the host or on
    ``device``, or a sequence of ints; one on a GPU is read to the host, once). No sequence
    may be longer than ``max_positions`` (None: any length). ValueError or TypeError naming
    the argument."""
    checks.check_tensor("input_ids", input_ids)
    checks.check_integer("input_ids", input_ids)
    if input_ids.dim() != 1:
        raise ValueError(
            f"input_ids must have shape [tokens] (the sequences end to end), got "
            f"{tuple(input_ids.shape)}"
        )
    check_ids_device(input_ids, device)
    if token_type_ids is not None:
        checks.check_tensor("token_type_ids", token_type_ids)
        checks.check_integer("token_type_ids", token_type_ids)
        if token_type_ids.shape != input_ids.shape or token_type_ids.device != device:
            raise ValueError(
                f"token_type_ids must be [tokens] on {device} like input_ids, got "
                f"{tuple(token_type_ids.shape)} on {token_type_ids.device}"
            )
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype in (torch.bool, torch.uint8):
            raise TypeError(f"cu_seqlens must hold integers, got {cu_seqlens.dtype}")
        host = cu_seqlens.detach().cpu().numpy().astype(np.int64)
    else:
        host = np.asarray(cu_seqlens)
        if host.size and not np.issubdtype(host.dtype, np.integer):
            raise TypeError(f"cu_seqlens must hold integers, got {host.dtype}")
        host = host.astype(np.int64)
    tokens = input_ids.numel()
    if host.ndim != 1 or host.size < 1 or host[0] != 0 or host[-1] != tokens:
        raise ValueError(
            f"cu_seqlens must be [sequences + 1] offsets from 0 to the {tokens} tokens of "
            f"input_ids, got {host.tolist()[:8]}{'...' if host.size > 8 else ''}"
        )
    lengths = np.diff(host)
    if (lengths < 0).any():
        raise ValueError("cu_seqlens must never decrease (each entry is where a sequence ends)")
    max_seqlen = int(lengths.max()) if lengths.size else 0
    if max_positions is not None and max_seqlen > max_positions:
        index = int(lengths.argmax())
        raise ValueError(
            f"sequence {index} has {max_seqlen} tokens, more than the model's "
            f"{max_positions} positions; truncate the input"
        )
    on_device = torch.from_numpy(host.astype(np.int32)).to(device, non_blocking=True)
    return PackedInputs(
        as_index(input_ids), as_index(token_type_ids), on_device, host[:-1], lengths, max_seqlen
    )


@dataclasses.dataclass(frozen=True)
class RowLengths:
    """The real tokens of each row of a padded [B, S] batch.

    lengths: int32 [B] on the batch's device; total and longest: read on the host; holes: the
    rows whose real tokens are not contiguous (padding amid them), when counted, else 0;
    padded_first: the rows with real tokens whose first position is padding (left padding).
    """

    lengths: torch.Tensor
    total: int
    longest: int
    holes: int = 0
    padded_first: int = 0


def read_batch(
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    vocab_size: int,
    type_vocab_size: int,
    count_holes: bool = False,
) -> RowLengths | None:
    """Check the ids against their tables and measure the mask's rows, in one host read.

    input_ids, token_type_ids: non-empty [B, S] integers; key_padding_mask: bool [B, S]
    (True = real token), or None when the row lengths are not wanted. Raises ValueError for
    an id outside its table (``vocab_size`` / ``type_vocab_size`` rows); returns the row
    lengths, or None without a mask. ``count_holes``: count the rows with padding amid their
    real tokens too (``RowLengths.holes``).
    """
    values = []
    lengths = None
    if key_padding_mask is not None:
        lengths = key_padding_mask.sum(dim=1, dtype=torch.int32)
        values.append(torch.stack([lengths.sum(), lengths.max()]).to(torch.int64))
        if count_holes:
            values.append(torch.stack([_rows_with_holes(key_padding_mask, lengths)] * 2))
        left_padded = (~key_padding_mask[:, 0]) & (lengths > 0)
        values.append(torch.stack([left_padded.sum(dtype=torch.int64)] * 2))
    read = checks.check_id_ranges(  # the host synchronisation
        input_ids, token_type_ids, None, vocab_size, type_vocab_size, 0, also_read=values
    )
    if lengths is None:
        return None
    padded_first = read.pop()[0]
    holes = read.pop()[0] if count_holes else 0
    total, longest = read[-1]
    return RowLengths(lengths, total, longest, holes, padded_first)


def _rows_with_holes(key_padding_mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """int64 scalar: the rows of a bool [B, S] mask whose real tokens do not form one span."""
    seq = key_padding_mask.shape[1]
    mask = key_padding_mask.to(torch.int8)
    first = mask.argmax(dim=1)
    last = seq - 1 - mask.flip(1).argmax(dim=1)
    spread = (last - first + 1) != lengths
    return (spread & (lengths > 0)).sum().to(torch.int64)
