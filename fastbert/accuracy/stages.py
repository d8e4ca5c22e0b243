"""fastbert against Hugging Face fp32, layer by layer: the library behind ``fastbert accuracy``.

For one model (the packaged all-MiniLM-L6-v2, a local checkpoint folder, or a random config),
Hugging Face's masked-LM model runs in float32 as the reference; fastbert runs the same weights
in each dtype. Compared at real-token positions only, per stage:

- ``embeddings`` and ``layer 1..N``: the hidden states [B, S, H] after each stage (in a
  pre-norm model, ModernBERT, the last one after the final LayerNorm, as Hugging Face reports
  it: ``layer N + final norm``);
- ``mlm logits`` [B, S, vocab]: also argmax agreement (fraction of tokens whose top token is
  the same) and top-5 agreement (mean overlap of the two top-5 sets, 0..1);
- ``sentence embedding`` [B, H]: the mean-pooled last hidden state (what sentence-transformers
  returns before normalising).

Each entry holds max and mean absolute error, the minimum and mean cosine similarity (per
token, or per sentence), and, for dtypes other than float32, the max error of Hugging Face
itself in that dtype (the yardstick of FlashAttention's rule: fastbert should stay within about
twice it).

fastbert runs dense (``padding_free=False``, ``cuda_graphs=False``) so that each layer's
output is the padded [B, S, H] batch; its per-layer outputs are read with forward hooks on
``model.embeddings`` and ``model.layers[i]``, the last one from ``model.encode``. A checkpoint
without a masked-LM head gets a random one (seeded), the same weights on both sides.

Families: "bert" runs fastbert's own ``BertForMaskedLM``. Another family fastbert supports
(roberta, xlm-roberta, electra, distilbert, mpnet, modernbert: see fastbert.model.families;
:func:`random_config` gives each its random config) runs through
``fastbert.optimize`` on a copy of the Hugging Face masked-LM model: fastbert's encoder under
Hugging Face's head; the per-stage outputs come from hooks on the encoder it installed.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import warnings
from collections.abc import Callable
from typing import Any, TextIO

import torch
import torch.nn.functional as F

from fastbert.accuracy.precision_report import JsonReport, model_path
from fastbert.accuracy.precisions import PRECISIONS, precision, runnable
from fastbert.bench.models import load_checked
from fastbert.bench.progress import Progress
from fastbert.bench.shapes import MODEL_SHAPES, padded_batch
from fastbert.integrations import models as hf_models
from fastbert.integrations.optimize import optimize
from fastbert.kernels import launch
from fastbert.model.encoder import BertModel
from fastbert.model.families import family_of_model_type
from fastbert.model.heads import BertForMaskedLM
from fastbert.model.pooling import mean_pool

TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Stock markets fell sharply on Monday after the central bank raised interest rates by "
    "half a percentage point, the largest increase in two decades.",
    "Is this the right way to the station?",
    "def attention(q, k, v): return softmax(q @ k.T / sqrt(d)) @ v",
    "Die Katze schläft auf dem Sofa, während es draußen regnet.",
    "Order #4521: 3 x USB-C cables ($12.99 each), shipped 2024-03-17.",
    "no no no no no no no no no no",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
)
# The plain dtypes by name (fp32, fp16, bf16): the precisions without quantize.
DTYPE_NAMES = {
    p.name: p.compute_dtype(torch.device("cpu")) for p in PRECISIONS if p.quantize is None
}


def compute_dtype(name: str, device: torch.device) -> torch.dtype:
    """The floating dtype precision ``name`` computes in on ``device``."""
    return precision(name).compute_dtype(device)


def quantization(name: str) -> str | None:
    """The ``quantize`` argument of precision ``name`` (None for a plain dtype)."""
    return precision(name).quantize


MINILM = "minilm"
RANDOM = "random"
# Under the Triton interpreter a vocab-wide GEMM takes about a minute (30522 columns): above
# this many columns the masked-LM head is Hugging Face's fp32 head on fastbert's last hidden
# state instead of fastbert's own head.
INTERPRETER_MAX_VOCAB = 4096
# The random configs: the benchmarks' bert-mini shape (small enough for the interpreter, head
# dim 64: the kernels' common case) with a vocabulary of 1000.
RANDOM_CONFIG = dict(MODEL_SHAPES["bert-mini"], vocab_size=1000, max_position_embeddings=512)
# ModernBERT's sliding layers attend to this many positions in all (half on each side of the
# query): fewer than the longer built-in texts have (up to 16 tokens under the interpreter),
# so the comparison exercises the window.
RANDOM_LOCAL_ATTENTION = 8


def random_config(family: str) -> dict[str, Any]:
    """The Hugging Face config values of ``--model random`` for ``family`` (a model_type).

    bert-mini's size (RANDOM_CONFIG) in each family's own structure: MPNet keeps
    mpnet-base's relative-position buckets, LayerNorm eps and position offset; ModernBERT keeps
    ModernBERT-base's layer alternation (a global layer every third, the others sliding), RoPE
    bases, LayerNorm eps and GeGLU width ratio (1.5 x hidden), with a window of
    RANDOM_LOCAL_ATTENTION and its special token ids inside the small vocabulary.
    """
    if family == "mpnet":
        return {**MODEL_SHAPES["mpnet-base"], **RANDOM_CONFIG, "max_position_embeddings": 514}
    if family == "modernbert":
        hidden = RANDOM_CONFIG["hidden_size"]
        return {
            **MODEL_SHAPES["modernbert-base"],
            **RANDOM_CONFIG,
            "intermediate_size": hidden * 3 // 2,
            "local_attention": RANDOM_LOCAL_ATTENTION,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "cls_token_id": 1,
            "eos_token_id": 2,
            "sep_token_id": 2,
        }
    return dict(RANDOM_CONFIG)


def _refuse_unrunnable_quantize(dtypes: list[str], family: str, constants: dict) -> None:
    """ValueError, before any stage runs, for a quantised precision of a family whose gated
    (GeGLU) FFNs the int8 / fp8 linears do not run."""
    quantized = [name for name in dtypes if quantization(name) is not None]
    if quantized and constants.get("glu"):
        raise ValueError(
            f"{', '.join(quantized)}: quantised linears do not run the gated (GeGLU) FFNs of "
            f"{family} models; leave {' and '.join(quantized)} out of the precisions"
        )


@dataclasses.dataclass
class Entry:
    """One compared stage. Errors are absolute, over real-token positions, in float32."""

    name: str
    max_abs_err: float
    mean_abs_err: float
    cosine_min: float
    cosine_mean: float
    hf_max_abs_err: float | None = None  # Hugging Face's own error in this dtype
    argmax_agreement: float | None = None
    top5_agreement: float | None = None


@dataclasses.dataclass
class DtypeResult:
    dtype: str
    layers: list[Entry]
    outputs: list[Entry]


@dataclasses.dataclass
class Report(JsonReport):
    model: str
    family: str
    device: str
    backend: str
    interpreter: bool
    texts: int
    tokens: int
    max_length: int
    head: str
    results: list[DtypeResult]
    notes: list[str]


@dataclasses.dataclass
class Run:
    """What one model computed: the hidden states after each stage, and the logits."""

    hidden_states: list[torch.Tensor]  # [B, S, H] each: embeddings, then every layer
    logits: torch.Tensor  # [B, S, vocab]


def supported_dtypes(device: torch.device, backend: str) -> list[str]:
    """The plain dtypes fastbert runs here (the precisions without ``quantize``: those run
    only when named): bf16 needs a GPU that has it, or the torch backend on a CPU."""
    return [name for name in runnable(device, backend) if precision(name).quantize is None]


def compare(got: torch.Tensor, ref: torch.Tensor, valid: torch.Tensor | None, name: str) -> Entry:
    """got, ref: [..., C] (any dtype); valid: bool mask over the leading dims, or None (all)."""
    got, ref = got.float(), ref.float()
    if valid is not None:
        got, ref = got[valid], ref[valid]
    diff = (got - ref).abs()
    # In float64: float32's own rounding put identical vectors at 0.9999994 to 1.0000002.
    cosine = F.cosine_similarity(got.double(), ref.double(), dim=-1)
    return Entry(
        name, diff.max().item(), diff.mean().item(), cosine.min().item(), cosine.mean().item()
    )


def top_k_agreement(got: torch.Tensor, ref: torch.Tensor, valid: torch.Tensor) -> tuple:
    """(argmax agreement, mean top-5 overlap) of logits [B, S, V] at valid positions."""
    got, ref = got.float()[valid], ref.float()[valid]
    argmax = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    k = min(5, ref.shape[-1])
    top_got, top_ref = got.topk(k, dim=-1).indices, ref.topk(k, dim=-1).indices
    overlap = (top_got[:, :, None] == top_ref[:, None, :]).any(-1).float().sum(-1) / k
    return argmax, overlap.mean().item()


def load_reference(model: str, family: str, seed: int = 0) -> tuple[Any, Any, str, list[str]]:
    """(Hugging Face masked-LM model in fp32 on the CPU, tokenizer or None, label, notes).

    model: "random" (a random config of ``family``, a transformers model_type), a model name
    ("minilm": the packaged all-MiniLM-L6-v2; a Hugging Face id in its cache) or a local
    checkpoint folder (its config names the family).
    """
    notes: list[str] = []
    torch.manual_seed(seed)
    if model == RANDOM:
        return (
            hf_models.random_masked_lm(family, **random_config(family)),
            None,
            f"random {family}",
            notes,
        )
    path, label = model_path(model, also=(RANDOM,))
    hf, has_head = load_checked(path, hf_models.load_masked_lm)
    if not has_head:
        notes.append("the checkpoint has no masked-LM head: a random one (seeded), shared")
    tokenizer = hf_models.load_tokenizer(path)
    if tokenizer is None:
        notes.append("no tokenizer in the checkpoint: random token ids")
    return hf, tokenizer, label, notes


def make_inputs(
    tokenizer: Any, vocab_size: int, texts: tuple[str, ...], max_length: int, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, token_type_ids) [B, S], right-padded.

    Without a tokenizer: random ids with each text's word count (+2) as its length.
    """
    if tokenizer is not None:
        batch = tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        ids, mask = batch["input_ids"], batch["attention_mask"]
        if ids.shape[1] > max_length:  # too short for the special tokens: it did not truncate
            raise ValueError(
                f"max_length {max_length} leaves no room for a text between the tokenizer's "
                f"{tokenizer.num_special_tokens_to_add()} special tokens"
            )
        types = batch.get("token_type_ids", torch.zeros_like(ids))
        return ids.to(device), mask.to(device), types.to(device)
    lengths = [min(max_length, len(t.split()) + 2) for t in texts]
    batch = padded_batch(lengths, max(lengths), vocab_size, device, seed=0)
    return batch.input_ids, batch.attention_mask, batch.token_type_ids


def run_hf(hf: Any, inputs: dict[str, torch.Tensor]) -> Run:
    """Hugging Face's hidden states after each stage and its masked-LM logits."""
    with torch.no_grad():
        out = hf(**inputs, output_hidden_states=True)
    return Run(list(out.hidden_states), out.logits)


def _run_with_stage_outputs(encoder: BertModel, call: Callable[[], Any]) -> tuple:
    """(per-stage hidden states [B, S, H] of a fastbert BertModel, ``call()``): the outputs of
    ``encoder.embeddings`` and of each layer but the last, read by forward hooks, then the
    encoder's last hidden state, read from ``encoder.encode`` (which both the encoder and the
    heads call). In a post-norm encoder that is the last layer's output; a pre-norm encoder
    (ModernBERT) ends with a LayerNorm after its last layer, and Hugging Face reports its last
    hidden state after that norm too."""
    outputs: list[torch.Tensor] = []
    stages = [encoder.embeddings, *encoder.layers][:-1]
    handles = [m.register_forward_hook(lambda _m, _i, out: outputs.append(out)) for m in stages]
    encode = encoder.encode

    def encode_and_record(*args: Any, **kwargs: Any) -> tuple:
        ops, hidden = encode(*args, **kwargs)
        outputs.append(hidden)
        return ops, hidden

    encoder.encode = encode_and_record  # an instance attribute over the method, deleted below
    try:
        return outputs, call()
    finally:
        del encoder.encode
        for handle in handles:
            handle.remove()


def run_fastbert_bert(
    hf: Any,
    dtype: torch.dtype,
    device: str,
    backend: str,
    fastbert_head: bool,
    inputs: dict,
    quantize: str | None = None,
) -> Run:
    """fastbert's BERT encoder (and masked-LM head, or Hugging Face's fp32 head) in ``dtype``
    (and ``quantize``)."""
    cls = BertForMaskedLM if fastbert_head else BertModel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no pooler": the masked-LM model has none
        model = cls.from_pretrained(
            hf,
            dtype=dtype,
            device=device,
            backend=backend,
            padding_free=False,
            cuda_graphs=False,
            quantize=quantize,
        )
    encoder = model.bert if fastbert_head else model
    hidden, out = _run_with_stage_outputs(encoder, lambda: model(**inputs))
    if fastbert_head:
        return Run(hidden, out.logits)
    with torch.no_grad():
        return Run(hidden, hf.cls(out.last_hidden_state.float()))


def run_fastbert_optimized(
    hf: Any,
    dtype: torch.dtype,
    device: str,
    backend: str,
    inputs: dict,
    quantize: str | None = None,
) -> Run:
    """Another family: ``fastbert.optimize`` on a copy of the Hugging Face model in ``dtype``
    (its own head in ``dtype``); per-stage outputs from the fastbert encoder it installed."""
    model = optimize(
        copy.deepcopy(hf),
        dtype=dtype,
        backend=backend,
        padding_free=False,
        cuda_graphs=False,
        quantize=quantize,
    )
    encoder = next(
        m.forward.current_encoder() for m in model.modules() if hasattr(m.forward, "encoder")
    )
    with torch.no_grad():
        hidden, out = _run_with_stage_outputs(encoder, lambda: model(**inputs))
    return Run(hidden, out.logits)


def compare_runs(
    got: Run, ref: Run, low: Run | None, mask: torch.Tensor, dtype: str, final_norm: bool = False
) -> DtypeResult:
    """fastbert's run against Hugging Face fp32 ``ref``; ``low``: Hugging Face in the dtype
    (None for float32). mask: the [B, S] attention mask (1 = real token). final_norm: the
    last hidden state is the last layer's output after a final LayerNorm (a pre-norm model),
    which its stage name says."""
    valid = mask.bool()

    def entry(name: str, pick: Callable[[Run], torch.Tensor], where) -> Entry:
        result = compare(pick(got), pick(ref), where, name)
        if low is not None:
            result.hf_max_abs_err = compare(pick(low), pick(ref), where, name).max_abs_err
        return result

    names = ["embeddings"] + [f"layer {i}" for i in range(1, len(ref.hidden_states))]
    if final_norm:
        names[-1] += " + final norm"
    layers = [entry(n, lambda r, i=i: r.hidden_states[i], valid) for i, n in enumerate(names)]
    logits = entry("mlm logits", lambda r: r.logits, valid)
    logits.argmax_agreement, logits.top5_agreement = top_k_agreement(got.logits, ref.logits, valid)
    sentence = entry("sentence embedding", lambda r: mean_pool(r.hidden_states[-1], mask), None)
    return DtypeResult(dtype, layers, [logits, sentence])


def evaluate(
    model: str = MINILM,
    family: str = "bert",
    device: str = "cpu",
    backend: str = "triton",
    dtypes: list[str] | None = None,
    texts: int = len(TEXTS),
    max_length: int = 128,
    progress: TextIO | None = None,
) -> Report:
    """Run the comparison; see the module docstring. Raises ValueError for a bad request.

    progress: where to show progress over the stages (loading, Hugging Face fp32, then fastbert
    and Hugging Face in each dtype): a tqdm bar on a terminal, numbered lines otherwise
    (fastbert.bench.progress); None shows none."""
    if not 1 <= texts <= len(TEXTS):
        raise ValueError(f"texts must be 1 to the {len(TEXTS)} built-in texts, got {texts}")
    torch_device = torch.device(device)
    interpreter = backend == "triton" and torch_device.type == "cpu" and launch.interpreting()
    dtypes = dtypes or supported_dtypes(torch_device, backend)
    stages = 2 + sum(
        1 if compute_dtype(name, torch_device) == torch.float32 else 2 for name in dtypes
    )
    with Progress(stages, "fastbert accuracy", stream=progress or io.StringIO()) as bar:
        return _evaluate(
            model, family, device, backend, dtypes, texts, max_length, interpreter, bar
        )


def _evaluate(
    model: str,
    family: str,
    device: str,
    backend: str,
    dtypes: list[str],
    texts: int,
    max_length: int,
    interpreter: bool,
    bar: Progress,
) -> Report:
    torch_device = torch.device(device)
    bar.step(f"loading {model}")
    hf, tokenizer, label, notes = load_reference(model, family)
    family = hf.config.model_type  # a checkpoint's own family
    hf = hf.to(device)
    ids, mask, types = make_inputs(
        tokenizer, hf.config.vocab_size, TEXTS[:texts], max_length, device
    )
    fastbert_head = not (interpreter and hf.config.vocab_size > INTERPRETER_MAX_VOCAB)
    if family != "bert":
        head = "the optimised model's own (Hugging Face) masked-LM head, in each dtype"
    elif fastbert_head:
        head = "fastbert's masked-LM head"
    else:
        head = (
            f"Hugging Face's fp32 masked-LM head on fastbert's last hidden state (a "
            f"{hf.config.vocab_size}-column GEMM is too slow for the interpreter)"
        )
    inputs = hf_models.forward_inputs(hf, ids, mask, types)
    constants = family_of_model_type(family).config_constants
    _refuse_unrunnable_quantize(dtypes, family, constants)
    final_norm = constants.get("norm_position") == "pre"
    bar.advance()
    bar.step("Hugging Face fp32")
    ref = run_hf(hf, inputs)
    bar.advance()
    results = []
    for name in dtypes:
        dtype, quantize = compute_dtype(name, torch_device), quantization(name)
        bar.step(f"fastbert {name}")
        if family == "bert":
            got = run_fastbert_bert(hf, dtype, device, backend, fastbert_head, inputs, quantize)
        else:
            got = run_fastbert_optimized(hf, dtype, device, backend, inputs, quantize)
        bar.advance()
        low = None
        if dtype != torch.float32:
            hf_name = name if quantize is None else str(dtype).removeprefix("torch.")
            bar.step(f"Hugging Face {hf_name}")
            low = run_hf(copy.deepcopy(hf).to(dtype), inputs)
            bar.advance()
        results.append(compare_runs(got, ref, low, mask, name, final_norm))
    return Report(
        model=label,
        family=family,
        device=str(torch_device),
        backend=backend,
        interpreter=interpreter,
        texts=ids.shape[0],
        tokens=int(mask.sum()),
        max_length=ids.shape[1],
        head=head,
        results=results,
        notes=notes,
    )
