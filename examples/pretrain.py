"""Pre-train a small BERT from scratch with masked-LM and next-sentence prediction, using
``fastbert.BertForPreTraining`` in a plain PyTorch loop.

The corpus is made here: "sentences" are runs of consecutive number words (w7 w8 w9 ...),
so a masked word is predictable from its neighbours, and sentence B follows sentence A when
it continues A's count (half the pairs) or starts anywhere (the other half). Runs on a CPU in
about a minute::

    python examples/pretrain.py              # 200 steps, batch 32
    python examples/pretrain.py --help
"""

from __future__ import annotations

import argparse
import math
import random
import sys

import torch

import fastbert

SPECIAL = ["[PAD]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = 40
PAD, CLS, SEP, MASK = range(4)
MAX_LENGTH = 16


def _word(n: int) -> int:
    return len(SPECIAL) + n % WORDS


def make_pair(rng: random.Random) -> tuple[list[int], list[int], list[int], int]:
    """(input ids, token types, masked-LM labels, next-sentence label) of one example."""
    start, len_a, len_b = rng.randrange(WORDS), rng.randint(2, 6), rng.randint(2, 6)
    follows = rng.random() < 0.5
    start_b = start + len_a if follows else rng.randrange(WORDS)
    a = [_word(start + i) for i in range(len_a)]
    b = [_word(start_b + i) for i in range(len_b)]
    ids = [CLS, *a, SEP, *b, SEP]
    types = [0] * (len_a + 2) + [1] * (len_b + 1)
    labels = [-100] * len(ids)
    for i, token in enumerate(ids):
        if token >= len(SPECIAL) and rng.random() < 0.15:
            labels[i], ids[i] = token, MASK
    return ids, types, labels, 0 if follows else 1  # 0 = "B follows A", as in BERT


def make_batch(size: int, rng: random.Random) -> dict[str, torch.Tensor]:
    """A right-padded batch of :func:`make_pair` examples."""
    pairs = [make_pair(rng) for _ in range(size)]

    def padded(column: int, fill: int) -> torch.Tensor:
        return torch.tensor([p[column] + [fill] * (MAX_LENGTH - len(p[column])) for p in pairs])

    ids = padded(0, PAD)
    return {
        "input_ids": ids,
        "attention_mask": (ids != PAD).long(),
        "token_type_ids": padded(1, 0),
        "labels": padded(2, -100),
        "next_sentence_label": torch.tensor([p[3] for p in pairs]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be >= 1")
    if not 0 < args.lr < math.inf:  # nan fails it too
        parser.error(f"--lr must be a number > 0, got {args.lr}")

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = fastbert.BertConfig(
        vocab_size=len(SPECIAL) + WORDS,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=MAX_LENGTH,
    )
    model = (
        fastbert.BertForPreTraining(config, device=device, backend=args.backend)
        .init_weights()
        .train()
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rng = random.Random(args.seed)
    try:
        from tqdm import tqdm

        steps = tqdm(range(args.steps), desc="pre-training", unit="step")
    except ImportError:
        steps = range(args.steps)
    losses = []
    for _ in steps:
        batch = {k: v.to(device) for k, v in make_batch(args.batch_size, rng).items()}
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    model.eval()
    held_out = {k: v.to(device) for k, v in make_batch(512, random.Random(-1)).items()}
    with torch.no_grad():
        out = model(**held_out)
    masked = held_out["labels"] != -100
    mlm = (out.prediction_logits.argmax(-1)[masked] == held_out["labels"][masked]).float().mean()
    nsp = (out.seq_relationship_logits.argmax(-1) == held_out["next_sentence_label"]).float()
    window = max(1, min(10, len(losses) // 2))
    print(
        f"{args.steps} steps: loss {sum(losses[:window]) / window:.3f} -> "
        f"{sum(losses[-window:]) / window:.3f}; held-out masked-word accuracy {mlm:.1%}, "
        f"next-sentence accuracy {nsp.mean():.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
