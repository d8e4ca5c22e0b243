"""A masked-LM head read from any family's ``*ForMaskedLM`` checkpoint, for sparse (SPLADE)
embeddings: transform (dense + activation + LayerNorm), then the decoder onto the vocabulary.

Where each family keeps the head's tensors is data (:class:`~fastbert.model.families.
MaskedLMHeadNames`). :meth:`MaskedLMHead.splade` pools SPLADE's ``log(1 + relu(logit))`` over
each sequence without holding the [tokens, vocabulary] logits (the ``splade_max`` op);
:meth:`MaskedLMHead.logits` gives them whole, for what needs every token's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fastbert.execution.backends import Ops
from fastbert.model.config import HIDDEN_ACTIVATIONS
from fastbert.model.families import Family
from fastbert.model.layers import norm_bias


class MaskedLMHead(nn.Module):
    """The head's parameters in the encoder's dtype and device: ``transform_weight`` [E, H],
    ``transform_bias`` [E] (or None), ``norm_weight`` / ``norm_bias`` [E] (bias or None),
    ``decoder_weight`` [V, E], ``decoder_bias`` [V] (or None); ``activation``: the transform's
    ("gelu" or "gelu_tanh"); ``eps``: the LayerNorm's epsilon."""

    def __init__(self, tensors: Mapping[str, torch.Tensor | None], activation: str, eps: float):
        super().__init__()
        for name, value in tensors.items():
            self.register_parameter(
                name, None if value is None else nn.Parameter(value, requires_grad=False)
            )
        self.activation = activation
        self.eps = eps

    @property
    def vocab_size(self) -> int:
        return self.decoder_weight.shape[0]

    def transform(self, ops: Ops, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> the transformed states [..., E] the decoder reads."""
        hidden = ops.linear(hidden, self.transform_weight, self.transform_bias, self.activation)
        bias = norm_bias(self.norm_bias, self.norm_weight)
        return ops.layer_norm(hidden, self.norm_weight, bias, self.eps)

    def logits(self, ops: Ops, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> the vocabulary's logits [..., V], in the model's dtype."""
        return ops.linear(self.transform(ops, hidden), self.decoder_weight, self.decoder_bias)

    def splade(
        self, ops: Ops, hidden: torch.Tensor, cu_seqlens: torch.Tensor, log_steps: int = 1
    ) -> torch.Tensor:
        """Packed token states [T, H] of B sequences (``cu_seqlens`` int32 [B + 1]) -> their
        SPLADE vectors [B, V], float32: per sequence, the max over its tokens of
        ``log1p(relu(logit))`` (``log_steps=2``: of ``log1p(log1p(relu(logit)))``)."""
        return ops.splade_max(
            self.transform(ops, hidden),
            self.decoder_weight,
            self.decoder_bias,
            cu_seqlens,
            log_steps,
        )


def read_masked_lm_head(
    state: Mapping[str, torch.Tensor],
    family: Family,
    config: Mapping[str, Any],
    word_embeddings: torch.Tensor,
    source: Path,
) -> MaskedLMHead:
    """The masked-LM head of ``family`` from a ``*ForMaskedLM`` checkpoint's ``state`` (read
    from ``source``, which errors name), its raw ``config`` dict, and the encoder's
    ``word_embeddings`` [V, E] (the decoder when the checkpoint ties it): in the word
    embeddings' dtype and device. ValueError naming the missing tensor or the activation
    fastbert does not run."""
    names = family.masked_lm_head
    if names is None:
        raise ValueError(f"fastbert does not read {family.name} masked-LM heads")

    def tensor(name: str, required: bool = True) -> torch.Tensor | None:
        value = state.get(name)
        if value is None and required:
            raise ValueError(f"{source}: the masked-LM head's {name!r} is missing")
        if value is None:
            return None
        return value.detach().to(word_embeddings.dtype).to(word_embeddings.device)

    activation_name = names.activation or config.get(names.activation_key) or "gelu"
    if activation_name not in HIDDEN_ACTIVATIONS:
        raise ValueError(
            f"{source}: the masked-LM head's activation {activation_name!r} is not one fastbert "
            f"runs ({sorted(HIDDEN_ACTIVATIONS)})"
        )
    eps = config.get(names.eps_key, names.eps) if names.eps_key else names.eps
    decoder = tensor(names.decoder, required=False)
    if decoder is None:
        decoder = word_embeddings.detach()
    bias = next((tensor(n) for n in names.biases if n in state), None)
    tensors = {
        "transform_weight": tensor(f"{names.dense}.weight"),
        "transform_bias": tensor(f"{names.dense}.bias", required=False),
        "norm_weight": tensor(f"{names.norm}.weight"),
        "norm_bias": tensor(f"{names.norm}.bias", required=False),
        "decoder_weight": decoder,
        "decoder_bias": bias,
    }
    width = tensors["transform_weight"].shape[0]
    if decoder.shape[1] != width:
        raise ValueError(
            f"{source}: the decoder reads {decoder.shape[1]} values, the transform gives {width}"
        )
    return MaskedLMHead(tensors, HIDDEN_ACTIVATIONS[activation_name], float(eps))
