"""Corpus embedding throughput from token ids: tokens/s of fastbert's embedding path on a GPU,
with random weights of a real model's size and no tokenizer (none needs a download).

A corpus is a list of documents' token counts drawn from a distribution; its ids are random.
It is embedded as ``fastbert.embed`` does after tokenising (fastbert.embedding.model's
FolderPipeline on its packed path): longest documents first, in batches of at most
``--batch-tokens`` tokens (fastbert.embedding.batching, packed), each batch's ids end to end
(``pack``) through ``forward_packed`` (only the real tokens exist), mean-pooled per document,
normalised and copied to the host. One untimed pass (it autotunes, fills the caches and
captures the CUDA graphs the model's ``cuda_graphs`` setting wants), then ``--reps`` timed
passes; the median is reported, with where a pass's time went (medians over the passes):
``prepare`` (the ids packed end to end, copied to the GPU), ``forward`` (the model call until
it returns: launching, or replaying a graph, and any wait inside it) and ``finish`` (pooling,
normalising, copying to the host: it waits for the GPU to finish the batch).
``--cuda-graphs auto,false`` measures each setting in turn (``auto`` replays a graph for calls
of up to fastbert.execution.graphs.GRAPH_AUTO_MAX_TOKENS tokens).

Distributions: ``s512``, every document 512 tokens; ``mixed``, lengths log-normal around a
median of 96 tokens (sigma 0.9), cut to [8, 512] (real text is mostly short with a long tail).

    python -m benchmarks.corpus_tokens --out DIR [--model bert-base] [--dtypes float16,bfloat16]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

DISTRIBUTIONS = ("s512", "mixed")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
CORPUS_JSON = "corpus.json"
CORPUS_MD = "corpus.md"
PARTS = ("prepare", "forward", "finish")
GRAPH_SETTINGS = {"auto": "auto", "false": False, "true": True}
MIXED_MEDIAN, MIXED_SIGMA, SHORTEST, LONGEST = 96, 0.9, 8, 512


def lengths(distribution: str, tokens: int, seed: int = 0) -> list[int]:
    """Documents' token counts of ``distribution`` adding up to about ``tokens``."""
    if distribution == "s512":
        return [LONGEST] * max(1, tokens // LONGEST)
    if distribution != "mixed":
        raise ValueError(f"distribution {distribution!r}: one of {', '.join(DISTRIBUTIONS)}")
    generator = np.random.default_rng(seed)
    found: list[int] = []
    while sum(found) < tokens:
        draw = generator.lognormal(math.log(MIXED_MEDIAN), MIXED_SIGMA, 1024)
        found += np.clip(np.rint(draw), SHORTEST, LONGEST).astype(int).tolist()
    total = 0
    for count, length in enumerate(found):
        total += length
        if total >= tokens:
            return found[: count + 1]
    return found


def corpus(counts: list[int], vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Random token ids in [1, vocab_size) for documents of ``counts`` tokens."""
    generator = np.random.default_rng(seed)
    return [generator.integers(1, vocab_size, n).tolist() for n in counts]


class Embedder:
    """Token ids of a batch of documents -> normalised mean-pooled embeddings on the host, as
    fastbert.embed computes them after tokenising (the documents packed end to end)."""

    def __init__(self, model):
        self.model = model
        self.seconds = dict.fromkeys(PARTS, 0.0)  # by part, since embed_pass reset them

    def __call__(self, documents: list[list[int]]) -> np.ndarray:
        from fastbert.embedding.model import pack
        from fastbert.model.pooling import pool_packed

        start = time.perf_counter()
        device = self.model.device
        ids, offsets = pack(documents, device)
        prepared = time.perf_counter()
        with torch.inference_mode():
            hidden = self.model.forward_packed(ids, offsets)
            returned = time.perf_counter()
            cu_seqlens = offsets.to(device, non_blocking=True)
            pooled = pool_packed(hidden, torch.ones_like(ids), cu_seqlens, ("mean",))
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        vectors = pooled.cpu().numpy()
        finished = time.perf_counter()
        spans = (prepared - start, returned - prepared, finished - returned)
        for part, seconds in zip(PARTS, spans):
            self.seconds[part] += seconds
        return vectors


def embed_pass(
    embedder, documents: list[list[int]], batches: list[list[int]]
) -> tuple[float, dict[str, float]]:
    """Seconds to embed ``documents`` in ``batches`` (positions into it), and the seconds of
    each of the embedder's parts (PARTS) in that pass."""
    embedder.seconds = dict.fromkeys(PARTS, 0.0)
    start = time.perf_counter()
    for batch in batches:
        embedder([documents[i] for i in batch])
    return time.perf_counter() - start, dict(embedder.seconds)


def measure(
    embedder, documents: list[list[int]], batch_tokens: int, reps: int
) -> dict[str, float | int]:
    """Tokens/s of ``embedder`` over ``documents``: median of ``reps`` passes after one."""
    from fastbert.bench import timing
    from fastbert.embedding.batching import token_batches

    batches = token_batches([len(d) for d in documents], batch_tokens, packed=True)
    embed_pass(embedder, documents, batches)
    passes = [embed_pass(embedder, documents, batches) for _ in range(reps)]
    seconds = [total for total, _ in passes]
    tokens = sum(len(d) for d in documents)
    median = statistics.median(seconds)
    parts = {f"{part}_s": statistics.median(spent[part] for _, spent in passes) for part in PARTS}
    return {
        "docs": len(documents),
        "tokens": tokens,
        "batches": len(batches),
        "median_s": median,
        "p20_s": timing.percentile(seconds, 20),
        "p80_s": timing.percentile(seconds, 80),
        "tokens_per_s": tokens / median,
        **parts,
    }


def build_embedder(
    model: str, dtype: torch.dtype, device: torch.device, cuda_graphs: str | bool = "auto"
) -> tuple[Embedder, int]:
    """fastbert's padding-free encoder of the embedded shape ``model`` (random weights, the
    model's ``cuda_graphs`` setting given) as an :class:`Embedder`, and its vocabulary size."""
    import fastbert
    from fastbert.bench.models import random_reference

    reference = random_reference(model)
    encoder = fastbert.BertModel.from_pretrained(
        reference.hf_model,
        dtype=dtype,
        device=device,
        padding_free=True,
        cuda_graphs=cuda_graphs,
    )
    return Embedder(encoder), reference.config.vocab_size


def markdown(report: dict) -> str:
    settings = report["settings"]
    lines = [
        f"# Corpus tokens/s: {settings['model']}, random weights, padding-free, "
        f"{report['environment'].get('gpu') or settings['device']}",
        "",
        f"Batches of at most {settings['batch_tokens']} tokens, longest documents first; "
        f"median of {settings['reps']} passes after one untimed. A pass's seconds by part: "
        "prepare (the ids packed end to end, on the device), forward (the model call until it "
        "returns), finish (pool, normalise, copy to the host: waits for the GPU).",
        "",
        "| dtype | lengths | CUDA graphs | documents | tokens | median s | tokens/s | "
        "prepare s | forward s | finish s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        parts = " | ".join(
            f"{row[f'{part}_s']:.3f}" if f"{part}_s" in row else "-" for part in PARTS
        )
        lines.append(
            f"| {row['dtype']} | {row['distribution']} | {row.get('cuda_graphs', 'auto')} | "
            f"{row['docs']:,} | {row['tokens']:,} | {row['median_s']:.3f} | "
            f"{row['tokens_per_s']:,.0f} | {parts} |"
        )
    return "\n".join(lines) + "\n"


def write(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / CORPUS_JSON).write_text(json.dumps(report, indent=1) + "\n")
    (out / CORPUS_MD).write_text(markdown(report))


def _names(choices) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"among {', '.join(choices)}, got {text!r}")
        return names

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.corpus_tokens", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for corpus.json / .md")
    parser.add_argument("--model", default="bert-base", help="an embedded model shape")
    parser.add_argument("--dtypes", type=_names(DTYPES), default=["float16", "bfloat16"])
    parser.add_argument("--lengths", type=_names(DISTRIBUTIONS), default=list(DISTRIBUTIONS))
    parser.add_argument(
        "--cuda-graphs",
        type=_names(GRAPH_SETTINGS),
        default=["auto"],
        help="the model's cuda_graphs settings to measure in turn (auto, false, true)",
    )
    parser.add_argument("--tokens", type=int, default=1 << 20, help="tokens per corpus (~1M)")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens a batch")
    parser.add_argument("--reps", type=int, default=3, help="timed passes")
    parser.add_argument("--device", default="cuda")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if min(args.tokens, args.batch_tokens, args.reps) < 1:
        parser.error("--tokens, --batch-tokens and --reps must be >= 1")
    from fastbert.bench import environment
    from fastbert.bench.shapes import MODEL_SHAPES

    if args.model not in MODEL_SHAPES:
        parser.error(f"--model: one of {', '.join(MODEL_SHAPES)}")
    device = torch.device(args.device)
    report = {
        "environment": environment.capture(),
        "settings": {
            "model": args.model,
            "device": device.type,
            "batch_tokens": args.batch_tokens,
            "reps": args.reps,
            "tokens": args.tokens,
            "padding_free": True,
            "weights": "random (seed 0)",
        },
        "rows": [],
    }
    try:
        for name in args.dtypes:
            embedders = {
                graphs: build_embedder(args.model, DTYPES[name], device, GRAPH_SETTINGS[graphs])
                for graphs in args.cuda_graphs
            }
            for distribution in args.lengths:
                for graphs, (embedder, vocab) in embedders.items():
                    documents = corpus(lengths(distribution, args.tokens), vocab)
                    row = measure(embedder, documents, args.batch_tokens, args.reps)
                    report["rows"].append(
                        {"dtype": name, "distribution": distribution, "cuda_graphs": graphs, **row}
                    )
                    write(report, args.out)
                    print(
                        f"{name} {distribution} cuda_graphs={graphs}: "
                        f"{row['tokens_per_s']:,.0f} tokens/s",
                        flush=True,
                    )
    except KeyboardInterrupt:
        write(report, args.out)
        print("interrupted: wrote what was measured", file=sys.stderr)
        return 130
    write(report, args.out)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
