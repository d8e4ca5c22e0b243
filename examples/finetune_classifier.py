"""Fine-tune a sentence classifier with the Hugging Face Trainer after ``fastbert.optimize``.

The example makes its own data (short reviews built from positive and negative words, a
word-level vocabulary) and a small randomly initialised BERT, so it needs no download and
runs on a CPU in well under a minute::

    python examples/finetune_classifier.py             # 3 epochs, then the accuracy
    python examples/finetune_classifier.py --help

The model is a transformers ``BertForSequenceClassification``; ``fastbert.optimize`` swaps
fastbert's encoder in (the Hugging Face parameters get the gradients), the Trainer trains it
unchanged, and ``save_pretrained`` writes an ordinary Hugging Face checkpoint.
"""

from __future__ import annotations

import argparse
import math
import random
import sys

import torch

import fastbert

POSITIVE = ["good", "great", "lovely", "excellent", "fun", "moving", "superb", "charming"]
NEGATIVE = ["bad", "awful", "boring", "dull", "poor", "terrible", "weak", "tedious"]
FILLER = [
    "the",
    "film",
    "was",
    "plot",
    "acting",
    "really",
    "quite",
    "and",
    "a",
    "story",
    "this",
    "music",
    "ending",
    "very",
    "it",
    "is",
]
VOCAB = ["[PAD]", "[CLS]", "[SEP]", *POSITIVE, *NEGATIVE, *FILLER]
MAX_LENGTH = 16


def make_reviews(count: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """``count`` labelled reviews (1 = positive), tokenised and padded to MAX_LENGTH."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        label = rng.random() < 0.5
        words = rng.choices(FILLER, k=rng.randint(3, 9))
        words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label else NEGATIVE))
        ids = [VOCAB.index("[CLS]"), *(VOCAB.index(w) for w in words), VOCAB.index("[SEP]")]
        mask = [1] * len(ids) + [0] * (MAX_LENGTH - len(ids))
        ids += [0] * (MAX_LENGTH - len(ids))
        rows.append(
            {
                "input_ids": torch.tensor(ids),
                "attention_mask": torch.tensor(mask),
                "labels": torch.tensor(int(label)),
            }
        )
    return rows


def accuracy(model, rows: list[dict[str, torch.Tensor]]) -> float:
    batch = {k: torch.stack([r[k] for r in rows]).to(model.device) for k in rows[0]}
    labels = batch.pop("labels")
    model.eval()
    with torch.no_grad():
        predicted = model(**batch).logits.argmax(-1)
    return (predicted == labels).float().mean().item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--train-size", type=int, default=800)
    parser.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    parser.add_argument("--output-dir", default=None, help="save the trained model here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 0 < args.epochs < math.inf or args.train_size < 8:  # nan fails the first too
        parser.error("--epochs must be a number > 0 and --train-size at least 8")

    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(args.seed)
    config = BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=MAX_LENGTH,
        num_labels=2,
    )
    model = fastbert.optimize(BertForSequenceClassification(config), backend=args.backend)
    train, test = make_reviews(args.train_size, args.seed), make_reviews(200, args.seed + 1)
    before = accuracy(model, test)
    trainer = Trainer(
        model=model,
        train_dataset=train,
        args=TrainingArguments(
            output_dir=args.output_dir or "finetune-output",
            num_train_epochs=args.epochs,
            per_device_train_batch_size=32,
            learning_rate=2e-3,
            logging_steps=10,
            save_strategy="no",
            report_to=[],
            seed=args.seed,
            use_cpu=not torch.cuda.is_available(),
        ),
    )
    result = trainer.train()
    after = accuracy(model, test)
    if args.output_dir:
        model.save_pretrained(args.output_dir)
    print(
        f"trained {result.global_step} steps, final train loss {result.training_loss:.3f}; "
        f"test accuracy {before:.1%} before, {after:.1%} after"
        + (f"; saved to {args.output_dir}" if args.output_dir else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
