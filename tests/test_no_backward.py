"""The Triton attention ops have no backward yet: an input requiring grad in grad mode raises,
instead of an output that silently carries no gradient (the reference ops keep PyTorch's
autograd). The other ops have backward kernels (tests/test_ops_backward.py)."""

from __future__ import annotations

import pytest
import torch

from fastbert import kernels as K


def _calls(device: str) -> dict:
    def t(*shape):
        return torch.randn(*shape, device=device)

    cu_seqlens = torch.tensor([0, 3], dtype=torch.int32, device=device)
    return {
        "attention": lambda g: K.attention(g(t(1, 2, 3, 32)), t(1, 2, 3, 32), t(1, 2, 3, 32)),
        "attention_varlen": lambda g: K.attention_varlen(
            g(t(3, 2, 32)), t(3, 2, 32), t(3, 2, 32), cu_seqlens, 3),
    }


@pytest.mark.parametrize("op", sorted(_calls("cpu")))
def test_an_input_requiring_grad_raises(device, op) -> None:
    call = _calls(device)[op]
    with pytest.raises(RuntimeError, match=f"fastbert.kernels.{op} has no backward"):
        call(lambda x: x.requires_grad_())
    with torch.no_grad():
        call(lambda x: x.requires_grad_())
    call(lambda x: x)
