"""End to end: one BertModel forward of each contender of fastbert bench (Hugging Face eager
and sdpa, torch.compile of it with --bench-compile, fastbert dense, padding-free and with CUDA
graphs when this fastbert has them) on every case, with identical random weights.

Each measurement files median/p20/p80 ms, peak MiB, FLOPs, bytes and roofline ms in
extra_info, like fastbert bench's records.
"""

from __future__ import annotations

import functools

import pytest
import torch

from benchmarks.cases import DEVICE, config_and_dtype
from fastbert.bench import hardware, memory, models, peers, runner
from fastbert.bench.shapes import make_batch

COMPILE_PEERS = ("hf-compile", "hf-compile-max")


@functools.cache
def _reference(model: str) -> models.Reference:
    return models.load_reference(model)


@pytest.mark.parametrize("peer_name", list(peers.PEERS))
def test_forward(case, peer_name, benchmark, request) -> None:
    peer = peers.PEERS[peer_name]
    if peer_name in COMPILE_PEERS and not request.config.getoption("--bench-compile"):
        pytest.skip("torch.compile peers run with --bench-compile")
    device = torch.device(DEVICE)
    reason = peers.unavailable_reason(peer, device)
    if reason:
        pytest.skip(reason)
    model, shape, _ = case
    config, dtype = config_and_dtype(case)
    reference = _reference(model)
    batch = make_batch(shape, config.vocab_size, device)
    settings = runner.Settings(
        dtype,
        device,
        warmup=request.config.getoption("--bench-warmup"),
        reps=request.config.getoption("--bench-reps"),
    )
    torch._dynamo.reset()
    memory.release(device)
    base_mib = memory.allocated_mib(device)
    try:
        forward = peer.build(reference, dtype, device, "auto")
        measured = runner.measure(forward, batch, settings, base_mib)
    except Exception as exc:  # a contender that cannot run this case is skipped, with why
        pytest.skip(f"{peer_name}: {runner.describe_error(exc)}")
    work = runner.work(reference, peer, shape, batch, dtype, hardware.peaks_here(device))
    benchmark.extra_info.update(
        runner.base_record(peer, shape, batch) | measured | work, model=model, dtype=case[2]
    )

    def synchronized() -> None:
        with torch.inference_mode():
            forward(batch)
        torch.cuda.synchronize()

    benchmark.pedantic(synchronized, rounds=max(10, settings.reps // 5), warmup_rounds=2)
