"""Fine-tune a sentence classifier with the Hugging Face Trainer after ``fastbert.optimize``.

The example makes its own data (short reviews built from positive and negative words, a
word-level vocabulary) and a small randomly initialised BERT, so it needs no download and
runs on a CPU in well under a minute::

    python examples/finetune_classifier.py             # 3 epochs, then the accuracy
    python examples/finetune_classifier.py --ray       # the same on 2 Ray Train workers
    python examples/finetune_classifier.py --help

The model is a transformers ``BertForSequenceClassification``; ``fastbert.optimize`` swaps
fastbert's encoder in (the Hugging Face parameters get the gradients), the Trainer trains it
unchanged, and ``save_pretrained`` writes an ordinary Hugging Face checkpoint. With ``--ray``
each of ``--workers`` Ray Train workers runs the same Trainer, which sees the process group
Ray Train set up and trains data-parallel (each worker a share of every batch, gradients
averaged); ``--plain`` trains Hugging Face's own model instead, for comparison.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile

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
    parser.add_argument("--dropout", type=float, default=0.1, help="BERT's dropout (0.1)")
    parser.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="train on Ray Train workers: the cluster at ADDRESS, else a local Ray instance",
    )
    parser.add_argument("--workers", type=int, default=2, help="Ray Train workers (default 2)")
    parser.add_argument(
        "--plain", action="store_true", help="train Hugging Face's own model (no fastbert)"
    )
    args = parser.parse_args(argv)
    if not 0 < args.epochs < math.inf or args.train_size < 8:  # nan fails the first too
        parser.error("--epochs must be a number > 0 and --train-size at least 8")
    if args.workers < 1 or not 0 <= args.dropout < 1:
        parser.error("--workers must be at least 1 and --dropout in [0, 1)")
    settings = {k: v for k, v in vars(args).items() if k not in ("ray", "workers")}
    result = train_on_ray(settings, args.ray, args.workers) if args.ray else train(settings)
    print(
        f"trained {result['steps']} steps, final train loss {result['loss']:.3f}; "
        f"test accuracy {result['before']:.1%} before, {result['after']:.1%} after"
        + (f"; saved to {args.output_dir}" if args.output_dir else "")
    )
    return 0


def train(settings: dict) -> dict:
    """Train one model with the Trainer (data-parallel where a process group is set up) and
    return its steps, final train loss and test accuracy before and after."""
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(settings["seed"])
    config = BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=MAX_LENGTH,
        num_labels=2,
        hidden_dropout_prob=settings["dropout"],
        attention_probs_dropout_prob=settings["dropout"],
    )
    model = BertForSequenceClassification(config)
    if not settings["plain"]:
        fastbert.optimize(model, backend=settings["backend"])
    seed = settings["seed"]
    reviews, test = make_reviews(settings["train_size"], seed), make_reviews(200, seed + 1)
    before = accuracy(model, test)
    trainer = Trainer(
        model=model,
        train_dataset=reviews,
        args=TrainingArguments(
            output_dir=settings["output_dir"] or "finetune-output",
            seed=seed,
            num_train_epochs=settings["epochs"],
            per_device_train_batch_size=32,
            learning_rate=2e-3,
            logging_steps=10,
            save_strategy="no",
            use_cpu=not torch.cuda.is_available(),
            report_to=[],
            # The classifier's loss is a mean already: scaled by the number of processes (for
            # a loss summed over tokens) it would read, and step, N times over.
            average_tokens_across_devices=False,
        ),
    )
    result = trainer.train()
    after = accuracy(model, test)
    if settings["output_dir"] and trainer.is_world_process_zero():
        model.save_pretrained(settings["output_dir"])
    return {
        "steps": result.global_step,
        "loss": result.training_loss,
        "before": before,
        "after": after,
    }


def train_on_ray(settings: dict, address: str, workers: int) -> dict:
    """:func:`train` on ``workers`` Ray Train workers (one CPU each, or one GPU each where the
    cluster has GPUs); rank 0's result."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address)
    use_gpu = ray.cluster_resources().get("GPU", 0) >= workers
    trainer = TorchTrainer(
        _ray_worker,
        train_loop_config=settings,
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu),
        run_config=RunConfig(name="finetune-classifier", storage_path=tempfile.mkdtemp()),
    )
    result = trainer.fit()
    if settings["output_dir"]:  # the checkpoint rank 0 reported: the trained model
        result.checkpoint.to_directory(settings["output_dir"])
    return result.metrics


def _ray_worker(settings: dict) -> None:
    """One Ray Train worker: :func:`train`, then rank 0 reports its result with the trained
    model saved as the run's checkpoint."""
    import ray.train

    torch.set_num_threads(1)  # a CPU per worker
    rank0 = ray.train.get_context().get_world_rank() == 0
    with tempfile.TemporaryDirectory() as saved:
        result = train({**settings, "output_dir": saved if rank0 else None})
        checkpoint = ray.train.Checkpoint.from_directory(saved) if rank0 else None
        ray.train.report(result, checkpoint=checkpoint)


if __name__ == "__main__":
    sys.exit(main())
