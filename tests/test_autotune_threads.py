"""Autotuned kernels launched from two threads at once.

Triton's autotuner keeps a launch's arguments on itself (``Autotuner.nargs``) while it tunes
and while a config's pre-hook runs (the linear kernel's sets its TMA descriptors' block
shapes), and clears them when the launch ends. Here thread A is held inside tuning (its prune
hook waits) while thread B launches a shape already tuned: B must wait for A, not clear the
arguments A is still using (a TypeError, as before each kernel's launch lock) or hand A its
own. Under the interpreter the attention kernel has one config, so it is given a second one
to make it tune.
"""

from __future__ import annotations

import threading

import pytest
import torch
import triton

from fastbert import kernels as K
from fastbert.kernels import flash_attention, fused_linear
from fastbert.kernels import reference as R
from fastbert.kernels.launch import AUTOTUNE_ENV
from tests.op_cases import check_op, padded_mask, randn
from tests.test_linear import operands


def _linear_case(device):
    first = operands(96, 48, 64, torch.float16, device, seed=11)
    second = operands(64, 32, 32, torch.float16, device, seed=12)
    return (
        fused_linear._linear_fwd_kernel,
        [
            (K.linear, R.linear, (x, w), {"bias": b, "activation": "gelu"})
            for x, w, b, _ in (first, second)
        ],
    )


def _attention_case(device):
    def inputs(seq, seed):
        q, k, v = (randn((2, 2, seq, 32), torch.float16, device, seed + i) for i in range(3))
        mask = padded_mask([seq, seq // 2], seq, device=device)
        return (K.attention, R.attention, (q, k, v), {"key_padding_mask": mask})

    return flash_attention._attention_fwd_kernel, [inputs(48, 0), inputs(80, 10)]


@pytest.mark.parametrize("case", [_linear_case, _attention_case], ids=["linear", "attention"])
def test_a_launch_waits_for_another_threads_tuning(monkeypatch, device, case) -> None:
    kernel, ((op_a, ref_a, args_a, kw_a), (op_b, ref_b, args_b, kw_b)) = case(device)
    monkeypatch.delenv(AUTOTUNE_ENV, raising=False)
    if len(kernel.configs) == 1:
        (only,) = kernel.configs
        twin = triton.Config(
            dict(only.kwargs),
            num_warps=only.num_warps,
            num_stages=only.num_stages,
            pre_hook=only.pre_hook,
        )
        monkeypatch.setattr(kernel, "configs", [only, twin])
    kernel.cache.clear()
    op_b(*args_b, **kw_b)  # tuned: B's launch below takes the cached path
    original = kernel.early_config_prune
    tuning, release = threading.Event(), threading.Event()

    def held_prune(*args, **kwargs):
        tuning.set()
        release.wait(timeout=10)
        return original(*args, **kwargs)

    monkeypatch.setattr(kernel, "early_config_prune", held_prune)
    outputs, errors = {}, []

    def launch(name, op, args, kwargs):
        try:
            outputs[name] = op(*args, **kwargs)
        except Exception as exc:  # reported below
            errors.append(exc)

    a = threading.Thread(target=launch, args=("a", op_a, args_a, kw_a))
    a.start()
    try:
        assert tuning.wait(timeout=30)
        b = threading.Thread(target=launch, args=("b", op_b, args_b, kw_b))
        b.start()
        b.join(timeout=2)  # without the lock B finishes here, under A's feet
    finally:
        release.set()
        a.join(timeout=60)
    b.join(timeout=60)
    kernel.cache.clear()
    assert not errors, errors
    for name, ref, args, kwargs in (("a", ref_a, args_a, kw_a), ("b", ref_b, args_b, kw_b)):
        ran = lambda *_, _out=outputs[name], **__: _out  # what the thread computed
        check_op(ran, ref, args, kwargs, what=f"thread {name}")
