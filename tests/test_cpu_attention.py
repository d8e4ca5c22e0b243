"""The compiled CPU attention (fastbert.kernels.cpu_attention): against the float64 reference
and the float32 math path, its float32 builds (AVX-512 with and without AVX512_BF16, AVX2)
against each other, the build each CPU class runs, the torch backend's calls that take it and
those that do not, NaN, threads, and the switch and build failures that leave the torch path
in place."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F

from fastbert.kernels import cpu_attention as C
from fastbert.kernels import cpu_engine_attention as T
from fastbert.kernels import reference as R
from tests.op_cases import padded_mask, randn
from tests.test_attention import packed_qkv

needs_kernel = pytest.mark.skipif(not C.available(), reason=f"cpu_attention: {C.status()}")
needs_bf16 = pytest.mark.skipif(
    torch.bfloat16 not in C.dtypes(), reason=f"no bfloat16 build here: {C.status()}"
)
# The dtype of the tests that any build serves: bfloat16 where it runs (its build's own
# path), else float32.
KERNEL_DTYPE = (*C.dtypes(), torch.float32)[0]
HEADS = 12
LENGTHS = [1, 2, 15, 16, 17, 31, 0, 33, 100, 129, 256, 5]


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return float((out.double() - expected).norm() / expected.norm())


def sharp_packed(lengths, head_dim, seed, dtype=torch.bfloat16):
    """q, k, v [T, H, D] views of one fused buffer (the encoder's layout), q scaled by 2 for
    sharper attention, and cu_seqlens."""
    q, k, v, cu = packed_qkv(lengths, HEADS, head_dim, dtype, "cpu", seed=seed)
    with torch.no_grad():
        q.mul_(2.0)
    return q, k, v, cu


@pytest.fixture
def calls(monkeypatch) -> list[int]:
    """Spy on the kernel: the number of sequences of each call."""
    seen: list[int] = []
    real = C.attention_sequences

    def spy(q, k, v, starts, *args):
        seen.append(starts.numel())
        return real(q, k, v, starts, *args)

    monkeypatch.setattr(C, "attention_sequences", spy)
    return seen


def needs_dtype(dtype: torch.dtype) -> None:
    if dtype not in C.dtypes():
        pytest.skip(f"the kernel here runs {C.dtypes()}: {C.status()}")


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_varlen_against_float64(dtype, head_dim, scale) -> None:
    """Every sequence against the float64 reference. bfloat16: about one rounding of the
    result, and no less accurate than PyTorch's flash kernel on the same sequence (which
    rounds P to bfloat16). float32: float32's accuracy (the flash kernel's measured 3.6e-7
    relative RMS error, the kernel's 3.7e-7) and at most twice the flash kernel's error on the
    same sequence (measured: at most 1.46x; a softmax exp off by about 10 ulp gave 3x). A
    kernel that read another sequence's keys, used the wrong scale, or rounded the scores
    would fail it."""
    needs_dtype(dtype)
    check_against_float64(dtype, head_dim, scale)


@pytest.mark.parametrize("build", list(C.BUILDS))
@pytest.mark.parametrize("head_dim", [32, 64])
def test_every_float32_build_against_float64(build, head_dim) -> None:
    """Each build that runs here (the AVX2 one on any CPU with AVX2), as the test above."""
    with C.taken(build):
        if not C.available():
            pytest.skip(f"{build}: {C.status()}")
        assert C.dtypes()[-1] == torch.float32
        check_against_float64(torch.float32, head_dim, 0.3)


def check_against_float64(dtype: torch.dtype, head_dim: int, scale: float | None) -> None:
    q, k, v, cu = sharp_packed(LENGTHS, head_dim, seed=head_dim, dtype=dtype)
    out = C.attention_varlen(q, k, v, cu, scale)
    assert out.shape == q.shape and out.is_contiguous() and out.dtype == dtype
    bounds = cu.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if start == end:
            continue
        one = [t[start:end].transpose(0, 1)[None] for t in (q, k, v)]  # [1, H, L, D]
        expected = R.attention(*(t.double() for t in one), None, scale)
        got = out[start:end].transpose(0, 1)[None]
        flash = F.scaled_dot_product_attention(*one, scale=scale)
        error = relative_error(got, expected)
        if dtype == torch.float32:
            assert error < 2e-6, (end - start, error)
            assert error <= 2 * relative_error(flash, expected) or end - start == 1, error
            continue
        assert error < 2.5e-3, (end - start, error)
        assert error <= relative_error(flash, expected), (end - start, error)


@needs_bf16
@pytest.mark.parametrize("head_dim", [32, 64])
def test_within_one_rounding_of_the_math_path(head_dim) -> None:
    """The float32 math path (cpu_engine_attention.math_attention) computes the same thing in
    the same precision with other summation orders and PyTorch's exp: the two bfloat16 results may
    differ by one rounding of the float32 value, plus float32's own error of a sum of terms
    up to max |v| (which shows where the terms cancel to an output near zero), never more."""
    q, k, v, cu = sharp_packed([7, 64, 100], head_dim, seed=3)
    out = C.attention_varlen(q, k, v, cu)
    bounds = cu.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        views = [
            t[start:end].view(1, end - start, HEADS, head_dim).transpose(1, 2) for t in (q, k, v)
        ]
        math = torch.empty(end - start, HEADS, head_dim, dtype=torch.bfloat16)
        T.math_attention(
            *views, None, None, math.view(1, end - start, HEADS, head_dim).transpose(1, 2)
        )
        gap = (out[start:end].float() - math.float()).abs()
        float32_error = 2**-16 * float(v[start:end].float().abs().max())
        assert torch.all(gap <= math.float().abs() * 2**-7 + float32_error), gap.max()
        assert (gap > 0).float().mean() < 0.01  # mostly the same bits


@needs_kernel
def test_views_and_copies_agree() -> None:
    """Views of a fused buffer and separate contiguous tensors give the same bits."""
    q, k, v, cu = sharp_packed([20, 3, 40], 32, seed=4, dtype=KERNEL_DTYPE)
    assert torch.equal(
        C.attention_varlen(q, k, v, cu),
        C.attention_varlen(q.contiguous(), k.contiguous(), v.contiguous(), cu),
    )


BOUNDS = {torch.bfloat16: 2.5e-3, torch.float32: 2e-6}


@needs_kernel
@pytest.mark.parametrize("dtype", list(BOUNDS), ids=str)
def test_torch_backend_varlen_takes_it(calls, dtype) -> None:
    """attention_varlen without dropout or positions: one kernel call for the whole batch,
    the reference's result."""
    needs_dtype(dtype)
    q, k, v, cu = sharp_packed(LENGTHS, 32, seed=5, dtype=dtype)
    out = T.attention_varlen_unchecked(q, k, v, cu, max(LENGTHS))
    assert calls == [len(LENGTHS)]
    expected = R.attention_varlen(q.double(), k.double(), v.double(), cu, max(LENGTHS))
    assert relative_error(out, expected) < BOUNDS[dtype]


@needs_kernel
@pytest.mark.parametrize("dtype", list(BOUNDS), ids=str)
@pytest.mark.parametrize("lengths", [[37, 37, 37], [37, 20, 1, 0]], ids=["full", "right-padded"])
def test_torch_backend_dense_takes_it(calls, dtype, lengths) -> None:
    """Dense attention without a mask or with right padding: one call, the reference at every
    query (padded ones attend to their row's real keys), zeros on a row without keys."""
    needs_dtype(dtype)
    batch, seq = len(lengths), 37
    qkv = randn((batch, seq, 3, HEADS, 32), dtype, "cpu", seed=6)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    mask = None if min(lengths) == seq else padded_mask(lengths, seq)
    out = T.attention(q, k, v, mask)
    assert calls == [batch]
    expected = R.attention(q.double(), k.double(), v.double(), mask)
    assert relative_error(out, expected) < BOUNDS[dtype]
    if 0 in lengths:
        assert torch.equal(out[lengths.index(0)], torch.zeros_like(out[0]))


# Per-distance tables and windows that bind: the kernel's relative bias and window options.
BIAS = R.RELATIVE_BUCKETS


def positions_options(case: str, heads: int) -> dict:
    """attention_varlen's keyword options for a case of relative bias, window or rotary."""
    table = randn((heads, BIAS), torch.float32, "cpu", seed=40)
    rotary = 1.0 / 10000 ** (torch.arange(0, 64, 2).float() / 64)
    return {
        "relative-bias": {"relative_bias": table},
        "window": {"window": 7},
        "relative-bias-and-window": {"relative_bias": table, "window": 20},
        "rotary-and-window": {"rotary": rotary, "window": 7},
    }[case]


@needs_kernel
@pytest.mark.parametrize("dtype", list(BOUNDS), ids=str)
@pytest.mark.parametrize(
    "case", ["relative-bias", "window", "relative-bias-and-window", "rotary-and-window"]
)
def test_positions_take_it(calls, dtype, case) -> None:
    """MPNet's relative bias, ModernBERT's window and rotary positions: one kernel call for
    the packed batch and one for a right-padded one, the float64 reference's result (rotary:
    on q and k rotated in their dtype first, as the torch path rotates them), zeros where a
    padded query has no key in its window."""
    needs_dtype(dtype)
    options = positions_options(case, HEADS)
    q, k, v, cu = sharp_packed(LENGTHS, 64, seed=41, dtype=dtype)
    out = T.attention_varlen_unchecked(
        q,
        k,
        v,
        cu,
        max(LENGTHS),
        None,
        0.0,
        options.get("relative_bias"),
        rotary=options.get("rotary"),
        window=options.get("window"),
    )
    assert calls == [len(LENGTHS)]
    if "rotary" in options:  # each sequence's own positions, rotated in the dtype
        rotary = options.pop("rotary")
        bounds = cu.tolist()
        q, k = (
            torch.cat(
                [
                    R.rotary_positions(t[a:b].transpose(0, 1), rotary).transpose(0, 1)
                    for a, b in zip(bounds[:-1], bounds[1:])
                ]
            )
            for t in (q, k)
        )
    wide = (t.double() for t in (q, k, v))
    bias = options.get("relative_bias")
    expected = R.attention_varlen(
        *wide,
        cu,
        max(LENGTHS),
        relative_bias=None if bias is None else bias.double(),
        window=options.get("window"),
    )
    assert relative_error(out, expected) < BOUNDS[dtype]

    lengths, seq = [37, 20, 1, 0], 37
    qkv = randn((len(lengths), seq, 3, HEADS, 64), dtype, "cpu", seed=42)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    options = positions_options(case, HEADS)
    mask = padded_mask(lengths, seq)
    out = T.attention(q, k, v, mask, **options)
    assert calls[1:] == [len(lengths)]
    if "rotary" in options:
        rotary = options.pop("rotary")
        q, k = (R.rotary_positions(t, rotary) for t in (q, k))
    expected = R.attention(
        q.double(),
        k.double(),
        v.double(),
        mask,
        relative_bias=None if bias is None else bias.double(),
        window=options.get("window"),
    )
    assert relative_error(out, expected) < BOUNDS[dtype]
    if "window" in options:  # the one-token row's queries past its window see no key
        unseen = out[2, :, 1 + options["window"] :]
        assert unseen.numel() and torch.equal(unseen, torch.zeros_like(unseen))


@needs_kernel
@pytest.mark.parametrize("case", ["relative-bias", "window"])
def test_positions_skip_nothing_near_the_queries(case) -> None:
    """Long sequences whose windows leave out whole key blocks, every head and query: the
    same as the reference, in float32 (where a skipped block that held a key would show)."""
    options = positions_options(case, HEADS)
    q, k, v, cu = sharp_packed([300, 129, 64], 32, seed=43, dtype=torch.float32)
    out = C.attention_varlen(q, k, v, cu, None, C.Positions(**options))
    bias = options.get("relative_bias")
    expected = R.attention_varlen(
        q.double(),
        k.double(),
        v.double(),
        cu,
        300,
        relative_bias=None if bias is None else bias.double(),
        window=options.get("window"),
    )
    assert relative_error(out, expected) < BOUNDS[torch.float32]


@needs_kernel
def test_a_window_wider_than_every_sequence_is_no_window() -> None:
    """Every distance within the window (up to one past the longest sequence, and one past
    a C int): the same bits as no window."""
    q, k, v, cu = sharp_packed([40, 7, 100], 32, seed=44, dtype=torch.float32)
    plain = C.attention_varlen(q, k, v, cu)
    for window in (99, 100, 2**32 + 5):
        assert torch.equal(C.attention_varlen(q, k, v, cu, None, C.Positions(window=window)), plain)
    narrower = C.attention_varlen(q, k, v, cu, None, C.Positions(window=98))
    assert not torch.equal(narrower, plain)


@needs_kernel
@pytest.mark.parametrize(
    "case", ["left-padded", "float16", "head-dim-80", "dropout", "autograd", "bias-autograd"]
)
def test_other_calls_keep_the_torch_path(calls, case) -> None:
    """What the kernel does not compute goes to the torch path, still correct: the kernel
    has no backward, so a relative bias whose gradient is recorded keeps the torch path."""
    dtype = torch.float16 if case == "float16" else torch.bfloat16
    head_dim = 80 if case == "head-dim-80" else 32
    q, k, v, cu = packed_qkv([9, 30], 2, head_dim, dtype, "cpu", seed=7)
    q.requires_grad_(case == "autograd")
    if case == "left-padded":
        dense = [
            t.detach()[:30].view(1, 30, 2, head_dim).transpose(1, 2).repeat(2, 1, 1, 1)
            for t in (q, k, v)
        ]
        mask = torch.arange(30) >= torch.tensor([21, 0])[:, None]
        T.attention(*dense, mask)
    else:
        table = randn((2, BIAS), torch.float32, "cpu", seed=8).requires_grad_()
        options = {
            "dropout": {"dropout_p": 0.1},
            "bias-autograd": {"relative_bias": table},
        }.get(case, {})
        T.attention_varlen_unchecked(q, k, v, cu, 30, **options)
    assert calls == []


@needs_kernel
def test_nan_stays_in_its_sequence() -> None:
    """A NaN key makes its own sequence's outputs NaN and no other's."""
    q, k, v, cu = sharp_packed([10, 12], 32, seed=9, dtype=KERNEL_DTYPE)
    k[3, 0, 5] = float("nan")
    out = C.attention_varlen(q, k, v, cu)
    assert torch.isnan(out[:10, 0]).all()
    assert not torch.isnan(out[:10, 1:]).any() and not torch.isnan(out[10:]).any()


@needs_kernel
def test_threads_share_nothing() -> None:
    """Calls from several Python threads at once (the serving case) give each its own result."""
    batches = [sharp_packed([5 + i, 40 - i, 17], 32, 10 + i, KERNEL_DTYPE) for i in range(6)]
    alone = [C.attention_varlen(*b) for b in batches]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda b: C.attention_varlen(*b), batches * 3))
    for i, out in enumerate(together):
        assert torch.equal(out, alone[i % len(batches)])


def run_fresh(code: str, **env: str) -> str:
    """``code`` in a new interpreter with ``env`` added; its stdout."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return result.stdout


CHECK = """
    import torch
    from fastbert.kernels import cpu_attention as C, cpu_engine_attention as T, reference as R
    from tests.test_attention import packed_qkv
    print(C.status())
    q, k, v, cu = packed_qkv([9, 30], 2, 32, torch.bfloat16, "cpu", seed=1)
    out = T.attention_varlen_unchecked(q, k, v, cu, 30)
    expected = R.attention_varlen(q.double(), k.double(), v.double(), cu, 30)
    print(float((out.double() - expected).norm() / expected.norm()) < 2.5e-3)
"""


def test_switch_off_keeps_the_torch_path() -> None:
    """FASTBERT_CPU_ATTENTION=0: not built, status says why, the torch path answers."""
    status, correct = run_fresh(CHECK, FASTBERT_CPU_ATTENTION="0").split("\n")[:2]
    assert status == "off ($FASTBERT_CPU_ATTENTION)" and correct == "True"


@pytest.mark.skipif(C.missing_requirement() is not None, reason="the kernel is never built here")
def test_build_failure_keeps_the_torch_path(tmp_path) -> None:
    """A compiler that fails: status names it, nothing is cached, the torch path answers."""
    status, correct = run_fresh(CHECK, CXX="false", FASTBERT_CACHE=str(tmp_path)).split("\n")[:2]
    assert status.startswith("not built: false failed"), status
    assert correct == "True"
    assert not list((tmp_path / "cpu-kernels").glob("*.so"))


@needs_kernel
def test_built_from_runs_another_source_inside_the_block_only(tmp_path) -> None:
    """A copy of the source (the same build, cached) gives the same bits inside the block; a
    source that does not compile raises, naming it; the kernel of before runs after either."""
    q, k, v, cu = sharp_packed([3, 40], 32, seed=7, dtype=KERNEL_DTYPE)
    before = C.attention_varlen(q, k, v, cu)
    copy = tmp_path / "copy.cpp"
    copy.write_bytes(C.SOURCE.read_bytes())
    with C.built_from(copy):
        assert C._library().source == copy.resolve()
        assert torch.equal(C.attention_varlen(q, k, v, cu), before)
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    with pytest.raises(RuntimeError, match="broken.cpp"):
        with C.built_from(broken):
            pass
    assert C._library().source == C.SOURCE
    assert torch.equal(C.attention_varlen(q, k, v, cu), before)


@needs_kernel
def test_turned_off_takes_the_torch_path(calls) -> None:
    """Inside turned_off() the torch path answers (the same bits as its own call), after it
    the kernel again."""
    q, k, v, cu = sharp_packed([9, 30], 32, seed=11, dtype=KERNEL_DTYPE)
    with C.turned_off():
        off = T.attention_varlen_unchecked(q, k, v, cu, 30)
    assert calls == []
    assert torch.equal(off, T.attention_by_length(q, k, v, cu, None, 0.0, None, None, None))
    T.attention_varlen_unchecked(q, k, v, cu, 30)
    assert calls == [2]


def tile_state_granted() -> bool:
    """Whether Linux grants this process AMX's tile state (asked here, through libc)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    arch_prctl, req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    return libc.syscall(arch_prctl, req_xcomp_perm, xfeature_xtiledata) == 0


needs_tiles = pytest.mark.skipif(not C.tiles(), reason="no AMX tiles for the kernel here")


@needs_kernel
def test_tiles_wherever_the_cpu_and_linux_give_them() -> None:
    """On a CPU with AMX-BF16 whose kernel grants the tile state, bfloat16 q k^T runs on the
    tiles (the build targets the CPU it runs on); elsewhere never."""
    from fastbert.kernels.cpu_library import cpu_flags

    amx = {"amx_tile", "amx_bf16"} <= cpu_flags()
    assert C.tiles() == (amx and tile_state_granted())


@needs_tiles
@pytest.mark.parametrize("positions", ["none", "relative-bias-and-window", "rotary-and-window"])
@pytest.mark.parametrize("head_dim", [32, 64])
def test_tiles_give_the_dot_products_values(head_dim, positions) -> None:
    """q k^T and P @ V on the tiles against AVX512_BF16 dot products and float32 FMAs: the
    same exact products summed in float32 in another order, P carried in two bfloat16 parts
    (within 2^-18 of P), so the bfloat16 results differ by at most one rounding of the
    float32 value plus float32's own error of a sum of terms up to max |v| (which shows where
    the terms cancel to an output near zero), and seldom at all (P rounded to bfloat16 alone
    fails this); packed and right-padded batches, lengths around the tiles' 16 rows and 32
    keys, with and without a bias and window."""
    options = {} if positions == "none" else positions_options(positions, HEADS)
    lengths = [16, 17, 31, 32, 33, 47, 100, 129, 256, 3]
    q, k, v, cu = sharp_packed(lengths, head_dim, seed=20 + head_dim)
    padded = [t[: 8 * 48].contiguous() for t in (q, k, v)]
    real = torch.tensor([48, 16, 0, 33, 47, 5, 17, 48])
    rows = (torch.arange(8) * 48, real, torch.full((8,), 48))  # starts, keys, queries
    for run in (
        lambda: C.attention_varlen(q, k, v, cu, None, C.Positions(**options)),
        lambda: C.attention_sequences(*padded, *rows, None, C.Positions(**options)),
    ):
        tiled = run()
        with C.tiles_turned_off():
            dots = run()
        gap = (tiled.float() - dots.float()).abs()
        float32_error = 2**-16 * float(v.float().abs().max())
        assert torch.all(gap <= dots.float().abs() * 2**-7 + float32_error), gap.max()
        assert (gap > 0).float().mean() < 0.01


@needs_tiles
def test_onednn_amx_linears_after_the_tiles_are_unchanged() -> None:
    """oneDNN runs its AMX kernels on the same threads as the attention kernel: after an
    attention call on the tiles, a bfloat16 oneDNN linear gives the same bits as before it."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 384, generator=g).bfloat16()
    weight = torch.randn(1536, 384, generator=g).bfloat16()
    linear = torch.ops.mkldnn._linear_pointwise
    with torch.inference_mode():
        before = linear(x, weight, None, "none", [], "")
        for _ in range(3):
            C.attention_varlen(*sharp_packed([40, 64, 17], 32, seed=30))
            assert torch.equal(linear(x, weight, None, "none", [], ""), before)


def runs_here(build: str) -> bool:
    with C.taken(build):
        return C.available()


@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize(
    "case", ["plain", "scale", "relative-bias", "rotary-and-window", "window-0", "right-padded"]
)
def test_the_float32_builds_give_the_same_bits(head_dim, case) -> None:
    """The builds sum in one order with the same fused multiply-adds whatever their vector
    width (AVX2's 8 floats, AVX-512's 16), so each that runs here gives the others' bits: on
    lengths around every vector and row step, with each position option."""
    builds = [build for build in C.BUILDS if runs_here(build)]
    if len(builds) < 2:
        pytest.skip(f"one build runs here: {builds}")
    lengths = [1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 0, 33, 64, 100, 129, 5]
    q, k, v, cu = sharp_packed(lengths, head_dim, seed=50, dtype=torch.float32)
    options = {
        "relative-bias": {"relative_bias": randn((HEADS, BIAS), torch.float32, "cpu", seed=51)},
        "rotary-and-window": {"rotary": 1.0 / 10000 ** (torch.arange(0, head_dim, 2) / head_dim)},
        "window-0": {"window": 0},
    }.get(case, {})
    if case == "rotary-and-window":
        options["window"] = 5
    positions = C.Positions(**options)
    scale = 0.3 if case == "scale" else None
    outputs = {}
    for build in builds:
        with C.taken(build):
            if case == "right-padded":  # queries past a sequence's keys, as compiled_dense asks
                starts, lengths_t = cu[:-1].long(), cu[1:].long() - cu[:-1].long()
                keys = lengths_t * 2 // 3
                out = C.attention_sequences(q, k, v, starts, keys, lengths_t, scale, positions)
            else:
                out = C.attention_varlen(q, k, v, cu, scale, positions)
        outputs[build] = out
    first, *others = builds
    for build in others:
        assert torch.equal(outputs[build], outputs[first]), (build, first)


@pytest.mark.parametrize(
    "flags, build",
    [
        ({"avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_bf16"}, "avx512_bf16"),
        ({"avx2", "fma", "avx512f", "avx512bw", "avx512_bf16"}, "avx512_bf16"),
        ({"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"}, "avx512"),  # Cascade/Ice Lake
        ({"avx2", "fma", "avx512f"}, "avx512"),  # Skylake-SP
        ({"avx2", "fma"}, "avx2"),  # AMD Zen 1-3, Intel client CPUs
    ],
)
def test_each_cpu_class_runs_its_build(monkeypatch, flags, build) -> None:
    from fastbert.kernels import cpu_library

    monkeypatch.setattr(cpu_library, "cpu_flags", lambda: frozenset(flags))
    assert C.chosen() == build


def test_a_cpu_without_avx2_says_so(monkeypatch) -> None:
    from fastbert.kernels import cpu_library

    monkeypatch.setattr(cpu_library, "cpu_flags", lambda: frozenset({"sse4_2", "avx"}))
    assert C.chosen() == "avx2"
    if cpu_library.missing_requirement() is None:
        assert C.missing_requirement() == "this CPU has no avx2"


def test_taken_names_a_build() -> None:
    with pytest.raises(ValueError, match="build must be one of"):
        C.taken("avx512_fp16")


@pytest.mark.skipif(not runs_here("avx2"), reason="the AVX2 build does not run here")
def test_a_float32_build_leaves_bfloat16_to_the_torch_path(calls) -> None:
    """Under a build without bfloat16 (an AVX2 or AVX-512 CPU without AVX512_BF16), bfloat16
    attention takes the torch path, still correct, and float32 the kernel."""
    with C.taken("avx2"):
        assert C.dtypes() == (torch.float32,)
        q, k, v, cu = sharp_packed([9, 30], 32, seed=52)
        out = T.attention_varlen_unchecked(q, k, v, cu, 30)
        assert calls == []
        expected = R.attention_varlen(q.double(), k.double(), v.double(), cu, 30)
        assert relative_error(out, expected) < BOUNDS[torch.bfloat16]
        q, k, v, cu = sharp_packed([9, 30], 32, seed=52, dtype=torch.float32)
        T.attention_varlen_unchecked(q, k, v, cu, 30)
        assert calls == [2]


@pytest.mark.skipif(not runs_here("avx2"), reason="the AVX2 build does not run here")
def test_the_engine_names_the_build_and_its_dtypes() -> None:
    """fastbert info's row: the build calls run and the dtypes it takes."""
    from fastbert.kernels import cpu_engine

    with C.taken("avx2"):
        assert C.running() == "avx2"
        assert cpu_engine.attention_status().startswith("float32, the avx2 build: ready (")
    assert C.running() == C.chosen()
    if C.available():
        dtypes = " and ".join(str(d).removeprefix("torch.") for d in C.dtypes())
        assert cpu_engine.attention_status().startswith(f"{dtypes}, the {C.chosen()} build")
