"""Corpus-embedding throughput: docs/s and tokens/s of the fastbert embed pipeline,
``fastbert.optimize(st).encode`` and sentence-transformers' ``st.encode``, on the packaged
all-MiniLM-L6-v2 (or, ``--model mpnet``, all-mpnet-base-v2: BERT-base size with MPNet's
relative position bias) and a corpus of real English shipped with Python (the paragraphs of
``pydoc_data.topics``, the help texts of the language reference: 2 to ~800 words each).

    python benchmarks/embed_bench.py --out benchmarks/results/cpu-embed-<date> [--docs 1000]
        [--model minilm|mpnet]

Contenders (each from a list of texts already in memory, or a .jsonl file for the pipeline,
to embeddings; the model loaded beforehand and not timed):

- ``fastbert embed``: the command's pipeline (read the .jsonl, tokenise ahead, sort by length
  in windows, token-budget batches, write Parquet shards), timed from the file to the shards.
- ``fastbert.embed(texts)``: the same pipeline from a list, into an array.
- ``fastbert.optimize(st).encode``: sentence-transformers' encode with fastbert swapped in.
- ``st.encode``: sentence-transformers as shipped (batch_size 32, its default).

Each runs ``--reps`` times after a warm-up on a slice of the corpus; the median is reported with
the min and max. Every contender's embeddings are compared with ``st.encode``'s (the least
cosine is reported). Writes embed-bench.json (with the environment) and embed-bench.md
(embed-bench-mpnet.* for all-mpnet-base-v2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def corpus(docs: int) -> list[str]:
    """``docs`` paragraphs of pydoc_data.topics, spread evenly over the whole text (so the
    length spread is the text's), one line each."""
    from pydoc_data.topics import topics

    paragraphs = [
        " ".join(p.split()) for name in sorted(topics) for p in topics[name].split("\n\n")
    ]
    paragraphs = [p for p in paragraphs if p]
    if docs > len(paragraphs):
        raise SystemExit(f"--docs: the corpus has {len(paragraphs)} paragraphs")
    step = len(paragraphs) / docs
    return [paragraphs[int(i * step)] for i in range(docs)]


# --model -> (the model's name, the function giving its packaged folder's path).
MODELS = {
    "minilm": ("all-MiniLM-L6-v2", "packaged_minilm_path"),
    "mpnet": ("all-mpnet-base-v2", "packaged_mpnet_path"),
}


def model_folder(model: str) -> Path:
    """The packaged folder of ``model`` (a key of MODELS)."""
    from fastbert.integrations import models

    return Path(getattr(models, MODELS[model][1])())


def contenders(
    texts: list[str], device: str, batch_tokens: int | None, workdir: Path, model: str = "minilm"
) -> dict[str, Callable[[list[str]], np.ndarray]]:
    """name -> function(texts) -> embeddings [n, dim] (float32 numpy)."""
    from sentence_transformers import SentenceTransformer

    import fastbert
    from fastbert.embed import readers, run
    from fastbert.embed.options import EmbedOptions
    from fastbert.embed.shards import ShardWriter
    from fastbert.embed.text_model import load_options

    folder = str(model_folder(model))
    options = EmbedOptions(model=folder, device=device, batch_tokens=batch_tokens, progress=False)
    loaded = load_options(options)
    st = SentenceTransformer(folder, device=device)
    swapped = fastbert.optimize(SentenceTransformer(folder, device=device))

    def embed_command(batch: list[str]) -> np.ndarray:
        source = workdir / f"corpus-{len(batch)}.jsonl"
        if not source.exists():
            source.write_text("".join(json.dumps({"text": t}) + "\n" for t in batch))
        output = Path(tempfile.mkdtemp(dir=workdir))
        writer = ShardWriter(
            output, loaded.options.rows_per_shard, loaded.encoder.dimensions, np.float32
        )
        run.run_rows(readers.read_rows([source], "text", None), loaded, writer, 0)
        return read_shards(output)

    def embed_list(batch: list[str]) -> np.ndarray:
        sink = run.ArraySink(len(batch), loaded.encoder.dimensions, np.float32)
        rows = (readers.Row(i, i, t, readers.LIST_SOURCE, i) for i, t in enumerate(batch))
        run.run_rows(rows, loaded, sink, 0)
        return sink.array

    return {
        "fastbert embed": embed_command,
        "fastbert.embed(texts)": embed_list,
        "fastbert.optimize(st).encode": lambda b: swapped.encode(b, convert_to_numpy=True),
        "st.encode": lambda b: st.encode(b, convert_to_numpy=True),
    }


def read_shards(folder: Path) -> np.ndarray:
    import pyarrow.parquet as pq

    tables = [pq.read_table(p) for p in sorted(folder.glob("part-*.parquet"))]
    return np.concatenate(
        [np.stack(t.column("embedding").to_numpy(zero_copy_only=False)) for t in tables]
    )


def count_tokens(texts: list[str], max_length: int, model: str = "minilm") -> int:
    """Tokens the model sees (special tokens included, truncated to ``max_length``)."""
    from fastbert.embed.model import load_tokenizer

    tokenizer = load_tokenizer(model_folder(model))
    ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    return sum(len(i) for i in ids)


def measure(
    fn: Callable[[list[str]], np.ndarray], texts: list[str], reps: int
) -> tuple[list[float], np.ndarray]:
    fn(texts[: max(1, len(texts) // 10)])  # warm-up
    seconds, result = [], None
    for _ in range(reps):
        start = time.perf_counter()
        result = fn(texts)
        seconds.append(time.perf_counter() - start)
    return seconds, result


def cosine_min(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    return float(cos.min())


def markdown(report: dict) -> str:
    env, rows = report["environment"], report["results"]
    lines = [
        f"# Corpus embedding, {report['device']}: {report['docs']} docs, {report['tokens']} tokens",
        "",
        f"{report.get('model', 'all-MiniLM-L6-v2')} (packaged), fp32, max_length "
        f"{report['max_length']}; corpus: "
        f"paragraphs of pydoc_data.topics (words per doc: median {report['words_median']}, "
        f"max {report['words_max']}); median of {report['reps']} runs after a warm-up; model "
        "loading not timed.",
        f"CPU: {env['cpu']} ({env['cpu_threads']} torch threads); load average at start "
        f"{report['load_average']}; torch {env['torch']}, transformers {env['transformers']}, "
        f"sentence-transformers {env['sentence-transformers']}; commit {env['commit']}; "
        f"{env['date']}.",
        "",
        "| contender | median s | min s | max s | docs/s | tokens/s | vs st.encode | "
        "min cosine vs st.encode |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    baseline = next(r["median_s"] for r in rows if r["name"] == "st.encode")
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['median_s']:.2f} | {min(r['seconds']):.2f} | "
            f"{max(r['seconds']):.2f} | {r['docs_per_s']:.1f} | {r['tokens_per_s']:,.0f} | "
            f"{baseline / r['median_s']:.2f}x | {r['cosine_min']:.6f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the results")
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-tokens", type=int, default=None)
    parser.add_argument("--model", choices=sorted(MODELS), default="minilm")
    args = parser.parse_args(argv)

    import torch

    from fastbert.bench import environment

    texts = corpus(args.docs)
    words = [len(t.split()) for t in texts]
    try:
        folder = model_folder(args.model)
    except ValueError as error:
        raise SystemExit(f"--model {args.model}: {error}") from error
    # The folder's max_seq_length (256 for MiniLM, 384 for MPNet), which every contender uses.
    max_length = json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokens = count_tokens(texts, max_length, args.model)
    load_average = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    results = []
    with tempfile.TemporaryDirectory() as workdir, torch.inference_mode():
        runs = contenders(texts, args.device, args.batch_tokens, Path(workdir), args.model)
        reference = None
        for name in ("st.encode", *[n for n in runs if n != "st.encode"]):
            seconds, embedded = measure(runs[name], texts, args.reps)
            reference = embedded if reference is None else reference
            median = statistics.median(seconds)
            results.append(
                {
                    "name": name,
                    "seconds": seconds,
                    "median_s": median,
                    "docs_per_s": len(texts) / median,
                    "tokens_per_s": tokens / median,
                    "cosine_min": cosine_min(embedded, reference),
                }
            )
            print(f"{name}: {median:.2f} s, {len(texts) / median:.1f} docs/s", file=sys.stderr)
    report = {
        "model": MODELS[args.model][0],
        "device": args.device,
        "docs": len(texts),
        "tokens": tokens,
        "reps": args.reps,
        "max_length": max_length,
        "words_median": statistics.median(words),
        "words_max": max(words),
        "load_average": load_average,
        "batch_tokens": args.batch_tokens,
        "environment": environment.capture(),
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "embed-bench" if args.model == "minilm" else f"embed-bench-{args.model}"
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
