"""Differential fuzzing against Hugging Face: random tiny models of every supported family and
random padded batches, run by fastbert and by transformers' eager fp32 model with the same
weights.

Hypothesis draws the config (family, head dim 32 or 64, heads, layers, GELU variant, pad id,
ELECTRA's embedding width, ...) and the batch (1-4 rows of 1-40 tokens; rows fully real,
right-padded, left-padded, with holes in the middle or all padding; id / mask dtypes;
whether token types and the mask are passed). fastbert runs through ``fastbert.optimize``
(every family) and ``fastbert.BertModel.from_pretrained`` (BERT), on the torch backend and on
the Triton kernels (the interpreter without a GPU), dense and padding-free.

The oracle: last_hidden_state within BOUND at real tokens; pooler_output within BOUND for rows
whose first token (the one the pooler reads) is real; fastbert's outputs finite everywhere.
Hugging Face's values at padded positions (and so the pooler of a row whose first token is
padding) are unspecified, as fastbert's are. The runs are derandomized, so CI sees the same
examples every time.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import fastbert
from tests.hf_models import NO_DROPOUT, as_distilbert, encoder_shape, randomize

BOUND = 1e-4
VOCAB = 100
MAX_SEQ = 40
FAMILIES = ("bert", "roberta", "xlm-roberta", "electra", "distilbert", "mpnet")
_PREFIX = {
    "bert": "Bert",
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
    "electra": "Electra",
    "distilbert": "DistilBert",
    "mpnet": "MPNet",
}
# DistilBERT's names of the config values the other families name as BERT does (it has no
# token types, and its eps is fixed).
ROW_LAYOUTS = ("full", "right", "left", "holes", "empty")
# Hugging Face takes a mask of any dtype (nonzero = real token). None (no mask) comes last: it
# is the least interesting case, and shrinking moves towards the first.
MASK_DTYPES = (
    torch.int64,
    torch.bool,
    torch.int32,
    torch.float32,
    torch.uint8,
    torch.int8,
    torch.float16,
    None,
)


def _settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        # The device fixture is a constant string: sharing it between examples is safe.
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One tiny Hugging Face base model: its family and Hugging Face config values."""

    family: str
    values: dict
    seed: int

    @property
    def pad_token_id(self) -> int:
        return self.values["pad_token_id"]

    @property
    def type_vocab_size(self) -> int:
        return self.values.get("type_vocab_size", 0)

    def build(self, device: str = "cpu") -> torch.nn.Module:
        """The transformers base model, eager attention, every parameter random."""
        import transformers

        prefix = _PREFIX[self.family]
        config = getattr(transformers, prefix + "Config")(
            **self.values, attn_implementation="eager"
        )
        torch.manual_seed(self.seed)
        return randomize(getattr(transformers, prefix + "Model")(config), self.seed).to(device)


def model_spec(
    family: str,
    *,
    head_dim: int = 64,
    heads: int = 2,
    layers: int = 2,
    intermediate: int = 64,
    activation: str = "gelu",
    pad: int = 1,
    type_vocab: int = 2,
    eps: float = 1e-12,
    embedding_size: int | None = None,
    sinusoidal: bool = False,
    seed: int = 0,
) -> ModelSpec:
    """A ModelSpec of ``family`` with hidden size ``head_dim * heads``. type_vocab, eps:
    ignored for DistilBERT (no token types, eps 1e-12); embedding_size: ELECTRA's (None: the
    hidden size); sinusoidal: DistilBERT's position table."""
    hidden = head_dim * heads
    # RoBERTa-style positions run from pad + 1 to pad + S (MPNet's pad is always 1).
    offset = {"roberta": pad + 1, "xlm-roberta": pad + 1, "mpnet": 2}.get(family, 0)
    values = dict(
        vocab_size=VOCAB,
        **encoder_shape(hidden, layers, heads, intermediate),
        hidden_act=activation,
        max_position_embeddings=MAX_SEQ + offset,
        type_vocab_size=type_vocab,
        pad_token_id=pad,
        layer_norm_eps=eps,
        **NO_DROPOUT,
    )
    if family == "distilbert":
        values = dict(as_distilbert(values), sinusoidal_pos_embds=sinusoidal)
    if family == "electra":
        values["embedding_size"] = embedding_size or hidden
    if family == "mpnet":  # no token types
        del values["type_vocab_size"]
    return ModelSpec(family, values, seed)


@dataclasses.dataclass(frozen=True)
class Batch:
    """Keyword inputs of a forward, and where the real tokens are (bool [B, S])."""

    inputs: dict
    valid: torch.Tensor

    def to(self, device: str) -> Batch:
        return Batch({k: v.to(device) for k, v in self.inputs.items()}, self.valid.to(device))


def make_batch(
    spec: ModelSpec,
    mask: list[list[bool]],
    *,
    seed: int = 0,
    id_dtype: torch.dtype = torch.int64,
    mask_dtype: torch.dtype | None = torch.int64,
    with_types: bool = True,
) -> Batch:
    """A batch a tokenizer could have made, real tokens where ``mask`` [B][S] is True: padded
    positions hold the pad id, real ones never do (RoBERTa's positions count the non-pad ids).

    id_dtype: of input_ids and token_type_ids; mask_dtype None passes no attention_mask (every
    position is then a real token); with_types passes random token_type_ids (families with
    token types only).
    """
    valid = torch.tensor(mask, dtype=torch.bool)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB - 1, valid.shape, generator=gen)
    ids = ids + (ids >= spec.pad_token_id).long()  # real tokens skip the pad id
    ids = torch.where(valid, ids, torch.full_like(ids, spec.pad_token_id))
    inputs = {"input_ids": ids.to(id_dtype)}
    if mask_dtype is None:
        valid = torch.ones_like(valid)
    else:
        inputs["attention_mask"] = valid.to(mask_dtype)
    if spec.type_vocab_size and with_types:
        types = torch.randint(0, spec.type_vocab_size, valid.shape, generator=gen)
        inputs["token_type_ids"] = types.to(id_dtype)
    return Batch(inputs, valid)


@dataclasses.dataclass(frozen=True)
class Case:
    """One differential run: a model, a batch, and whether fastbert runs padding-free."""

    spec: ModelSpec
    batch: Batch
    padding_free: bool


@st.composite
def model_specs(draw: st.DrawFn, families: tuple[str, ...]) -> ModelSpec:
    head_dim = draw(st.sampled_from([32, 64]))
    return model_spec(
        draw(st.sampled_from(families)),
        head_dim=head_dim,
        heads=draw(st.integers(1, 128 // head_dim)),
        layers=draw(st.integers(1, 2)),
        intermediate=draw(st.sampled_from([32, 64, 128])),
        activation=draw(st.sampled_from(["gelu", "gelu_new"])),
        pad=draw(st.integers(0, 3)),
        type_vocab=draw(st.integers(1, 3)),
        eps=draw(st.sampled_from([1e-12, 1e-5])),
        embedding_size=draw(st.sampled_from([None, 32, 48])),
        sinusoidal=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


@st.composite
def row_masks(draw: st.DrawFn, seq: int) -> list[bool]:
    """Which of ``seq`` positions of one row hold real tokens, in one of ROW_LAYOUTS."""
    layout = draw(st.sampled_from(ROW_LAYOUTS))
    if layout == "full":
        return [True] * seq
    if layout == "empty":
        return [False] * seq
    if layout == "holes":
        return draw(st.lists(st.booleans(), min_size=seq, max_size=seq))
    length = draw(st.integers(1, seq))
    row = [True] * length + [False] * (seq - length)
    return row if layout == "right" else row[::-1]


@st.composite
def cases(draw: st.DrawFn, families: tuple[str, ...] = FAMILIES) -> Case:
    spec = draw(model_specs(families))
    seq = draw(st.integers(1, MAX_SEQ))
    mask = [draw(row_masks(seq)) for _ in range(draw(st.integers(1, 4)))]
    batch = make_batch(
        spec,
        mask,
        seed=draw(st.integers(0, 2**16)),
        id_dtype=draw(st.sampled_from([torch.int64, torch.int32])),
        mask_dtype=draw(st.sampled_from(MASK_DTYPES)),
        with_types=draw(st.booleans()),
    )
    return Case(spec, batch, draw(st.booleans()))


# Rows right-padded, left-padded, with holes, and all padding, in one batch.
MIXED_ROWS = [
    [True] * 4 + [False] * 5,
    [False] * 5 + [True] * 4,
    [True, True, False, False, True, False, True, True, True],
    [False] * 9,
]


def _mixed(spec: ModelSpec, padding_free: bool, **batch_options) -> Case:
    return Case(spec, make_batch(spec, MIXED_ROWS, seed=1, **batch_options), padding_free)


# Run before the drawn cases, on every backend: each family on MIXED_ROWS.
OPTIMIZE_EXAMPLES = [
    _mixed(model_spec("roberta", pad=1), True),
    _mixed(
        model_spec("xlm-roberta", head_dim=32, heads=3, pad=3, activation="gelu_new"),
        False,
        id_dtype=torch.int32,
        mask_dtype=torch.bool,
    ),
    _mixed(model_spec("electra", head_dim=32, embedding_size=48, activation="gelu_new"), True),
    _mixed(model_spec("distilbert", heads=1, pad=0), False, mask_dtype=torch.float32),
    _mixed(model_spec("bert", pad=0, type_vocab=3), True),
    # Holes in a row: padding-free runs dense (packing would change the bias' distances).
    _mixed(model_spec("mpnet", pad=1), True),
]
FROM_PRETRAINED_EXAMPLES = [
    _mixed(model_spec("bert", pad=0), True),
    _mixed(model_spec("bert", head_dim=32, heads=4, pad=0, activation="gelu_new"), False),
]


def with_examples(cases: list[Case]):
    """Decorator: hypothesis ``example``s, one per case, for a test taking ``case``."""

    def decorate(test):
        for case in reversed(cases):
            test = example(case=case)(test)
        return test

    return decorate


def hf_outputs(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(last_hidden_state [B, S, H], pooler_output [B, H] or None) of a transformers model."""
    with torch.no_grad():
        out = model(**batch.inputs)
    return out.last_hidden_state, getattr(out, "pooler_output", None)


def assert_matches(
    expected: tuple[torch.Tensor, torch.Tensor | None],
    got: tuple[torch.Tensor, torch.Tensor | None],
    valid: torch.Tensor,
) -> None:
    """fastbert's (hidden, pooled) against Hugging Face's: see the module docstring."""
    (want_hidden, want_pooled), (hidden, pooled) = expected, got
    assert hidden.shape == want_hidden.shape and hidden.dtype == want_hidden.dtype
    assert hidden.isfinite().all(), "last_hidden_state is not finite"
    if valid.any():
        err = (hidden - want_hidden)[valid].abs().max().item()
        assert err <= BOUND, f"last_hidden_state differs by {err} at real tokens"
    assert (pooled is None) == (want_pooled is None)
    if pooled is None:
        return
    assert pooled.shape == want_pooled.shape
    assert pooled.isfinite().all(), "pooler_output is not finite"
    first_real = valid[:, 0]
    if first_real.any():
        err = (pooled - want_pooled)[first_real].abs().max().item()
        assert err <= BOUND, f"pooler_output differs by {err}"


def check_optimize(case: Case, backend: str, device: str = "cpu") -> None:
    model = case.spec.build(device)
    batch = case.batch.to(device)
    expected = hf_outputs(model, batch)
    fastbert.optimize(model, backend=backend, padding_free=case.padding_free)
    assert_matches(expected, hf_outputs(model, batch), batch.valid)


def check_from_pretrained(case: Case, backend: str, device: str = "cpu") -> None:
    hf = case.spec.build(device)
    batch = case.batch.to(device)
    expected = hf_outputs(hf, batch)
    ours = fastbert.BertModel.from_pretrained(
        hf, dtype=torch.float32, device=device, backend=backend, padding_free=case.padding_free
    )
    inputs = batch.inputs
    out = ours(inputs["input_ids"], inputs.get("attention_mask"), inputs.get("token_type_ids"))
    assert_matches(expected, (out.last_hidden_state, out.pooler_output), batch.valid)


@_settings(max_examples=60)
@with_examples(OPTIMIZE_EXAMPLES)
@given(case=cases())
def test_optimize_torch_backend(case: Case) -> None:
    check_optimize(case, "torch")


@_settings(max_examples=20)
@with_examples(FROM_PRETRAINED_EXAMPLES)
@given(case=cases(("bert",)))
def test_from_pretrained_torch_backend(case: Case) -> None:
    check_from_pretrained(case, "torch")


# The Triton interpreter takes seconds per forward on a CPU: fewer drawn cases.
@pytest.mark.slow
@_settings(max_examples=12)
@with_examples(OPTIMIZE_EXAMPLES)
@given(case=cases())
def test_optimize_triton_backend(device: str, case: Case) -> None:
    check_optimize(case, "triton", device)


@pytest.mark.slow
@_settings(max_examples=4)
@with_examples(FROM_PRETRAINED_EXAMPLES)
@given(case=cases(("bert",)))
def test_from_pretrained_triton_backend(device: str, case: Case) -> None:
    check_from_pretrained(case, "triton", device)
