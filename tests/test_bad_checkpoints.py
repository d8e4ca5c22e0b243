"""Malformed checkpoints, configs and load arguments fail early, naming the file and the problem.

Each case writes a tiny Hugging Face checkpoint, breaks one thing in it, and checks the error's
type and that its message names the broken file (or argument) and what is wrong.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import fastbert
from fastbert.model.families import BERT, DISTILBERT, ELECTRA, ROBERTA, XLM_ROBERTA
from tests.hf_models import as_pytorch_bin, hf_model, padded_batch

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


def _checkpoint(folder: Path, **overrides) -> Path:
    hf_model("BertModel", seed=7, **overrides).save_pretrained(folder)
    return folder


def _edit_config(folder: Path, **fields) -> Path:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(fields)
    path.write_text(json.dumps(config))
    return path


def _load(folder: Path, **kwargs):
    return fastbert.BertModel.from_pretrained(folder, device="cpu", **kwargs)


def _tiny_config() -> fastbert.BertConfig:
    """A valid one-layer config, for the model constructors' own argument checks."""
    return fastbert.BertConfig(
        vocab_size=10,
        hidden_size=8,
        num_attention_heads=2,
        intermediate_size=16,
        num_hidden_layers=1,
    )


def _names(path: Path, problem: str) -> str:
    """A pattern for a message that names ``path`` and then (a regex) ``problem``."""
    return re.escape(str(path)) + ".*" + problem


# --- config.json ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"num_attention_heads": 0}, "num_attention_heads must be >= 1, got 0"),
        ({"num_attention_heads": -2}, "num_attention_heads must be >= 1, got -2"),
        ({"num_attention_heads": 3}, "hidden_size 64 is not a multiple of num_attention_heads 3"),
        ({"type_vocab_size": 0}, "type_vocab_size must be >= 1: BERT models have token types"),
        ({"type_vocab_size": -1}, "type_vocab_size must be >= 0, got -1"),
        ({"num_hidden_layers": -1}, "num_hidden_layers must be >= 0, got -1"),
        ({"hidden_size": "64"}, "hidden_size must be an integer, got '64' \\(str\\)"),
        ({"hidden_size": 64.5}, "hidden_size must be an integer, got 64.5 \\(float\\)"),
        ({"hidden_size": 64.0}, "hidden_size must be an integer, got 64.0 \\(float\\)"),
        ({"num_hidden_layers": True}, "num_hidden_layers must be an integer, got True"),
        ({"vocab_size": None}, "vocab_size must be an integer, got None"),
        ({"layer_norm_eps": "1e-12"}, "layer_norm_eps must be a finite number >= 0"),
        ({"layer_norm_eps": False}, "layer_norm_eps must be a finite number >= 0"),
        ({"layer_norm_eps": -1e-5}, "layer_norm_eps must be a finite number >= 0"),
        ({"layer_norm_eps": float("nan")}, "layer_norm_eps must be a finite number >= 0"),
        ({"pad_token_id": "0"}, "pad_token_id must be an integer, got '0'"),
        ({"hidden_act": 5}, "hidden_act must be a string, got 5"),
        ({"hidden_act": ["gelu"]}, "hidden_act must be a string"),
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else "",
)
def test_malformed_config_names_file_and_field(tmp_path, fields: dict, problem: str) -> None:
    path = _edit_config(_checkpoint(tmp_path), **fields)
    with pytest.raises(ValueError, match=_names(path, problem)):
        _load(tmp_path)
    with pytest.raises(ValueError, match=_names(path, problem)):
        fastbert.BertConfig.from_json_file(path)


@pytest.mark.parametrize("contents", ["[1, 2]", "3", '"bert"', "null"])
def test_config_that_is_not_an_object(tmp_path, contents: str) -> None:
    _checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(contents)
    with pytest.raises(ValueError, match=_names(tmp_path / "config.json", "must be a JSON object")):
        _load(tmp_path)


@pytest.mark.parametrize("contents", ['{"hidden_size": 64,', "", b"\xff\xfe{}"])
def test_config_that_is_not_json(tmp_path, contents: str | bytes) -> None:
    _checkpoint(tmp_path)
    path = tmp_path / "config.json"
    path.write_bytes(contents if isinstance(contents, bytes) else contents.encode())
    with pytest.raises(ValueError, match=_names(path, "is not valid JSON")):
        _load(tmp_path)


def test_config_is_checked_before_the_weights_are_read(tmp_path) -> None:
    path = _edit_config(_checkpoint(tmp_path), num_attention_heads=0)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=_names(path, "num_attention_heads")):
        _load(tmp_path)


@pytest.mark.parametrize("family", [BERT, ROBERTA, XLM_ROBERTA, ELECTRA], ids=lambda f: f.name)
def test_families_with_token_types_need_a_type_table(family) -> None:
    values = {"model_type": family.model_type, "type_vocab_size": 0}
    with pytest.raises(ValueError, match=f"type_vocab_size must be >= 1: {family.name}"):
        fastbert.BertConfig.from_dict(values, family)
    assert fastbert.BertConfig.from_dict({**values, "type_vocab_size": 1}, family)


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"pad_token_id": None}, "pad_token_id must be an integer >= 0 for padding_offset"),
        ({"pad_token_id": -1}, "pad_token_id must be an integer >= 0 for padding_offset"),
        (
            {"pad_token_id": 1, "max_position_embeddings": 2},
            "max_position_embeddings 2 leaves no position after the 2 reserved by pad_token_id 1",
        ),
    ],
    ids=["null", "negative", "no-room"],
)
def test_roberta_positions_need_a_pad_id(fields: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        fastbert.BertConfig.from_dict({"model_type": "roberta", **fields}, ROBERTA)


def test_electra_embedding_size_must_be_an_integer() -> None:
    values = {"model_type": "electra", "embedding_size": "32"}
    with pytest.raises(ValueError, match="embedding_size must be an integer, got '32'"):
        fastbert.BertConfig.from_dict(values, ELECTRA)


def test_distilbert_has_no_token_types() -> None:
    config = fastbert.BertConfig.from_dict(
        {"model_type": "distilbert", "dim": 64, "n_heads": 2, "hidden_dim": 128}, DISTILBERT
    )
    assert config.type_vocab_size == 0


def test_config_mapping_required_without_a_file() -> None:
    with pytest.raises(ValueError, match="must be a JSON object of fields, got list"):
        fastbert.BertConfig.from_dict([("hidden_size", 64)])


def test_null_position_embedding_type_means_absolute(tmp_path) -> None:
    hf = hf_model("BertModel", seed=7)
    hf.save_pretrained(tmp_path)
    _edit_config(tmp_path, position_embedding_type=None)
    ids, mask, types = padded_batch([6, 3], seed=7)
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    got = _load(tmp_path)(ids, mask, types)
    assert (got.pooler_output - expected.pooler_output).abs().max() < 1e-4


def test_zero_layers_run_the_embeddings_alone(tmp_path) -> None:
    """Hugging Face builds a 0-layer encoder (embeddings, then the pooler); so does fastbert."""
    hf = hf_model("BertModel", seed=8, num_hidden_layers=0)
    hf.save_pretrained(tmp_path)
    ids, mask, types = padded_batch([6, 3], seed=8)
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    for padding_free in (False, True):
        got = _load(tmp_path, padding_free=padding_free)(ids, mask, types)
        valid = mask.bool()
        diff = got.last_hidden_state[valid] - expected.last_hidden_state[valid]
        assert diff.abs().max() < 1e-4
        assert (got.pooler_output - expected.pooler_output).abs().max() < 1e-4


# --- model.safetensors.index.json and shards -----------------------------------------------


def _sharded(folder: Path) -> Path:
    """A checkpoint split into several safetensors shards; returns its index."""
    hf_model("BertModel", seed=9).save_pretrained(folder, max_shard_size="100KB")
    index = folder / "model.safetensors.index.json"
    assert len(set(json.loads(index.read_text())["weight_map"].values())) > 1
    return index


def _pickled(index: Path) -> Path:
    """The shards of ``index`` as an older transformers saved them (pytorch_model-*.bin
    and pytorch_model.bin.index.json, which transformers 5 no longer writes); returns the
    new index."""
    from safetensors.torch import load_file

    contents = json.loads(index.read_text())
    renamed = {}
    for shard in set(contents["weight_map"].values()):
        renamed[shard] = shard.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
        torch.save(load_file(index.parent / shard), index.parent / renamed[shard])
        (index.parent / shard).unlink()
    contents["weight_map"] = {k: renamed[v] for k, v in contents["weight_map"].items()}
    pickled = index.parent / "pytorch_model.bin.index.json"
    pickled.write_text(json.dumps(contents))
    index.unlink()
    return pickled


@pytest.mark.parametrize("pickled", [False, True], ids=["safetensors", "bin"])
def test_sharded_checkpoint_loads_like_instance(tmp_path, pickled: bool) -> None:
    index = _sharded(tmp_path)
    if pickled:
        _pickled(index)
    ids, mask, types = padded_batch([5, 2], seed=9)
    expected = fastbert.BertModel.from_pretrained(hf_model("BertModel", seed=9), device="cpu")
    got = _load(tmp_path)
    assert torch.equal(got(ids, mask, types)[0], expected(ids, mask, types)[0])


def test_a_single_file_saved_over_shards_is_the_one_read(tmp_path) -> None:
    """save_pretrained of one file over a sharded checkpoint leaves the old index (and, copied
    over, its shards): Hugging Face reads model.safetensors; fastbert read the stale shards
    (5.67 from Hugging Face's outputs) or refused the index's missing ones."""
    import transformers

    _sharded(tmp_path)
    stale = {p.name: p.read_bytes() for p in tmp_path.glob("model-*.safetensors")}
    newer = hf_model("BertModel", seed=10)
    newer.save_pretrained(tmp_path)  # one file; the index stays, the shards go
    assert (tmp_path / "model.safetensors.index.json").exists()
    ids, mask, types = padded_batch([5, 2], seed=9)
    real = mask.bool()  # fastbert's padded positions are zeros
    with torch.no_grad():
        want = transformers.BertModel.from_pretrained(tmp_path).eval()(ids, mask, types)[0]
    for name, data in [(None, None), *stale.items()]:  # then the old shards back beside it
        if name is not None:
            (tmp_path / name).write_bytes(data)
        got = _load(tmp_path)(ids, mask, types)[0]
        torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "contents, problem",
    [
        ('{"weight_map": {', "is not valid JSON"),
        ('{"metadata": {}}', "must be a JSON object with a weight_map object"),
        ('{"weight_map": ["model-00001-of-00002.safetensors"]}', "with a weight_map object"),
        ('[{"weight_map": {}}]', "must be a JSON object with a weight_map object"),
        ('{"weight_map": {"embeddings.word_embeddings.weight": 1}}', "must be a shard file name"),
        (
            '{"weight_map": {"embeddings.word_embeddings.weight": "gone.safetensors"}}',
            "names the shard 'gone.safetensors', which does not exist",
        ),
    ],
    ids=[
        "invalid-json",
        "no-weight-map",
        "weight-map-list",
        "index-list",
        "shard-not-string",
        "missing-shard",
    ],
)
def test_malformed_index_names_it(tmp_path, contents: str, problem: str) -> None:
    index = _sharded(tmp_path)
    index.write_text(contents)
    with pytest.raises(ValueError, match=_names(index, problem)):
        _load(tmp_path)


def test_corrupt_shard_names_it(tmp_path) -> None:
    index = _sharded(tmp_path)
    shard = tmp_path / sorted(set(json.loads(index.read_text())["weight_map"].values()))[-1]
    shard.write_bytes(shard.read_bytes()[:-16])
    with pytest.raises(ValueError, match=_names(shard, "not a readable safetensors file")):
        _load(tmp_path)


# --- model.safetensors and pytorch_model.bin ---------------------------------------------------


def _corrupt(data: bytes, how: str) -> bytes:
    return {"empty": b"", "garbage": b"this is not a checkpoint", "truncated": data[:-64]}[how]


@pytest.mark.parametrize("how", ["empty", "garbage", "truncated"])
def test_corrupt_safetensors_names_it(tmp_path, how: str) -> None:
    path = _checkpoint(tmp_path) / "model.safetensors"
    path.write_bytes(_corrupt(path.read_bytes(), how))
    with pytest.raises(ValueError, match=_names(path, "not a readable safetensors file")):
        _load(tmp_path)


def _bin_checkpoint(folder: Path) -> Path:
    return as_pytorch_bin(_checkpoint(folder))


@pytest.mark.parametrize("how", ["empty", "garbage", "truncated"])
def test_corrupt_bin_names_it(tmp_path, how: str) -> None:
    path = _bin_checkpoint(tmp_path)
    path.write_bytes(_corrupt(path.read_bytes(), how))
    with pytest.raises(ValueError, match=_names(path, "not a readable PyTorch checkpoint")):
        _load(tmp_path)


@pytest.mark.parametrize(
    "contents, problem",
    [
        ([torch.ones(2)], "holds a list, not a state dict"),
        (torch.ones(2), "holds a Tensor, not a state dict"),
        (
            {"embeddings.word_embeddings.weight": 3},
            "'embeddings.word_embeddings.weight' holds a int, not a tensor",
        ),
        ({1: torch.ones(2)}, "its key 1 is not a string"),
    ],
    ids=["list", "tensor", "non-tensor-value", "non-string-key"],
)
def test_bin_that_is_not_a_state_dict_names_it(tmp_path, contents, problem: str) -> None:
    path = _bin_checkpoint(tmp_path)
    torch.save(contents, path)
    with pytest.raises(ValueError, match=_names(path, problem)):
        _load(tmp_path)


# --- sentence-transformers modules.json --------------------------------------------------------


def _sentence_transformers_folder(folder: Path) -> Path:
    """A sentence-transformers layout: modules.json at the top, the checkpoint in 0_Transformer."""
    hf_model("BertModel", seed=10).save_pretrained(folder / "0_Transformer")
    modules = [
        {
            "idx": 0,
            "name": "0",
            "path": "0_Transformer",
            "type": "sentence_transformers.models.Transformer",
        },
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder / "modules.json"


def test_sentence_transformers_folder_loads(tmp_path) -> None:
    _sentence_transformers_folder(tmp_path)
    ids, mask, types = padded_batch([5, 4], seed=10)
    expected = fastbert.BertModel.from_pretrained(hf_model("BertModel", seed=10), device="cpu")
    assert torch.equal(_load(tmp_path)(ids, mask, types)[0], expected(ids, mask, types)[0])


@pytest.mark.parametrize(
    "contents, problem",
    [
        ('[{"path": "0_Transformer",', "is not valid JSON"),
        ('{"0": {"path": "0_Transformer"}}', "must be a JSON list of module objects"),
        ('["0_Transformer"]', "must be a JSON list of module objects"),
        ('[{"path": "0_Transformer", "type": 3}]', "type and path must be strings"),
        (
            '[{"path": null, "type": "sentence_transformers.models.Transformer"}]',
            "type and path must be strings",
        ),
    ],
    ids=["invalid-json", "object", "list-of-strings", "type-not-string", "path-null"],
)
def test_malformed_modules_json_names_it(tmp_path, contents: str, problem: str) -> None:
    modules = _sentence_transformers_folder(tmp_path)
    modules.write_text(contents)
    with pytest.raises(ValueError, match=_names(modules, problem)):
        _load(tmp_path)


# --- dtype and device arguments ---------------------------------------------------------------

BAD_DTYPES = [torch.int8, torch.float64, torch.bool, "float16", None]
BAD_DTYPE_IDS = ["int8", "float64", "bool", "string", "None"]
_ALLOWED = "torch.float16, torch.bfloat16, torch.float32"


@pytest.mark.parametrize("dtype", BAD_DTYPES[:-1], ids=BAD_DTYPE_IDS[:-1])
def test_from_pretrained_rejects_dtype_before_reading(tmp_path, dtype) -> None:
    _checkpoint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read: the dtype fails first
    with pytest.raises(TypeError, match=re.escape(f"dtype must be one of {_ALLOWED}, got")):
        _load(tmp_path, dtype=dtype)


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=BAD_DTYPE_IDS)
def test_model_constructors_reject_dtype(dtype) -> None:
    config = _tiny_config()
    for cls in (
        fastbert.BertModel,
        fastbert.BertForMaskedLM,
        fastbert.BertForSequenceClassification,
    ):
        with pytest.raises(TypeError, match=re.escape(f"dtype must be one of {_ALLOWED}")):
            cls(config, dtype=dtype)


@NO_CUDA
@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)], ids=str)
def test_cuda_without_cuda_is_a_clear_error(tmp_path, device) -> None:
    _checkpoint(tmp_path)
    with pytest.raises(ValueError, match="CUDA is not available"):
        fastbert.BertModel.from_pretrained(tmp_path, device=device)
    config = _tiny_config()
    with pytest.raises(ValueError, match="CUDA is not available"):
        fastbert.BertModel(config, device=device)


@pytest.mark.gpu
def test_missing_cuda_index_is_a_clear_error() -> None:
    device = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ValueError, match=f"device '{device}': this machine has"):
        fastbert.BertModel.from_pretrained(hf_model("BertModel"), device=device)


@pytest.mark.parametrize(
    "device", ["gpu", "cuda:x", ""], ids=["unknown-type", "bad-index", "empty"]
)
def test_unparseable_device_names_it(device: str) -> None:
    with pytest.raises(ValueError, match=f"device '{device}' is not a device torch knows"):
        fastbert.BertModel.from_pretrained(hf_model("BertModel"), device=device)


def test_device_of_another_kind_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="device must be a torch.device or a string, got 1.5"):
        fastbert.BertModel.from_pretrained(hf_model("BertModel"), device=1.5)
