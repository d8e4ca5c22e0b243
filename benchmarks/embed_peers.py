"""ONNX Runtime and OpenVINO as contenders of the corpus-embedding benchmark
(benchmarks/embed_bench.py), each fed the batches fastbert's pipeline forms.

The model folder's transformer is exported once to ONNX with ``torch.onnx.export`` (the
TorchScript exporter, Hugging Face's eager attention: the graph ONNX Runtime's BERT fusions
recognise), then

- ``ort-fp32``: the graph fused by ``onnxruntime.transformers.optimizer`` (model_type "bert",
  the model's own head count and width: Attention, EmbedLayerNormalization,
  SkipLayerNormalization and BiasGelu nodes), run by ONNX Runtime in float32;
- ``ort-int8``: that fused graph through ``onnxruntime.quantization.quantize_dynamic``,
  int8 weights per output channel, uint8 activations quantised per tensor at run time (U8S8,
  the quantiser's default; ONNX Runtime's guide asks for 7-bit reduce_range only on x86-64
  CPUs without VNNI, against saturation);
- ``openvino-fp32``, ``openvino-bf16``: the exported (unfused) graph compiled by OpenVINO for
  the CPU with the inference precision hint f32 or bf16 (a CPU without native bf16 runs what
  OpenVINO chooses instead; the compiled model's own precision is what is recorded).

The files are cached under ``$FASTBERT_CACHE`` (default ``~/.cache/fastbert``) in
``peers/<model>-<key>``, the key a hash of the transformer folder's files and the versions of
torch, transformers, onnx and onnxruntime, so a new version of any of them exports again;
the fused and int8 graphs are made there when first needed.

Every contender pools and normalises as the model folder says (its Pooling and Normalize
modules, fastbert.model.sentence_folder); folders with other modules are not run here. The
packages are imported here only, when a peer is built: install them with
``pip install 'fastbert[peers]'``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fastbert.embedding import model as embed_model
from fastbert.model.loading import transformer_folder
from fastbert.model.pooling import POOLINGS
from fastbert.model.sentence_folder import read_folder

INSTALL = "pip install 'fastbert[peers]'"
ONNX_OPSET = 17
EXPORTED, FUSED, INT8 = "model.onnx", "model-fused.onnx", "model-fused-int8.onnx"


@dataclass(frozen=True)
class Peer:
    """One contender: its row name, the packages it needs, the precision it runs and the
    least cosine against sentence-transformers fp32 it is held to."""

    name: str
    packages: tuple[str, ...]
    precision: str
    min_cosine: float


# The bounds: float32 graphs compute what sentence-transformers does, to rounding; bf16 keeps
# 8 bits of mantissa (OpenVINO bf16 measured 0.99996 least cosine on 1,000 paragraphs of
# pydoc_data.topics with all-MiniLM-L6-v2); dynamic int8 (weights per channel, activations
# quantised per batch tensor at run time) measured 0.971 least cosine over the whole corpus
# (2,608 paragraphs, mean 0.992), 0.974 on 1,000 and 0.976 on 200, its 4-token paragraphs
# ("Note:") the worst, and 0.984 on 4,000 English sentences; per-tensor weights, ONNX
# Runtime's default, measured 0.897 there and are not offered.
PEERS = {
    "ort-fp32": Peer("onnxruntime fp32 (fused graph)", ("onnxruntime", "onnx"), "float32", 0.9999),
    "ort-int8": Peer(
        "onnxruntime int8 (dynamic, per channel)", ("onnxruntime", "onnx"), "int8", 0.96
    ),
    "openvino-fp32": Peer("openvino fp32", ("openvino", "onnx"), "float32", 0.9999),
    "openvino-bf16": Peer("openvino bf16", ("openvino", "onnx"), "bfloat16", 0.999),
}
PACKAGES = ("onnx", "onnxruntime", "openvino")


def installed(key: str) -> bool:
    """Whether every package peer ``key`` needs can be imported."""
    return all(importlib.util.find_spec(p) is not None for p in PEERS[key].packages)


def available() -> list[str]:
    """The keys of the peers whose packages are installed, in PEERS' order."""
    return [key for key in PEERS if installed(key)]


def versions() -> dict[str, str | None]:
    """package -> installed version (None when absent) of the peers' packages."""
    return {p: _version(p) for p in PACKAGES}


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


class PeerPipeline:
    """Batches of token ids -> pooled embeddings (numpy float32 [n, hidden]), the interface
    of fastbert.embedding.model.FolderPipeline, computed by another runtime.

    ``forward``: {input name: int64 array [n, longest]} -> last hidden state [n, longest,
    hidden] (float32); ``inputs``: the names the graph takes (of input_ids, attention_mask,
    token_type_ids); ``details``: what is recorded beside the results (precision that ran,
    threads, fused or quantised nodes).
    """

    # Batched as fastbert's packed path is (a batch's budget counts its tokens), so that a peer
    # runs the very batches fastbert runs; the peer pads each batch itself.
    packed = True

    def __init__(
        self,
        forward: Callable[[dict[str, np.ndarray]], np.ndarray],
        inputs: list[str],
        pad_id: int,
        pooling: str,
        normalize: bool,
        dimensions: int,
        details: dict,
    ):
        self.forward = forward
        self.inputs = inputs
        self.pad_id = pad_id
        self.pool = POOLINGS[pooling]
        self.normalize = normalize
        self.dimensions = dimensions
        self.details = details

    def __call__(self, tokens: list[list[int]]) -> np.ndarray:
        """token ids of n rows -> embeddings [n, hidden], float32, normalised when the folder
        says so."""
        input_ids, mask, _ = embed_model.pad(tokens, None, self.pad_id, torch.device("cpu"))
        feeds = {
            "input_ids": input_ids.numpy(),
            "attention_mask": mask.numpy(),
            "token_type_ids": np.zeros_like(input_ids.numpy()),
        }
        hidden = self.forward({name: feeds[name] for name in self.inputs})
        pooled = self.pool(torch.from_numpy(np.asarray(hidden, np.float32)), mask)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.numpy()


def build(
    key: str, folder: Path, threads: int, cache: Path | None = None, name: str | None = None
) -> PeerPipeline:
    """The encoder of peer ``key`` for the sentence-transformers (or Hugging Face) model
    ``folder`` (called ``name`` in the cache, default the folder's name), running on
    ``threads`` CPU threads. ValueError naming the install command when a package it needs is
    missing."""
    if key not in PEERS:
        raise ValueError(f"unknown peer {key!r}: one of {', '.join(PEERS)}")
    if not installed(key):
        missing = [p for p in PEERS[key].packages if importlib.util.find_spec(p) is None]
        raise ValueError(f"peer {key} needs {', '.join(missing)}: {INSTALL}")
    files = exported(folder, cache, name)
    config = json.loads((files / "export.json").read_text())
    if key.startswith("ort-"):
        path, nodes = fused(files, config)
        if key == "ort-int8":
            path, nodes = quantized(files, path)
        forward, inputs, details = _onnxruntime(path, threads)
        details["nodes"] = nodes
    else:
        forward, inputs, details = _openvino(files / EXPORTED, threads, PEERS[key].precision)
    pooling, normalize = _pooling(folder)
    details.update(files=str(files), opset=ONNX_OPSET)
    return PeerPipeline(
        forward, inputs, config["pad_token_id"], pooling, normalize, config["hidden_size"], details
    )


def _pooling(folder: Path) -> tuple[str, bool]:
    """(the folder's pooling mode, whether it normalises) for a folder of a Transformer, one
    Pooling mode and an optional Normalize; ValueError for any other folder."""
    spec = read_folder(folder)
    names = [m.class_name for m in spec.modules]
    if names not in (["Pooling"], ["Pooling", "Normalize"]):
        raise ValueError(f"{folder}: the peers run a Pooling and a Normalize module, not {names}")
    mode = embed_model.pooling_name(spec)
    if mode not in POOLINGS:
        raise ValueError(f"{folder}: the peers pool with one mode, not {mode}")
    return mode, embed_model.ends_with_normalize(spec)


def _onnxruntime(path: Path, threads: int) -> tuple[Callable, list[str], dict]:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    inputs = [i.name for i in session.get_inputs()]
    return (lambda feeds: session.run(None, feeds)[0]), inputs, {"threads": threads}


def _openvino(path: Path, threads: int, precision: str) -> tuple[Callable, list[str], dict]:
    import openvino

    core = openvino.Core()
    hint = {"float32": "f32", "bfloat16": "bf16"}[precision]
    compiled = core.compile_model(
        core.read_model(str(path)),
        "CPU",
        {
            "INFERENCE_PRECISION_HINT": hint,
            "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY",
        },
    )
    request = compiled.create_infer_request()
    inputs = [i.get_any_name() for i in compiled.inputs]

    def forward(feeds: dict[str, np.ndarray]) -> np.ndarray:
        return request.infer(feeds)[compiled.outputs[0]]

    ran = compiled.get_property("INFERENCE_PRECISION_HINT")
    details = {
        "threads": compiled.get_property("INFERENCE_NUM_THREADS"),
        "performance_hint": str(compiled.get_property("PERFORMANCE_HINT")),
        "precision_hint": hint,
        "precision_ran": str(ran.get_type_name() if hasattr(ran, "get_type_name") else ran),
    }
    return forward, inputs, details


def cache_root(cache: Path | None = None) -> Path:
    """Where exported graphs are kept: ``cache`` or ``$FASTBERT_CACHE`` or
    ``~/.cache/fastbert``, then ``peers``."""
    root = cache or Path(os.environ.get("FASTBERT_CACHE", Path.home() / ".cache" / "fastbert"))
    return root / "peers"


def cache_key(folder: Path) -> str:
    """A hash of the transformer folder's files (names and contents) and of the versions
    that shape the exported graphs."""
    digest = hashlib.sha256()
    source = transformer_folder(folder)
    for path in sorted(p for p in source.iterdir() if p.is_file()):
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    for package in ("torch", "transformers", "onnx", "onnxruntime"):
        digest.update(f"{package}={_version(package)}".encode())
    return digest.hexdigest()[:16]


def exported(folder: Path, cache: Path | None = None, name: str | None = None) -> Path:
    """The cache folder of ``folder``'s model (``name``-<key>), holding its exported graph and
    export.json (hidden size, heads, pad id, inputs), exported on the first call for this
    cache key."""
    folder = Path(folder)
    target = cache_root(cache) / f"{name or folder.name}-{cache_key(folder)}"
    if (target / "export.json").exists():
        return target
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    config = export_onnx(folder, partial / EXPORTED)
    (partial / "export.json").write_text(json.dumps(config, indent=2) + "\n")
    try:
        partial.rename(target)
    except OSError:  # another process made it first
        shutil.rmtree(partial, ignore_errors=True)
    return target


def fused(files: Path, config: dict) -> tuple[Path, dict[str, int]]:
    """The fused graph in ``files`` (made on the first call) and the count of each fused node
    in it."""
    path, counts = files / FUSED, files / "fused-nodes.json"
    if not counts.exists():
        nodes = fuse(files / EXPORTED, _partial(path), config)
        _partial(path).rename(path)
        counts.write_text(json.dumps(nodes) + "\n")
    return path, json.loads(counts.read_text())


def quantized(files: Path, source: Path) -> tuple[Path, dict[str, int]]:
    """The int8 graph of ``source`` in ``files`` (made on the first call) and the count of
    each quantised node in it."""
    import onnx

    path = files / INT8
    if not path.exists():
        quantize(source, _partial(path))
        _partial(path).rename(path)
    graph = onnx.load(str(path), load_external_data=False).graph
    counts: dict[str, int] = {}
    for node in graph.node:
        if node.op_type.startswith(("Q", "DynamicQuantize")) or node.op_type.endswith("Integer"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return path, dict(sorted(counts.items()))


def _partial(path: Path) -> Path:
    """Where this process writes ``path`` before renaming it into place."""
    return path.with_name(f"{path.name}.partial-{os.getpid()}")


def export_onnx(folder: Path, path: Path) -> dict:
    """Export the transformer of ``folder`` (its last hidden state from input_ids,
    attention_mask and, where the model takes them, token_type_ids; batch and sequence
    dynamic) to ``path``; the model's hidden size, heads and pad id."""
    from fastbert.integrations import models

    with models.quiet():
        hf = models.import_transformers().AutoModel.from_pretrained(
            str(transformer_folder(folder)), attn_implementation="eager"
        )
    hf.eval()
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in inspect.signature(hf.forward).parameters:
        names.append("token_type_ids")

    class LastHiddenState(torch.nn.Module):
        def __init__(self, model: torch.nn.Module):
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.model(**dict(zip(names, tensors))).last_hidden_state

    # Two rows, the second padded: the traced graph keeps the mask's path.
    input_ids = torch.full((2, 16), 1000, dtype=torch.int64)
    mask = torch.ones_like(input_ids)
    mask[1, 9:] = 0
    example = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": 0 * mask}
    axes = {0: "batch", 1: "sequence"}
    with torch.no_grad(), warnings.catch_warnings():
        # Not news: the TorchScript exporter is deprecated but chosen (its graph is the one
        # ONNX Runtime's fusions match; the torch.export-based one needs onnxscript), and the
        # mask's branch on a padding length is traced as a constant (it is 0 in an encoder,
        # whose mask is as long as the keys).
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            LastHiddenState(hf),
            tuple(example[n] for n in names),
            str(path),
            dynamo=False,
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes={n: axes for n in [*names, "last_hidden_state"]},
            opset_version=ONNX_OPSET,
        )
    return {
        "model": folder.name,
        "hidden_size": hf.config.hidden_size,
        "num_heads": hf.config.num_attention_heads,
        "pad_token_id": hf.config.pad_token_id or 0,
        "inputs": names,
    }


def fuse(source: Path, target: Path, config: dict) -> dict[str, int]:
    """ONNX Runtime's BERT fusions of ``source`` into ``target``; the count of each fused
    node made."""
    from onnxruntime.transformers import optimizer

    optimized = optimizer.optimize_model(
        str(source),
        model_type="bert",
        num_heads=config["num_heads"],
        hidden_size=config["hidden_size"],
        opt_level=0,
    )
    optimized.save_model_to_file(str(target))
    return {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}


def quantize(source: Path, target: Path) -> None:
    """Dynamic int8 of ``source`` into ``target``: weights int8 per output channel."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(source),
        str(target),
        per_channel=True,
        weight_type=QuantType.QInt8,
        # The fused nodes (com.microsoft domain) defeat ONNX's shape inference: their outputs
        # are float32.
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
