"""The benchmark library behind ``fastbert bench`` and the suites in benchmarks/.

One job per module:

- :mod:`~fastbert.bench.timing`: warm-up, repetitions, median with p20/p80 (CUDA events or
  the wall clock); :mod:`~fastbert.bench.memory`: peak CUDA memory.
- :mod:`~fastbert.bench.counts`: FLOPs and bytes per op and per BERT forward;
  :mod:`~fastbert.bench.hardware`: the roofline peaks of known GPUs.
- :mod:`~fastbert.bench.environment`: what a measurement was taken on.
- :mod:`~fastbert.bench.shapes`: model shapes and input batches;
  :mod:`~fastbert.bench.models`: the reference weights every contender is built from;
  :mod:`~fastbert.bench.peers`: the contenders.
- :mod:`~fastbert.bench.runner`: the end-to-end comparison, record by record;
  :mod:`~fastbert.bench.progress`: its progress bar.
- :mod:`~fastbert.bench.analysis`: derived figures; :mod:`~fastbert.bench.report`: JSON,
  Markdown and PNG (:mod:`~fastbert.bench.document`: the results file itself);
  :mod:`~fastbert.bench.targets`: the goals, met or missed.

Importing it queries no device and imports neither transformers nor matplotlib.
"""
