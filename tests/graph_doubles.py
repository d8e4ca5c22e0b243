"""A CPU stand-in for CUDA graphs, to test the bookkeeping of fastbert.execution.graphs without a
GPU."""

from __future__ import annotations

from fastbert.execution import graphs


class ReplayingGraphs(graphs.EncoderGraphs):
    """EncoderGraphs whose "graph" re-runs the captured call on the CPU: it checks the
    bookkeeping around a CUDA graph (static buffers, keys, when to capture, eviction, the
    copy of the output, thread and weight safety), not the capture itself (the GPU tests of
    tests/test_runtime.py do that)."""

    DEVICE_TYPE = "cpu"

    def __init__(self, setting, device_type: str = "cpu"):
        super().__init__(setting)
        self.DEVICE_TYPE = device_type  # where the model under test runs (the GPU run: cuda)
        self.replays = 0

    def _record(self, forward):
        static_out = forward()
        weights = self.weights  # what a real graph would read: the storage at capture

        def replay() -> None:
            if self.weights != weights:
                raise RuntimeError("a graph was replayed against weights other than its own")
            self.replays += 1
            static_out.copy_(forward())

        return replay, static_out
