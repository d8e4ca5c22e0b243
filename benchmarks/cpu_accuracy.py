"""The CPU accuracy figures of docs/precisions.md and docs/cpu.md, each measured the way the
docs describe it, written with the environment it ran in.

    python -m benchmarks.cpu_accuracy --out benchmarks/results/cpu-accuracy-<date>
        [--threads N] [--sentences 400] [--fp8-sentences 200] [--paragraphs 300]
        [--overlap-paragraphs 500] [--attention-paragraphs 300]

All on the packaged all-MiniLM-L6-v2 on the CPU, against sentence-transformers in float32 (its
``encode``: mean-pooled, normalised embeddings); cosine per text, least and mean:

- int8 (docs/precisions.md, "Accuracy" of int8): ``--sentences`` sentences of Python's
  documentation (benchmarks/cpu_torch.py's corpus), embedded as tests/test_int8_model.py does
  (``BertModel.from_pretrained``, the sentence-transformers tokenizer, mean pooling, batches
  of 50): per-token int8 without smoothing (``SMOOTHED_LINEARS`` emptied while it quantises),
  as shipped (smoothing QKV and FFN1 with maxima from the seeded random-token forward), with
  the smoothing maxima from a float forward of the sentences themselves (one at a time, no
  padding), and int8 weights with float activations (per-output-channel int8 weights, not
  smoothed, dequantised into a float model; and the shipped smoothed int8 weights so);
- fp8 (docs/precisions.md, "Accuracy" of fp8): the first ``--fp8-sentences`` of them, int8 and
  fp8 e4m3 (the CPU emulation) as shipped, the same path;
- bfloat16 (docs/cpu.md, "bfloat16 on the CPU"): ``--paragraphs`` paragraphs of up to 120
  words (tests/test_embed.py's corpus, as tests/test_cpu_bfloat16.py takes them) through
  ``fastbert.load(dtype="bfloat16").embed``, and sentence-transformers itself in bfloat16; the
  top-10 neighbours of the first 100 texts among all, overlapping the float32 reference's,
  on those paragraphs and on ``--overlap-paragraphs``;
- GELU by table (docs/cpu.md, "GELU by table"): the bfloat16 embeddings of the same
  paragraphs with the table's kernel and with oneDNN's GELU post-op
  (``cpu_gelu.turned_off()``), as 1 - cosine; where the CPU lacks AVX512BW only the post-op;
- bfloat16 attention (docs/cpu.md, "Attention in bfloat16"): ``--attention-paragraphs``
  paragraphs of the corpus benchmark (benchmarks/embed_bench.py's corpus) through
  ``fastbert.embed`` in bfloat16 with the compiled attention off, runs of up to
  MATH_ATTENTION_MAX_LENGTH tokens on the float32 math path (as shipped) and on PyTorch's
  flash kernel (the thresholds emptied): the two against each other, and each against float32;
- the int8 GEMM's error (docs/precisions.md, "On the CPU: which int8 kernel"):
  benchmarks/int8_cpu.py's operands (x [4096, 384] with two outlier channels 20x the others,
  W [1536, 384], bias), relative error against float64 of fastbert's ``linear_int8`` and of
  fbgemm's dynamic linear, and of fastbert's on the same operands without the outliers;
  torchao's ``Int8DynamicActivationInt8WeightConfig`` where torchao is installed (otherwise
  recorded as not measured).

Writes cpu-accuracy.json (every figure, the environment: CPU model and flags, threads,
versions, commit, date; and the command) and cpu-accuracy.md (a table per topic). Accuracy
only: nothing is timed. 1.5 to 4 minutes with 2 threads on a shared 2-core AMD EPYC.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from benchmarks.precision_accuracy import footer  # noqa: E402

BATCH = 50  # tests/test_int8_model.py's batch
MAX_LENGTH = 256
QUERIES = 100  # tests/test_cpu_bfloat16.py's top-10 queries
TOP_K = 10


# --- the texts ----------------------------------------------------------------------------


def paragraphs(count: int, max_words: int = 120) -> list[str]:
    """The first ``count`` paragraphs of Python's documentation of up to ``max_words`` words,
    one line each: tests/test_embed.py's ``corpus(count, 0, max_words)``, which
    tests/test_cpu_bfloat16.py takes with 120 words."""
    from pydoc_data.topics import topics

    found = [" ".join(p.split()) for name in sorted(topics) for p in topics[name].split("\n\n")]
    found = [p for p in found if p and len(p.split()) <= max_words]
    if len(found) < count:
        raise ValueError(f"the documentation has {len(found)} such paragraphs, fewer than {count}")
    return found[:count]


# --- the metrics --------------------------------------------------------------------------


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with the same row of ``b``, in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def agreement(got: np.ndarray, reference: np.ndarray) -> dict:
    """Least and mean cosine of ``got`` with ``reference``, row by row."""
    c = cosines(got, reference)
    return {"cosine_least": float(c.min()), "cosine_mean": float(c.mean())}


def top10(embeddings: np.ndarray, queries: int) -> np.ndarray:
    """The 10 nearest other texts (cosine) of each of the first ``queries`` texts, as
    tests/test_cpu_bfloat16.py finds them."""
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    scores = unit[:queries] @ unit.T
    scores[np.arange(queries), np.arange(queries)] = -np.inf
    return np.argsort(-scores, axis=1)[:, :TOP_K]


def top10_overlap(got: np.ndarray, reference: np.ndarray, queries: int = QUERIES) -> float:
    """The mean fraction of each query's 10 nearest texts in ``got`` that are also among its
    10 nearest in ``reference``."""
    pairs = zip(top10(got, queries), top10(reference, queries))
    return float(np.mean([len(set(a) & set(b)) / TOP_K for a, b in pairs]))


# --- int8 and fp8 on sentences ------------------------------------------------------------


def embed_with(model, tokenizer, texts: list[str]):
    """Mean-pooled, normalised embeddings of ``texts`` by a fastbert BertModel, float32
    [len(texts), H] torch tensor, in batches of BATCH padded by the tokenizer (as
    tests/test_int8_model.py embeds them)."""
    import torch
    import torch.nn.functional as F

    from fastbert.model.pooling import mean_pool

    out = []
    with torch.inference_mode():
        for start in range(0, len(texts), BATCH):
            batch = tokenizer(
                texts[start : start + BATCH],
                padding=True,
                truncation=True,
                max_length=MAX_LENGTH,
                return_tensors="pt",
            )
            hidden = model(
                batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
            ).last_hidden_state
            out.append(F.normalize(mean_pool(hidden, batch["attention_mask"]), dim=-1))
    return torch.cat(out).float()


def variant_row(name: str, model, st, texts: list[str], reference: np.ndarray) -> dict:
    """A table row: ``model``'s embeddings of ``texts`` (with ``st``'s tokenizer) against the
    float32 ``reference``."""
    return {"variant": name, **agreement(embed_with(model, st.tokenizer, texts).numpy(), reference)}


class RunningMax(dict):
    """A layer's calibration record that keeps each linear's maxima over every call (the
    model's own record keeps the last call's)."""

    def __setitem__(self, name, value) -> None:
        import torch

        old = self.get(name)
        super().__setitem__(name, value if old is None else torch.maximum(old, value))


def text_maxima(model, tokenizer, texts: list[str]) -> list[dict]:
    """Each layer's linear inputs' maxima per channel over float forwards of ``texts``, one
    text a call (no padding token in them)."""
    import torch

    from fastbert.model.layers import calibrating

    maxima = [RunningMax() for _ in model.layers]
    with torch.inference_mode(), calibrating(model.layers, maxima):
        for text in texts:
            ids = tokenizer(text, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
            model(ids["input_ids"], None, ids["token_type_ids"])
    return [dict(m) for m in maxima]


@contextlib.contextmanager
def no_smoothing() -> Iterator[None]:
    """Inside the block a model quantised smooths no linear (per-token activations as they
    are)."""
    from fastbert.model import quantization

    before, quantization.SMOOTHED_LINEARS = quantization.SMOOTHED_LINEARS, ()
    try:
        yield
    finally:
        quantization.SMOOTHED_LINEARS = before


def dequantized_into(float_model, weights: Callable[[object, str], object]) -> None:
    """Writes into each layer's quantised linears of ``float_model`` the float weight
    ``weights(layer_index, name)``."""
    import torch

    from fastbert.model.quantization import QUANTIZED_LINEARS

    with torch.no_grad():
        for index, layer in enumerate(float_model.layers):
            for name in QUANTIZED_LINEARS:
                getattr(layer, name).copy_(weights(index, name))


def int8_variants(path: str, st, texts: list[str], reference: np.ndarray, say) -> list[dict]:
    """The rows of docs/precisions.md's int8 table (and a plain weight-only row)."""
    import fastbert
    from fastbert.kernels.reference import quantize_weight
    from fastbert.model.quantization import SMOOTHED_LINEARS as SMOOTHED

    def load(**options):
        return fastbert.BertModel.from_pretrained(path, device="cpu", **options).eval()

    rows = []

    def row(name: str, model) -> None:
        say(f"int8: {name}")
        rows.append(variant_row(name, model, st, texts, reference))

    with no_smoothing():
        unsmoothed = load(quantize="int8")
    if any(
        layer.quantized[name][2] is not None for layer in unsmoothed.layers for name in SMOOTHED
    ):
        raise RuntimeError("the model was smoothed with SMOOTHED_LINEARS emptied")
    row("int8, per-token activations, no smoothing", unsmoothed)
    shipped = load(quantize="int8")
    row("int8 as shipped (smoothing QKV and FFN1)", shipped)

    real = load()
    maxima = text_maxima(real, st.tokenizer, texts)
    real.activation_maxima = lambda: maxima  # the model's calibration reads the texts' maxima
    real.quantize = "int8"
    row("int8, smoothing factors from the evaluated texts themselves", real)

    plain = load()

    def plain_weight(index: int, name: str):
        q, scale = quantize_weight(getattr(plain.layers[index], name).detach().float(), "int8")
        return q.float() * scale[:, None]

    dequantized_into(plain, plain_weight)
    row("int8 weights only (per output channel, not smoothed), float activations", plain)

    def shipped_weight(index: int, name: str):
        q, scale, input_scale = shipped.layers[index].quantized[name]
        w = q.float() * scale[:, None]
        return w if input_scale is None else w * input_scale[None, :]

    weights_only = load()
    dequantized_into(weights_only, shipped_weight)
    row("int8 weights only (the shipped smoothed weights), float activations", weights_only)
    return rows


def fp8_rows(path: str, st, texts: list[str], reference: np.ndarray, say) -> list[dict]:
    """int8 and fp8 as shipped, the rows of docs/precisions.md's fp8 table."""
    import fastbert

    rows = []
    for quantize, name in (
        ("int8", "int8 as shipped"),
        ("fp8", "fp8 e4m3 (smoothing QKV and FFN1)"),
    ):
        say(f"fp8 table: {quantize}")
        model = fastbert.BertModel.from_pretrained(path, device="cpu", quantize=quantize).eval()
        rows.append(variant_row(name, model, st, texts, reference))
    return rows


# --- bfloat16, GELU by table, bfloat16 attention ------------------------------------------


def bfloat16_topics(path: str, st_model: Callable, args, say) -> tuple[dict, dict]:
    """The bfloat16 figures of docs/cpu.md on paragraphs: fastbert and sentence-transformers in
    bfloat16 (with the top-10 overlap on two sample sizes), and GELU by table against the
    post-op."""
    import torch

    import fastbert
    from fastbert.kernels import cpu_gelu

    texts = paragraphs(max(args.paragraphs, args.overlap_paragraphs))
    say(f"sentence-transformers float32 and bfloat16, {len(texts)} paragraphs")
    reference = st_model().encode(texts, convert_to_numpy=True, batch_size=64)
    same = st_model().to(torch.bfloat16).encode(texts, convert_to_tensor=True, batch_size=64)
    same = same.float().numpy()
    model = fastbert.load(path, device="cpu", dtype="bfloat16")
    say("fastbert bfloat16")
    got = model.embed(texts)
    n, m = args.paragraphs, args.overlap_paragraphs
    bf16 = {"paragraphs": n, "overlap_paragraphs": m, "queries": QUERIES, "rows": []}
    for name, emb in (("fastbert bfloat16", got), ("sentence-transformers bfloat16", same)):
        bf16["rows"].append(
            {
                "variant": name,
                **agreement(emb[:n], reference[:n]),
                "top10_overlap": top10_overlap(emb[:n], reference[:n]),
                "top10_overlap_more": top10_overlap(emb[:m], reference[:m]),
            }
        )

    table = cpu_gelu.available()
    gelu = {"paragraphs": n, "table_available": table, "table_status": cpu_gelu.status()}
    rows = []
    if table:
        rows.append(("fastbert bfloat16, GELU by table", got[:n]))
    say("fastbert bfloat16, GELU as oneDNN's post-op")
    with cpu_gelu.turned_off():
        rows.append(("fastbert bfloat16, oneDNN's GELU post-op", model.embed(texts[:n])))
    rows.append(("sentence-transformers bfloat16", same[:n]))
    gelu["rows"] = []
    for name, emb in rows:
        c = cosines(emb, reference[:n])
        gelu["rows"].append(
            {
                "variant": name,
                "one_minus_least": float(1 - c.min()),
                "one_minus_mean": float(1 - c.mean()),
            }
        )
    return bf16, gelu


@contextlib.contextmanager
def counting_math_attention() -> Iterator[list[int]]:
    """Inside the block, the number of math-path attention calls, in a one-element list."""
    from fastbert.kernels import cpu_engine_attention as engine

    calls = [0]
    original = engine.math_attention

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    engine.math_attention = counted
    try:
        yield calls
    finally:
        engine.math_attention = original


@contextlib.contextmanager
def flash_only() -> Iterator[None]:
    """Inside the block every bfloat16 run takes PyTorch's SDPA (the math path's thresholds
    emptied)."""
    from fastbert.kernels import cpu_engine_attention as engine

    before = dict(engine.MATH_ATTENTION_MAX_LENGTH)
    engine.MATH_ATTENTION_MAX_LENGTH.clear()
    try:
        yield
    finally:
        engine.MATH_ATTENTION_MAX_LENGTH.update(before)


def attention_topic(path: str, st_model: Callable, count: int, say) -> dict:
    """docs/cpu.md's bfloat16 math attention against the flash kernel, end to end."""
    import fastbert
    from benchmarks.embed_bench import corpus
    from fastbert.kernels import cpu_attention
    from fastbert.kernels.cpu_engine_attention import MATH_ATTENTION_MAX_LENGTH

    texts = corpus(count)
    say(f"bfloat16 attention: {count} paragraphs of the corpus benchmark")
    reference = st_model().encode(texts, convert_to_numpy=True, batch_size=64)
    out = {}
    with cpu_attention.turned_off():
        with counting_math_attention() as calls:
            math = fastbert.embed(texts, model=path, device="cpu", dtype="bfloat16")
        with flash_only(), counting_math_attention() as flash_calls:
            flash = fastbert.embed(texts, model=path, device="cpu", dtype="bfloat16")
    out = {
        "paragraphs": count,
        "math_max_length": {f"{d}, D={h}": n for (d, h), n in MATH_ATTENTION_MAX_LENGTH.items()},
        "math_calls": calls[0],
        "math_calls_flash_run": flash_calls[0],
        "math_vs_flash": agreement(math, flash),
        "math_vs_float32": agreement(math, reference),
        "flash_vs_float32": agreement(flash, reference),
    }
    return out


# --- the int8 GEMM ------------------------------------------------------------------------


def relative_error(out, exact) -> float:
    return float((out.double() - exact).norm() / exact.norm())


def torchao_error(x, weight, bias) -> dict:
    """torchao's eager int8 dynamic linear on x @ W^T + b: its relative error against float64,
    or why it was not measured."""
    try:
        import torchao  # noqa: F401
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    except ImportError as exc:
        return {"measured": False, "why": f"torchao is not installed here ({exc})"}
    import torch

    try:
        linear = torch.nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            linear.weight.copy_(weight)
            linear.bias.copy_(bias)
        quantize_(linear, Int8DynamicActivationInt8WeightConfig())
        with torch.no_grad():
            out = linear(x)
    except Exception as exc:  # report, do not fail the other topics
        return {"measured": False, "why": f"torchao failed: {type(exc).__name__}: {exc}"}
    exact = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
    return {"measured": True, "rel_error": relative_error(out, exact)}


def gemm_topic(say) -> dict:
    """benchmarks/int8_cpu.py's operands: each int8 linear's relative error against float64."""

    import torch
    import torch.nn.functional as F

    from benchmarks.int8_cpu import fbgemm_packed, operands
    from fastbert.kernels import reference, torch_ops

    say("int8 GEMM errors")
    x, weight, bias = operands()
    plain_x = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    rows = []
    for label, xs in (("two outlier channels", x), ("no outliers", plain_x)):
        exact = F.linear(xs.double(), weight.double(), bias.double())
        q, scale = reference.quantize_weight(weight)
        rows.append(
            {
                "variant": "fastbert int8: per-token, torch._int_mm",
                "activations": label,
                "rel_error": relative_error(torch_ops.linear_int8(xs, q, scale, bias), exact),
            }
        )
        packed = fbgemm_packed(weight, scale, bias)
        fbgemm = torch.ops.quantized.linear_dynamic(xs, packed, False)
        rows.append(
            {
                "variant": "fbgemm linear_dynamic, per-channel W, per-tensor x",
                "activations": label,
                "rel_error": relative_error(fbgemm, exact),
            }
        )
        ao = torchao_error(xs, weight, bias)
        rows.append(
            {
                "variant": "torchao Int8DynamicActivationInt8WeightConfig, eager",
                "activations": label,
                "rel_error": ao.get("rel_error"),
                **({} if ao["measured"] else {"not_measured": ao["why"]}),
            }
        )
    return {"shape": "x [4096, 384] @ W^T [1536, 384] + bias", "rows": rows}


# --- the report ---------------------------------------------------------------------------


def measure(args, say: Callable[[str], None]) -> dict:
    """Every topic's figures (see the module docstring)."""
    from sentence_transformers import SentenceTransformer

    from benchmarks.cpu_torch import corpus
    from fastbert.integrations.models import packaged_minilm_path

    path = str(packaged_minilm_path())

    def st_model():
        return SentenceTransformer(path, device="cpu")

    st = st_model()
    sentences = corpus(max(args.sentences, args.fp8_sentences))
    say(f"sentence-transformers float32, {len(sentences)} sentences")
    reference = st.encode(sentences, convert_to_tensor=True, batch_size=BATCH).float().numpy()
    n, k = args.sentences, args.fp8_sentences
    int8 = {
        "sentences": n,
        "rows": int8_variants(path, st, sentences[:n], reference[:n], say),
    }
    fp8 = {"sentences": k, "rows": fp8_rows(path, st, sentences[:k], reference[:k], say)}
    bf16, gelu = bfloat16_topics(path, st_model, args, say)
    attention = attention_topic(path, st_model, args.attention_paragraphs, say)
    return {
        "model": "all-MiniLM-L6-v2 (packaged)",
        "reference": "sentence-transformers float32 encode() on the CPU",
        "int8": int8,
        "fp8": fp8,
        "bfloat16": bf16,
        "gelu_table": gelu,
        "bfloat16_attention": attention,
        "int8_gemm": gemm_topic(say),
    }


def _cosine_table(rows: list[dict]) -> list[str]:
    lines = ["| | least cosine | mean cosine |", "|---|---:|---:|"]
    lines += [
        f"| {r['variant']} | {r['cosine_least']:.5f} | {r['cosine_mean']:.5f} |" for r in rows
    ]
    return lines


def markdown(result: dict, command: str) -> str:
    """The figures as a Markdown table per topic, with the environment and the command."""
    r, env = result["figures"], result["environment"]
    bf16, gelu, att, gemm = r["bfloat16"], r["gelu_table"], r["bfloat16_attention"], r["int8_gemm"]
    lines = [
        f"# CPU accuracy, {r['model']}",
        "",
        f"Reference: {r['reference']}. Cosine: of each text's embedding with the reference's "
        "(mean-pooled, normalised), least and mean over the texts.",
        "",
        f"## int8 on {r['int8']['sentences']} sentences of pydoc_data.topics",
        "",
        "benchmarks/cpu_torch.py's corpus; BertModel.from_pretrained, batches of 50 "
        "(tests/test_int8_model.py's path).",
        "",
        *_cosine_table(r["int8"]["rows"]),
        "",
        f"## fp8 on {r['fp8']['sentences']} sentences (the CPU emulation)",
        "",
        *_cosine_table(r["fp8"]["rows"]),
        "",
        f"## bfloat16 on {bf16['paragraphs']} paragraphs (tests/test_cpu_bfloat16.py's texts)",
        "",
        f"Top-10 overlap: the mean fraction of the {bf16['queries']} first texts' 10 nearest "
        "others that are also the reference's, among the "
        f"{bf16['paragraphs']} paragraphs and among {bf16['overlap_paragraphs']}.",
        "",
        f"| | least cosine | mean cosine | top-10 overlap ({bf16['paragraphs']}) "
        f"| top-10 overlap ({bf16['overlap_paragraphs']}) |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {x['variant']} | {x['cosine_least']:.5f} | {x['cosine_mean']:.5f} "
        f"| {100 * x['top10_overlap']:.1f}% | {100 * x['top10_overlap_more']:.1f}% |"
        for x in bf16["rows"]
    ]
    table = "available" if gelu["table_available"] else "not available here"
    lines += [
        "",
        f"## GELU by table (bfloat16), {gelu['paragraphs']} paragraphs",
        "",
        f"The table's kernel: {table} ({gelu['table_status']}).",
        "",
        "| | 1 - least cosine | 1 - mean cosine |",
        "|---|---:|---:|",
    ]
    lines += [
        f"| {x['variant']} | {x['one_minus_least']:.3e} | {x['one_minus_mean']:.3e} |"
        for x in gelu["rows"]
    ]
    lengths = ", ".join(f"{k}: {v}" for k, v in att["math_max_length"].items())
    lines += [
        "",
        f"## bfloat16 attention: math path and flash kernel, {att['paragraphs']} paragraphs",
        "",
        "The corpus benchmark's paragraphs through fastbert.embed in bfloat16, the compiled "
        f"attention off; the math path's longest runs: {lengths}. Math-path calls: "
        f"{att['math_calls']} as shipped, {att['math_calls_flash_run']} with the flash kernel "
        "only.",
        "",
        "| | least cosine | mean cosine |",
        "|---|---:|---:|",
    ]
    for key, name in (
        ("math_vs_flash", "math path against flash kernel"),
        ("math_vs_float32", "math path against the float32 reference"),
        ("flash_vs_float32", "flash kernel against the float32 reference"),
    ):
        lines.append(f"| {name} | {att[key]['cosine_least']:.6f} | {att[key]['cosine_mean']:.6f} |")
    lines += [
        "",
        f"## int8 GEMM error, {gemm['shape']} (benchmarks/int8_cpu.py's operands)",
        "",
        "| | activations | rel. error vs float64 |",
        "|---|---|---:|",
    ]
    for x in gemm["rows"]:
        error = (
            "not measured: " + x["not_measured"] if "not_measured" in x else f"{x['rel_error']:.2e}"
        )
        lines.append(f"| {x['variant']} | {x['activations']} | {error} |")
    return "\n".join([*lines, *footer(env, command)])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu_accuracy", description=__doc__)
    p.add_argument("--out", type=Path, required=True, help="folder for the result files")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: its)")
    p.add_argument("--sentences", type=int, default=400, help="int8's table")
    p.add_argument("--fp8-sentences", type=int, default=200, help="fp8's table")
    p.add_argument("--paragraphs", type=int, default=300, help="bfloat16 and GELU by table")
    p.add_argument("--overlap-paragraphs", type=int, default=500, help="the second top-10 overlap")
    p.add_argument("--attention-paragraphs", type=int, default=300, help="math against flash")
    return p


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    for name in ("threads", "sentences", "fp8_sentences", "attention_paragraphs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    for name in ("paragraphs", "overlap_paragraphs"):
        if getattr(args, name) <= QUERIES + TOP_K:
            p.error(
                f"--{name.replace('_', '-')} must be more than {QUERIES + TOP_K} (the top-10 "
                f"neighbours of {QUERIES} queries), got {getattr(args, name)}"
            )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)

    import torch

    from fastbert.bench import environment

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    env = environment.capture()  # before the run: the commit and load it started with
    figures = measure(args, lambda line: print(line, file=sys.stderr, flush=True))
    command = "python -m benchmarks.cpu_accuracy " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"figures": figures, "environment": env, "command": command}
    (args.out / "cpu-accuracy.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result, command)
    (args.out / "cpu-accuracy.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
