"""fastbert.optimize on every sentence-transformers model kind: a SentenceTransformer (with
truncate_dim), a SparseEncoder, a MultiVectorEncoder (ColBERT: query expansion, a token-level
projection, a skiplist) and a CrossEncoder, each over a BERT, an MPNet and a ModernBERT
encoder with random weights and MiniLM's vocabulary (tests/sentence_folders.py).

Each optimized model is compared with an un-optimized copy of itself on every call of its
kind, by the rule of the kernel tests (tests/accuracy.py): against the same model in float64,
the optimized float32 model may err at most twice what the un-optimized float32 model errs,
plus two float32 ulps. Forward hooks show that no Hugging Face module under the encoder runs
once the model is optimized (and that they do run without optimize), and that fastbert's
encoder does.
"""

from __future__ import annotations

import contextlib
import copy
import io
import string
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import fastbert
from fastbert.integrations.optimize import FastbertForward
from tests.accuracy import assert_within_rule
from tests.sentence_folders import (
    FAMILIES,
    HIDDEN,
    TEXTS,
    family_folder,
    inference_free_folder,
    save_modules,
    transformer,
)

st = pytest.importorskip("sentence_transformers")
from sentence_transformers.base.modules import Dense, Normalize  # noqa: E402
from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling  # noqa: E402
from sentence_transformers.sparse_encoder.modules import SpladePooling  # noqa: E402

# Past the ModernBERT's sliding window (16 positions each side) and truncated at 48 tokens.
TEXTS = [*TEXTS, "a longer text, about sliding windows and rotary positions, " * 4]
PAIRS = list(zip(TEXTS, TEXTS[1:] + TEXTS[:1]))
PROMPTS = {"query": "[Q] ", "document": "[D] "}  # GTE-ModernColBERT's prefixes
# ColBERT's query expansion: queries padded to 16 tokens with [MASK]s that the encoder does not
# attend to but whose outputs MaxSim scores. Every expansion position lies within the
# ModernBERT's window of the [CLS] token (as GTE-ModernColBERT's 32 lie within its 64).
EXPANSION = {"strategy": "fixed", "length": 16, "attend": False}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Callable[[str, str], Any]:
    """(family, head) -> that model's folder, made once per module."""
    made: dict[tuple[str, str], Any] = {}

    def folder(family: str, head: str) -> Any:
        if (family, head) not in made:
            path = tmp_path_factory.mktemp(family) / head
            made[family, head] = family_folder(path, family, head, seed=len(made))
        return made[family, head]

    return folder


def dense(tmp_path, base) -> Any:
    modules = [transformer(base), Pooling(HIDDEN, "mean"), Dense(HIDDEN, 32), Normalize()]
    folder = save_modules(tmp_path / "dense", modules, prompts=PROMPTS)
    return st.SentenceTransformer(str(folder), device="cpu", truncate_dim=24)


def sparse(tmp_path, mlm) -> Any:
    modules = [transformer(mlm, transformer_task="fill-mask"), SpladePooling("max")]
    folder = save_modules(tmp_path / "sparse", modules, kind="SparseEncoder", prompts=PROMPTS)
    return st.SparseEncoder(str(folder), device="cpu")


def multi_vector(tmp_path, base) -> Any:
    """GTE-ModernColBERT's modules over ``base``: a token-level projection without bias,
    normalised token vectors, and the punctuation skiplist on documents. Query expansion is
    set after loading (see test_multi_vector_encoder)."""
    token_level = dict(module_input_name="token_embeddings", module_output_name="token_embeddings")
    modules = [
        transformer(base, query_length=16, document_length=32),
        Dense(HIDDEN, 24, bias=False, activation_function=torch.nn.Identity(), **token_level),
        Normalize(**token_level),
        MultiVectorMask(skiplist_words=list(string.punctuation)),
    ]
    folder = save_modules(tmp_path / "mv", modules, kind="MultiVectorEncoder", prompts=PROMPTS)
    return st.MultiVectorEncoder(str(folder), device="cpu")


def encoder_path(model: torch.nn.Module) -> str:
    """The name of the one module whose forward fastbert.optimize replaced."""
    names = [
        name
        for name, module in model.named_modules()
        if isinstance(vars(module).get("forward"), FastbertForward)
    ]
    assert len(names) == 1, names
    return names[0]


@contextlib.contextmanager
def calls(modules: dict[str, torch.nn.Module]) -> Iterator[list[str]]:
    """The names of ``modules`` as each is called, while in the block: their classes' forward
    wrapped (not the instances', nor a hook: an optimized model refuses both on the modules
    it does not call)."""
    called: list[str] = []
    names = {id(module): name for name, module in modules.items()}
    classes = {type(module) for module in modules.values()}
    originals = {cls: cls.__dict__.get("forward") for cls in classes}

    def recording(forward: Any) -> Any:
        def record(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if id(self) in names:
                called.append(names[id(self)])
            return forward(self, *args, **kwargs)

        return record

    for cls in classes:
        cls.forward = recording(cls.forward)
    try:
        yield called
    finally:
        for cls, original in originals.items():
            if original is None:
                del cls.forward
            else:
                cls.forward = original


def hf_modules(model: torch.nn.Module, path: str) -> dict[str, torch.nn.Module]:
    """Every module under the Hugging Face base model at ``path`` (not the base model itself,
    whose forward fastbert's replaces): embeddings, layers, their attention and feed-forward
    parts, the pooler, the final norm."""
    modules = dict(model.get_submodule(path).named_modules(prefix=path))
    del modules[path]
    return modules


def as_tensor(output: Any) -> torch.Tensor:
    """One tensor of an encode / predict result (a sparse tensor made dense, the token vectors
    of a multi-vector model concatenated), in the dtype it was computed in: the rule's floor
    is two units in the last place of that dtype (made float64 here, a float32 result lost its
    floor, and a Hugging Face result that happened to be exact left no room at all)."""
    if isinstance(output, list):
        return torch.cat([torch.as_tensor(o) for o in output])
    output = torch.as_tensor(output)
    return output.to_dense() if output.is_sparse else output


def compare(model: Any, run: dict[str, Callable[[Any], Any]], **optimize: Any) -> dict:
    """Optimize a copy of ``model`` and hold each call of ``run`` on it to the rule against
    ``model`` itself (float32) and a float64 copy. Returns {name: (optimized, float32,
    float64)} outputs for the kind's own checks."""
    reference64 = copy.deepcopy(model).double()
    optimized = fastbert.optimize(copy.deepcopy(model), **optimize)
    path = encoder_path(optimized)
    encoder = optimized.get_submodule(path).forward.encoder
    results = {}
    with (
        calls(hf_modules(optimized, path)) as hf_called,
        calls({"fastbert": encoder}) as fastbert_called,
        calls(hf_modules(model, path)) as reference_called,
    ):
        for name, call in run.items():
            got, want, want64 = (call(m) for m in (optimized, model, reference64))
            if isinstance(want, list):  # one [tokens, dim] array per text
                assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want], name
            assert_within_rule(as_tensor(got), as_tensor(want), as_tensor(want64), what=name)
            results[name] = (got, want, want64)
    assert not hf_called, f"Hugging Face modules ran in the optimized model: {set(hf_called)}"
    assert len(fastbert_called) >= len(run)
    assert f"{path}.embeddings" in reference_called  # the hooks see Hugging Face's calls
    return results


@pytest.mark.parametrize("family", FAMILIES)
def test_sentence_transformer(folders, tmp_path, family: str) -> None:
    model = dense(tmp_path, folders(family, "Model"))
    # MiniLM's BERT tokenizer makes token types, which sentence-transformers passes on to the
    # MPNet too (whose Hugging Face forward ignores them); the ModernBERT's tokenizer makes none.
    assert ("token_type_ids" in model.preprocess(TEXTS)) == (family != "modernbert")
    results = compare(
        model,
        {
            "encode": lambda m: m.encode(TEXTS, convert_to_tensor=True),
            "encode_query": lambda m: m.encode_query(TEXTS, convert_to_tensor=True),
            "encode_document": lambda m: m.encode_document(TEXTS, convert_to_tensor=True),
            "normalized": lambda m: m.encode(
                TEXTS, convert_to_tensor=True, normalize_embeddings=True
            ),
        },
    )
    got, want, _ = results["encode"]
    assert got.shape == want.shape == (len(TEXTS), 24)  # truncate_dim
    assert torch.nn.functional.cosine_similarity(got, want).min() > 0.99999


def test_a_features_dict_run_again_gives_the_same_embeddings(folders, tmp_path) -> None:
    """sentence-transformers writes its outputs (token_embeddings, sentence_embedding) into
    the features dict, and a loss that runs the dict again (CachedGISTEmbedLoss) passes them
    back to the model's forward, which Hugging Face ignores: fastbert refused them."""
    model = fastbert.optimize(dense(tmp_path, folders("bert", "Model")), backend="torch")
    features = model.preprocess(TEXTS)
    with torch.no_grad():
        first = model(features)["sentence_embedding"].clone()
        assert "token_embeddings" in features
        torch.testing.assert_close(model(features)["sentence_embedding"], first)


@pytest.mark.parametrize("family", FAMILIES)
def test_sparse_encoder(folders, tmp_path, family: str) -> None:
    model = sparse(tmp_path, folders(family, "ForMaskedLM"))
    results = compare(
        model,
        {
            "encode": lambda m: m.encode(TEXTS),
            "max_active_dims": lambda m: m.encode(TEXTS, max_active_dims=12),
            "encode_query": lambda m: m.encode_query(TEXTS),
            "encode_document": lambda m: m.encode_document(TEXTS, max_active_dims=12),
        },
    )
    for name, (got, want, want64) in results.items():
        active = [as_tensor(v) != 0 for v in (got, want, want64)]
        assert torch.equal(active[0], active[1]) and torch.equal(active[0], active[2]), name
    got = results["max_active_dims"][0].to_dense()
    assert ((got != 0).sum(dim=1) == 12).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_inference_free_sparse_encoder(folders, tmp_path, family: str) -> None:
    """A Router's documents run fastbert's encoder (the one Transformer among its routes);
    its queries take the SparseStaticEmbedding route, no encoder, as before."""
    folder = inference_free_folder(tmp_path / "ifs", folders(family, "ForMaskedLM"))
    model = st.SparseEncoder(str(folder), device="cpu")
    compare(
        model,
        {
            "encode": lambda m: m.encode(TEXTS),
            "encode_document": lambda m: m.encode_document(TEXTS, max_active_dims=12),
        },
    )
    want = model.encode_query(TEXTS).to_dense()
    optimized = fastbert.optimize(copy.deepcopy(model))
    assert torch.equal(optimized.encode_query(TEXTS).to_dense(), want)


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_vector_encoder(folders, tmp_path, family: str) -> None:
    """Documents first, without query expansion, then queries with it, switched on after
    optimize: the encoder runs the padded query batches dense, computing the masked expansion
    positions that MaxSim scores (a padding-free call would leave them zero)."""
    model = multi_vector(tmp_path, folders(family, "Model"))

    def encode_query(m):
        m[0].query_expansion = EXPANSION
        try:
            return m.encode_query(TEXTS)
        finally:
            m[0].query_expansion = None

    results = compare(
        model,
        {
            "encode_document": lambda m: m.encode_document(TEXTS),
            "encode": lambda m: m.encode(TEXTS),
            "encode_query": encode_query,
            "similarity": lambda m: m.similarity(encode_query(m), m.encode_document(TEXTS)),
        },
    )
    got, want, _ = results["encode_query"]
    assert all(len(g) == EXPANSION["length"] for g in got)
    cosine = torch.nn.functional.cosine_similarity(as_tensor(got), as_tensor(want))
    assert cosine.min() > 0.99999


def test_multi_vector_encoder_refuses_padding_free_with_query_expansion(folders, tmp_path) -> None:
    model = multi_vector(tmp_path, folders("modernbert", "Model"))
    model[0].query_expansion = EXPANSION
    with pytest.raises(ValueError, match="padding_free=True cannot run .* attend=False"):
        fastbert.optimize(model, padding_free=True)
    assert "forward" not in vars(model[0].auto_model)  # unchanged
    model[0].query_expansion = None
    fastbert.optimize(model, padding_free=True)
    model[0].query_expansion = EXPANSION
    with pytest.raises(ValueError, match="padding_free=True cannot run"):
        model.encode_query(TEXTS)


def test_a_copy_of_an_optimized_multi_vector_encoder_asks_its_own_transformer(
    folders, tmp_path
) -> None:
    """Whether the expansion is read was a closure over the optimized model's Transformer: a
    deep copy with expansion set on it alone ran padding-free (zeros at the expansion, MaxSim
    0.24 off), and the optimized model did not pickle (nor run in a process pool)."""
    reference = multi_vector(tmp_path, folders("bert", "Model"))
    model = fastbert.optimize(copy.deepcopy(reference), backend="torch")
    clone = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for each in (reference, clone, loaded):
        each[0].query_expansion = EXPANSION
    want = reference.encode_query(TEXTS)
    for each in (clone, loaded):
        got = each.encode_query(TEXTS)
        assert all((g - w).abs().max() <= 1e-5 for g, w in zip(got, want))


@pytest.mark.parametrize("family", FAMILIES)
def test_cross_encoder(folders, family: str) -> None:
    model = st.CrossEncoder(str(folders(family, "ForSequenceClassification")), device="cpu")
    results = compare(
        model,
        {
            "predict": lambda m: m.predict(PAIRS, activation_fn=torch.nn.Identity()),
            "sigmoid": lambda m: m.predict(PAIRS),
            "rank": lambda m: torch.tensor(
                [r["score"] for r in sorted(m.rank(TEXTS[0], TEXTS), key=lambda r: r["corpus_id"])]
            ),
        },
    )
    got, want, _ = results["predict"]
    assert got.shape == want.shape == (len(PAIRS),)
