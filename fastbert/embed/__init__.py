"""Embedding a corpus with a BERT-family model: ``fastbert.embed(...)`` and ``fastbert embed``.

One job per module, importing downward: :mod:`~fastbert.embed.readers` (input files -> rows),
:mod:`~fastbert.embed.tokenize` (tokenising ahead in a thread),
:mod:`~fastbert.embed.batching` (length-sorted windows, token-budget batches),
:mod:`~fastbert.embed.model` (folder settings, loading, pooling),
:mod:`~fastbert.embed.shards` and :mod:`~fastbert.embed.manifest` (Parquet output, resuming),
:mod:`~fastbert.embed.options`, :mod:`~fastbert.embed.pipeline` (the one-process job),
:mod:`~fastbert.embed.ray_driver` (the Ray Data job; the only module here that imports ray) and
:mod:`~fastbert.embed.api` (the entry point).

This package is itself callable: ``fastbert.embed(texts, model=...)`` is
:func:`fastbert.embed.api.embed`. Importing it imports neither pyarrow, transformers nor ray.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from fastbert.embed.api import embed


class _CallablePackage(types.ModuleType):
    """``fastbert.embed`` names both this package and the function: calling the package calls
    the function."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return embed(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

__all__ = ["embed"]
