"""The contenders of the end-to-end comparison, each built from the same reference weights.

A :class:`Peer` builds a forward function ``forward(batch) -> outputs`` for a dtype, device
and fastbert backend. Building may fail (torch.compile without a C++ compiler, a fastbert
option that does not exist yet, no CUDA): the runner records the reason and goes on.

fastbert's padding-free and CUDA-graph runtimes are options of ``from_pretrained``; their
peers are offered only when this fastbert's ``from_pretrained`` takes the keyword.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch

from fastbert.bench.models import Reference
from fastbert.bench.shapes import Batch
from fastbert.integrations import models as hf_models

Forward = Callable[[Batch], Any]
Builder = Callable[[Reference, torch.dtype, torch.device, str], Forward]


@dataclasses.dataclass(frozen=True)
class Peer:
    """A contender: ``build(reference, dtype, device, backend) -> forward``.

    ``packs``: it computes the real tokens only (FLOPs are counted on those).
    ``needs_cuda``: it cannot run without a CUDA device. ``keyword``: the from_pretrained
    keyword it needs (None: always there).
    """

    name: str
    description: str
    build: Builder
    packs: bool = False
    needs_cuda: bool = False
    keyword: str | None = None


def fastbert_keywords() -> frozenset[str]:
    """The keyword arguments this fastbert's ``BertModel.from_pretrained`` accepts."""
    from fastbert.model.encoder import BertModel

    return frozenset(inspect.signature(BertModel.from_pretrained).parameters)


def hf_model(
    reference: Reference, attn_implementation: str, dtype: torch.dtype, device: torch.device
) -> Any:
    """A Hugging Face base model with the reference weights, on ``device`` in ``dtype``.

    Raises ValueError when its architecture has no ``attn_implementation`` (MPNet: no sdpa)."""
    if attn_implementation == "sdpa" and not has_sdpa(reference):
        raise ValueError(f"Hugging Face's {type(reference.hf_model).__name__} has no sdpa")
    return hf_models.model_like(reference.hf_model, attn_implementation, dtype, device)


def has_sdpa(reference: Reference) -> bool:
    """Whether Hugging Face runs the reference's architecture on scaled_dot_product_attention."""
    return bool(getattr(reference.hf_model, "_supports_sdpa", False))


def _hf_forward(model: Any, takes_token_types: bool) -> Forward:
    """Hugging Face's forward on a batch: the token types only where its family has them."""
    if takes_token_types:
        return lambda b: model(
            input_ids=b.input_ids, attention_mask=b.attention_mask, token_type_ids=b.token_type_ids
        )
    return lambda b: model(input_ids=b.input_ids, attention_mask=b.attention_mask)


def _build_hf(
    attn_implementation: str,
    reference: Reference,
    dtype: torch.dtype,
    device: torch.device,
    backend: str,
) -> Forward:
    model = hf_model(reference, attn_implementation, dtype, device)
    return _hf_forward(model, hf_models.takes_token_types(model))


def _build_hf_compiled(
    mode: str, reference: Reference, dtype: torch.dtype, device: torch.device, backend: str
) -> Forward:
    """torch.compile of the HF sdpa model (eager where the architecture has no sdpa), static
    shapes (one graph per input shape)."""
    model = hf_model(reference, "sdpa" if has_sdpa(reference) else "eager", dtype, device)
    takes_token_types = hf_models.takes_token_types(model)
    return _hf_forward(torch.compile(model, mode=mode, dynamic=False), takes_token_types)


def _hf_peer(name: str, description: str, attn_implementation: str) -> Peer:
    """Hugging Face's model with ``attn_implementation`` (eager, sdpa)."""
    return Peer(name, description, functools.partial(_build_hf, attn_implementation))


def _hf_compiled_peer(name: str, mode: str) -> Peer:
    """torch.compile of Hugging Face's sdpa model in compile mode ``mode``."""
    description = f"torch.compile of HF sdpa (eager without sdpa; mode {mode})"
    return Peer(name, description, functools.partial(_build_hf_compiled, mode))


def _build_fastbert(
    options: dict[str, Any],
    reference: Reference,
    dtype: torch.dtype,
    device: torch.device,
    backend: str,
) -> Forward:
    """fastbert with ``options`` given to from_pretrained where it takes them."""
    from fastbert.model.encoder import BertModel

    keywords = fastbert_keywords()
    with warnings.catch_warnings():
        # A family without a pooler (ModernBERT, ELECTRA, DistilBERT): its absence is expected.
        warnings.filterwarnings("ignore", message="the checkpoint has no pooler")
        model = BertModel.from_pretrained(
            reference.hf_model,
            dtype=dtype,
            device=device,
            backend=backend,
            **{k: v for k, v in options.items() if k in keywords},
        )
    if reference.config.type_vocab_size == 0:  # no token types: none passed, as users do
        return lambda b: model(b.input_ids, b.attention_mask)
    return lambda b: model(b.input_ids, b.attention_mask, b.token_type_ids)


def _fastbert_peer(
    name: str, description: str, padding_free: bool = False, cuda_graphs: bool = False
) -> Peer:
    """fastbert with its padding-free and CUDA-graph runtimes on or off: padding-free, it packs;
    on CUDA graphs, it needs CUDA; it needs the from_pretrained keyword of the runtime it turns
    on (cuda_graphs when both)."""
    options = {"padding_free": padding_free, "cuda_graphs": cuda_graphs}
    keyword = "cuda_graphs" if cuda_graphs else "padding_free" if padding_free else None
    return Peer(
        name,
        description,
        functools.partial(_build_fastbert, options),
        packs=padding_free,
        needs_cuda=cuda_graphs,
        keyword=keyword,
    )


PEERS = {
    peer.name: peer
    for peer in (
        _hf_peer("hf-eager", "Hugging Face model, eager attention", "eager"),
        _hf_peer("hf-sdpa", "Hugging Face model, scaled_dot_product_attention", "sdpa"),
        _hf_compiled_peer("hf-compile", "default"),
        _hf_compiled_peer("hf-compile-max", "max-autotune"),
        _fastbert_peer("fastbert", "fastbert, dense (padded batch as is)"),
        _fastbert_peer(
            "fastbert-padfree", "fastbert, padding-free (real tokens only)", padding_free=True
        ),
        _fastbert_peer(
            "fastbert-graphs", "fastbert, dense, replayed from CUDA graphs", cuda_graphs=True
        ),
        _fastbert_peer(
            "fastbert-padfree-graphs",
            "fastbert, padding-free, replayed from CUDA graphs of its size bucket",
            padding_free=True,
            cuda_graphs=True,
        ),
    )
}
# torch.compile on a CPU needs a C++ compiler and minutes; max-autotune takes minutes per shape
# on a GPU too: both run only when asked for.
DEFAULT_GPU_PEERS = (
    "hf-eager",
    "hf-sdpa",
    "hf-compile",
    "fastbert",
    "fastbert-padfree",
    "fastbert-graphs",
    "fastbert-padfree-graphs",
)
DEFAULT_CPU_PEERS = ("hf-eager", "hf-sdpa", "fastbert", "fastbert-padfree")


def select(names: str | None, device: torch.device) -> list[Peer]:
    """Peers by comma-separated ``names`` ("all" for every one but hf-compile-max, which
    takes minutes per shape: name it to run it; None for the defaults). ValueError for an
    unknown name, an empty list or an empty entry (``"fastbert,,hf-eager"``)."""
    if names is None:
        names = ",".join(DEFAULT_GPU_PEERS if device.type == "cuda" else DEFAULT_CPU_PEERS)
    if names.strip() == "all":
        return [peer for name, peer in PEERS.items() if name != "hf-compile-max"]
    chosen = [n.strip() for n in names.split(",")]
    if "" in chosen:
        empty = f"entry {chosen.index('') + 1} is empty" if len(chosen) > 1 else "it names none"
        raise ValueError(f"{empty}; peers: all, {', '.join(PEERS)}")
    unknown = [n for n in chosen if n not in PEERS]
    if unknown:
        raise ValueError(f"unknown peer {unknown[0]!r}; peers: {', '.join(PEERS)}")
    return [PEERS[n] for n in chosen]


def unavailable_reason(peer: Peer, device: torch.device) -> str | None:
    """Why ``peer`` cannot run here, or None when it can."""
    if peer.needs_cuda and device.type != "cuda":
        return "needs a CUDA GPU"
    if peer.keyword and peer.keyword not in fastbert_keywords():
        return f"this fastbert's from_pretrained has no {peer.keyword}= option yet"
    return None
