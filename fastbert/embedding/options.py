"""The options of an embedding job, validated once for the command, the Python API and the Ray
driver, and resolved against the device and the model folder (a model given by name is found
here, once)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from fastbert.embedding.quantized import PRECISIONS, check_ranges_apply
from fastbert.execution.arguments import positive_integer
from fastbert.integrations.model_names import FOLDER, resolve_model

# sentence-transformers' pooling modes (fastbert.model.pooling; `fastbert embed --help` names
# them too).
POOLINGS = ("mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
STORE_DTYPES = ("float32", "float16")
BACKENDS = ("auto", "torch", "triton")
QUANTIZATIONS = ("int8", "fp8")
BATCH_TOKENS = {"cuda": 16384, "cpu": 4096}
# int8 / uint8 ranges, without ranges or a calibration file: from this many of the job's rows.
CALIBRATION_ROWS = 1000


@dataclass(frozen=True)
class EmbedOptions:
    """What to embed with and how. None means "the default": for ``pooling``, ``normalize``
    and ``max_length`` what the model folder says (sentence-transformers' config; else mean
    pooling, no normalisation, the model's limit); for ``device`` CUDA when present; for
    ``dtype`` float16 on CUDA, float32 on the CPU; for ``batch_tokens`` 16384 on CUDA, 4096 on
    the CPU; for ``id_field`` the row number across all inputs. ``quantize``: None (exact),
    "int8" or "fp8" (the encoder's linears on int8 / float8 e4m3 weights and activations; on
    the CPU with dtype float32, on CUDA on sm_80 (int8) / sm_89 (fp8) or newer: see
    fastbert.model.quantization). ``precision``: how dense embeddings are stored, "float32" or
    quantized as sentence-transformers' ``quantize_embeddings`` does ("int8", "uint8", "binary",
    "ubinary": see :mod:`fastbert.embedding.quantized`); int8 / uint8 buckets span ``ranges``
    ([min per dimension], [max per dimension]) when given, else those of the embeddings of
    ``calibration`` (a file of texts, read as the inputs are), else of the job's first
    :data:`CALIBRATION_ROWS` rows.

    ``model``: a model folder, or a name :func:`~fastbert.integrations.model_names.resolve_model`
    finds (a model in the Hugging Face cache, a packaged model: ``all-MiniLM-L6-v2``,
    ``minilm``); the options hold its folder, and in ``name`` the name it was given by (None
    for a folder), which a server answers with and a manifest records."""

    model: str
    name: str | None = None
    text_field: str = "text"
    id_field: str | None = None
    batch_tokens: int | None = None
    max_length: int | None = None
    pooling: str | None = None
    normalize: bool | None = None
    dtype: str | torch.dtype | None = None  # held as its name
    store_dtype: str = "float32"
    device: str | None = None
    backend: str = "auto"
    quantize: str | None = None
    prompt_name: str | None = None
    prompt: str | None = None
    dimensions: int | None = None
    force_dimensions: bool = False
    max_active_dims: int | None = None
    precision: str = "float32"
    ranges: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    calibration: str | None = None
    skip_bad: bool = False
    overwrite: bool = False
    rows_per_shard: int = 50_000
    window_rows: int = 10_000
    progress: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.model, str | Path):
            raise ValueError(f"model: {self.model!r} is not a model folder or name")
        found = resolve_model(self.model)
        object.__setattr__(self, "model", str(found.folder))
        if found.source != FOLDER and self.name is None:
            object.__setattr__(self, "name", found.name)
        for name in (
            "batch_tokens",
            "max_length",
            "rows_per_shard",
            "window_rows",
            "dimensions",
            "max_active_dims",
        ):
            value = getattr(self, name)
            if value is not None:  # as plain ints: the manifest records them as JSON
                object.__setattr__(self, name, positive_integer(name, value))
        for name in ("normalize", "force_dimensions", "skip_bad", "overwrite", "progress"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):  # "false" would read as True
                raise ValueError(f"{name} must be True or False, got {value!r}")
        _check_choice("pooling", self.pooling, POOLINGS, none_ok=True)
        if isinstance(self.dtype, torch.dtype):  # torch.bfloat16 as "bfloat16"
            names = {value: name for name, value in DTYPES.items()}
            object.__setattr__(self, "dtype", names.get(self.dtype, self.dtype))
        _check_choice("dtype", self.dtype, tuple(DTYPES), none_ok=True)
        _check_choice("store_dtype", self.store_dtype, STORE_DTYPES)
        _check_choice("backend", self.backend, BACKENDS)
        _check_choice("quantize", self.quantize, QUANTIZATIONS, none_ok=True)
        if self.quantize and self.dtype not in (None, "float32"):
            if self.resolved_device().type == "cpu":
                raise ValueError(
                    f"quantize {self.quantize} on the CPU runs with float32 activations: give "
                    f"dtype float32 with it, or dtype {self.dtype} without quantize"
                )
        if self.store_dtype == "float16" and self.dtype in (None, "float32", "bfloat16"):
            raise ValueError(
                "store_dtype float16 needs dtype float16 (embeddings are stored "
                "in the precision they were computed in, or float32)"
            )
        for name in ("prompt_name", "prompt"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a string, got {value!r}")
        if self.prompt_name is not None and self.prompt is not None:
            raise ValueError("give prompt or prompt_name, not both")
        self._check_precision()
        if not self.text_field:
            raise ValueError("text_field must be a field name")
        if self.device is not None:
            try:
                device = torch.device(self.device)
            except RuntimeError:
                device = None
            if device is None or device.type not in ("cpu", "cuda"):
                raise ValueError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")

    def _check_precision(self) -> None:
        _check_choice("precision", self.precision, PRECISIONS)
        if self.precision != "float32" and self.store_dtype != "float32":
            raise ValueError(
                f"store_dtype {self.store_dtype} applies to float embeddings; precision "
                f"{self.precision} stores them quantized"
            )
        check_ranges_apply(self.precision, ranges=self.ranges, calibration=self.calibration)
        if self.ranges is not None and self.calibration is not None:
            raise ValueError("give ranges or calibration, not both")
        if self.ranges is not None:  # held as numbers, hashable, as the manifest records them
            try:
                ranges = tuple(tuple(float(v) for v in row) for row in self.ranges)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"ranges must be two lists of numbers: {exc}") from exc
            if len(ranges) != 2 or len(ranges[0]) != len(ranges[1]):
                raise ValueError("ranges must be two lists of numbers of one length (min, max)")
            object.__setattr__(self, "ranges", ranges)
        if self.calibration is not None and not Path(self.calibration).exists():
            raise ValueError(f"calibration: {self.calibration!r} does not exist")

    def resolved_device(self) -> torch.device:
        """The device to run on (None: CUDA when this machine has it); ValueError for CUDA on a
        machine without."""
        if self.device is None:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r}, but CUDA is not available here")
        return device

    def with_defaults(self, device: torch.device | None = None) -> EmbedOptions:
        """These options with the device-dependent defaults filled in (device, dtype,
        batch_tokens), for ``device`` when given (a Ray worker's), else this machine's."""
        device = device or self.resolved_device()
        dtype = self.dtype or ("float16" if device.type == "cuda" else "float32")
        batch_tokens = self.batch_tokens or BATCH_TOKENS[device.type]
        return replace(self, device=str(device), dtype=dtype, batch_tokens=batch_tokens)

    def as_dict(self) -> dict:
        return asdict(self)


def _check_choice(name: str, value: object, choices: tuple, none_ok: bool = False) -> None:
    if value is None and none_ok:
        return
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
