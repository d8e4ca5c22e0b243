"""fastbert demo: encode sentences with the packaged all-MiniLM-L6-v2 through
sentence-transformers and through fastbert, and compare the embeddings."""

from __future__ import annotations

import argparse
import time

import torch

from fastbert.integrations import models as hf_models

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
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))


def _load_sentence_transformer(device: str):
    try:
        return hf_models.packaged_minilm(device)
    except ValueError as exc:
        raise SystemExit(f"the demo needs the packaged model: {exc}") from exc


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, (time.perf_counter() - start) * 1e3


def run(args: argparse.Namespace) -> int:
    import torch.nn.functional as F

    import fastbert
    from fastbert.pooling import mean_pool

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    sentences = list(args.sentences) or list(SENTENCES)
    st = _load_sentence_transformer(device)
    model = fastbert.BertModel.from_pretrained(st, device=device, backend=args.backend)
    batch = st.tokenizer(sentences, padding=True, return_tensors="pt").to(device)

    def encode_fastbert():
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        return F.normalize(mean_pool(out.last_hidden_state, batch["attention_mask"]), dim=-1)

    expected, st_ms = _timed(lambda: st.encode(sentences, convert_to_tensor=True).float())
    got, fb_ms = _timed(encode_fastbert)
    cosine = F.cosine_similarity(got, expected, dim=-1)
    print(f"model: all-MiniLM-L6-v2 ({device}, {model.dtype}, backend {model.ops().name})")
    print(f"{'cosine':>9}  sentence")
    for c, s in zip(cosine.tolist(), sentences):
        print(f"{c:9.6f}  {s[:70]}")
    print(f"max |difference| of embeddings: {(got - expected).abs().max().item():.2e}")
    print(f"one call, first run included: sentence-transformers {st_ms:.1f} ms, "
          f"fastbert {fb_ms:.1f} ms (for timings use the benchmarks)")
    similarity = got @ got.T
    print("fastbert similarity matrix:")
    for row in similarity.tolist():
        print("  " + " ".join(f"{v:6.3f}" for v in row))
    return 0
