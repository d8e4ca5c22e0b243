"""CUDA graphs of the encoder: which calls replay one, and replaying safely.

A graph is captured per key: the shape and dtype of each input, which optional inputs are
present, and a host value the capture depends on (see fastbert.execution.runtime for the dense and
padding-free keys). The ``cuda_graphs`` setting of a model chooses when:

- ``False``: never.
- ``"auto"`` (on CUDA only): a call of at most GRAPH_AUTO_MAX_TOKENS rows whose key has been
  called CAPTURE_AFTER times (so a stream of ever-new shapes pays no capture cost, and the
  largest batches, which the GPU's work bounds rather than the launches, keep no graph
  memory). The graphs share one memory pool (their replays never overlap): they hold the
  activations of the largest one, and each its output.
- ``True``: every key on its first call; raises off CUDA.

At most MAX_GRAPHS graphs are kept. Once that many are kept, a key is captured only when it
has been called more than REPLACE_RATIO times as often as the least-called kept graph, which
it then replaces (ties: the least recently used one), so a cycle or a uniform mix of more
shapes than MAX_GRAPHS settles on a fixed set instead of capturing on every call. Call
counts are kept for at most SEEN_MAX keys (the least recently called forgotten first) and
halved every AGE_EVERY calls, so the kept set follows a workload that changes.

Safety:

- Threads: one lock per model covers the copy into a graph's input buffers, the replay and
  the copy out, so concurrent callers each get their own result. On CUDA, a replay from
  another stream than the previous one waits for that stream first (graphs share one memory
  pool and their buffers).
- Weights: every graph is dropped when the storage of any parameter changes (``.half()``,
  ``.to()``, ``load_state_dict(..., assign=True)``, a parameter or its ``.data`` replaced):
  a graph reads the addresses it was captured with. ``run`` takes the weights' key.
"""

from __future__ import annotations

import collections
import threading
import warnings
from collections.abc import Callable, Hashable

import torch

# Graphs kept per model; each holds its activations.
MAX_GRAPHS = 8
# "auto" graphs calls up to this many rows (batch x seq, or a padding-free bucket's rows):
# fastbert.embed's batches on CUDA (16384 tokens) included. Up to about this size an eager
# BERT-base forward spends longer launching its kernels than the GPU spends running them;
# past it the GPU's work sets the time (docs/results.md, "The second GPU run").
GRAPH_AUTO_MAX_TOKENS = 16384
# "auto" captures a key on this call of it (capturing costs far more than one replay saves).
CAPTURE_AFTER = 2
# Once MAX_GRAPHS are kept, a key replaces the least-called graph only when called more than
# this many times as often (a capture costs far more than the replays of one call).
REPLACE_RATIO = 2
# Keys whose call counts are remembered (about 0.5 KB each).
SEEN_MAX = 256
# Every this many calls through the graphs, all call counts are halved.
AGE_EVERY = 1024


class CallCounts:
    """How often each key was called lately: bounded, least recently called forgotten first."""

    def __init__(self, limit: int = SEEN_MAX):
        self.limit = limit
        self.counts: collections.OrderedDict[Hashable, int] = collections.OrderedDict()

    def add(self, key: Hashable, count: int = 1) -> int:
        """Count ``count`` more calls of ``key``; returns its count."""
        total = self.counts.pop(key, 0) + count
        self.counts[key] = total
        if len(self.counts) > self.limit:
            self.counts.popitem(last=False)
        return total

    def pop(self, key: Hashable) -> int:
        return self.counts.pop(key, 0)

    def halve(self) -> None:
        for key in list(self.counts):
            self.counts[key] //= 2

    def __len__(self) -> int:
        return len(self.counts)


class _Graph:
    """One captured graph: its replay, static input buffers, static output and call count."""

    def __init__(self, replay: Callable[[], None], inputs: tuple, output: torch.Tensor):
        self.replay = replay
        self.inputs = inputs
        self.output = output
        self.calls = 0


class EncoderGraphs:
    """The CUDA graphs of one model's encoder (embeddings and layers), one per key.

    ``run(encode, *inputs, host_key=..., weights=..., finish=...)`` replays the key's graph
    when the policy above wants one: it copies the inputs (None for one that is absent) into
    the graph's static buffers, replays it and returns ``finish(output)``, computed while the
    graph is held (``finish`` must copy what it keeps; without one, a copy of the output).
    Otherwise it runs ``encode(*inputs)`` eagerly and returns its output (through ``finish``
    when given). ``encode`` must not synchronise with the host (the model checks the ids
    beforehand), and any host value it reads besides the inputs' shapes must be in
    ``host_key``; ``weights`` is the key of the weights' storage (see above). A capture that
    fails (an op that cannot be captured) warns once and falls back to eager execution for
    good.
    """

    # Graphs need CUDA; a test double that records without CUDA sets its own device type.
    DEVICE_TYPE = "cuda"

    def __init__(self, setting: str | bool):
        self.setting = setting
        self.graphs: collections.OrderedDict[Hashable, _Graph] = collections.OrderedDict()
        self.seen = CallCounts()
        self.captures = 0
        self.failed = False
        self.pool = None
        self.weights: Hashable = None
        self._calls = 0
        self._last_stream = None
        self._lock = threading.Lock()

    def check_device(self, device: torch.device) -> None:
        """ValueError when the setting is True and ``device`` is not a CUDA device. Every
        call of the model checks it, whether or not that call could replay a graph (one
        recording gradients could not), so that the setting fails the same way on any
        path."""
        if self.setting is True and device.type != self.DEVICE_TYPE:
            raise ValueError(
                f"cuda_graphs=True needs the model on a CUDA device, it is on "
                f"{device}; use cuda_graphs='auto' or False"
            )

    def wants(self, device: torch.device, tokens: int) -> bool:
        """Whether a call running ``tokens`` rows (dense: batch x seq; padding-free: the
        bucket's rows) on ``device`` may replay a graph."""
        if self.setting is False or self.failed or torch.compiler.is_compiling():
            return False
        self.check_device(device)
        if device.type != self.DEVICE_TYPE:
            return False
        return self.setting is True or tokens <= GRAPH_AUTO_MAX_TOKENS

    def run(
        self,
        encode: Callable[..., torch.Tensor],
        *inputs: torch.Tensor | None,
        host_key: Hashable = None,
        weights: Hashable = None,
        finish: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        key = (
            *(None if t is None else (tuple(t.shape), t.dtype, t.device) for t in inputs),
            host_key,
        )
        with self._lock:
            if weights != self.weights:
                self.graphs.clear()  # captured against storage that may be gone
                self.weights = weights
            graph = self._graph_for(key, encode, inputs)
            if graph is not None:
                return self._replay(graph, inputs, finish or torch.clone)
        out = encode(*inputs)
        return out if finish is None else finish(out)

    def _graph_for(self, key: Hashable, encode: Callable, inputs: tuple) -> _Graph | None:
        """The graph to replay for ``key`` (captured now if the policy says so), or None."""
        self._age()
        graph = self.graphs.get(key)
        if graph is not None:
            graph.calls += 1
            self.graphs.move_to_end(key)
            return graph
        calls = self.seen.add(key)
        if self.setting == "auto" and calls < CAPTURE_AFTER:
            return None
        victim = self._victim()
        if victim is not None and calls <= REPLACE_RATIO * self.graphs[victim].calls:
            return None
        graph = self._capture(encode, inputs)
        if graph is None:
            return None
        if victim is not None:
            self.seen.add(victim, self.graphs.pop(victim).calls)
        graph.calls = self.seen.pop(key)
        self.graphs[key] = graph
        return graph

    def _victim(self) -> Hashable | None:
        """The graph a new capture would replace (None while fewer than MAX_GRAPHS are kept):
        the least called, the least recently used among equals."""
        if len(self.graphs) < MAX_GRAPHS:
            return None
        return min(self.graphs, key=lambda k: self.graphs[k].calls)  # first minimum = LRU

    def _age(self) -> None:
        self._calls += 1
        if self._calls % AGE_EVERY == 0:
            self.seen.halve()
            for graph in self.graphs.values():
                graph.calls //= 2

    def _replay(self, graph: _Graph, inputs: tuple, finish: Callable) -> torch.Tensor:
        self._follow_last_stream()
        for static, t in zip(graph.inputs, inputs):
            if t is not None:
                static.copy_(t)
        graph.replay()
        return finish(graph.output)

    def _follow_last_stream(self) -> None:
        """Order this replay after the previous one when it came from another CUDA stream."""
        if self.DEVICE_TYPE != "cuda":
            return
        stream = torch.cuda.current_stream()
        if self._last_stream is not None and self._last_stream != stream:
            stream.wait_stream(self._last_stream)
        self._last_stream = stream

    def _capture(self, encode: Callable[..., torch.Tensor], inputs: tuple) -> _Graph | None:
        """A new graph for the key of ``inputs``, or None when the capture failed."""
        static_inputs = tuple(None if t is None else t.clone() for t in inputs)
        try:
            replay, static_out = self._record(lambda: encode(*static_inputs))
        except RuntimeError as exc:
            self.failed = True
            warnings.warn(
                f"CUDA graph capture failed ({exc}); running without CUDA graphs", stacklevel=4
            )
            return None
        self.captures += 1
        return _Graph(replay, static_inputs, static_out)

    def _record(self, forward: Callable[[], torch.Tensor]):
        """Capture one call of ``forward`` in a CUDA graph: (its replay, its output tensor).

        ``forward`` reads only the static buffers, so a replay recomputes the output in place
        from whatever they hold.
        """
        self._follow_last_stream()
        # Warm up on a side stream (autotuning and lazy initialisation happen here, not inside
        # the capture), then capture one call. "thread_local": other threads' CUDA calls
        # during the capture do not invalidate it.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward()
        torch.cuda.current_stream().wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            static_out = forward()
        return graph.replay, static_out
