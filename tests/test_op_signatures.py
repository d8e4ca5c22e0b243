"""op.implements and op.checked: an op's signature is written once, in its reference, and the
backends' functions keep it."""

from __future__ import annotations

import inspect

import pytest
import torch

from fastbert import kernels as K
from fastbert.kernels import cpu_engine_attention, cpu_engine_linear, sparse_head_torch
from fastbert.kernels.op import checked, implements


def reference(x: torch.Tensor, scale: float = 1.0, *, hook: bool = False) -> torch.Tensor:
    return x * scale


def test_implements_gives_the_reference_defaults_and_annotations() -> None:
    @implements(reference)
    def implementation(x, scale, *, extra: int = 3):
        return x * scale + extra

    parameters = inspect.signature(implementation).parameters
    assert parameters["scale"].default == 1.0 and parameters["extra"].default == 3
    assert parameters["x"].annotation == "torch.Tensor"
    assert implementation(torch.ones(1)).item() == 4.0


def test_implements_refuses_another_order_or_default() -> None:
    with pytest.raises(TypeError, match="order"):

        @implements(reference)
        def swapped(scale, x):
            return x

    with pytest.raises(TypeError, match="default"):

        @implements(reference)
        def other_default(x, scale=2.0):
            return x


def test_checked_runs_each_check_with_the_arguments_it_names() -> None:
    seen = []

    @implements(reference)
    def implementation(x, scale):
        return x * scale

    def check_scale(scale):
        seen.append(scale)
        if scale < 0:
            raise ValueError("scale must be >= 0")

    public = checked(implementation, check_scale)
    assert public.__name__ == "implementation"
    assert inspect.signature(public) == inspect.signature(implementation)
    assert public(torch.ones(1)).item() == 1.0 and seen == [1.0]
    with pytest.raises(ValueError, match="scale"):
        public(torch.ones(1), -1.0)
    with pytest.raises(TypeError):
        public(torch.ones(1), 1.0, 2.0)
    with pytest.raises(TypeError):
        public(torch.ones(1), nope=1)


@pytest.mark.parametrize(
    "function",
    [
        K.torch_ops.attention,
        K.torch_ops.attention_unchecked,
        K.torch_ops.attention_varlen_unchecked,
        K.torch_ops.linear,
        K.torch_ops.linear_int8,
        K.torch_ops.linear_fp8,
        K.torch_ops.layer_norm,
        K.torch_ops.embeddings_layer_norm,
        cpu_engine_attention.attention,
        cpu_engine_attention.attention_varlen_unchecked,
        cpu_engine_linear.linear_unchecked,
        sparse_head_torch.splade_max,
        K.attention,
        K.attention_varlen,
        K.scaled_masked_softmax,
        K.linear,
        K.linear_int8,
        K.linear_fp8,
        K.layer_norm,
        K.embeddings_layer_norm,
        K.splade_max,
    ],
    ids=lambda f: f"{f.__module__.rsplit('.', 1)[-1]}.{f.__name__}",
)
def test_backend_functions_keep_the_reference_defaults(function) -> None:
    name = function.__name__.removesuffix("_unchecked")
    expected = inspect.signature(getattr(K.reference, name)).parameters
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name in expected:
            assert parameter.default == expected[parameter.name].default, parameter.name
            assert parameter.annotation == expected[parameter.name].annotation, parameter.name
