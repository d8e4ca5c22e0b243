"""A SPLADE model end to end on a CPU: ``fastbert.load(folder).embed`` (the fused sparse head:
the max of each text's logits reduced as the decoder computes them) against
sentence-transformers' ``SparseEncoder.encode`` (the [tokens, vocabulary] logits, then
log1p(relu) and the max), on the same texts, in turns.

    python -m benchmarks.sparse_bench --out benchmarks/results/sparse-cpu-<date>
        [--shape bert-base] [--docs 128] [--rounds 3] [--dtype float32]

The model: a SparseEncoder folder (an MLM transformer, then SpladePooling max) of the shape's
size with seeded random weights and all-MiniLM-L6-v2's tokenizer (BERT's 30,522-entry
vocabulary), made once in ``--cache``; no SPLADE checkpoint ships in a package, and speed does
not depend on the weights. The texts: the corpus benchmark's paragraphs of real English
(benchmarks/embed_bench.py), cut at 256 tokens. Each round times both contenders once, in
alternating order; the medians are reported, with tokens/s and their share of this CPU's
measured GEMM limit for the model's linear layers and the head's decoder
(benchmarks/gemm_limit.py). The outputs are compared: the same active dimensions in every
row, and the largest difference. Writes sparse-bench.json and sparse-bench.md. Speed is
measured here, never asserted in a test.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from benchmarks import reporting

MAX_SEQ_LENGTH = 256


def build_folder(cache: Path, shape: str, seed: int = 0) -> Path:
    """The random SparseEncoder folder of ``shape`` (fastbert.bench.shapes), made once."""
    folder = cache / f"sparse-{shape}-{seed}"
    if (folder / "modules.json").exists():
        return folder
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    from fastbert.bench.shapes import MODEL_SHAPES
    from fastbert.integrations import models

    tokenizer = models.load_tokenizer(str(models.packaged_minilm_path()))
    transformers = models.import_transformers()
    config = transformers.BertConfig(**{**MODEL_SHAPES[shape], "vocab_size": tokenizer.vocab_size})
    torch.manual_seed(seed)
    mlm = folder.with_name(folder.name + "-mlm")
    transformers.BertForMaskedLM(config).save_pretrained(mlm)
    tokenizer.save_pretrained(mlm)
    head = Transformer(str(mlm), transformer_task="fill-mask", max_seq_length=MAX_SEQ_LENGTH)
    SparseEncoder(modules=[head, SpladePooling("max")], device="cpu").save(str(folder))
    return folder


def compare(reference, got) -> dict:
    """sentence-transformers' sparse tensor against fastbert's SparseVectors."""
    import numpy as np

    want = reference.to_dense().numpy()
    have = got.to_dense()
    scale = float(np.abs(want).max())
    return {
        "same_active_dimensions": bool(np.array_equal(want > 0, have > 0)),
        "active_per_row": float((want > 0).sum(1).mean()),
        "max_abs_diff": float(np.abs(want - have).max()),
        "max_relative_diff": float(np.abs(want - have).max() / scale) if scale else 0.0,
    }


def run(shape: str, docs: int, rounds: int, dtype: str, cache: Path) -> dict:
    import torch
    from sentence_transformers import SparseEncoder

    import fastbert
    from benchmarks import embed_bench, gemm_limit
    from fastbert.bench import environment

    folder = build_folder(cache, shape)
    texts = embed_bench.corpus(docs)
    reference = SparseEncoder(str(folder), device="cpu", model_kwargs={"dtype": dtype})
    loaded = fastbert.load(folder, device="cpu", dtype=dtype)
    tokens = sum(len(ids) for ids in loaded.tokenize(texts).ids)
    contenders = {
        "st.encode": lambda: reference.encode(texts, batch_size=32),
        "fastbert": lambda: loaded.embed(texts),
    }
    outputs = {key: run() for key, run in contenders.items()}  # warm-up, and the outputs
    seconds = reporting.in_turns(contenders, rounds)
    config = loaded.encoder.model.config
    vocab = loaded.dimensions
    head_flops = 2 * (config.hidden_size * config.hidden_size + vocab * config.hidden_size)
    flops = gemm_limit.linear_flops_per_token(
        config.hidden_size, config.intermediate_size, config.num_hidden_layers
    )
    rate, kernel = gemm_limit.gemm_flops_per_s(
        dtype, 4096, config.hidden_size, config.intermediate_size
    )
    limit_tokens_per_s = rate / (flops + head_flops)
    rows = {}
    for key, times in seconds.items():
        median = statistics.median(times)
        rows[key] = {
            "seconds": times,
            "median_s": median,
            "tokens_per_s": tokens / median,
            "share_of_gemm_limit": tokens / median / limit_tokens_per_s,
        }
    return {
        "environment": environment.capture(),
        "shape": shape,
        "dtype": dtype,
        "docs": docs,
        "tokens": tokens,
        "rounds": rounds,
        "vocabulary": vocab,
        "gemm_limit": {
            "gflops": rate / 1e9,
            "kernel": kernel,
            "tokens_per_s": limit_tokens_per_s,
            "flops_per_token": flops + head_flops,
        },
        "contenders": rows,
        "speedup": rows["st.encode"]["median_s"] / rows["fastbert"]["median_s"],
        "agreement": compare(outputs["st.encode"], outputs["fastbert"]),
        "threads": torch.get_num_threads(),
    }


def markdown(report: dict) -> str:
    env = report["environment"]
    agreement = report["agreement"]
    lines = [
        f"# SPLADE end to end on a CPU: {report['shape']}, {report['dtype']}",
        "",
        f"CPU: {env.get('cpu', '?')} ({env.get('cpu_flags', '')}); {report['threads']} threads; "
        f"torch {env.get('torch', '?')}; {report['docs']} documents, {report['tokens']} tokens "
        f"(at most {MAX_SEQ_LENGTH} a document); {report['rounds']} rounds in turns; random "
        "weights of the shape, BERT's vocabulary.",
        "",
        "| contender | median s | tokens/s | share of the GEMM limit |",
        "|---|---|---|---|",
    ]
    for key, row in report["contenders"].items():
        lines.append(
            f"| {key} | {row['median_s']:.2f} | {row['tokens_per_s']:,.0f} | "
            f"{row['share_of_gemm_limit']:.0%} |"
        )
    limit = report["gemm_limit"]
    lines += [
        "",
        f"fastbert: **{report['speedup']:.2f}x** `SparseEncoder.encode`. GEMM limit: "
        f"{limit['gflops']:.0f} GFLOP/s ({limit['kernel']}), {limit['tokens_per_s']:,.0f} "
        "tokens/s for the linear layers and the head's decoder.",
        f"Outputs: same active dimensions in every row: {agreement['same_active_dimensions']} "
        f"({agreement['active_per_row']:.0f} a row); largest difference "
        f"{agreement['max_abs_diff']:.2e} ({agreement['max_relative_diff']:.2e} of the largest "
        "value).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    description = "a SPLADE model end to end: fastbert against SparseEncoder.encode, on a CPU"
    parser = reporting.parser("sparse_bench", description, 128, 3)
    parser.add_argument("--shape", default="bert-base", help="model shape")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path.home() / ".cache" / "fastbert",
        metavar="DIR",
        help="where the random model folder is made once",
    )
    args = parser.parse_args(argv)
    from fastbert.bench.shapes import MODEL_SHAPES, MODEL_TYPES

    shapes = [name for name in MODEL_SHAPES if name not in MODEL_TYPES]  # BERT's own
    if args.shape not in shapes:
        parser.error(f"--shape {args.shape!r}: one of {', '.join(shapes)}")
    if args.docs < 1 or args.rounds < 1:
        parser.error("--docs and --rounds must be positive")
    report = run(args.shape, args.docs, args.rounds, args.dtype, args.cache)
    reporting.write_report(args.out, "sparse-bench", report, markdown(report), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
