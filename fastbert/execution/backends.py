"""The one dispatch point for the hot ops: PyTorch's fastest primitives or the Triton kernels.

``backend="auto"`` picks the Triton kernels for CUDA tensors and the torch backend
(kernels/torch_ops.py: scaled_dot_product_attention, addmm, layer_norm, embedding) elsewhere;
``"triton"`` on a CPU tensor runs only under the Triton interpreter (TRITON_INTERPRET=1).
The triton backend calls the kernels through the ``torch.ops.fastbert`` custom ops
(fastbert/execution/custom_ops.py), so a model running it compiles with ``torch.compile`` without
graph
breaks. The torch backend is plain PyTorch for ``torch.compile`` to trace (its id-range check
in the embeddings reads values on the host, when the caller has not checked the ids). The
encoder runs the torch ops without their per-call input checks (torch_ops.UNCHECKED): it
builds their inputs itself from inputs it has validated. fastbert.kernels.reference, the
float64-exact oracle of the tests, is no backend.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from fastbert.kernels import launch
from fastbert.kernels.flash_attention import SUPPORTED_HEAD_DIMS

BACKENDS = ("auto", "torch", "triton")


@dataclasses.dataclass(frozen=True)
class Ops:
    """The hot ops of one backend, with the signatures of fastbert.kernels.reference.

    ``attention_fallback``: the two attention ops are the torch backend's although the others
    are ``name``'s (a triton model whose head dim the kernel does not run).
    """

    name: str
    attention: Callable[..., torch.Tensor]
    attention_varlen: Callable[..., torch.Tensor]
    scaled_masked_softmax: Callable[..., torch.Tensor]
    linear: Callable[..., torch.Tensor]
    layer_norm: Callable[..., torch.Tensor]
    embeddings_layer_norm: Callable[..., torch.Tensor]
    attention_fallback: bool = False

    @property
    def attention_backend(self) -> str:
        """Where the attention ops run: "torch" or "triton"."""
        return "torch" if self.attention_fallback else self.name


# The op fields of Ops, computed once here: torch.compile does not trace dataclasses.fields.
OP_NAMES = (
    "attention",
    "attention_varlen",
    "scaled_masked_softmax",
    "linear",
    "layer_norm",
    "embeddings_layer_norm",
)


def check_backend(backend: str) -> None:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def check_head_dim(head_dim: int) -> None:
    """Raise unless the Triton attention kernel runs heads of ``head_dim``."""
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"backend='triton' cannot run this model: its head dim (hidden_size / "
            f"num_attention_heads) is {head_dim}, and the Triton attention kernel runs "
            f"{SUPPORTED_HEAD_DIMS}. Use backend='auto' (the attention then runs on the "
            "torch backend, every other op on Triton) or backend='torch'."
        )


def resolve_backend(backend: str, device: torch.device | str) -> str:
    """The concrete backend ("torch" or "triton") for tensors on ``device``."""
    check_backend(backend)
    device = torch.device(device)
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if (
        backend == "triton"
        and device.type != "cuda"
        and not (device.type == "cpu" and launch.interpreting())
    ):
        raise ValueError(
            f"backend='triton' needs CUDA tensors, got {device}; on a CPU it runs only under "
            "the Triton interpreter (set TRITON_INTERPRET=1 before importing fastbert). Use "
            "backend='torch' or 'auto' here."
        )
    return backend


def backend_label(backend: str, device: torch.device | str) -> str:
    """What ``backend`` runs on ``device``, for people: "torch", "triton", or
    "triton (interpreter)" (the Triton kernels emulated on a CPU, TRITON_INTERPRET=1).
    ValueError as :func:`resolve_backend`."""
    resolved = resolve_backend(backend, device)
    if resolved == "triton" and torch.device(device).type == "cpu":
        return "triton (interpreter)"
    return resolved


@functools.cache
def _ops_for(backend: str, attention_fallback: bool) -> Ops:
    """The Ops of a concrete backend ("torch" or "triton"), built once. The torch ops come
    without their input checks (see the module docstring)."""
    from fastbert.kernels import torch_ops

    unchecked = Ops("torch", **{op: torch_ops.UNCHECKED[op] for op in OP_NAMES})
    if backend == "torch":
        return unchecked
    from fastbert.execution import custom_ops

    ops = Ops("triton", **{op: getattr(custom_ops, op) for op in OP_NAMES})
    if not attention_fallback:
        return ops
    return dataclasses.replace(
        ops,
        attention=unchecked.attention,
        attention_varlen=unchecked.attention_varlen,
        attention_fallback=True,
    )


@functools.cache
def autocast_ops(ops: Ops, dtype: torch.dtype) -> Ops:
    """``ops`` computing in ``dtype``: each casts its floating tensor arguments to ``dtype``
    first (a cast is differentiable, so float32 master weights get float32 gradients).

    What ``torch.autocast`` means for the Triton ops, which autocast does not reach (the
    torch backend's primitives follow autocast themselves)."""

    def cast(value: object) -> object:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(dtype)
        return value

    def casting(op: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        @functools.wraps(op)
        def run(*args: object, **kwargs: object) -> torch.Tensor:
            return op(*map(cast, args), **{k: cast(v) for k, v in kwargs.items()})

        return run

    return dataclasses.replace(ops, **{op: casting(getattr(ops, op)) for op in OP_NAMES})


def get_ops(backend: str, device: torch.device | str, head_dim: int | None = None) -> Ops:
    """The ops for ``backend`` on ``device`` (see :func:`resolve_backend`); with a
    ``head_dim`` the Triton attention kernel does not run, the attention ops of the triton
    backend are the torch backend's. Under ``torch.autocast`` for the device, the triton
    backend's ops compute in autocast's dtype (:func:`autocast_ops`)."""
    resolved = resolve_backend(backend, device)
    fallback = (
        resolved == "triton" and head_dim is not None and (head_dim not in SUPPORTED_HEAD_DIMS)
    )
    ops = _ops_for(resolved, fallback)
    device_type = torch.device(device).type
    if resolved == "triton" and torch.is_autocast_enabled(device_type):
        return autocast_ops(ops, torch.get_autocast_dtype(device_type))
    return ops
