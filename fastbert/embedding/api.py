"""``fastbert.embed`` and ``fastbert.load``: the Python entry points of the embedding job."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastbert.embedding.loading import load, load_options, model_files
from fastbert.embedding.options import EmbedOptions
from fastbert.embedding.quantized import check_ranges_apply, quantization_ranges
from fastbert.embedding.text_model import TextModel

# Options that change how a loaded model is used, not what is loaded.
_CALL_OPTIONS = (
    "normalize",
    "progress",
    "prompt_name",
    "prompt",
    "dimensions",
    "force_dimensions",
    "max_active_dims",
    "precision",
    "ranges",
    "calibration_embeddings",
)
# How many models fastbert.embed keeps loaded between calls (by folder and options).
_CACHE_SIZE = 2


def embed(
    texts_or_paths: Sequence[str] | str | Path | Sequence[str | Path],
    model: str | Path | TextModel,
    *,
    output: str | Path | None = None,
    ray: str | bool | None = None,
    **options: Any,
) -> Any:
    """Embed texts with a BERT-family model folder (Hugging Face or sentence-transformers).

    ``model``: a model folder, or a model loaded with :func:`fastbert.load` (then only
    ``normalize``, ``prompt_name``, ``prompt``, ``dimensions``, ``force_dimensions``,
    ``max_active_dims``, ``precision``, ``ranges``, ``calibration_embeddings`` and ``progress``
    may be given: the other options were fixed when it loaded).
    A folder is loaded on the first call and kept loaded (the last two folder-and-options pairs),
    so calling ``fastbert.embed`` in a loop pays for the forward passes only; a folder whose
    weights or configs change on disk is loaded again.

    Without ``output``: ``texts_or_paths`` is a list of strings; returns what the model's kind
    gives for them, row i for text i: an embedding model's numpy array [len(texts), dim]
    (float32, or float16 with ``dtype="float16", store_dtype="float16"``), a sparse model's
    :class:`~fastbert.embedding.sparse.SparseVectors`, a multi-vector model's list of
    [tokens, dim] arrays (see :meth:`~fastbert.embedding.text_model.TextModel.embed`).

    With ``output``: ``texts_or_paths`` is a file or folder (or a list of them) of .jsonl,
    .parquet, .csv or .txt; the embeddings are written as Parquet shards with a _manifest.json
    in the ``output`` folder (an unfinished run of the same job is continued), and the
    :class:`~fastbert.embedding.run.Summary` is returned. ``ray``: run the job on Ray Data
    (True for a local Ray instance, or a cluster address).

    ``options``: text_field, id_field, batch_tokens, max_length, pooling (a
    sentence-transformers pooling mode), normalize, dtype, store_dtype, device, backend,
    quantize (None, "int8" or "fp8"), prompt_name / prompt (the prompt before every input;
    default: the folder's default prompt), dimensions / force_dimensions (Matryoshka cuts),
    max_active_dims (sparse), precision ("float32", or quantized as sentence-transformers'
    ``quantize_embeddings`` gives them: "int8", "uint8", "binary", "ubinary"), ranges (int8 /
    uint8 buckets: [2, dimensions], min and max per dimension), calibration_embeddings
    (embeddings whose min and max give the ranges; in memory, as sentence-transformers takes
    them, the ranges default to those of the texts' own embeddings), calibration (with
    ``output``: a file of texts whose embeddings give them; the default is the job's first
    1,000 rows, and the manifest records the ranges), skip_bad, overwrite, rows_per_shard,
    window_rows, progress (see :class:`~fastbert.embedding.options.EmbedOptions`).

    Raises ValueError (or its subclasses InputError / OutputError) naming the bad argument,
    file and row.
    """
    from fastbert.embedding import pipeline

    if isinstance(model, TextModel):
        return _embed_loaded(texts_or_paths, model, output, ray, options)
    calibration_embeddings = options.pop("calibration_embeddings", None)
    check_ranges_apply(
        options.get("precision", "float32"), calibration_embeddings=calibration_embeddings
    )
    if calibration_embeddings is not None and output is not None:
        if options.get("ranges") is None:  # the manifest records the ranges as numbers
            options["ranges"] = quantization_ranges(calibration_embeddings)
    settings = EmbedOptions(model=str(model), **options)
    if output is None:
        if ray:
            raise ValueError("ray runs write shards: give output=")
        if settings.skip_bad:
            raise ValueError("skip_bad applies to files; an array needs a row for every text")
        if settings.calibration is not None:
            raise ValueError(
                "calibration (a file of texts) applies to files with output=; in memory give "
                "ranges= or calibration_embeddings="
            )
        texts = _texts(texts_or_paths)
        # One loaded model for every precision: it quantizes what it gives, per call.
        loaded = _cached(replace(settings, precision="float32", ranges=None))
        return loaded.embed(
            texts,
            precision=settings.precision,
            ranges=settings.ranges,
            calibration_embeddings=calibration_embeddings,
            progress=settings.progress and len(texts) > 1000,
        )
    paths = [texts_or_paths] if isinstance(texts_or_paths, str | Path) else list(texts_or_paths)
    if ray:
        from fastbert.embedding import ray_driver

        return ray_driver.embed_files(
            paths, output, settings, address=None if ray is True else str(ray)
        )
    return pipeline.embed_files(paths, output, settings)


def _embed_loaded(
    texts: Any, model: TextModel, output: Any, ray: Any, options: dict[str, Any]
) -> Any:
    if output is not None or ray:
        raise ValueError(
            "a loaded model embeds lists of texts; to write shards, give the model's folder"
        )
    fixed = sorted(set(options) - set(_CALL_OPTIONS))
    if fixed:
        raise TypeError(
            f"{', '.join(fixed)}: set when the model loads (fastbert.load); with a loaded model "
            f"only {', '.join(_CALL_OPTIONS)} may be given"
        )
    texts = _texts(texts)
    progress = options.get("progress", True) and len(texts) > 1000
    calls = {k: v for k, v in options.items() if k != "progress"}
    return model.embed(texts, progress=progress, **calls)


_cache: OrderedDict[tuple, TextModel] = OrderedDict()
_cache_lock = threading.Lock()


def _cached(options: EmbedOptions) -> TextModel:
    """The model ``options`` load, loaded once and kept while its folder's files are unchanged
    (the most recently used :data:`_CACHE_SIZE` of them)."""
    key = (replace(options, progress=False, name=None), tuple(model_files(Path(options.model))))
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    loaded = load_options(key[0])
    with _cache_lock:
        _cache[key] = loaded
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return loaded


def _texts(texts: Any) -> list[str]:
    if isinstance(texts, str | Path | bytes | bytearray) or not isinstance(texts, Sequence):
        raise TypeError(
            "texts_or_paths: without output= give a list of strings to embed "
            f"(got {type(texts).__name__}); to embed files, give output= too"
        )
    return list(texts)


__all__ = ["embed", "load"]
