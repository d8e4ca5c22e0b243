"""Dynamic int8 and fp8: the quantised copies of an encoder layer's linear weights, kept current.

With ``quantize="int8"`` the four linears of every layer (the fused QKV projection, the
attention output, the two FFN projections) run on int8 operands: each weight is quantised once
per output channel (:func:`fastbert.kernels.reference.quantize_weight`: int8 [N, K] and
float32 [N] scales), the activations per token at run time, the products accumulate in int32
and are dequantised in the GEMM's epilogue before the bias, GELU and residual. Attention,
LayerNorm, softmax, the embeddings, the pooler and the heads stay in floating point.
``quantize="fp8"`` does the same with float8 e4m3 operands (scales max / 448, each value
rounded to the nearest e4m3) and float32 accumulation.

Outlier channels. The two linears fed by a LayerNorm (QKV and the FFN's first) read
activations with a few channels 10 to 30 times the others (all-MiniLM-L6-v2: channel 99 up to
30 where the median channel reaches 2), which per-token int8 would leave with few levels for
the rest. Those two are smoothed as SmoothQuant does (Xiao et al., 2022): per input channel j,
s_j = sqrt(max |x_j| / max_n |W[n, j]|) moves the outliers into the weight (x_j / s_j and
W[:, j] * s_j: the same product). max |x_j| is measured once, when the model is quantised, by
a float forward of CALIBRATION_SHAPE random token ids (seeded: the same factors every time):
outlier channels are properties of the weights, which any tokens show. On all-MiniLM-L6-v2
and 400 sentences of real text, smoothing raised the least cosine similarity to the float32
embeddings from 0.991 to 0.996 and the mean from 0.9973 to 0.9989. fp8 is smoothed the same
way (e4m3's relative precision is the same at every magnitude, but values below 2^-6 of a
row's maximum lose it as subnormals: an outlier channel pushes a row's others there).

The float weights stay the model's parameters: ``state_dict``, ``save_pretrained`` and a
Hugging Face model's own modules see them unchanged, and the int8 copies (plain tensors held by
the layer, in no ``state_dict``) are derived from them. Before every call the model checks that
each of its parameters is still the tensor it quantised from, at the same address and PyTorch
version counter (bumped by every in-place write: ``load_state_dict``, ``copy_`` under
``no_grad``, an optimizer step), the Hugging Face query, key and value parameters of a
fastbert.optimize model included (views of its fused QKV tensor: a write through one bumps
its counter, not the fused tensor's), and calibrates and quantises again when one changed, in place
where the shapes and device allow (a CUDA graph captured earlier then reads the new values).
A write through ``weight.data`` bypasses the version counter: set ``model.quantize`` again
after one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch

from fastbert.kernels.optimizer_steps import values_version
from fastbert.kernels.reference import quantize_weight

# The linears of a layer that run quantised, by their weight's name.
QUANTIZED_LINEARS = ("qkv_weight", "attn_out_weight", "ffn_in_weight", "ffn_out_weight")
# Those fed by a LayerNorm, whose outlier channels are smoothed into the weight.
SMOOTHED_LINEARS = ("qkv_weight", "ffn_in_weight")
SMOOTHING_ALPHA = 0.5
# Random token ids of the calibration forward: [batch, sequence] (the sequence capped by the
# model's positions), drawn from the upper 90% of the vocabulary (BERT's first ids are
# special and unused tokens).
CALIBRATION_SHAPE = (8, 128)
CALIBRATION_SEED = 0
# Floor of the maxima in the smoothing factors (a channel that is zero everywhere).
SMOOTHING_FLOOR = 1e-5


class _HeldMemory:
    """The parameters' memory, held by a key (equal to any other, so that keys compare by
    their addresses and versions alone): while a key lives, no parameter given new memory
    (``param.data = ...``) can be handed an address the key holds."""

    __slots__ = ("storages",)

    def __init__(self, storages: list) -> None:
        self.storages = storages

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _HeldMemory)

    def __hash__(self) -> int:
        return 0


def parameters_key(module: torch.nn.Module, extra: Iterable[torch.Tensor] = ()) -> tuple:
    """What identifies the values of ``module``'s parameters (and of the ``extra`` tensors):
    see :func:`tensors_key`."""
    return tensors_key([*module.parameters(), *extra])


def tensors_key(params: list[torch.Tensor]) -> tuple:
    """What identifies the values of ``params``: each one's address and version (its counter
    and the fused optimizer steps that write without it:
    fastbert.kernels.optimizer_steps.values_version), and
    the device; the key holds their memory (see _HeldMemory). A parameter made under
    torch.inference_mode has no version counter (and can change only inside it): its address
    alone."""
    device = params[0].device if params else None
    held = _HeldMemory([p.untyped_storage() for p in params])
    pairs = ((p.data_ptr(), None if p.is_inference() else values_version(p)) for p in params)
    return (device, *pairs, held)


def smoothing_scale(activation_max: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The input scale (float32 [K]) that multiplies the activations, 1 / s_j with
    s_j = max|x_j|^alpha / max_n |W[n, j]|^(1 - alpha); the weight's columns are divided by it."""
    a = activation_max.float().clamp(min=SMOOTHING_FLOOR)
    w = weight.detach().float().abs().amax(dim=0).clamp(min=SMOOTHING_FLOOR)
    return (w ** (1 - SMOOTHING_ALPHA) / a**SMOOTHING_ALPHA).contiguous()


@dataclasses.dataclass
class QuantizedWeight:
    """One quantised weight: int8 or float8_e4m3fn [N, K], float32 [N] scales, and the float32
    [K] input scale (None for a linear that is not smoothed)."""

    weight: torch.Tensor
    scale: torch.Tensor
    input_scale: torch.Tensor | None


class QuantizedWeights:
    """The quantised copies of one layer's linear weights (:data:`QUANTIZED_LINEARS`), in
    ``format`` ("int8" or "fp8")."""

    def __init__(self, format: str) -> None:
        self.format = format
        self.weights: dict[str, QuantizedWeight] = {}

    def __getitem__(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        entry = self.weights[name]
        return entry.weight, entry.scale, entry.input_scale

    @torch.no_grad()
    @torch.inference_mode(False)
    def quantize(self, layer: torch.nn.Module, activation_max: dict[str, torch.Tensor]) -> None:
        """Quantise ``layer``'s weights, smoothing those of :data:`SMOOTHED_LINEARS` with the
        ``activation_max`` of their inputs (float32 [K] each), into the tensors held already
        where the shapes and device match. The tensors are never inference tensors, even when
        made under ``torch.inference_mode()``: their version counters tell the CPU engine's
        packed copies (fastbert.kernels.packed_weights) that they were written."""
        for name in QUANTIZED_LINEARS:
            weight = getattr(layer, name).detach()
            input_scale = None
            if name in SMOOTHED_LINEARS:
                input_scale = smoothing_scale(activation_max[name], weight)
                weight = weight.float() / input_scale
            q, scale = quantize_weight(weight, self.format)
            new = QuantizedWeight(q, scale, input_scale)
            old = self.weights.get(name)
            if old is None or not _same_layout(old, new):
                self.weights[name] = new
                continue
            for mine, theirs in ((old.weight, q), (old.scale, scale)):
                mine.copy_(theirs)
            if input_scale is not None:
                old.input_scale.copy_(input_scale)


def _same_layout(a: QuantizedWeight, b: QuantizedWeight) -> bool:
    pairs = [(a.weight, b.weight), (a.scale, b.scale)]
    if (a.input_scale is None) != (b.input_scale is None):
        return False
    if a.input_scale is not None:
        pairs.append((a.input_scale, b.input_scale))
    return all(x.shape == y.shape and x.device == y.device for x, y in pairs)


def calibration_ids(vocab_size: int, max_positions: int, device: torch.device) -> torch.Tensor:
    """The calibration forward's token ids: int64 [batch, sequence] (:data:`CALIBRATION_SHAPE`),
    seeded."""
    batch, seq = CALIBRATION_SHAPE
    seq = min(seq, max_positions)
    generator = torch.Generator().manual_seed(CALIBRATION_SEED)
    ids = torch.randint(vocab_size // 10, vocab_size, (batch, seq), generator=generator)
    return ids.to(device)
