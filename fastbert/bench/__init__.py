"""The benchmark library behind ``fastbert bench`` and the suites in benchmarks/.

One job per module:

- :mod:`~fastbert.bench.timing`: warm-up, repetitions, median with p20/p80 and its 95%
  interval (CUDA events or the wall clock); :mod:`~fastbert.bench.stopping`: the median's
  interval and when to stop; :mod:`~fastbert.bench.turns`: contenders timed in turns until
  then; :mod:`~fastbert.bench.memory`: peak CUDA memory.
- :mod:`~fastbert.bench.machine`: what else the machine was doing meanwhile (other
  processes' CPU time, steal, load, CPU clock); :mod:`~fastbert.bench.noise`: the caution
  naming the cells too noisy to rank, with the likely cause.
- :mod:`~fastbert.bench.counts`: FLOPs and bytes per op and per BERT forward;
  :mod:`~fastbert.bench.hardware`: the roofline peaks of known GPUs.
- :mod:`~fastbert.bench.environment`: what a measurement was taken on.
- :mod:`~fastbert.bench.shapes`: model shapes and input batches;
  :mod:`~fastbert.bench.models`: the reference weights every contender is built from;
  :mod:`~fastbert.bench.peers`: the contenders.
- :mod:`~fastbert.bench.runner`: the end-to-end comparison, record by record;
  :mod:`~fastbert.bench.progress`: its progress bar (with the time left inside a step).
- :mod:`~fastbert.bench.analysis`: derived figures; :mod:`~fastbert.bench.report`: JSON,
  Markdown and PNG (:mod:`~fastbert.bench.document`: the results file itself);
  :mod:`~fastbert.bench.targets`: the goals, met or missed.

Importing it queries no device and imports neither transformers nor matplotlib.
"""
