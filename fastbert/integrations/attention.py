"""fastbert's attention inside Hugging Face models: ``attn_implementation="fastbert"``.

For users who keep Hugging Face's modules and only want the fused attention kernel::

    import fastbert  # registers "fastbert" with transformers (now, or when it is imported)
    model = AutoModel.from_pretrained(path, attn_implementation="fastbert")
    model.set_attn_implementation("fastbert")  # or switch an existing model

Two entries are registered under the name "fastbert":

- ``AttentionMaskInterface``: :func:`padding_mask` hands the attention function the [B, S_k]
  bool key-padding mask itself (True = real token), or None without padding, instead of a
  [B, 1, S_q, S_k] mask; no host synchronisation. It does so for bidirectional masks, full or
  sliding-window (Hugging Face's ``sliding_window_bidirectional_mask_function``, ModernBERT's
  local layers), as Hugging Face's flash-attention mask does. Any other pattern (causal or
  causal sliding window, extra mask functions, key offsets) gets Hugging Face's own 4-D sdpa
  mask.
- ``AttentionInterface``: :func:`attention_forward` runs the fused kernel on a key-padding
  mask, with the sliding window the model passes as ``sliding_window`` (see below). It hands
  the call to Hugging Face's sdpa attention, which computes it correctly, when the call is not
  bidirectional attention over a key-padding mask: a 4-D mask, causal attention without a
  mask, grouped-query heads, a position bias, softcapping, attention sinks or a paged cache.
  Attention dropout (a model in training mode) runs inside the kernel, and the attention has
  a backward, so such a model trains.

Sliding window: Hugging Face's bidirectional sliding-window mask keeps the keys j of query i
with |i - j| <= ``config.sliding_window`` (ModernBERT: ``local_attention // 2``), and the
attention modules pass ``sliding_window=config.sliding_window + 1`` to the attention function,
which its flash-attention path turns into the inclusive window (sliding_window - 1,
sliding_window - 1). The kernel's ``window`` w keeps |i - j| <= w, so it gets
``sliding_window - 1``: the same keys as the mask. Rotary positions are applied by Hugging
Face before the attention function; the kernel gets q and k rotated already.

Which models: those whose attention module calls Hugging Face's ``ALL_ATTENTION_FUNCTIONS``
(BERT, RoBERTa, XLM-RoBERTa, ELECTRA, DistilBERT, ModernBERT). MPNet's does not:
``MPNetSelfAttention`` computes its scores, relative position bias included, itself, so there
``attn_implementation="fastbert"`` is accepted and changes nothing (``fastbert.optimize`` runs
MPNet's bias inside the kernel).

Where the kernel runs: CUDA tensors use the Triton kernel (as ``torch.ops.fastbert.attention``
under torch.compile, so a compiled model has no graph break); CPU tensors use it under the
Triton interpreter (``TRITON_INTERPRET=1``) and the torch backend otherwise (on a CPU its
engine, fastbert.kernels.cpu_engine; elsewhere fastbert.kernels.torch_ops). Head dims the
kernel does not support (it runs 32, 64, 80, 96, 128), float64 and inputs without unit
stride on the head dim use the torch backend too. Attention weights are never returned
(None), as with sdpa.

Loading helpers for ``fastbert accuracy`` (:func:`random_masked_lm`, :func:`load_masked_lm`,
:func:`load_tokenizer`) live here too, with the rest of fastbert's use of transformers.

Registration: ``import fastbert`` registers at once if transformers is already imported and
otherwise adds an import hook that registers when transformers' ``modeling_utils`` /
``masking_utils`` finish loading, so fastbert never imports transformers itself
(:mod:`fastbert.integrations.registration`, which loads this module only then).
:func:`register` registers explicitly (importing transformers).
This module imports transformers only inside functions.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import torch

from fastbert import kernels
from fastbert.integrations.registration import ENTRIES, register_in
from fastbert.integrations.registration import NAME as NAME  # the name models ask for
from fastbert.kernels import cpu_engine, launch, torch_ops
from fastbert.kernels.checks import FLOAT_DTYPES
from fastbert.kernels.flash_attention import SUPPORTED_HEAD_DIMS

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
    window = _kernel_window(kwargs.get("sliding_window"))
    if window is not None:
        # Hugging Face's eager and sdpa masks read the window from the config at each call;
        # the argument is the one the module was built with (a window edited since: 0.86 off).
        live = getattr(getattr(module, "config", None), "sliding_window", None)
        if isinstance(live, int) and not isinstance(live, bool) and live >= 0:
            window = live
    return _attend(query, key, value, attention_mask, scaling, dropout, window), None


def _kernel_window(sliding_window: Any) -> int | None:
    """The kernel's window w (keys with |i - j| <= w) for Hugging Face's ``sliding_window``
    argument, which its flash-attention path applies as the inclusive window
    (sliding_window - 1, sliding_window - 1); None (no window) stays None."""
    if sliding_window is None:
        return None
    if (
        not isinstance(sliding_window, int)
        or isinstance(sliding_window, bool)
        or sliding_window < 1
    ):
        raise ValueError(
            f"attn_implementation='fastbert' needs sliding_window None or an integer >= 1, "
            f"got {sliding_window!r}"
        )
    return sliding_window - 1


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
    window: int | None = None,
) -> torch.Tensor:
    """[B, H, S, D] q, k, v and a [B, S_k] mask -> contiguous [B, S_q, H, D]; window: None or
    the w of a sliding window (query i attends keys j with |i - j| <= w)."""
    if _kernel_runs(query, key, value):
        # The kernel's [B, H, S_q, D] result is the transpose of a contiguous [B, S_q, H, D].
        out = kernels.attention(
            query, key, value, key_padding_mask, scale, dropout_p, window=window
        )
        return out.transpose(1, 2)
    torch_backend = cpu_engine if cpu_engine.serves(query.device) else torch_ops
    out = torch_backend.attention(
        query, key, value, key_padding_mask, scale, dropout_p, window=window
    )
    return out.transpose(1, 2).contiguous()


# Model types whose attention module computes its scores itself and adds the mask to them
# (never calling the attention interface): MPNet's, with its relative position bias.
OWN_SCORES = frozenset({"mpnet"})


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
    attention, full or sliding-window (the attention function applies the window); Hugging
    Face's 4-D sdpa mask for any other pattern; and for a model whose attention adds the mask
    to scores it computes itself (MPNet: :data:`OWN_SCORES`), the eager mask it gets with
    ``attn_implementation="eager"``, so that there the setting changes nothing.

    attention_mask: the model's 2-D mask, already bool [B, S_k] (True = real token).
    local_size (in kwargs): the window of a sliding-window mask, None for a full one.
    config (in kwargs): the model's config.
    """
    masking_utils = _masking_utils()
    if getattr(kwargs.get("config"), "model_type", None) in OWN_SCORES:
        build = masking_utils.eager_mask
    elif _plain(mask_function, kv_offset, kv_length, attention_mask, kwargs.get("local_size")):
        return attention_mask
    else:
        build = masking_utils.sdpa_mask
    return build(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        **kwargs,
    )


def _plain(
    mask_function: Callable | None,
    kv_offset: int,
    kv_length: int,
    attention_mask: torch.Tensor | None,
    local_size: int | None,
) -> bool:
    """Whether the mask is bidirectional, full or of window ``local_size``, over keys the
    [B, S_k] padding mask covers: then the kernel takes that mask itself."""
    if kv_offset != 0 or (attention_mask is not None and attention_mask.shape[-1] != kv_length):
        return False
    if local_size is None:  # an identity test, which torch.compile traces whatever it closes over
        return mask_function is _masking_utils().bidirectional_mask_function
    return _is_sliding_bidirectional(mask_function, local_size)


def _masking_utils() -> Any:
    """transformers.masking_utils, loaded by the time :func:`padding_mask` runs (it is
    registered there). Read from sys.modules: torch.compile in torch 2.11 cannot trace an
    import through transformers' lazy module ("Bad import result")."""
    return sys.modules["transformers.masking_utils"]


# torch.compile reads no closure cells, so under it the test runs once, while tracing: its
# answer depends only on which of Hugging Face's mask builders made the function, not on data.
@torch.compiler.assume_constant_result
def _is_sliding_bidirectional(mask_function: Callable | None, local_size: int) -> bool:
    """Whether ``mask_function`` is Hugging Face's
    ``sliding_window_bidirectional_mask_function(local_size)``. Hugging Face builds a fresh
    closure for each sliding-window mask, so it is recognised by its code and the values it
    closes over; a mask function combined with any other (a user's ``and_mask_function``, a
    causal overlay) is not recognised and gets the 4-D mask."""
    from transformers import masking_utils

    expected = masking_utils.sliding_window_bidirectional_mask_function(local_size)
    return _same_function(mask_function, expected)


def _same_function(got: Any, expected: Any) -> bool:
    """Whether two functions compute the same: one object, or closures of one code object over
    the same functions, tuples of them and ints (any other closed-over value counts as
    different)."""
    if got is expected:
        return True
    code = getattr(expected, "__code__", None)
    if code is None or getattr(got, "__code__", None) is not code:
        return False
    got_cells, expected_cells = got.__closure__ or (), expected.__closure__ or ()
    return len(got_cells) == len(expected_cells) and all(
        _same_value(g.cell_contents, e.cell_contents)
        for g, e in zip(got_cells, expected_cells, strict=True)
    )


def _same_value(got: Any, expected: Any) -> bool:
    if callable(expected):
        return _same_function(got, expected)
    if isinstance(expected, tuple):
        return (
            isinstance(got, tuple)
            and len(got) == len(expected)
            and all(_same_value(g, e) for g, e in zip(got, expected, strict=True))
        )
    return type(expected) is int and type(got) is int and got == expected


def register() -> None:
    """Register ``attn_implementation="fastbert"`` with transformers now (imports it)."""
    for name in ENTRIES:
        register_in(importlib.import_module(name), sys.modules[__name__])
