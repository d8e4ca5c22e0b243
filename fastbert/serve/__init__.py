"""Serving a model over HTTP: ``fastbert serve``, in Hugging Face text-embeddings-inference's
and OpenAI's shapes.

One job per module, importing downward: :mod:`~fastbert.serve.options` (the limits),
:mod:`~fastbert.serve.errors` (each failure's status and body), :mod:`~fastbert.serve.schemas`
(request bodies), :mod:`~fastbert.serve.inputs` (inputs -> token ids),
:mod:`~fastbert.serve.batcher` (the model thread: token-budget batches, bounded admission),
:mod:`~fastbert.serve.metrics` (Prometheus), :mod:`~fastbert.serve.app` (the routes),
:mod:`~fastbert.serve.server` (uvicorn, graceful shutdown) and
:mod:`~fastbert.serve.ray_serve` (the same app as a Ray Serve deployment). The model is a
:class:`~fastbert.embed.text_model.TextModel`, as ``fastbert.embed`` runs it.

Importing this package imports neither FastAPI, uvicorn nor ray: they load when a server
starts (the ``fastbert[serve]`` extra; Ray Serve is ``fastbert[ray]``'s).
"""
