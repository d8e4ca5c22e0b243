"""Embedding a corpus with a BERT-family model: the job behind ``fastbert.embed(...)``,
``fastbert.load(...)`` and ``fastbert embed``.

One job per module, importing downward: :mod:`~fastbert.embedding.readers` (input files ->
rows), :mod:`~fastbert.embedding.tokenize` (tokenising ahead in a thread),
:mod:`~fastbert.embedding.batching` (length-sorted windows, token-budget batches),
:mod:`~fastbert.embedding.model` (folder settings, loading, pooling),
:mod:`~fastbert.embedding.shards` and :mod:`~fastbert.embedding.manifest` (Parquet output,
resuming), :mod:`~fastbert.embedding.options`, :mod:`~fastbert.embedding.pipeline` (the
one-process job), :mod:`~fastbert.embedding.ray_driver` (the Ray Data job; the only module here
that imports ray), :mod:`~fastbert.embedding.text_model` (a folder loaded once),
:mod:`~fastbert.embedding.loading` (``fastbert.load``: a folder to a text model) and
:mod:`~fastbert.embedding.api` (``fastbert.embed``). Importing this
package imports neither pyarrow, transformers nor ray.
"""
