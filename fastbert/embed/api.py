"""``fastbert.embed``: the Python entry point of the embedding job."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def embed(
    texts_or_paths: Sequence[str] | str | Path | Sequence[str | Path],
    model: str | Path,
    *,
    output: str | Path | None = None,
    ray: str | bool | None = None,
    **options: Any,
) -> Any:
    """Embed texts with a BERT-family model folder (Hugging Face or sentence-transformers).

    Without ``output``: ``texts_or_paths`` is a list of strings; returns their embeddings, a
    numpy array [len(texts), dim] (float32, or float16 with ``dtype="float16",
    store_dtype="float16"``), row i for text i.

    With ``output``: ``texts_or_paths`` is a file or folder (or a list of them) of .jsonl,
    .parquet, .csv or .txt; the embeddings are written as Parquet shards with a manifest.json
    in the ``output`` folder (an unfinished run of the same job is continued), and the
    :class:`~fastbert.embed.pipeline.Summary` is returned. ``ray``: run the job on Ray Data
    (True for a local Ray instance, or a cluster address).

    ``options``: text_field, id_field, batch_tokens, max_length, pooling ("mean" | "cls"),
    normalize, dtype, store_dtype, device, backend, quantize (None or "int8"), skip_bad,
    overwrite, rows_per_shard, window_rows, progress (see
    :class:`~fastbert.embed.options.EmbedOptions`).

    Raises ValueError (or its subclasses InputError / OutputError) naming the bad argument,
    file and row.
    """
    from fastbert.embed import pipeline
    from fastbert.embed.options import EmbedOptions

    settings = EmbedOptions(model=str(model), **options)
    if output is None:
        if ray:
            raise ValueError("ray runs write shards: give output=")
        return pipeline.embed_texts(_texts(texts_or_paths), settings)
    paths = [texts_or_paths] if isinstance(texts_or_paths, str | Path) else list(texts_or_paths)
    if ray:
        from fastbert.embed import ray_driver

        return ray_driver.embed_files(
            paths, output, settings, address=None if ray is True else str(ray)
        )
    return pipeline.embed_files(paths, output, settings)


def _texts(texts: Any) -> list[str]:
    if isinstance(texts, str | Path) or not isinstance(texts, Sequence):
        raise TypeError(
            "texts_or_paths: without output= give a list of strings to embed "
            f"(got {type(texts).__name__}); to embed files, give output= too"
        )
    return list(texts)


__all__ = ["embed"]
