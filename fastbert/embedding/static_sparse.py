"""The query side of inference-free SPLADE: a sentence-transformers ``SparseStaticEmbedding``
route (see :mod:`fastbert.model.router_folder`). A text's vector holds, for each distinct
token of it, that token's learnt weight: a tokenizer call and a lookup, no encoder, as
sentence-transformers computes it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from fastbert.embedding.sparse import SparseVectors
from fastbert.embedding.tokenize import TextTokenizer
from fastbert.model.loading import read_checkpoint_state

# A tokenizer's model_max_length over this means it sets no limit (transformers then does not
# truncate, and neither does sentence-transformers).
NO_LIMIT = 10**9
# The most tokens a text may have where the tokenizer sets no limit.
UNLIMITED = 2**31 - 1


@dataclasses.dataclass
class StaticSparseEncoder:
    """Token ids -> sparse vectors of width ``len(weight)``: each distinct token's weight
    (float32 [vocabulary]), zero elsewhere; ``max_active_dims``: each row's that-many values
    largest in magnitude (None: all). ``packed``, ``prompt_length`` and ``task`` are what the
    embed loop reads of any encoder (:class:`fastbert.embedding.model.FolderPipeline`)."""

    weight: torch.Tensor
    max_active_dims: int | None = None
    prompt_length: int = 0
    task: str | None = None
    packed: bool = True

    @property
    def dimensions(self) -> int:
        return int(self.weight.shape[0])

    def with_prompt(self, prompt_length: int, task: str | None = None) -> StaticSparseEncoder:
        """A copy for inputs of ``task`` (the prompt changes nothing here but the ids)."""
        return dataclasses.replace(self, prompt_length=prompt_length, task=task)

    def __call__(self, tokens: list[list[int]]) -> SparseVectors:
        """Token ids of n inputs -> their SparseVectors. ValueError for an id outside the
        vocabulary."""
        width = self.dimensions
        bad = next((i for row in tokens for i in row if not 0 <= i < width), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary (0 .. {width - 1})")
        present = torch.zeros(len(tokens), width)
        rows = [r for r, row in enumerate(tokens) for _ in row]
        columns = [i for row in tokens for i in row]
        present[rows, columns] = 1.0
        return SparseVectors.from_dense(present * self.weight, self.max_active_dims)


def load_static_tokenizer(folder: Path) -> TextTokenizer:
    """The tokenizer of the SparseStaticEmbedding saved in ``folder``, run as
    sentence-transformers runs it: no special tokens added; cut at the tokenizer's
    model_max_length, or not at all where it sets none."""
    from fastbert.integrations import models

    with models.quiet():
        tokenizer = models.import_transformers().AutoTokenizer.from_pretrained(
            str(folder), local_files_only=True
        )
    limit = getattr(tokenizer, "model_max_length", None) or NO_LIMIT + 1
    max_length = int(limit) if limit <= NO_LIMIT else UNLIMITED
    return TextTokenizer(tokenizer, max_length, add_special_tokens=False)


def load_static_route(folder: Path) -> tuple[TextTokenizer, StaticSparseEncoder]:
    """(the tokenizer, the encoder) of the SparseStaticEmbedding saved in ``folder``: see
    :func:`load_static_tokenizer`; its weights, float32 [vocabulary]. ValueError naming the
    folder for weights of another shape than its tokenizer's vocabulary."""
    tokenizer = load_static_tokenizer(folder)
    weight = read_checkpoint_state(folder).get("weight")
    vocabulary = len(tokenizer.tokenizer.get_vocab())
    if weight is None or tuple(weight.shape) != (vocabulary,):
        found = "none" if weight is None else f"shape {tuple(weight.shape)}"
        raise ValueError(
            f"{folder}: a SparseStaticEmbedding needs a 'weight' of [{vocabulary}] (its "
            f"tokenizer's vocabulary), found {found}"
        )
    return tokenizer, StaticSparseEncoder(weight.detach().float().contiguous())


__all__ = ["StaticSparseEncoder", "load_static_route", "load_static_tokenizer"]
