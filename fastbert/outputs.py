"""Model outputs with Hugging Face's field names; index or unpack them like a tuple too."""

from __future__ import annotations

import dataclasses

import torch


class _Output:
    """Attribute access by HF name, and ``out[0]`` / tuple unpacking over the set fields."""

    def to_tuple(self) -> tuple[torch.Tensor, ...]:
        return tuple(
            getattr(self, f.name)
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if getattr(self, f.name) is not None
        )

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
    """logits: [B, S, vocab] (masked LM) or [B, num_labels] (sentence-level heads)."""

    logits: torch.Tensor
