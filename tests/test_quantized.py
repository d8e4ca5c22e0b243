"""fastbert.embed.quantized against sentence-transformers' own quantize_embeddings: the same
values, bit for bit, for every precision, with ranges given, from calibration embeddings or from
the batch itself, on float32 and float64 arrays, torch tensors, widths that are no multiple of 8
and multi-vector lists; and the errors it gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastbert.embed import quantized
from fastbert.embed.quantized import PRECISIONS, quantize_embeddings

st_util = pytest.importorskip("sentence_transformers.util.quantization")


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


def test_few_calibration_embeddings_warn(caplog):
    with caplog.at_level("WARNING", logger="fastbert.embed"):
        quantized.quantization_ranges(random_embeddings(10, 8, seed=2))
    assert "from 10 embeddings" in caplog.text
