"""The Triton ops without a backward yet: an input requiring grad in grad mode raises, instead of
an output that silently carries no gradient (the reference ops keep PyTorch's autograd). The
attention ops have one (tests/test_attention_backward.py)."""

from __future__ import annotations

import pytest
import torch

from fastbert import kernels as K


def _calls(device: str) -> dict:
    def t(*shape):
        return torch.randn(*shape, device=device)

    ids = torch.tensor([[1, 2, 3]], device=device)
    return {
        "scaled_masked_softmax": lambda g: K.scaled_masked_softmax(g(t(1, 1, 2, 4))),
        "linear": lambda g: K.linear(t(2, 8), g(t(4, 8)), t(4)),
        "layer_norm": lambda g: K.layer_norm(t(2, 8), g(t(8)), t(8), 1e-5),
        "embeddings_layer_norm": lambda g: K.embeddings_layer_norm(
            ids, None, None, g(t(5, 8)), t(4, 8), t(1, 8), t(8), t(8), 1e-12),
    }


@pytest.mark.parametrize("op", sorted(_calls("cpu")))
def test_an_input_requiring_grad_raises(device, op) -> None:
    call = _calls(device)[op]
    with pytest.raises(RuntimeError, match=f"fastbert.kernels.{op} has no backward"):
        call(lambda x: x.requires_grad_())
    with torch.no_grad():
        call(lambda x: x.requires_grad_())
    call(lambda x: x)
