"""Model outputs with Hugging Face's field names; index or unpack them like a tuple too.

As in Hugging Face, ``loss`` comes first when it is set (the call had ``labels``), and fields
that are None are left out of the tuple.
"""

from __future__ import annotations

import dataclasses

import torch


class _Output:
    """Attribute access by HF name, and ``out[0]`` / tuple unpacking over the set fields."""

    def to_tuple(self) -> tuple[torch.Tensor, ...]:
        names = [f.name for f in dataclasses.fields(self)]  # type: ignore[arg-type]
        if "loss" in names:
            names.remove("loss")
            names.insert(0, "loss")
        return tuple(getattr(self, n) for n in names if getattr(self, n) is not None)

    def __getitem__(self, index: int | str) -> torch.Tensor:
        if isinstance(index, str):
            return getattr(self, index)
        return self.to_tuple()[index]

    def __iter__(self):
        return iter(self.to_tuple())


@dataclasses.dataclass
class BaseModelOutputWithPooling(_Output):
    """last_hidden_state: [B, S, H]; pooler_output: [B, H] (None without a pooler)."""

    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor | None = None


@dataclasses.dataclass
class LogitsOutput(_Output):
    """logits: [B, S, vocab] (masked LM) or [B, num_labels] (sentence-level heads); loss: the
    scalar loss of the call's ``labels`` (None without labels)."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


@dataclasses.dataclass
class PreTrainingOutput(_Output):
    """prediction_logits: [B, S, vocab] (masked LM); seq_relationship_logits: [B, 2]
    (next sentence); loss: their summed losses when both label sets were given, else None."""

    prediction_logits: torch.Tensor
    seq_relationship_logits: torch.Tensor
    loss: torch.Tensor | None = None
