"""fastbert in each precision against sentence-transformers float32, on a retrieval sample of
real text: the library behind ``fastbert accuracy --precisions``.

The reference is the model as sentence-transformers runs it in float32 (Hugging Face's model
inside it, unchanged). Each precision is what a user runs: ``fastbert.optimize`` on a copy of
the same SentenceTransformer with the precision's ``dtype`` and ``quantize`` (padding-free and
CUDA graphs at their defaults). Both encode the same texts in the same batches (sorted by
length, as ``encode`` sorts them), and for each precision the report gives:

- hidden states: the last layer's output (the Transformer module's token embeddings) at real
  tokens, max and mean absolute error against the reference's, in float32;
- for a sentence-transformers model (a folder with modules.json; the packaged
  all-MiniLM-L6-v2): the sentence embeddings (what ``encode`` returns), least and mean cosine
  similarity to the reference's, per text; and the overlap of each query's top-10 neighbours
  in the corpus (cosine) with the reference's neighbours, least and mean over the queries
  (see :mod:`fastbert.accuracy.retrieval` for the sample and the overlap).

The texts are the sample's queries and corpus together; the cosines cover all of them.

An emulated precision (fp8 on a CPU: e4m3 values multiplied in float32, its accuracy but not
its speed) runs only on request (``emulated=True``). The run
shows its progress batch by batch with the time left, and once the reference has done a
tenth of its work, the time the whole run is expected to take (fastbert/accuracy/estimate.py).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import itertools
from collections.abc import Callable
from typing import Any, TextIO

import torch
import torch.nn.functional as F

from fastbert.accuracy import estimate, retrieval
from fastbert.accuracy.precisions import PRECISION_NAMES, precision, runnable
from fastbert.bench.models import load_checked
from fastbert.bench.progress import Progress
from fastbert.integrations import models as hf_models
from fastbert.integrations.model_names import FOLDER, resolve_model
from fastbert.integrations.optimize import optimize

MINILM = "minilm"
REFERENCE = "sentence-transformers float32 (the Hugging Face model inside it)"
DEFAULT_QUERIES, DEFAULT_CORPUS, BATCH_SIZE = 100, 1000, 32


@dataclasses.dataclass
class PrecisionResult:
    """One precision against the reference; the sentence-level fields are None for a model
    that is not a sentence-transformers model."""

    precision: str
    compute_dtype: str  # the floating dtype it runs in: "float32", "float16", "bfloat16"
    quantize: str | None
    hidden_max_abs_err: float
    hidden_mean_abs_err: float
    cosine_least: float | None = None
    cosine_mean: float | None = None
    top10_overlap_least: float | None = None
    top10_overlap_mean: float | None = None
    emulated: bool = False  # an emulation of the precision's math (its accuracy, not its speed)

    def runs_in(self) -> str:
        """What the precision runs in, as the tables say it: "float32 + int8 (emulated)"."""
        return runs_in(self.compute_dtype, self.quantize, self.emulated)


def runs_in(compute_dtype: str, quantize: str | None, emulated: bool) -> str:
    """The "runs in" column of a result (also of one read back from JSON)."""
    text = compute_dtype + (f" + {quantize}" if quantize else "")
    return text + (" (emulated)" if emulated else "")


class JsonReport:
    """A dataclass report that turns into plain dicts, lists and numbers, for JSON."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class PrecisionReport(JsonReport):
    model: str
    device: str
    backend: str
    reference: str
    embedding_model: bool  # sentence embeddings and neighbours reported
    source: str  # where the text comes from
    queries: int
    corpus: int
    tokens: int  # real tokens over all texts
    hidden_mean_abs: float  # mean |reference hidden state|: the scale of the errors
    top_k: int
    results: list[PrecisionResult]
    notes: list[str]


@dataclasses.dataclass
class Encoded:
    """What one model computed for every text, in the sample's order."""

    hidden: list[torch.Tensor]  # [tokens_i, H] float32 each: the real tokens' hidden states
    sentences: torch.Tensor  # [texts, D] float32


def check_precisions(
    names: list[str] | None, device: torch.device, backend: str, emulated: bool = False
) -> list[str]:
    """``names`` (None: every precision the device runs, the emulated ones only with
    ``emulated``) checked: ValueError naming the choices for an unknown one, naming what the
    device runs for one it cannot, and asking for ``emulated`` for an emulated one."""
    runs = runnable(device, backend)
    if names is None:
        return [n for n in runs if emulated or not precision(n).emulated(device)]
    unknown = [n for n in names if n not in PRECISION_NAMES]
    if unknown:
        raise ValueError(f"unknown {', '.join(unknown)}; choose from {', '.join(PRECISION_NAMES)}")
    refused = [n for n in names if n not in runs]
    if refused:
        raise ValueError(
            f"{', '.join(refused)} cannot run on {device} with backend {backend}; it runs "
            f"{', '.join(runs)}"
        )
    unasked = [n for n in names if precision(n).emulated(device) and not emulated]
    if unasked:
        raise ValueError(
            f"{', '.join(unasked)} on {device.type} is an emulation (its accuracy, not its "
            "speed): ask for emulated precisions to run it (--emulated)"
        )
    return list(dict.fromkeys(names))


def length_batches(texts: list[str], batch_size: int) -> list[list[int]]:
    """Indices of ``texts`` in batches of ``batch_size``, longest first (as ``encode`` sorts,
    so a batch pads little)."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def encode(
    model: Any,
    texts: list[str],
    batches: list[list[int]],
    on_batch: Callable[[int], None] | None = None,
) -> Encoded:
    """Every text's real-token hidden states and sentence embedding from a SentenceTransformer
    ``model``, batch by batch: its ``preprocess`` and forward, as ``encode`` runs them, with
    every output kept (``encode(output_value=None)`` keeps them too, but in
    sentence-transformers 6.0 and 6.1 it fails on a batch of more than four texts: it indexes
    the string-valued ``modality`` output by row); ``on_batch(k)`` after the k-th batch."""
    hidden: list[torch.Tensor | None] = [None] * len(texts)
    sentences: list[torch.Tensor | None] = [None] * len(texts)
    model.eval()
    for done, batch in enumerate(batches, 1):
        features = model.preprocess([texts[i] for i in batch])
        with torch.inference_mode():
            outputs = model(
                {k: v.to(model.device) if torch.is_tensor(v) else v for k, v in features.items()}
            )
        real = outputs["attention_mask"].bool()
        for row, index in enumerate(batch):
            hidden[index] = outputs["token_embeddings"][row][real[row]].float().cpu()
            sentences[index] = outputs["sentence_embedding"][row].float().cpu()
        if on_batch is not None:
            on_batch(done)
    return Encoded(hidden, torch.stack(sentences))


def compare_encoded(
    got: Encoded, ref: Encoded, queries: int, embedding_model: bool
) -> dict[str, float | None]:
    """The metrics of ``got`` against ``ref`` (see the module docstring); the first
    ``queries`` texts are the queries, the rest the corpus."""
    max_err, err_sum, count = 0.0, 0.0, 0
    for got_hidden, ref_hidden in zip(got.hidden, ref.hidden):
        diff = (got_hidden - ref_hidden).abs()
        max_err = max(max_err, diff.max().item())
        err_sum += diff.double().sum().item()
        count += diff.numel()
    metrics: dict[str, float | None] = {
        "hidden_max_abs_err": max_err,
        "hidden_mean_abs_err": err_sum / count,
    }
    if embedding_model:
        # In float64: float32's own rounding put identical vectors below 1.
        cosine = F.cosine_similarity(got.sentences.double(), ref.sentences.double(), dim=-1)
        got_top = retrieval.neighbours(got.sentences[:queries], got.sentences[queries:])
        ref_top = retrieval.neighbours(ref.sentences[:queries], ref.sentences[queries:])
        shared = retrieval.overlap(got_top, ref_top)
        metrics.update(
            cosine_least=cosine.min().item(),
            cosine_mean=cosine.mean().item(),
            top10_overlap_least=shared.min().item(),
            top10_overlap_mean=shared.mean().item(),
        )
    return metrics


def _plan(names: list[str], device: torch.device, backend: str) -> str:
    """What the run will do, said before it starts: the stages, the emulated precisions among
    them or left out, and when the expected time will be known."""
    emulated = [n for n in runnable(device, backend) if precision(n).emulated(device)]
    line = (
        f"the reference, then {', '.join(names)}; the expected run time follows once the "
        "reference has run a tenth of its work"
    )
    running = [n for n in emulated if n in names]
    if running:
        line += (
            f"; {', '.join(running)} on {device.type} is emulated: its values multiplied in "
            "float32, for its accuracy, not its speed"
        )
    left_out = [n for n in emulated if n not in names]
    if left_out:
        line += f" ({', '.join(left_out)}: emulated here, run only on request: --emulated)"
    return line


class _Work:
    """The progress of a stage batch by batch, weighted by each batch's work, and the run's
    expected time once the reference has done enough of its work to tell its rate."""

    def __init__(self, bar: Progress, batches: list[list[int]], units: list[int]):
        self.bar = bar
        self.batches = len(batches)
        self.done_units = list(itertools.accumulate(units))
        self.total = self.done_units[-1]

    def batch(self, done: int) -> None:
        self.bar.within(done, self.batches, "batches", self.done_units[done - 1] / self.total)

    def reference_batch(self, names: list[str], device: torch.device) -> Callable[[int], None]:
        """``batch`` for the reference, which also announces the expected time once."""
        announced = False

        def on_batch(done: int) -> None:
            nonlocal announced
            self.batch(done)
            fraction = self.done_units[done - 1] / self.total
            if not announced and fraction >= estimate.CALIBRATION:
                announced = True
                elapsed = self.bar.step_elapsed()
                rate = self.done_units[done - 1] / max(elapsed, 1e-9)
                stages = estimate.expected_seconds(names, device, self.total, rate)
                left = elapsed * (1 - fraction) / fraction
                self.bar.note(estimate.summary(left, stages))

        return on_batch


def model_path(model: str, also: tuple[str, ...] = ()) -> tuple[str, str]:
    """(folder, label) of ``model``: a local folder (labelled as given) or a model name
    ("minilm": the packaged all-MiniLM-L6-v2; a Hugging Face id in its cache; see
    :func:`~fastbert.integrations.model_names.resolve_model`), labelled by its id's name
    part. ModelNotFound (a ValueError) for anything else, offering ``also`` among the close
    matches."""
    found = resolve_model(model, also=also)
    return str(found.folder), model if found.source == FOLDER else found.label


def evaluate_precisions(
    model: str = MINILM,
    device: str = "cpu",
    backend: str = "torch",
    precisions: list[str] | None = None,
    queries: int = DEFAULT_QUERIES,
    corpus: int = DEFAULT_CORPUS,
    batch_size: int = BATCH_SIZE,
    progress: TextIO | None = None,
    emulated: bool = False,
) -> PrecisionReport:
    """Run the comparison; see the module docstring. precisions: names from
    :data:`~fastbert.accuracy.precisions.PRECISIONS` (None: every one the device runs, the
    emulated ones only with ``emulated``). Raises ValueError for a bad request, before loading
    anything.

    progress: where to show progress over the runs (loading, the reference, each precision,
    batch by batch with the time left) and the run's expected time: a tqdm bar on a terminal,
    numbered lines otherwise; None shows none."""
    torch_device = torch.device(device)
    names = check_precisions(precisions, torch_device, backend, emulated)
    path, label = model_path(model)
    sample = retrieval.retrieval_sample(queries, corpus)
    with Progress(2 + len(names), "fastbert accuracy", stream=progress or io.StringIO()) as bar:
        bar.note(_plan(names, torch_device, backend))
        bar.step(f"loading {model}")
        st, embedding_model = load_checked(path, hf_models.load_sentence_transformer, device)
        texts = sample.queries + sample.corpus
        batches = length_batches(texts, batch_size)
        lengths = estimate.token_lengths(st, texts)
        work = _Work(bar, batches, estimate.batch_units(lengths, batches))
        bar.advance()
        bar.step(f"sentence-transformers fp32, {len(texts)} texts")
        ref = encode(st, texts, batches, work.reference_batch(names, torch_device))
        bar.advance()
        results = []
        for name in names:
            entry = precision(name)
            is_emulated = entry.emulated(torch_device)
            bar.step(f"fastbert {name}" + (" (emulated)" if is_emulated else ""))
            dtype = entry.compute_dtype(torch_device)
            swapped = optimize(
                copy.deepcopy(st), dtype=dtype, backend=backend, quantize=entry.quantize
            )
            metrics = compare_encoded(
                encode(swapped, texts, batches, work.batch), ref, queries, embedding_model
            )
            del swapped
            runs_in = str(dtype).removeprefix("torch.")
            results.append(
                PrecisionResult(name, runs_in, entry.quantize, **metrics, emulated=is_emulated)
            )
            bar.advance()
    notes = []
    if not embedding_model:
        notes.append("not a sentence-transformers folder (no modules.json): hidden states only")
    tokens = sum(h.shape[0] for h in ref.hidden)
    hidden_mean_abs = sum(h.abs().double().sum().item() for h in ref.hidden) / (
        tokens * ref.hidden[0].shape[-1]
    )
    return PrecisionReport(
        model=label,
        device=str(torch_device),
        backend=backend,
        reference=REFERENCE,
        embedding_model=embedding_model,
        source=retrieval.SOURCE,
        queries=len(sample.queries),
        corpus=len(sample.corpus),
        tokens=tokens,
        hidden_mean_abs=hidden_mean_abs,
        top_k=retrieval.TOP_K,
        results=results,
        notes=notes,
    )
