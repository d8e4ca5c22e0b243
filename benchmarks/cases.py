"""What the suites share: a case is (model shape name, Shape, dtype name); its inputs are
random tensors shaped as fastbert's encoder feeds its ops."""

from __future__ import annotations

import torch

from fastbert.bench.shapes import Shape, model_config, sequence_lengths
from fastbert.model.config import BertConfig

Case = tuple[str, Shape, str]
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
DEVICE = "cuda"


def info(case: Case, op: str, impl: str) -> dict:
    """The identification filed with a measurement (read by fastbert.bench.targets)."""
    model, shape, dtype = case
    return {
        "op": op,
        "impl": impl,
        "model": model,
        "dtype": dtype,
        "batch": shape.batch,
        "seq": shape.seq,
        "padded": shape.padded,
    }


def config_and_dtype(case: Case) -> tuple[BertConfig, torch.dtype]:
    return model_config(case[0]), DTYPES[case[2]]


def key_padding_mask(shape: Shape) -> torch.Tensor:
    """[batch, seq] bool, True = real token (all True for a dense shape)."""
    lengths = torch.tensor(sequence_lengths(shape), device=DEVICE)
    return torch.arange(shape.seq, device=DEVICE)[None, :] < lengths[:, None]


def randn(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    return torch.randn(shape, generator=generator, device=DEVICE).mul_(scale).to(dtype)
