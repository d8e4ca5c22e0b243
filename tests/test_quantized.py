"""fastbert.embedding.quantized against sentence-transformers' own quantize_embeddings: the same
values, bit for bit, for every precision, with ranges given, from calibration embeddings or from
the batch itself, on float32 and float64 arrays, torch tensors, widths that are no multiple of 8
and multi-vector lists; and the errors it gives."""

from __future__ import annotations

import functools
import importlib.metadata
import json

import numpy as np
import pytest
import torch
from packaging.version import Version

from fastbert.embedding import quantized
from fastbert.embedding.quantized import PRECISIONS, quantize_embeddings

st_util = pytest.importorskip("sentence_transformers.util.quantization")
# 6.2 changed quantize_embeddings: int8 / uint8 ranges are rounded to float32 before the
# buckets are computed (a float64 value near a bucket's edge can fall one bucket over), a single
# vector's bits are packed as a vector, and bfloat16 tensors are read. fastbert gives 6.2's.
pytestmark = pytest.mark.skipif(
    Version(importlib.metadata.version("sentence-transformers")) < Version("6.2"),
    reason="the reference is sentence-transformers 6.2's quantize_embeddings",
)


def random_embeddings(rows: int, width: int, seed: int, dtype=np.float32) -> np.ndarray:
    """Normalised random vectors with a few exact zeros (the binary threshold) and ties."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, width))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[0, :3] = 0.0
    x[1, 3] = x[2, 3]
    return x.astype(dtype)


def assert_identical(got, want) -> None:
    assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("width", [8, 13, 384])
def test_same_bits_as_sentence_transformers(precision, dtype, width):
    embeddings = random_embeddings(150, width, seed=width, dtype=dtype)
    calibration = random_embeddings(300, width, seed=width + 1, dtype=dtype) * 0.8
    ranges = np.vstack([calibration.min(0), calibration.max(0)])
    cases = [{}, {"ranges": ranges}, {"calibration_embeddings": calibration}]
    for kwargs in cases:
        want = st_util.quantize_embeddings(embeddings, precision, **kwargs)
        assert_identical(quantize_embeddings(embeddings, precision, **kwargs), want)
    if precision.endswith("binary"):
        assert want.shape == (150, (width + 7) // 8)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_torch_tensors_single_vectors_and_lists(precision):
    embeddings = random_embeddings(40, 20, seed=3)
    ranges = np.vstack([embeddings.min(0) - 0.1, embeddings.max(0) + 0.1])
    tensor = torch.from_numpy(embeddings)
    want = st_util.quantize_embeddings(tensor, precision, ranges=ranges)
    assert_identical(quantize_embeddings(tensor, precision, ranges=ranges), want)
    one = st_util.quantize_embeddings(embeddings[0], precision, ranges=ranges)
    assert_identical(quantize_embeddings(embeddings[0], precision, ranges=ranges), one)
    rows = list(embeddings)
    assert_identical(
        quantize_embeddings(rows, precision, ranges=ranges),
        st_util.quantize_embeddings(rows, precision, ranges=ranges),
    )


@pytest.mark.parametrize("precision", PRECISIONS)
def test_multi_vector_matrices_share_their_ranges(precision):
    matrices = [random_embeddings(n, 16, seed=n) for n in (5, 9, 3)]
    matrices.append(np.zeros((0, 16), np.float32))
    want = st_util.quantize_embeddings(matrices, precision)
    got = quantize_embeddings(matrices, precision)
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        assert_identical(g, w)


def test_bfloat16_tensors_are_read_as_float32():
    tensor = torch.from_numpy(random_embeddings(10, 16, seed=5)).bfloat16()
    ranges = np.array([[-1.0] * 16, [1.0] * 16])
    want = st_util.quantize_embeddings(tensor, "int8", ranges=ranges)
    assert_identical(quantize_embeddings(tensor, "int8", ranges=ranges), want)


def test_the_buckets_span_the_ranges():
    ranges = np.array([[-1.0, 0.0], [1.0, 0.0]])  # the second dimension has no spread
    x = np.array([[-1.0, 5.0], [1.0, -5.0], [0.0, 0.0], [-2.0, 0.0]], np.float32)
    # The top of the range lands in bucket 254 or 255, as float32 rounds (x - min) / step.
    assert quantize_embeddings(x, "uint8", ranges=ranges)[:, 0].tolist() == [0, 254, 127, 0]
    assert quantize_embeddings(x, "int8", ranges=ranges)[:, 0].tolist() == [-128, 126, -1, -128]
    assert quantize_embeddings(x, "uint8", ranges=ranges)[:, 1].tolist() == [5, 0, 0, 0]
    assert quantize_embeddings(x, "ubinary").tolist() == [[64], [128], [0], [0]]
    assert quantize_embeddings(x, "binary").tolist() == [[-64], [0], [-128], [-128]]


def test_errors():
    x = random_embeddings(4, 8, seed=1)
    with pytest.raises(ValueError, match="precision must be one of float32, int8"):
        quantize_embeddings(x, "int4")
    with pytest.raises(ValueError, match="from a single embedding"):
        quantize_embeddings(x[:1], "int8")
    with pytest.raises(ValueError, match="must be float"):
        quantize_embeddings(x.astype(np.int8), "uint8")
    assert quantize_embeddings(x[:0], "binary").shape == (0, 1)
    assert quantized.check_ranges([[0.0] * 8, [1.0] * 8], 8).dtype == np.float32
    with pytest.raises(ValueError, match=r"ranges must be \[2, 8\]"):
        quantized.check_ranges(np.zeros((2, 7)), 8)
    with pytest.raises(ValueError, match="dimension 2 has its min above its max"):
        quantized.check_ranges([[0, 0, 1, 0], [1, 1, 0, 1]], 4)
    with pytest.raises(ValueError, match="finite"):
        quantized.check_ranges([[0, float("nan")], [1, 1]], 2)


@pytest.mark.parametrize("precision", ["int8", "uint8"])
def test_calibration_and_ranges_that_cannot_bucket_raise(precision):
    """One calibration embedding gave empty ranges (every value in the first or last bucket),
    another width a numpy broadcasting error, a given range with its min above its max
    silently scrambled buckets: each raises a ValueError naming the argument."""
    x = random_embeddings(4, 8, seed=1)
    with pytest.raises(ValueError, match="calibration_embeddings hold 1 embedding"):
        quantize_embeddings(x, precision, calibration_embeddings=x[:1])
    with pytest.raises(ValueError, match=r"calibration_embeddings must be \[n, 8\]"):
        quantize_embeddings(x, precision, calibration_embeddings=random_embeddings(9, 6, seed=2))
    with pytest.raises(ValueError, match=r"calibration_embeddings must be \[n, 8\]"):
        quantize_embeddings(x, precision, calibration_embeddings=x[0])
    with pytest.raises(ValueError, match="min above its max"):
        quantize_embeddings(x, precision, ranges=[[1.0] * 8, [0.0] * 8])
    matrices = [random_embeddings(3, 8, seed=4), random_embeddings(5, 8, seed=5)]
    with pytest.raises(ValueError, match="calibration_embeddings hold 1 embedding"):
        quantize_embeddings(matrices, precision, calibration_embeddings=x[:1])


def test_few_calibration_embeddings_warn(caplog):
    with caplog.at_level("WARNING", logger="fastbert.embedding"):
        quantized.quantization_ranges(random_embeddings(10, 8, seed=2))
    assert "from 10 embeddings" in caplog.text


# -- TextModel.embed, fastbert.embed and fastbert embed with a precision ----------------------


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """A tiny random sentence-transformers folder (mean pooling, normalised), 64 wide."""
    from sentence_transformers.base.modules import Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling

    from tests.sentence_folders import HIDDEN, hf_folder, save_modules, transformer

    base = hf_folder(tmp_path_factory.mktemp("base") / "bert", seed=4)
    modules = [transformer(base), Pooling(HIDDEN, "mean"), Normalize()]
    return save_modules(tmp_path_factory.mktemp("dense") / "st", modules)


@pytest.fixture(scope="module")
def texts():
    from tests.test_embed import corpus

    return corpus(120, offset=100, max_words=30)


@pytest.fixture(scope="module")
def st_floats(dense, texts):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(dense), device="cpu").encode(texts, convert_to_numpy=True)


def assert_near_sentence_transformers(got, floats, precision, **kwargs):
    """``got`` (fastbert's quantized embeddings) against sentence-transformers' quantization of
    its own float embeddings: the float embeddings differ in their last bits (other summation
    orders), so a value on a bucket's edge may land one bucket over, a value at 0 on the other
    side of the binary threshold; nothing else may differ."""
    want = st_util.quantize_embeddings(floats, precision, **kwargs)
    assert got.dtype == want.dtype and got.shape == want.shape
    if precision.endswith("binary"):
        flipped = np.unpackbits(got.view(np.uint8), axis=1) != np.unpackbits(
            want.view(np.uint8), axis=1
        )
        assert np.abs(floats[flipped[:, : floats.shape[1]]]).max(initial=0) < 1e-5
    else:
        difference = np.abs(got.astype(int) - want.astype(int))
        assert difference.max() <= 1 and (difference == 0).mean() > 0.99


@pytest.mark.parametrize("precision", PRECISIONS)
def test_text_model_embed_quantizes_as_sentence_transformers(dense, texts, st_floats, precision):
    import fastbert

    model = fastbert.load(dense, device="cpu")
    floats = model.embed(texts)
    calibration = model.embed(texts[:60])
    ranges = np.vstack([calibration.min(0), calibration.max(0)])
    ranged = precision in quantized.RANGED
    for kwargs in ({}, {"ranges": ranges}, {"calibration_embeddings": calibration})[
        : 3 if ranged else 1
    ]:
        got = model.embed(texts, precision=precision, **kwargs)
        assert_identical(got, st_util.quantize_embeddings(floats, precision, **kwargs))
        assert_near_sentence_transformers(got, st_floats, precision, **kwargs)
    through_embed = fastbert.embed(texts, model=dense, device="cpu", precision=precision)
    assert_identical(through_embed, model.embed(texts, precision=precision))
    if ranged:
        loaded = fastbert.embed(texts, model, precision=precision, ranges=ranges)
        assert_identical(loaded, model.embed(texts, precision=precision, ranges=ranges))


def test_precision_errors(dense, texts, tmp_path):
    import fastbert

    model = fastbert.load(dense, device="cpu")
    with pytest.raises(ValueError, match="precision must be one of"):
        model.embed(texts, precision="int4")
    with pytest.raises(ValueError, match=r"ranges must be \[2, 64\]"):
        model.embed(texts, precision="int8", ranges=np.zeros((2, 10)))
    with pytest.raises(ValueError, match="from a single embedding"):
        model.embed(texts[:1], precision="uint8")
    assert model.embed(texts[:1], precision="binary").shape == (1, 8)
    with pytest.raises(ValueError, match="ranges applies to precision int8 or uint8"):
        fastbert.embed(texts, model=dense, precision="binary", ranges=[[0.0], [1.0]])
    # Ranges where the precision has no buckets are refused by every entry, never ignored.
    ranges = np.zeros((2, 64))
    for call in (model.embed, functools.partial(fastbert.embed, model=model)):
        for precision in ("float32", "binary", "ubinary"):
            with pytest.raises(ValueError, match=f"ranges applies to .*, not {precision}"):
                call(texts, precision=precision, ranges=ranges)
        with pytest.raises(ValueError, match="calibration_embeddings applies to .*, not binary"):
            call(texts, precision="binary", calibration_embeddings=ranges)
    with pytest.raises(ValueError, match="store_dtype float16 applies to float embeddings"):
        fastbert.embed(texts, model=dense, precision="int8", dtype="float16", store_dtype="float16")
    with pytest.raises(ValueError, match="calibration .* applies to files"):
        fastbert.embed(
            texts, model=dense, precision="int8", calibration=str(dense / "modules.json")
        )


def read_column(folder):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pq.read_table(p) for p in sorted(folder.glob("part-*.parquet"))]
    column = pa.concat_tables(tables).column("embedding").combine_chunks()
    values = column.flatten().to_numpy()  # the stored type: float32, int8 or uint8
    return column.type, values.reshape(len(column), column.type.list_size)


def job_floats(folder, source, output):
    """The float32 embeddings a corpus job writes for ``source`` (its encoder normalises in
    torch, where TextModel.embed normalises in numpy: the last bits may differ)."""
    import fastbert

    fastbert.embed(source, model=folder, output=output, device="cpu", progress=False)
    return read_column(output)[1]


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_corpus_job_calibrates_on_its_first_rows(dense, texts, tmp_path, precision):
    """fastbert embed --precision: the Parquet column is int8 / uint8; int8 / uint8 buckets
    span the min and max of the job's first 1,000 rows (here all 120), recorded in the
    manifest as numbers."""
    from fastbert.cli import main

    source = tmp_path / "corpus.txt"
    source.write_text("".join(t + "\n" for t in texts))
    out = tmp_path / "out"
    argv = ["embed", str(source), "--model", str(dense), "--output", str(out)]
    assert main([*argv, "--device", "cpu", "--no-progress", "--precision", precision]) == 0
    record = json.loads((out / "_manifest.json").read_text())
    assert record["precision"] == precision
    floats = job_floats(dense, source, tmp_path / "floats")
    column_type, stored = read_column(out)
    want = st_util.quantize_embeddings(floats, precision)
    assert str(column_type.value_type) == str(want.dtype)
    if precision in ("int8", "uint8"):
        assert record["calibration"] == "the first 1000 rows of the inputs"
        np.testing.assert_array_equal(record["ranges"], [floats.min(0), floats.max(0)])
    else:
        assert "ranges" not in record and "calibration" not in record
    assert_identical(stored, want)


def test_calibration_file_ranges_and_resuming(dense, texts, tmp_path):
    """--calibration FILE: the ranges come from its texts; a resumed run quantizes with the
    ranges its manifest recorded (not calibrated again), and ranges given from Python are
    used and recorded as given."""
    import fastbert

    calibration = tmp_path / "calibration.jsonl"
    calibration.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[60:]))
    source = tmp_path / "corpus.txt"
    source.write_text("".join(t + "\n" for t in texts[:60]))
    out = tmp_path / "out"
    options = dict(output=out, device="cpu", precision="uint8", rows_per_shard=20)
    summary = fastbert.embed(source, model=dense, calibration=str(calibration), **options)
    floats = job_floats(dense, source, tmp_path / "floats")
    calibrated = job_floats(dense, calibration, tmp_path / "calibrated")
    ranges = np.vstack([calibrated.min(0), calibrated.max(0)])
    assert summary.manifest["calibration"] == f"the texts of {calibration.resolve()}"
    np.testing.assert_array_equal(summary.manifest["ranges"], ranges)
    assert_identical(read_column(out)[1], st_util.quantize_embeddings(floats, "uint8", ranges))

    # An unfinished run whose manifest recorded other ranges: the resumed shards use them.
    (out / "part-00002.parquet").unlink()
    recorded = json.loads((out / "_manifest.json").read_text())
    wider = (ranges * 2).tolist()
    for key in ("rows", "tokens", "truncated", "skipped", "shards"):
        recorded.pop(key)
    (out / "_manifest.json").write_text(
        json.dumps({**recorded, "complete": False, "ranges": wider})
    )
    summary = fastbert.embed(source, model=dense, calibration=str(calibration), **options)
    assert summary.docs == 20 and summary.manifest["ranges"] == wider
    stored = read_column(out)[1]
    assert_identical(
        stored[40:], st_util.quantize_embeddings(floats[40:], "uint8", np.array(wider))
    )

    given = fastbert.embed(
        source, model=dense, ranges=ranges * 3, **{**options, "output": tmp_path / "given"}
    )
    assert given.manifest["calibration"] == "ranges given"
    np.testing.assert_array_equal(given.manifest["ranges"], ranges * 3)
    assert_identical(
        read_column(tmp_path / "given")[1], st_util.quantize_embeddings(floats, "uint8", ranges * 3)
    )


def test_ranges_calibrate_on_the_jobs_own_good_rows(dense, texts, tmp_path):
    """int8 ranges come from this job's good rows: not from another job's run that stopped in
    the same folder before its first shard (its ranges were taken: 14,826 of 15,360 values
    quantized on the wrong ranges), nor from rows bad for their id (they were counted in)."""
    import fastbert
    from fastbert.embedding import readers

    def rows(path, items):
        path.write_text("".join(json.dumps(item) + "\n" for item in items))
        return path

    a = rows(tmp_path / "a.jsonl", [{"text": t} for t in texts[:40]] + [{"body": "no text"}])
    out = tmp_path / "out"
    options = dict(device="cpu", precision="int8", progress=False)
    with pytest.raises(readers.InputError):
        fastbert.embed(a, model=dense, output=out, **options)
    assert "ranges" in json.loads((out / "_manifest.json").read_text())
    b = rows(tmp_path / "b.jsonl", [{"text": t} for t in texts[60:]])
    fastbert.embed(b, model=dense, output=out, **options)
    floats = job_floats(dense, b, tmp_path / "b-floats")
    ranges = json.loads((out / "_manifest.json").read_text())["ranges"]
    np.testing.assert_array_equal(ranges, [floats.min(0), floats.max(0)])

    # Rows without the id field are bad rows of an id_field job: not among its calibration.
    extreme = [{"text": t} for t in texts[:20]]  # other texts, other extremes
    good = [{"id": i, "text": t} for i, t in enumerate(texts[60:])]
    c = rows(tmp_path / "c.jsonl", [*extreme, *good])
    summary = fastbert.embed(
        c, model=dense, output=tmp_path / "c-out", id_field="id", skip_bad=True, **options
    )
    assert summary.manifest["skipped"] == 20
    np.testing.assert_array_equal(summary.manifest["ranges"], ranges)


def test_packed_bits_follow_a_dimensions_cut(dense, texts, tmp_path):
    """--dimensions with --precision ubinary: the cut embeddings' bits, ceil(20 / 8) = 3 bytes
    each, in memory and in the shards (the width the model loaded with applies to both)."""
    import fastbert

    model = fastbert.load(dense, device="cpu")
    cut = model.embed(texts, dimensions=20, force_dimensions=True)
    options = dict(device="cpu", dimensions=20, force_dimensions=True, precision="ubinary")
    in_memory = fastbert.embed(texts, model=dense, **options)
    assert_identical(in_memory, st_util.quantize_embeddings(cut, "ubinary"))
    source = tmp_path / "corpus.txt"
    source.write_text("".join(t + "\n" for t in texts))
    summary = fastbert.embed(
        source, model=dense, output=tmp_path / "out", progress=False, **options
    )
    assert summary.manifest["dimensions"] == 20
    column_type, stored = read_column(tmp_path / "out")
    assert column_type.list_size == 3
    assert (np.unpackbits(stored, axis=1)[:, 20:] == 0).all()
    assert (stored != in_memory).mean() < 0.01  # bits of values at 0 may differ (see above)
