"""FASTBERT_AUTOTUNE: which autotune configs a launch times (all, or one by its index).

The prune hooks are called directly here, with the GPU config lists (and the linear GEMM's
interpreter list, whose wide tile goes first where it fits the operands).
"""

from __future__ import annotations

import pytest
import torch
import triton

from fastbert.kernels import (
    attention_launch,
    flash_attention,
    flash_attention_backward,
    fused_linear,
    launch,
    linear_configs,
)


def test_all_by_default_and_one_by_index(monkeypatch) -> None:
    kept = ["a", "b", "c"]
    monkeypatch.delenv(launch.AUTOTUNE_ENV, raising=False)
    assert launch.tuned(kept) == kept
    for everything in ("all", ""):
        monkeypatch.setenv(launch.AUTOTUNE_ENV, everything)
        assert launch.tuned(kept) == kept
    monkeypatch.setenv(launch.AUTOTUNE_ENV, "2")
    assert launch.tuned(kept) == ["c"]


@pytest.mark.parametrize("value", ["3", "-1", "first"])
def test_a_bad_choice_says_what_is_allowed(monkeypatch, value) -> None:
    monkeypatch.setenv(launch.AUTOTUNE_ENV, value)
    with pytest.raises(ValueError, match="FASTBERT_AUTOTUNE"):
        launch.tuned(["a", "b", "c"])


def test_linear_prune_pins_the_chosen_config(monkeypatch) -> None:
    candidates = linear_configs.gpu_configs()
    args = {
        "x_ptr": torch.empty(1, dtype=torch.float16),
        "M_BUCKET": 4096,
        "N": 768,
        "K": 768,
        "ACTIVATION": fused_linear.ACTIVATION_CODES["gelu"],
        "HAS_RESIDUAL": False,
        "STORE_PRE_ACTIVATION": False,
        "GRAD_ACTIVATION": 0,
        "HAS_ROW_SUM": False,
        "HAS_DESCRIPTORS": 0,
        "GATED": False,
        "GATED_GRAD": 0,
    }
    monkeypatch.delenv(launch.AUTOTUNE_ENV, raising=False)
    kept = linear_configs.prune(candidates, args)
    assert 1 < len(kept) < len(candidates)  # the GELU epilogue drops the widest tile
    monkeypatch.setenv(launch.AUTOTUNE_ENV, "1")
    assert linear_configs.prune(candidates, args) == [kept[1]]


@pytest.mark.parametrize(
    "n, k, first",
    [
        (384, 384, (32, 256, 128)),
        (256, 128, (32, 256, 128)),
        (255, 384, (32, 128, 128)),
        (128, 200, (32, 128, 128)),
        (384, 127, None),
        (127, 384, None),
        (36, 40, None),
    ],
)
def test_linear_interpreter_takes_the_widest_tile_that_fits(n, k, first) -> None:
    """The widest wide tile that N and K hold whole runs first (and only); the small tile and
    its persistent twin stay in their order behind it, for FASTBERT_AUTOTUNE to pin."""
    candidates = linear_configs.interpreter_configs()
    variant = {"activation": 1, "has_residual": True, "has_descriptors": True}
    small = linear_configs.kept_candidates(candidates, 2, 1024, 36, 40, **variant)
    assert [c.kwargs["PERSISTENT"] for c in small] == [0, 1]
    tile_of = linear_configs.tile_of
    assert all(tile_of(c) not in linear_configs.INTERPRETER_WIDE_TILES for c in small)
    kept = linear_configs.kept_candidates(candidates, 2, 1024, n, k, **variant)
    assert kept == small if first is None else (tile_of(kept[0]), kept[1:]) == (first, small)


@pytest.mark.parametrize(
    "variant",
    [
        {"STORE_PRE_ACTIVATION": True},
        {"GRAD_ACTIVATION": 1},
        {"GATED_GRAD": 1, "GRAD_ACTIVATION": 1},
        {"GATED_GRAD": 2},
    ],
    ids=["store-pre", "gelu-prologue", "gated-prologue", "glu-prologue"],
)
def test_linear_training_variants_keep_small_tiles(monkeypatch, variant) -> None:
    """Storing the pre-activation or a prologue (a GELU derivative, or a gated linear's dY'
    with or without one) holds more registers: only tiles of at most 32 accumulator values
    per thread (and, for a prologue, K tiles of 32) are kept, those that compile without
    spills (tests/compile_cases/linear.py)."""
    monkeypatch.delenv(launch.AUTOTUNE_ENV, raising=False)
    args = {
        "x_ptr": torch.empty(1, dtype=torch.float16),
        "M_BUCKET": 4096,
        "N": 768,
        "K": 768,
        "ACTIVATION": 0,
        "HAS_RESIDUAL": False,
        "STORE_PRE_ACTIVATION": False,
        "GRAD_ACTIVATION": 0,
        "HAS_ROW_SUM": False,
        "HAS_DESCRIPTORS": 1,
        "GATED": False,
        "GATED_GRAD": 0,
        **variant,
    }
    kept = linear_configs.prune(linear_configs.gpu_configs(), args)
    assert kept
    for c in kept:
        meta = c.kwargs
        assert meta["BLOCK_M"] * meta["BLOCK_N"] // (32 * c.num_warps) <= 32
        prologue = variant.get("GRAD_ACTIVATION") or variant.get("GATED_GRAD")
        assert not prologue or meta["BLOCK_K"] <= 32


def _attention_configs(space) -> list[triton.Config]:
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
        for m, n, w, s in space
    ]


def _attention_launch(dtype: torch.dtype, block_d: int, rotary: bool = False) -> dict:
    """A masked dense attention launch's arguments, as the pruners read them."""
    flags = {"IS_VARLEN": False, "HAS_MASK": True, "HAS_BIAS": False, "HAS_DROPOUT": False}
    return {"Q": torch.empty(1, dtype=dtype), "BLOCK_D": block_d, "ROTARY": rotary, **flags}


def test_attention_prune_pins_the_chosen_config(monkeypatch) -> None:
    candidates = _attention_configs(flash_attention._TUNE_SPACE)
    args = _attention_launch(torch.float16, 64)
    monkeypatch.delenv(launch.AUTOTUNE_ENV, raising=False)
    kept = flash_attention._prune(candidates, args)
    assert len(kept) > 1
    monkeypatch.setenv(launch.AUTOTUNE_ENV, str(len(kept) - 1))
    assert flash_attention._prune(candidates, args) == [kept[-1]]


def test_a_pinned_config_is_not_timed(monkeypatch) -> None:
    calls = []
    monkeypatch.setenv(launch.AUTOTUNE_ENV, "0")
    assert launch.time_config(lambda: calls.append(1), (0.5, 0.2, 0.8)) == [0.0, 0.0, 0.0]
    assert calls == []


@pytest.mark.parametrize("pass_", ["forward", "dkdv", "dq"])
def test_a_variant_that_keeps_no_config_runs_the_lightest(monkeypatch, pass_) -> None:
    """float32 rotary heads of 80 (BLOCK_D 128) fit no config's budget: the pruner runs the one
    holding the fewest values, not the first (whose forward needed 384 KiB of shared memory on
    an H200; tests/compile_cases/attention*.py compile the one chosen)."""
    monkeypatch.delenv(launch.AUTOTUNE_ENV, raising=False)
    args = _attention_launch(torch.float32, 128, rotary=True)
    if pass_ == "forward":
        space, prune = flash_attention._TUNE_SPACE, flash_attention._prune
        load = flash_attention.load
        variant = (False, True, False, True, False)
    else:
        backward = flash_attention_backward
        is_dkdv = pass_ == "dkdv"
        space = backward._DKDV_TUNE_SPACE if is_dkdv else backward._DQ_TUNE_SPACE
        load, variant = backward.load, (is_dkdv, False, True)
        prune = attention_launch.pruner(backward.keep, lambda args: variant, load)
    candidates = _attention_configs(space)
    (chosen,) = prune(candidates, args)
    loads = [load(c, 128, 4, *variant) for c in candidates]
    assert load(chosen, 128, 4, *variant) == min(loads)
