"""fastbert demo: encode sentences with the packaged all-MiniLM-L6-v2 through
sentence-transformers and through fastbert, and compare the embeddings.

Both sides are timed alike: one call each from the sentences (tokenisation included) to the
normalised embeddings."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastbert.commands.options import (
    CommandError,
    UsageError,
    add_backend_argument,
    add_device_argument,
    resolve_device,
)

if TYPE_CHECKING:
    import torch

NAME = "demo"
HELP = "encode sentences with the packaged MiniLM via sentence-transformers and fastbert"
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A fast auburn fox leapt above a sleepy hound.",
    "Stock markets fell sharply on Monday.",
    "Flash attention never materialises the attention matrix.",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sentences", nargs="*", help="sentences to encode (default: a few)")
    add_device_argument(parser)
    add_backend_argument(parser)


def _backend_here(backend: str, device: torch.device) -> str:
    """What fastbert runs on (``backend_label``); UsageError when it cannot."""
    from fastbert.execution.backends import backend_label

    try:
        return backend_label(backend, device)
    except ValueError as exc:
        raise UsageError(f"--backend {backend}: {exc}") from exc


def _load_sentence_transformer(device: torch.device) -> Any:
    from fastbert.integrations import models as hf_models

    try:
        return hf_models.packaged_minilm(str(device))
    except ValueError as exc:
        raise CommandError(f"the demo needs the packaged model: {exc}") from exc


def _timed(fn: Callable[[], torch.Tensor], device: torch.device) -> tuple[torch.Tensor, float]:
    """(fn(), its wall-clock time in ms, the device synchronised before the clock stops)."""
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
    return result, (time.perf_counter() - start) * 1e3


def encode_fastbert(
    model: Any, tokenizer: Any, sentences: list[str], device: torch.device
) -> torch.Tensor:
    """Sentences -> normalised mean-pooled embeddings [n, hidden] (float32), tokenisation
    included, as SentenceTransformer.encode does for all-MiniLM-L6-v2."""
    import torch.nn.functional as F

    from fastbert.model.pooling import mean_pool

    batch = tokenizer(sentences, padding=True, return_tensors="pt").to(device)
    out = model(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    pooled = mean_pool(out.last_hidden_state, batch["attention_mask"])
    return F.normalize(pooled.float(), dim=-1)


def run(args: argparse.Namespace) -> int:
    import torch.nn.functional as F

    import fastbert

    device = resolve_device(args.device)
    backend = _backend_here(args.backend, device)
    sentences = list(args.sentences) or list(SENTENCES)
    st = _load_sentence_transformer(device)
    model = fastbert.BertModel.from_pretrained(st, device=device, backend=args.backend)

    expected, st_ms = _timed(lambda: st.encode(sentences, convert_to_tensor=True).float(), device)
    got, fb_ms = _timed(lambda: encode_fastbert(model, st.tokenizer, sentences, device), device)
    cosine = F.cosine_similarity(got, expected, dim=-1)
    print(f"model: all-MiniLM-L6-v2 ({device}, {model.dtype}, backend {backend})")
    print(f"{'cosine':>9}  sentence")
    for c, s in zip(cosine.tolist(), sentences):
        print(f"{c:9.6f}  {s[:70]}")
    print(f"max |difference| of embeddings: {(got - expected).abs().max().item():.2e}")
    print(
        f"one call each, first run, tokenisation included: sentence-transformers "
        f"{st_ms:.1f} ms, fastbert {fb_ms:.1f} ms (for timings use fastbert bench)"
    )
    similarity = got @ got.T
    print("fastbert similarity matrix:")
    for row in similarity.tolist():
        print("  " + " ".join(f"{v:6.3f}" for v in row))
    return 0
