"""fastbert's attention inside Hugging Face models: ``attn_implementation="fastbert"``.

For users who keep Hugging Face's modules and only want the fused attention kernel::

    import fastbert  # registers "fastbert" with transformers (now, or when it is imported)
    model = AutoModel.from_pretrained(path, attn_implementation="fastbert")
    model.set_attn_implementation("fastbert")  # or switch an existing model

Two entries are registered under the name "fastbert":

- ``AttentionMaskInterface``: :func:`padding_mask` hands the attention function the [B, S_k]
  bool key-padding mask itself (True = real token), or None without padding, instead of a
  [B, 1, S_q, S_k] mask; no host synchronisation. Any other pattern (causal, sliding window,
  extra mask functions, key offsets) gets Hugging Face's own 4-D sdpa mask.
- ``AttentionInterface``: :func:`attention_forward` runs the fused kernel on a key-padding
  mask. It hands the call to Hugging Face's sdpa attention, which computes it correctly, when
  the call is not plain bidirectional attention over a key-padding mask: a 4-D mask, causal
  attention without a mask, grouped-query heads, a position bias, softcapping, attention
  sinks or a paged cache. Attention dropout (a model in training mode) runs inside the
  kernel, and the attention has a backward, so such a model trains.

Where the kernel runs: CUDA tensors use the Triton kernel (as ``torch.ops.fastbert.attention``
under torch.compile, so a compiled model has no graph break); CPU tensors use it under the
Triton interpreter (``TRITON_INTERPRET=1``) and the torch backend (fastbert.kernels.torch_ops)
otherwise. Head dims the kernel does not support (it runs 32, 64, 80, 96, 128), float64 and
inputs without unit stride on the head dim use the torch backend too. Attention weights are
never returned (None), as with sdpa.

Loading helpers for ``fastbert accuracy`` (:func:`random_masked_lm`, :func:`load_masked_lm`,
:func:`load_tokenizer`) live here too, with the rest of fastbert's use of transformers.

Registration: ``import fastbert`` calls :func:`register_on_import`, which registers at once if
transformers is already imported and otherwise adds an import hook that registers when
transformers' ``modeling_utils`` / ``masking_utils`` finish loading, so fastbert never
imports transformers itself. :func:`register` registers explicitly (importing transformers).
This module imports transformers only inside functions.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from fastbert import kernels
from fastbert.kernels import launch, torch_ops
from fastbert.kernels.checks import FLOAT_DTYPES
from fastbert.kernels.flash_attention import SUPPORTED_HEAD_DIMS

NAME = "fastbert"
# Keyword arguments that change the attention's math; sdpa handles (or rejects) them.
_SDPA_ONLY_KWARGS = ("position_bias", "softcap", "s_aux", "sinks", "cache")


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Hugging Face attention function: (attn_output [B, S_q, H, D] contiguous, None).

    query: [B, H, S_q, D]; key, value: [B, H, S_k, D] (Hugging Face's transposed views);
    attention_mask: the [B, S_k] bool key-padding mask from :func:`padding_mask` (True = real
    token), None, or a 4-D mask (handed to sdpa). scaling defaults to D**-0.5. dropout: the
    attention-probability dropout (Hugging Face passes 0.0 in eval mode).
    """
    if _needs_sdpa(module, query, key, attention_mask, kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    return _attend(query, key, value, attention_mask, scaling, dropout), None


def _is_causal(module: torch.nn.Module, query: torch.Tensor, kwargs: dict) -> bool:
    """Whether the call is causal, by sdpa's rule (a module without the flag counts as causal)."""
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    return bool(is_causal) and query.shape[2] > 1


def _needs_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    kwargs: dict,
) -> bool:
    """Whether the call is something other than bidirectional attention over a padding mask."""
    if any(kwargs.get(name) is not None for name in _SDPA_ONLY_KWARGS):
        return True
    if query.shape[1] != key.shape[1]:
        return True  # grouped-query attention
    if attention_mask is not None and attention_mask.dim() != 2:
        return True  # a 4-D mask: causal, sliding window, custom pattern or a user's mask
    if _is_causal(module, query, kwargs):
        if attention_mask is not None:
            raise ValueError(
                "attn_implementation='fastbert' got a 2-D key-padding mask for a causal "
                f"attention module ({type(module).__name__}); causal masks are 4-D"
            )
        return True
    return False


def _kernel_runs(*tensors: torch.Tensor) -> bool:
    """Whether the Triton attention kernel can take these q, k, v (else: the torch backend)."""
    q = tensors[0]
    on_device = q.device.type == "cuda" or (q.device.type == "cpu" and launch.interpreting())
    return (
        on_device
        and q.dtype in FLOAT_DTYPES
        and q.shape[-1] in SUPPORTED_HEAD_DIMS
        and all(t.stride(-1) == 1 for t in tensors)
    )


def _attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    scale: float | None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """[B, H, S, D] q, k, v and a [B, S_k] mask -> contiguous [B, S_q, H, D]."""
    if _kernel_runs(query, key, value):
        # The kernel's [B, H, S_q, D] result is the transpose of a contiguous [B, S_q, H, D].
        out = kernels.attention(query, key, value, key_padding_mask, scale, dropout_p)
        return out.transpose(1, 2)
    out = torch_ops.attention(query, key, value, key_padding_mask, scale, dropout_p)
    return out.transpose(1, 2).contiguous()


def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """Hugging Face mask function: the [B, S_k] bool padding mask (or None) for bidirectional
    attention; Hugging Face's 4-D sdpa mask for any other pattern.

    attention_mask: the model's 2-D mask, already bool [B, S_k] (True = real token).
    """
    from transformers import masking_utils

    plain = (
        mask_function is masking_utils.bidirectional_mask_function
        and kv_offset == 0
        and kwargs.get("local_size") is None
        and (attention_mask is None or attention_mask.shape[-1] == kv_length)
    )
    if plain:
        return attention_mask
    return masking_utils.sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        **kwargs,
    )


# transformers module -> how to register fastbert in it once it is loaded.
_REGISTRARS: dict[str, Callable[[ModuleType], None]] = {
    "transformers.modeling_utils": lambda m: m.AttentionInterface.register(NAME, attention_forward),
    "transformers.masking_utils": lambda m: m.AttentionMaskInterface.register(NAME, padding_mask),
}


def register() -> None:
    """Register ``attn_implementation="fastbert"`` with transformers now (imports it)."""
    for name, registrar in _REGISTRARS.items():
        registrar(importlib.import_module(name))


def register_on_import() -> None:
    """Register with transformers now if it is loaded, else as soon as it is (no import here)."""
    pending = {}
    for name, registrar in _REGISTRARS.items():
        module = sys.modules.get(name)
        if module is None:
            pending[name] = registrar
        else:
            registrar(module)
    if pending and not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport(pending))


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of each pending module to register after it."""

    def __init__(self, pending: dict[str, Callable[[ModuleType], None]]):
        self.pending = pending

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        registrar = self.pending.pop(fullname, None)
        if registrar is None:
            return None
        if not self.pending:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RegisteringLoader(spec.loader, registrar)
                return spec
        return None


class _RegisteringLoader(importlib.abc.Loader):
    """Runs the real loader, then registers fastbert in the freshly executed module."""

    def __init__(self, loader: Any, registrar: Callable[[ModuleType], None]):
        self.loader = loader
        self.registrar = registrar

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            self.registrar(module)
        except Exception as exc:  # a transformers without these interfaces: say so, go on
            warnings.warn(
                f"fastbert could not register attn_implementation='fastbert' with "
                f"{module.__name__}: {exc}",
                stacklevel=2,
            )

    def __getattr__(self, name: str) -> Any:
        # get_source, get_resource_reader, is_package, ...: the real loader's.
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)
