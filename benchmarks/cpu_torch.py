"""fastbert's torch backend against Hugging Face on this CPU, side by side in one run.

    python -m benchmarks.cpu_torch --out benchmarks/results/cpu-YYYY-MM-DD

Measures, on bert-mini (random weights) and the packaged all-MiniLM-L6-v2 by default
(``--models`` takes any model of fastbert bench: e.g. ``bert-base,mpnet,modernbert-base``, the
packaged all-mpnet-base-v2 and ModernBERT-base's shape with random weights):

- end to end forwards of Hugging Face eager, Hugging Face sdpa, fastbert dense
  (padding_free=False), fastbert padding-free (True) and fastbert with its defaults ("auto"),
  on dense batches (1x64, 8x64, 32x128) and padded ones: lengths uniform in [16, 128]
  ("32x128p") and lengths drawn from the token lengths of the real-text corpus below, padded to
  the longest as a tokenizer pads ("32 sentences", "128 sentences");
- ``fastbert.optimize(st).encode(texts)`` against ``st.encode(texts)`` with the packaged
  all-MiniLM-L6-v2 on real English text of mixed lengths: the sentences of Python's own
  documentation (``pydoc_data.topics``, shipped with Python), checking every embedding against
  sentence-transformers' to cosine >= 0.99999.

On a CPU shared with other work the contenders are timed round-robin (one call of each in
turn, repeatedly) so that a change of load hits them alike; medians with p20 / p80 are
reported. ``--batches`` and ``--peers`` pick a subset (a base-sized model takes ~8x
MiniLM's time per batch). Writes results.json (with fastbert.bench.environment) and
results.md into --out.
Exits 1 when an output differs from Hugging Face's beyond the checks.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections.abc import Callable
from pathlib import Path

import torch

import fastbert
from fastbert.bench import environment, timing
from fastbert.bench.models import load_reference
from fastbert.bench.shapes import Batch, Shape, make_batch, padded_batch
from fastbert.integrations import models as hf_models

MODELS = ("bert-mini", "minilm")
DENSE_SHAPES = ("1x64", "8x64", "32x128")
PADDED_LIMIT = 128  # the longest sequence of a padded batch (sentence batches are cut there)
SENTENCE_BATCHES = (32, 128)
PEERS = ("hf-eager", "hf-sdpa", "fastbert-dense", "fastbert-padfree", "fastbert-auto")
BATCH_KEYS = (
    *DENSE_SHAPES,
    f"{SENTENCE_BATCHES[0]}x{PADDED_LIMIT}p",
    *(f"{n}sentences" for n in SENTENCE_BATCHES),
)
FASTBERT_SETTINGS = {"fastbert-dense": False, "fastbert-padfree": True, "fastbert-auto": "auto"}
MIN_COSINE = 0.99999
MAX_ABS_DIFF = 1e-4  # fp32 outputs against Hugging Face sdpa, as the parity tests hold them


def corpus(count: int, seed: int = 0) -> list[str]:
    """``count`` English sentences of Python's documentation, shuffled with ``seed``.

    The pydoc topics (the text of ``help()``) split into paragraphs, then sentences; runs of
    whitespace collapsed; sentences of three words or more."""
    from pydoc_data.topics import topics

    sentences = []
    for key in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[key]):
            for sentence in re.split(r"(?<=[.!?])\s+", " ".join(paragraph.split())):
                if len(sentence.split()) >= 3:
                    sentences.append(sentence)
    random.Random(seed).shuffle(sentences)
    if len(sentences) < count:
        raise ValueError(f"the corpus holds {len(sentences)} sentences, fewer than {count}")
    return sentences[:count]


def batches(token_lengths: list[int], vocab_size: int, seed: int) -> dict[str, Batch]:
    """label -> the batches a model can run (see the module docstring; ``--batches`` picks)."""
    out = {}
    for text in DENSE_SHAPES:
        batch, seq = map(int, text.split("x"))
        out[text] = make_batch(Shape(batch, seq), vocab_size, "cpu", seed)
    out["32x128p"] = make_batch(Shape(32, PADDED_LIMIT, True), vocab_size, "cpu", seed)
    capped = [min(n, PADDED_LIMIT) for n in token_lengths]
    for size in SENTENCE_BATCHES:
        lengths = random.Random(seed + size).sample(capped, size)
        out[f"{size} sentences"] = padded_batch(lengths, max(lengths), vocab_size, "cpu", seed)
    return out


def build(peer: str, reference) -> Callable[[Batch], torch.Tensor]:
    """``forward(batch) -> last hidden state`` of one contender, fp32 on the CPU."""
    if peer.startswith("hf-"):
        model = hf_models.model_like(
            reference.hf_model, peer.removeprefix("hf-"), torch.float32, torch.device("cpu")
        )
        return lambda b: model(**model_inputs(b, reference)).last_hidden_state
    model = fastbert.BertModel.from_pretrained(
        reference.hf_model, backend="torch", padding_free=FASTBERT_SETTINGS[peer]
    )
    return lambda b: model(**model_inputs(b, reference)).last_hidden_state


def model_inputs(batch: Batch, reference) -> dict[str, torch.Tensor]:
    """The batch's ids and mask, and its token types for a family that has them (MPNet and
    ModernBERT take none)."""
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    if reference.config.type_vocab_size:
        inputs["token_type_ids"] = batch.token_type_ids
    return inputs


def round_robin(calls: dict[str, Callable[[], object]], warmup: int, reps: int) -> dict:
    """name -> timing summary dict: each call timed once per round, ``reps`` rounds, the
    order rotated every round."""
    names = list(calls)
    for _ in range(warmup):
        for name in names:
            calls[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            start = time.perf_counter()
            calls[name]()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: timing.summarize(s).to_dict() for name, s in samples.items()}


def max_diff(out: torch.Tensor, expected: torch.Tensor, batch: Batch) -> float:
    """The largest |out - expected| over the batch's real tokens."""
    real = batch.attention_mask.bool()
    return (out[real] - expected[real]).abs().max().item()


def measure_model(
    name: str,
    texts: list[str],
    options: argparse.Namespace,
) -> list[dict]:
    """One record per batch of model ``name`` (``options.batches``): each contender's
    (``options.peers``) timing and fastbert's largest difference from Hugging Face sdpa (eager
    where transformers has no sdpa for the model, MPNet), which always runs."""
    reference = load_reference(name, options.seed)
    tokenizer = hf_models.load_tokenizer(str(hf_models.packaged_minilm_path()))
    token_lengths = [len(ids) for ids in tokenizer(texts, truncation=True)["input_ids"]]
    forwards = {}
    for peer in options.peers:
        try:
            forwards[peer] = build(peer, reference)
        except ValueError as error:  # MPNet: transformers has no sdpa attention for it
            if peer != "hf-sdpa":
                raise
            print(f"{reference.name}: no hf-sdpa ({str(error).split('.')[0]})", flush=True)
    hf_reference = "hf-sdpa" if "hf-sdpa" in forwards else "hf-eager"
    forwards.setdefault(hf_reference, build(hf_reference, reference))
    every = batches(token_lengths, reference.config.vocab_size, options.seed)
    records = []
    for label, batch in every.items():
        if batch_key(label) not in options.batches:
            continue
        with torch.inference_mode():
            expected = forwards[hf_reference](batch)
            diffs = {
                peer: max_diff(forward(batch), expected, batch)
                for peer, forward in forwards.items()
                if peer.startswith("fastbert")
            }
            timings = round_robin(
                {peer: (lambda f=forward, b=batch: f(b)) for peer, forward in forwards.items()},
                options.warmup,
                options.reps,
            )
        shape = tuple(batch.input_ids.shape)
        record = {
            "model": reference.name,
            "batch": label,
            "shape": list(shape),
            "real_tokens": batch.real_tokens,
            "padding": round(1 - batch.real_tokens / (shape[0] * shape[1]), 3),
            "timings": timings,
            "hf_reference": hf_reference,
            "max_abs_diff_vs_hf": diffs,
        }
        print(format_record(record), flush=True)
        records.append(record)
    return records


def measure_encode(texts: list[str], batch_size: int, warmup: int, reps: int) -> dict:
    """optimize(st).encode against st.encode on ``texts``, and their embeddings' agreement."""
    with hf_models.quiet():
        st = hf_models.packaged_minilm("cpu")
        fast = fastbert.optimize(hf_models.packaged_minilm("cpu"))
    encoders = {
        "st.encode": lambda: st.encode(texts, batch_size=batch_size, convert_to_tensor=True),
        "fastbert.optimize(st).encode": lambda: fast.encode(
            texts, batch_size=batch_size, convert_to_tensor=True
        ),
    }
    expected, got = (encode() for encode in encoders.values())
    cosine = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
    timings = round_robin(encoders, warmup, reps)
    record = {
        "texts": len(texts),
        "batch_size": batch_size,
        "words_mean": sum(len(t.split()) for t in texts) / len(texts),
        "timings": timings,
        "min_cosine": cosine.min().item(),
        "speedup": timings["st.encode"]["median_ms"]
        / timings["fastbert.optimize(st).encode"]["median_ms"],
    }
    print(
        f"encode {len(texts)} texts: st {timings['st.encode']['median_ms']:.0f} ms, fastbert "
        f"{timings['fastbert.optimize(st).encode']['median_ms']:.0f} ms "
        f"(x{record['speedup']:.2f}), min cosine {record['min_cosine']:.7f}",
        flush=True,
    )
    return record


def choices(text: str, allowed: tuple[str, ...], option: str) -> tuple[str, ...]:
    """The comma-separated names of ``text``, each one of ``allowed``."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in names if name not in allowed]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{option}: unknown {', '.join(unknown) or repr(text)}; choose from "
            + ", ".join(allowed)
        )
    return names


def batch_key(label: str) -> str:
    """A batch's name on the command line: its label without spaces ("32sentences")."""
    return label.replace(" ", "")


def speedup(record: dict, peer: str, over: str) -> float | None:
    """``over``'s median over ``peer``'s, None when one of them was not run."""
    t = record["timings"]
    if peer not in t or over not in t:
        return None
    return t[over]["median_ms"] / t[peer]["median_ms"]


def ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_record(record: dict) -> str:
    t = record["timings"]
    times = ", ".join(f"{peer} {t[peer]['median_ms']:.1f}" for peer in t)
    return (
        f"{record['model']} {record['batch']} {record['shape']} pad {record['padding']:.0%}:"
        f" {times} ms; auto {ratio_cell(speedup(record, 'fastbert-auto', 'hf-sdpa'))} over sdpa"
    )


def markdown(doc: dict) -> str:
    env = doc["environment"]
    run = {peer for r in doc["records"] for peer in r["timings"]}
    peers = [peer for peer in PEERS if peer in run]
    lines = [
        "# fastbert torch backend on a CPU",
        "",
        f"{env['cpu']}, {env['cpu_threads']} torch threads; torch {env['torch']}, "
        f"transformers {env['transformers']}, sentence-transformers "
        f"{env['sentence-transformers']}, Python {env['python']}; commit {env['commit']}, "
        f"{env['date']}. fp32. Median ms of {doc['settings']['reps']} round-robin "
        "repetitions (p20-p80 in results.json); speed-ups are over the Hugging Face "
        "median.",
        "",
        "| model | batch | shape | padding | "
        + " | ".join(peers)
        + " | dense / sdpa | auto / sdpa | auto / eager |",
        "|---" * (len(peers) + 7) + "|",
    ]
    for r in doc["records"]:
        t = r["timings"]
        cells = [
            r["model"],
            r["batch"],
            "x".join(map(str, r["shape"])),
            f"{r['padding']:.0%}",
            *(f"{t[p]['median_ms']:.1f}" if p in t else "-" for p in peers),
            ratio_cell(speedup(r, "fastbert-dense", "hf-sdpa")),
            ratio_cell(speedup(r, "fastbert-auto", "hf-sdpa")),
            ratio_cell(speedup(r, "fastbert-auto", "hf-eager")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    e = doc["encode"]
    if e is not None:
        te = e["timings"]
        lines += [
            "",
            f"`encode` of {e['texts']} sentences of Python's documentation (mean "
            f"{e['words_mean']:.1f} words), batch size {e['batch_size']}, all-MiniLM-L6-v2: "
            f"st.encode {te['st.encode']['median_ms']:.0f} ms, fastbert.optimize(st).encode "
            f"{te['fastbert.optimize(st).encode']['median_ms']:.0f} ms: {e['speedup']:.2f}x; "
            f"smallest cosine between their embeddings {e['min_cosine']:.7f}.",
        ]
    lines += [
        "",
        "Largest |fastbert - HF| over real tokens (HF sdpa; eager for a model without sdpa, "
        "MPNet): "
        f"{max(max(r['max_abs_diff_vs_hf'].values()) for r in doc['records']):.2e}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-cpu", help="folder for results.json / .md")
    parser.add_argument(
        "--models",
        default=",".join(MODELS),
        help="comma-separated: bert-mini, minilm (the packaged weights), ...",
    )
    parser.add_argument(
        "--batches",
        type=lambda text: choices(text, BATCH_KEYS, "--batches"),
        default=BATCH_KEYS,
        help="comma-separated, from " + ", ".join(BATCH_KEYS) + " (default: all)",
    )
    parser.add_argument(
        "--peers",
        type=lambda text: choices(text, PEERS, "--peers"),
        default=PEERS,
        help="comma-separated, from " + ", ".join(PEERS) + " (default: all; hf-sdpa, the "
        "reference of the differences, always runs)",
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--texts", type=int, default=512, help="sentences to encode")
    parser.add_argument(
        "--encode-reps", type=int, default=5, help="0: no encode comparison (MiniLM's)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.peers = tuple(p for p in PEERS if p in args.peers or p == "hf-sdpa")  # in PEERS' order
    env = environment.capture()  # the commit measured, before anything else runs
    texts = corpus(args.texts, args.seed)
    records = []
    for name in args.models.split(","):
        records += measure_model(name.strip(), texts, args)
    encode = measure_encode(texts, 32, 1, args.encode_reps) if args.encode_reps else None
    doc = {
        "environment": env,
        "settings": {
            "warmup": args.warmup,
            "reps": args.reps,
            "seed": args.seed,
            "dtype": "float32",
            "backend": "torch",
        },
        "records": records,
        "encode": encode,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "results.md").write_text(markdown(doc))
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}")
    worst = max(max(r["max_abs_diff_vs_hf"].values()) for r in records)
    exact = encode is None or encode["min_cosine"] >= MIN_COSINE
    return 0 if worst <= MAX_ABS_DIFF and exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
