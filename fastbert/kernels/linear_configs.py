"""Autotune configs of the linear GEMM (fused_linear.py's ``_linear_fwd_kernel``) and
the predicate that prunes them per launch.

:func:`configs` lists the candidates (:func:`gpu_configs` on a GPU,
:func:`interpreter_configs` under the interpreter); the autotuner passes them through
:func:`prune`, which keeps those :func:`keep` allows for the launch's variant, dtype and M
bucket: each config must fit the shared memory of sm_80 and sm_90 and compile without register
spills for that variant (the limits below, each with what was measured).
"""

from __future__ import annotations

import triton

from .launch import interpreting, next_power_of_2, tuned

# Shared memory a config may fill with its pipelined tiles: below the 163 KiB of an A100
# (sm_80, the smaller of the two targets) with room for the epilogue's scratch.
SHARED_MEMORY_BUDGET = 160 * 1024
# float32 runs tl.dot as an FMA loop (IEEE, no tensor cores) that holds its operand tiles in
# registers: K tiles wider than this spill on sm_80.
FP32_MAX_BLOCK_K = 32
# float32 accumulator values per thread above which only the light epilogues (bias or nothing)
# fit the 255 registers: a 128 x 256 tile over 8 warps (128 values) compiles without spills
# as a plain GEMM + bias on sm_80 and sm_90, but a GELU or a residual on top of it spills
# (48 to 716 bytes per thread, on both targets).
HEAVY_EPILOGUE_MAX_ACC_VALUES = 64
# The training variants hold more: storing the pre-activation next to a GELU and a residual
# spills 40 to 48 bytes on sm_80 at 64 accumulator values per thread, and the GELU derivative
# in the prologue (an A tile and a pre-activation tile in float32 registers) spills 16 to
# 22520 bytes at BLOCK_K = 64 or 64 accumulator values (both targets). 32 values and a
# BLOCK_K of 32 compile without spills.
TRAINING_MAX_ACC_VALUES = 32
GRAD_ACTIVATION_MAX_BLOCK_K = 32
# int8 operands (QUANT 1): the 128 int32 accumulator values per thread of a 128 x 256 tile over
# 8 warps spill 708 bytes on sm_80 even under the bias epilogue alone (the int8 fragments of the
# IMMA operands take more registers than 16-bit ones); 64 compile without spills on both targets.
# keep() applies it to every one-byte operand, float8 e4m3 (QUANT 2) too.
INT8_MAX_ACC_VALUES = 64
# The dweight product (HAS_ROW_SUM) reads both operands transposed: more than 64 operand
# values per thread per K step ((BLOCK_M + BLOCK_N) x BLOCK_K / threads) spill, 284 to 6888
# bytes (128 x 256 x 64 over 8 warps, 128 x 64 x 64 over 4).
TRANSPOSED_MAX_OPERAND_VALUES = 64
# The gated product in float32 (two accumulators and two B tiles in the FMA loop's registers):
# 64 accumulator values per thread spill 648 to 688 bytes (64 x 64 x 32 over 4 warps, both
# targets).
GATED_FP32_MAX_ACC_VALUES = 32
# The gated backward's dweight prologue in float32 (dout and both pre-activation tiles read
# transposed, in float32 registers beside the FMA loop's operands): 32 accumulator values per
# thread spill 304 bytes on sm_80 (64 x 64 x 32 over 4 warps); 16 compile without spills.
GATED_DWEIGHT_FP32_MAX_ACC_VALUES = 16


def _set_descriptor_blocks(nargs: dict) -> None:
    """Autotune pre-hook: give the TMA descriptors (when present) the launch's tile shapes."""
    if nargs["x_desc"] is not None:
        nargs["x_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
        nargs["weight_desc"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_K"]]


def _config(
    block_m: int, block_n: int, block_k: int, stages: int, warps: int, persistent: int = 0
) -> triton.Config:
    """A tile config; ``persistent``: 0 for one program per output tile, else the programs
    per SM of a persistent launch (as many as the SM holds at once: the others' main loops
    overlap one program's epilogue)."""
    meta = {
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
        "GROUP_M": 8,
        "PERSISTENT": persistent,
    }
    return triton.Config(meta, num_stages=stages, num_warps=warps, pre_hook=_set_descriptor_blocks)


def gpu_configs() -> list[triton.Config]:
    """Hopper- and Ampere-friendly tiles for the encoder's GEMMs, none spilling registers.

    128 x 256 (the Triton matmul tutorial's best float16 config on H100) serves the big-M
    projections whose epilogue is at most a bias, 128 x 128 tiles every big-M projection
    (M = batch x sequence up to 65536), the narrow ones the small-M calls (one sentence, the
    pooler). The four with BLOCK_K = 32 are also the float32 ones (see :func:`keep`).
    64 x 128 tiles in three stages fit three CTAs per SM, and make 384 tiles of BERT-base's
    N = 768 projections at M = 4096 (97% of the 396 slots of 132 SMs, where 128 x 256 makes 96
    tiles, 73% of 132), 1152 of its QKV projection (N = 2304).

    The persistent configs (sm_90 and newer, see :func:`keep`) run one or two programs per SM
    over the output tiles with TMA loads; the autotuner times them beside the others.
    """
    return [
        _config(128, 256, 64, stages=3, warps=8),
        _config(128, 128, 64, stages=4, warps=8),
        _config(128, 128, 32, stages=4, warps=8),
        _config(128, 64, 64, stages=4, warps=4),
        _config(64, 128, 64, stages=4, warps=4),
        _config(64, 128, 64, stages=3, warps=4),
        _config(64, 64, 64, stages=4, warps=4),
        _config(64, 64, 32, stages=4, warps=4),
        _config(32, 64, 32, stages=4, warps=4),
        _config(16, 64, 32, stages=4, warps=4),
        _config(128, 256, 64, stages=3, warps=8, persistent=1),
        _config(128, 128, 64, stages=4, warps=8, persistent=1),
        _config(128, 128, 32, stages=3, warps=8, persistent=2),
        _config(64, 128, 64, stages=4, warps=4, persistent=2),
    ]


# The interpreter runs every operation of a program in Python, at a cost that grows far more
# slowly than the tile: a model's projections (N and K in the hundreds) run several times
# faster in 32 x 256 x 128 or 32 x 128 x 128 tiles than in 32 x 32 x 32 ones. A launch takes
# the widest of these that its N and K hold whole; smaller ones (the kernel tests' odd sizes)
# keep the small tile, and with it several tiles and K steps per launch.
INTERPRETER_WIDE_TILES = ((32, 256, 128), (32, 128, 128))


def interpreter_configs() -> list[triton.Config]:
    """The candidates under the interpreter: a 32 x 32 x 32 tile, its persistent twin, and
    the wide tiles (:data:`INTERPRETER_WIDE_TILES`), one of which :func:`kept_candidates`
    puts first where it fits the operands. Nothing is timed there: the first kept runs
    unless FASTBERT_AUTOTUNE pins another. The register and shared-memory limits of
    :func:`keep` concern GPU compiles: the wide tiles are never compiled for a GPU."""
    return [
        _config(32, 32, 32, stages=1, warps=4),
        _config(32, 32, 32, stages=1, warps=4, persistent=1),
        *(_config(*tile, stages=1, warps=4) for tile in INTERPRETER_WIDE_TILES),
    ]


def configs() -> list[triton.Config]:
    """The autotune candidates: :func:`gpu_configs`, or :func:`interpreter_configs` under the
    interpreter."""
    return interpreter_configs() if interpreting() else gpu_configs()


PERSISTENT_MIN_BLOCK_M = min(c.kwargs["BLOCK_M"] for c in configs() if c.kwargs["PERSISTENT"])


def shared_memory_bytes(config: triton.Config, element_size: int) -> int:
    """Bytes of shared memory the software pipeline holds: num_stages x (x tile + weight tile)."""
    meta = config.kwargs
    tile = meta["BLOCK_M"] * meta["BLOCK_K"] + meta["BLOCK_K"] * meta["BLOCK_N"]
    return config.num_stages * tile * element_size


def keep(
    config: triton.Config,
    element_size: int,
    m_bucket: int,
    *,
    activation: int,
    has_residual: bool,
    store_pre: bool = False,
    grad_activation: int = 0,
    row_sum: bool = False,
    has_descriptors: bool = False,
    gated: bool = False,
    gated_grad: int = 0,
) -> bool:
    """Whether ``config`` is worth timing for inputs of ``element_size`` bytes and M rows.

    A persistent config needs 16-bit inputs and a launch with TMA descriptors
    (``has_descriptors``: the launcher builds them only where they apply, see
    fused_linear's ``descriptors``).

    It must fit the shared memory of both targets, in float32 keep its K tile narrow enough
    for the FMA loop's registers, hold at most ``HEAVY_EPILOGUE_MAX_ACC_VALUES`` accumulator
    values per thread when the epilogue has an ``activation`` (a code of fused_linear's
    ``ACTIVATION_CODES``) or a residual (and int8 operands, ``element_size`` 1, at most
    ``INT8_MAX_ACC_VALUES`` whatever the epilogue), at most ``TRAINING_MAX_ACC_VALUES`` when it
    stores the pre-activation or the prologue applies a ``grad_activation`` (which also needs
    BLOCK_K <= GRAD_ACTIVATION_MAX_BLOCK_K), at most ``TRANSPOSED_MAX_OPERAND_VALUES``
    operand values per thread per K step for the dweight product (``row_sum``), and not have a
    row tile taller than M's bucket (those rows would only be masked work). ``gated`` (GATED)
    holds two accumulators: they count twice. ``gated_grad`` (GATED_GRAD, the gated backward's
    prologue, 1 for the dx product and 2 for dweight) counts as a ``grad_activation``, and its
    float32 dweight product keeps at most ``GATED_DWEIGHT_FP32_MAX_ACC_VALUES``.
    """
    meta = config.kwargs
    if meta["PERSISTENT"] and (element_size == 4 or not has_descriptors):
        return False
    if shared_memory_bytes(config, element_size) > SHARED_MEMORY_BUDGET:
        return False
    if element_size == 4 and meta["BLOCK_K"] > FP32_MAX_BLOCK_K:
        return False
    acc_values = meta["BLOCK_M"] * meta["BLOCK_N"] // (32 * config.num_warps)
    acc_values *= 2 if gated else 1
    if gated and element_size == 4 and acc_values > GATED_FP32_MAX_ACC_VALUES:
        return False
    fp32_gated_dweight = gated_grad == 2 and element_size == 4
    if fp32_gated_dweight and acc_values > GATED_DWEIGHT_FP32_MAX_ACC_VALUES:
        return False
    if (activation or has_residual) and acc_values > HEAVY_EPILOGUE_MAX_ACC_VALUES:
        return False
    if element_size == 1 and acc_values > INT8_MAX_ACC_VALUES:
        return False
    prologue = grad_activation or gated_grad
    if (store_pre or prologue) and acc_values > TRAINING_MAX_ACC_VALUES:
        return False
    if prologue and meta["BLOCK_K"] > GRAD_ACTIVATION_MAX_BLOCK_K:
        return False
    threads = 32 * config.num_warps
    operand_values = (meta["BLOCK_M"] + meta["BLOCK_N"]) * meta["BLOCK_K"] // threads
    if row_sum and operand_values > TRANSPOSED_MAX_OPERAND_VALUES:
        return False
    return meta["BLOCK_M"] <= m_bucket


def prune(candidates: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Autotuner hook: the configs ``keep`` allows for this launch (only one of them when
    FASTBERT_AUTOTUNE names it)."""
    args = {**named_args, **kwargs}
    element_size = args["x_ptr"].element_size()
    epilogue = {
        "activation": args["ACTIVATION"],
        "has_residual": bool(args["HAS_RESIDUAL"]),
        "store_pre": bool(args["STORE_PRE_ACTIVATION"]),
        "grad_activation": args["GRAD_ACTIVATION"],
        "row_sum": bool(args["HAS_ROW_SUM"]),
        "has_descriptors": bool(args["HAS_DESCRIPTORS"]),
        "gated": bool(args["GATED"]),
        "gated_grad": args["GATED_GRAD"],
    }
    kept = kept_candidates(
        candidates, element_size, args["M_BUCKET"], args["N"], args["K"], **epilogue
    )
    return tuned(kept)


def tile_of(config: triton.Config) -> tuple[int, int, int]:
    """A config's (BLOCK_M, BLOCK_N, BLOCK_K)."""
    return tuple(config.kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))


def kept_candidates(
    candidates: list[triton.Config], element_size: int, bucket: int, n: int, k: int, **variant
) -> list[triton.Config]:
    """The ``candidates`` that :func:`keep` allows for an [M, K] x [K, N] launch, in order;
    under the interpreter, first the widest wide tile that N and K hold whole, if any."""
    tiles = [c for c in candidates if tile_of(c) not in INTERPRETER_WIDE_TILES]
    # The interpreter's small tile is taller than the smallest M buckets: it runs them.
    kept = [c for c in tiles if keep(c, element_size, bucket, **variant)] or tiles[:1]
    wide = [c for c in candidates if c not in tiles]
    fitting = [c for c in wide if c.kwargs["BLOCK_N"] <= n and c.kwargs["BLOCK_K"] <= k]
    return fitting[:1] + kept


def config_name(config: triton.Config) -> str:
    """A config as the reports name it: "128x128x64 s4 w8", plus " persistent=P" for the
    persistent ones (P programs per SM)."""
    meta = config.kwargs
    tile = "x".join(map(str, tile_of(config)))
    persistent = f" persistent={meta['PERSISTENT']}" if meta["PERSISTENT"] else ""
    return f"{tile} s{config.num_stages} w{config.num_warps}{persistent}"


def m_bucket(m: int) -> int:
    """The autotune key for M: the next power of two, at least 16 (the smallest row tile)."""
    return max(16, next_power_of_2(m))
