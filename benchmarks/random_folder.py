"""A sentence-transformers folder of a real model's size with random weights and a tokenizer
made on the spot, for machines with no network and no packaged model (the GPU run serves it).

The weights: fastbert.bench.shapes' embedded shape (BERT-base by default), seeded. The
tokenizer: BERT's WordPiece (lower case, BERT's pre-tokenizer, [CLS] ... [SEP]) trained on
Python's own help texts (``pydoc_data.topics``, in the standard library), so it needs no
download; its vocabulary is what that text yields (some 5,600 entries of the model's 30,522
ids), so English comes out in somewhat more tokens than BERT's own vocabulary makes of it.
Pooling: the mean of the token states, normalised. Speed, not quality, is what such a folder
is for.

    python -m benchmarks.random_folder --out DIR [--shape bert-base] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_SEQ_LENGTH = 512
MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {
        "idx": 2,
        "name": "2",
        "path": "2_Normalize",
        "type": "sentence_transformers.models.Normalize",
    },
]


def help_texts() -> list[str]:
    """The paragraphs of Python's help texts."""
    from pydoc_data.topics import topics

    return [p for name in sorted(topics) for p in topics[name].split("\n\n") if p.strip()]


def tokenizer(vocab_size: int):
    """A fast WordPiece tokenizer (transformers' PreTrainedTokenizerFast) trained on
    :func:`help_texts` with at most ``vocab_size`` entries."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import WordPieceTrainer

    from fastbert.integrations.models import import_transformers

    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.decoder = decoders.WordPiece()
    trainer = WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS))
    wordpiece.train_from_iterator(help_texts(), trainer)
    cls, sep = wordpiece.token_to_id("[CLS]"), wordpiece.token_to_id("[SEP]")
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return import_transformers().PreTrainedTokenizerFast(
        tokenizer_object=wordpiece,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=MAX_SEQ_LENGTH,
    )


def build(out: Path, shape: str = "bert-base", seed: int = 0) -> Path:
    """Write the folder ``out`` (made if missing): config.json and model.safetensors, the
    tokenizer's files, modules.json, 1_Pooling, 2_Normalize, sentence_bert_config.json."""
    from fastbert.bench.models import random_reference

    reference = random_reference(shape, seed=seed)
    config = reference.config
    out.mkdir(parents=True, exist_ok=True)
    reference.hf_model.save_pretrained(str(out))
    tokenizer(config.vocab_size).save_pretrained(str(out))
    (out / "modules.json").write_text(json.dumps(MODULES, indent=2))
    (out / "2_Normalize").mkdir(exist_ok=True)
    (out / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": config.hidden_size, "pooling_mode_mean_tokens": True}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    settings = {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False}
    (out / "sentence_bert_config.json").write_text(json.dumps(settings, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    from fastbert.bench.shapes import MODEL_SHAPES, MODEL_TYPES

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.random_folder", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    bert_shapes = [name for name in MODEL_SHAPES if name not in MODEL_TYPES]
    parser.add_argument("--shape", choices=bert_shapes, default="bert-base")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"wrote {build(args.out, args.shape, args.seed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
