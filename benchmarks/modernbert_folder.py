"""A sentence-transformers folder of the ModernBERT-base shape for the CPU benchmarks.

No ModernBERT checkpoint installs offline, so the corpus benchmark's ``--model
modernbert-base`` runs ModernBERT-base's architecture and size (fastbert.bench.shapes'
``modernbert-base``: 22 pre-norm layers, rotary positions, GeGLU, a 128-token sliding window
in two layers of three) with seeded random weights. Its tokenizer is all-MiniLM-L6-v2's
(BERT WordPiece, 30,522 ids, all inside ModernBERT's 50,368-row table), so the token counts of
the corpus are BERT's. Pooling: the mean of the token states, normalised; 512 tokens at most.
Speed, not quality, is what it measures: the embeddings are compared only with
sentence-transformers running the same folder.

The folder is built once under ``$FASTBERT_CACHE`` (default ``~/.cache/fastbert``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

SHAPE = "modernbert-base"
SEED = 0
MAX_SEQ_LENGTH = 512
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


def folder(cache: Path | None = None) -> Path:
    """The folder (built on first use): config.json and model.safetensors of the random
    ModernBERT-base, the tokenizer files, modules.json, 1_Pooling, 2_Normalize."""
    root = cache or Path(os.environ.get("FASTBERT_CACHE", Path.home() / ".cache" / "fastbert"))
    target = root / "bench" / f"{SHAPE}-random-seed{SEED}"
    if (target / "modules.json").exists():
        return target
    building = target.with_name(target.name + f".building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    _build(building)
    try:
        building.rename(target)
    except OSError:  # another process finished first: keep its folder
        shutil.rmtree(building, ignore_errors=True)
    return target


def _build(path: Path) -> None:
    from fastbert.bench.models import random_reference
    from fastbert.integrations import models

    reference = random_reference(SHAPE, seed=SEED)
    reference.hf_model.save_pretrained(str(path))
    minilm = Path(models.packaged_minilm_path())
    for name in TOKENIZER_FILES:
        shutil.copy(minilm / name, path / name)
    shutil.copy(minilm / "modules.json", path / "modules.json")
    (path / "2_Normalize").mkdir()
    (path / "1_Pooling").mkdir()
    pooling = {
        "word_embedding_dimension": reference.config.hidden_size,
        "pooling_mode_mean_tokens": True,
    }
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    settings = {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False}
    (path / "sentence_bert_config.json").write_text(json.dumps(settings, indent=2))
