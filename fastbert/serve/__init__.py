"""Serving a model over HTTP: ``fastbert serve``, in Hugging Face text-embeddings-inference's,
OpenAI's and Cohere's shapes.

One job per module, importing downward: :mod:`~fastbert.serve.options` (the limits),
:mod:`~fastbert.serve.errors` (each failure's status and body), :mod:`~fastbert.serve.schemas`
(request bodies), :mod:`~fastbert.serve.inputs` (inputs -> token ids),
:mod:`~fastbert.serve.batcher` (the model thread: token-budget batches, bounded admission),
:mod:`~fastbert.serve.metrics` (Prometheus), :mod:`~fastbert.serve.calibration` (the int8 /
uint8 ranges, fixed at start), :mod:`~fastbert.serve.service` (what every route shares: the
checks, tokenising, running, replying), :mod:`~fastbert.serve.scores` (a cross-encoder's
scores), the route families :mod:`~fastbert.serve.routes_tei`,
:mod:`~fastbert.serve.routes_openai` and :mod:`~fastbert.serve.routes_cohere`,
:mod:`~fastbert.serve.info` (``GET /info``), :mod:`~fastbert.serve.app` (the app: routes,
checks, errors), :mod:`~fastbert.serve.server` (uvicorn, graceful shutdown) and
:mod:`~fastbert.serve.ray_serve` (the same app as a Ray Serve deployment). The model is a
:class:`~fastbert.embedding.text_model.TextModel`, as ``fastbert.embed`` runs it.

Importing this package imports neither FastAPI, uvicorn nor ray: they load when a server
starts (the ``fastbert[serve]`` extra; Ray Serve is ``fastbert[ray]``'s).
"""
