"""The models and input batches benchmarks run on.

Model shapes are embedded (random weights, no download): BERT-base, BERT-large, MiniLM-L6,
MPNet-base (BERT-base's size with MPNet's relative position bias), ModernBERT-base (rotary
positions, GeGLU, sliding-window layers) and two small ones for CPU runs. A :class:`Shape` is
a batch size and a sequence length, dense (every position a real token) or padded (lengths
uniform in [16, seq], padding on the right as tokenizers do: so seq is at least 16). Written
``32x128`` and ``64x512p`` on the command line.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import torch

from fastbert.model.config import BertConfig
from fastbert.model.families import family_of_model_type

MODEL_SHAPES = {
    "bert-base": {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
    },
    "bert-large": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
    },
    "minilm-l6": {
        "hidden_size": 384,
        "num_hidden_layers": 6,
        "num_attention_heads": 12,
        "intermediate_size": 1536,
    },
    # all-mpnet-base-v2's size and config (514 positions: 512 after the padding offset).
    "mpnet-base": {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "max_position_embeddings": 514,
        "relative_attention_num_buckets": 32,
        "layer_norm_eps": 1e-5,
    },
    # answerdotai/ModernBERT-base's size and config: 22 pre-norm layers, every third one global
    # and the others attending 128 tokens around each query, rotary positions, GeGLU.
    "modernbert-base": {
        "vocab_size": 50368,
        "hidden_size": 768,
        "num_hidden_layers": 22,
        "num_attention_heads": 12,
        "intermediate_size": 1152,
        "max_position_embeddings": 8192,
        "global_attn_every_n_layers": 3,
        "local_attention": 128,
        "global_rope_theta": 160_000.0,
        "local_rope_theta": 10_000.0,
        "norm_eps": 1e-5,
        "pad_token_id": 50283,
    },
    "bert-mini": {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
    },
    "bert-tiny": {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 512,
    },
}
# The shapes of another family than BERT: name -> Hugging Face model_type.
MODEL_TYPES = {"mpnet-base": "mpnet", "modernbert-base": "modernbert"}
# The grid of the benchmark method; the target shapes of the README.
GRID = ("1x128", "32x128", "8x512", "64x512")
MIN_PADDED_LENGTH = 16


def model_config(name: str) -> BertConfig:
    """The embedded config ``name`` (vocabulary 30522, 512 positions, exact GELU)."""
    if name not in MODEL_SHAPES:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(MODEL_SHAPES)}")
    if name in MODEL_TYPES:
        family = family_of_model_type(MODEL_TYPES[name])
        return BertConfig.from_dict({"model_type": family.model_type, **MODEL_SHAPES[name]}, family)
    return BertConfig(**MODEL_SHAPES[name])


@dataclasses.dataclass(frozen=True)
class Shape:
    """``batch`` sequences of ``seq`` positions; ``padded``: lengths uniform in [16, seq], so
    a padded shape's ``seq`` is at least 16 (ValueError otherwise: shorter, it would hold no
    padding)."""

    batch: int
    seq: int
    padded: bool = False

    def __post_init__(self) -> None:
        if self.batch < 1 or self.seq < 1:
            raise ValueError(f"batch and seq must be >= 1, got {self.batch}x{self.seq}")
        if self.padded and self.seq < MIN_PADDED_LENGTH:
            raise ValueError(
                f"a padded shape's lengths are uniform in [{MIN_PADDED_LENGTH}, seq]: its seq "
                f"must be at least {MIN_PADDED_LENGTH}, got {self.label}"
            )

    @property
    def label(self) -> str:
        return f"{self.batch}x{self.seq}" + (" padded" if self.padded else "")


def parse_shape(text: str, padded: bool = False) -> Shape:
    """``"32x128"`` -> Shape(32, 128); a trailing ``p`` (``"64x512p"``) or ``padded`` pads it."""
    match = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*(p?)\s*", text)
    if not match:
        raise ValueError(f"a shape is BATCHxSEQ, optionally with a trailing p, got {text!r}")
    return Shape(int(match[1]), int(match[2]), padded or bool(match[3]))


def parse_shapes(text: str, padded: bool = False) -> list[Shape]:
    """A comma-separated list of shapes, e.g. ``"1x128,32x128,64x512p"``; ValueError for an
    empty list or an empty entry (``"2x32,,"``), naming it."""
    parts = text.split(",")
    for number, part in enumerate(parts, 1):
        if not part.strip():
            empty = f"entry {number} is empty" if len(parts) > 1 else "it names none"
            raise ValueError(f"{empty}; a shape is BATCHxSEQ, optionally with a trailing p")
    return [parse_shape(part, padded) for part in parts]


@dataclasses.dataclass(frozen=True)
class Batch:
    """Model inputs: ids, mask and token types [batch, seq] int64 on one device, and the
    real length of every sequence."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    lengths: tuple[int, ...]

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)


def sequence_lengths(shape: Shape, seed: int = 0) -> tuple[int, ...]:
    """``shape.seq`` each when dense; uniform integers in [16, seq] when padded."""
    if not shape.padded:
        return (shape.seq,) * shape.batch
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(MIN_PADDED_LENGTH, shape.seq + 1, (shape.batch,), generator=generator)
    return tuple(lengths.tolist())


def make_batch(
    shape: Shape, vocab_size: int, device: torch.device | str, seed: int = 0, pad_token_id: int = 0
) -> Batch:
    """A random batch of ``shape`` (ids in [1, vocab), padding set to ``pad_token_id``)."""
    lengths = sequence_lengths(shape, seed)
    return padded_batch(lengths, shape.seq, vocab_size, device, seed + 1, pad_token_id)


def padded_batch(
    lengths: Sequence[int],
    seq: int,
    vocab_size: int,
    device: torch.device | str,
    seed: int,
    pad_token_id: int = 0,
) -> Batch:
    """Sequences of ``lengths`` tokens right-padded to ``seq``: ids drawn in [1, vocab) with
    ``seed``, padding set to ``pad_token_id``, token types 0."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (len(lengths), seq), generator=generator)
    mask = (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = ids.masked_fill(mask == 0, pad_token_id)
    return Batch(ids.to(device), mask.to(device), torch.zeros_like(ids).to(device), tuple(lengths))
