"""What the subcommands share: argument types that validate as argparse parses, the device,
dtype, backend and quantize options, and the two ways a command fails (see fastbert/cli.py for
the exit codes)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that need it: building the parser (--help) must not.
DEVICE_TYPES = ("cpu", "cuda")


class UsageError(ValueError):
    """A bad option found after parsing: the command exits 2 with its usage line, as argparse
    does for the errors it finds itself."""


class CommandError(RuntimeError):
    """The command could not do its job (a package missing, nothing measured): exit 1 with a
    one-line message."""


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or a positive integer, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """argparse type: a number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be zero or a positive number, got {text!r}")
    return value


def fraction(text: str) -> float:
    """argparse type: a number between 0 and 1, both excluded."""
    value = nonnegative_float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def device(text: str) -> str:
    """argparse type: "cpu", "cuda" or "cuda:N"."""
    import torch

    try:
        parsed = torch.device(text)
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in DEVICE_TYPES:
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text!r}")
    return text


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", type=device, default=None, help="cpu, cuda or cuda:N (default: cuda if present)"
    )


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """--backend of the commands that run fastbert's model on the device's default backend."""
    parser.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "torch", "triton"),
        help="fastbert's backend (auto: Triton on CUDA, PyTorch elsewhere; "
        "triton on a CPU needs TRITON_INTERPRET=1)",
    )


def resolve_device(name: str | None) -> torch.device:
    """The device of ``--device`` (None: CUDA when present, else the CPU); UsageError when it
    names CUDA and there is none."""
    import torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    chosen = torch.device(name)
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}, but CUDA is not available here")
    return chosen


def add_quantize_argument(parser: argparse.ArgumentParser) -> None:
    """--quantize of the commands that load a model for inference."""
    parser.add_argument(
        "--quantize",
        choices=("int8", "fp8"),
        default=None,
        help="int8 / fp8: the encoder's linears on int8 / float8 e4m3 weights (per channel) "
        "and activations (per token), for speed at a small accuracy cost; fp8 needs an sm_89 "
        "or newer GPU (on a CPU it is an emulation, for accuracy only) (default: exact, "
        "unquantised)",
    )


def add_inference_arguments(parser: argparse.ArgumentParser) -> None:
    """--device, --dtype, --backend and --quantize of the commands that load a model for
    inference (embed, serve); left out, each is the device's default."""
    add_device_argument(parser)
    parser.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        default=None,
        help="compute dtype (default: float16 on CUDA, float32 on the CPU)",
    )
    add_backend_argument(parser)
    add_quantize_argument(parser)


def add_batch_tokens_argument(parser: argparse.ArgumentParser, flag: str) -> None:
    """The token budget of one forward pass (``flag``: --batch-tokens, or the server's
    --max-batch-tokens); left out, the device's default."""
    parser.add_argument(
        flag,
        type=positive_int,
        default=None,
        metavar="N",
        help="tokens per forward pass (rows x longest row on the padded route; default: "
        "16384 on CUDA, 4096 on the CPU)",
    )


def inference_options(args: argparse.Namespace) -> dict[str, str | None]:
    """The values of :func:`add_inference_arguments`' options, by the names of the keyword
    arguments that take them (EmbedOptions', BertModel's)."""
    return {name: getattr(args, name) for name in ("device", "dtype", "backend", "quantize")}
