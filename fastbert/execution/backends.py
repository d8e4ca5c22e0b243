"""The one dispatch point for the hot ops: PyTorch's fastest primitives or the Triton kernels.

``backend="auto"`` picks the Triton kernels for CUDA tensors and the torch backend elsewhere;
``"triton"`` on a CPU tensor runs only under the Triton interpreter (TRITON_INTERPRET=1). The torch
backend is the plain one (fastbert/kernels/torch_ops.py: PyTorch's primitives, any device), whose
attention and linear the CPU engine (fastbert/kernels/cpu_engine.py: the compiled attention,
per-length SDPA, oneDNN's linear) replaces for CPU tensors: :func:`get_ops` chooses by the device.

The backends are read from the ops' declarations (:data:`fastbert.kernels.OPS`): the triton
backend of an op is the declaration itself (its public call: under ``torch.compile`` the
``torch.ops.fastbert`` custom op, so a model running it compiles without graph breaks; in eager
mode its launchers), the torch backend its ``torch`` implementation, which skips the per-call
input checks: the encoder builds the ops' inputs itself from inputs it has validated. The
torch backend is plain PyTorch for ``torch.compile`` to trace (its id-range check in the
embeddings reads values on the host, when the caller has not checked the ids).
fastbert.kernels.reference, the float64-exact oracle of the tests, is no backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch

from fastbert.kernels import OPS, cpu_engine, launch
from fastbert.kernels.flash_attention import SUPPORTED_HEAD_DIMS

BACKENDS = ("auto", "torch", "triton")
ATTENTION_OPS = ("attention", "attention_varlen")


class Ops:
    """The hot ops of one backend, as attributes named as in fastbert.kernels.OPS
    (``ops.linear(...)``), with the signatures of fastbert.kernels.reference.

    ``name``: "torch" or "triton". ``attention_fallback``: the attention ops are the torch
    backend's although the others are ``name``'s (a triton model whose head dim the kernel
    does not run).
    """

    def __init__(
        self, name: str, ops: Mapping[str, Callable[..., torch.Tensor]], attention_fallback=False
    ):
        self.name = name
        self.attention_fallback = attention_fallback
        self.names = tuple(ops)
        for op_name, op in ops.items():
            setattr(self, op_name, op)

    @property
    def attention_backend(self) -> str:
        """Where the attention ops run: "torch" or "triton"."""
        return "torch" if self.attention_fallback else self.name

    def by_name(self) -> dict[str, Callable[..., torch.Tensor]]:
        """Each op of this backend, by name."""
        return {name: getattr(self, name) for name in self.names}

    def __repr__(self) -> str:
        fallback = ", attention on torch" if self.attention_fallback else ""
        return f"Ops({self.name!r}{fallback})"


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
def _torch_ops(on_cpu: bool) -> dict[str, Callable[..., torch.Tensor]]:
    """The torch backend's ops, without their input checks (see the module docstring): the
    plain ones, those of the CPU engine in their place ``on_cpu``."""
    ops = {name: op.torch for name, op in OPS.items()}
    return {**ops, **cpu_engine.OPS} if on_cpu else ops


@functools.cache
def _ops_for(backend: str, attention_fallback: bool, on_cpu: bool) -> Ops:
    """The Ops of a concrete backend ("torch" or "triton") for CPU tensors or others, built
    once from the declarations."""
    torch_ops = _torch_ops(on_cpu)
    if backend == "torch":
        return Ops("torch", torch_ops)
    ops = dict(OPS)
    if attention_fallback:
        ops.update({name: torch_ops[name] for name in ATTENTION_OPS})
    return Ops("triton", ops, attention_fallback)


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
        def run(*args: object, **kwargs: object) -> torch.Tensor:
            return op(*map(cast, args), **{k: cast(v) for k, v in kwargs.items()})

        return run

    casts = {name: casting(op) for name, op in ops.by_name().items()}
    return Ops(ops.name, casts, ops.attention_fallback)


def get_ops(backend: str, device: torch.device | str, head_dim: int | None = None) -> Ops:
    """The ops for ``backend`` on ``device`` (see :func:`resolve_backend`): on a CPU the torch
    backend's attention and linear are the CPU engine's (fastbert.kernels.cpu_engine); with a
    ``head_dim`` the Triton attention kernel does not run, the attention ops of the triton
    backend are the torch backend's. Under ``torch.autocast`` for the device, the triton
    backend's ops compute in autocast's dtype (:func:`autocast_ops`)."""
    resolved = resolve_backend(backend, device)
    fallback = (
        resolved == "triton" and head_dim is not None and (head_dim not in SUPPORTED_HEAD_DIMS)
    )
    ops = _ops_for(resolved, fallback, cpu_engine.serves(device))
    device_type = torch.device(device).type
    if resolved == "triton" and torch.is_autocast_enabled(device_type):
        return autocast_ops(ops, torch.get_autocast_dtype(device_type))
    return ops
