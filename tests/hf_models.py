"""Tiny random Hugging Face BERT models and inputs shared by the end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import torch


def encoder_shape(hidden: int, layers: int, heads: int, intermediate: int) -> dict[str, int]:
    """The config values that size an encoder, in the names of Hugging Face's BERT-style
    families (BERT, RoBERTa, ELECTRA, MPNet, ModernBERT) and of fastbert's BertConfig."""
    return dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
    )


NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# The tiny encoder the end-to-end tests share, no dropout.
TINY_SHAPE = dict(encoder_shape(64, 2, 2, 128), **NO_DROPOUT)
# Hugging Face DistilBERT's config names for the BERT ones it shares.
_DISTILBERT_NAMES = {
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "intermediate_size": "hidden_dim",
    "hidden_act": "activation",
    "hidden_dropout_prob": "dropout",
    "attention_probs_dropout_prob": "attention_dropout",
}


def as_distilbert(values: dict) -> dict:
    """BERT-named config ``values`` in DistilBERT's names, less those DistilBERT has no
    setting for (token types, LayerNorm eps)."""
    return {
        _DISTILBERT_NAMES.get(name, name): value
        for name, value in values.items()
        if name not in ("type_vocab_size", "layer_norm_eps")
    }


def tiny_config(**overrides):
    from transformers import BertConfig

    values = dict(
        vocab_size=97,
        **TINY_SHAPE,
        max_position_embeddings=160,
        type_vocab_size=2,
        num_labels=3,
    )
    values.update(overrides)
    return BertConfig(**values)


def randomize(
    model: torch.nn.Module, seed: int = 0, norm: str = "LayerNorm.weight"
) -> torch.nn.Module:
    """Give every parameter (norm weights included: those whose names contain ``norm``, near
    one) random values, so no term can hide."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if norm in name:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.08 * noise)
    return model.eval()


def random_hf_model(
    model_class: str,
    config: object,
    seed: int = 0,
    norm: str = "LayerNorm.weight",
    attn_implementation: str | None = None,
) -> torch.nn.Module:
    """The transformers class named ``model_class`` built from ``config`` (a transformers
    config) after ``torch.manual_seed(seed)``, then randomized (see :func:`randomize`);
    ``attn_implementation`` (e.g. "eager") picks its attention, else transformers' default."""
    import transformers

    torch.manual_seed(seed)
    cls = getattr(transformers, model_class)
    if attn_implementation is None:
        model = cls(config)
    else:
        model = cls._from_config(config, attn_implementation=attn_implementation)
    return randomize(model, seed, norm)


def hf_model(cls_name: str = "BertModel", seed: int = 0, **overrides) -> torch.nn.Module:
    return random_hf_model(cls_name, tiny_config(**overrides), seed)


def padded_batch(
    lengths: list[int], vocab: int = 97, seed: int = 0, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, token_type_ids), each [B, max(lengths)], right-padded."""
    gen = torch.Generator().manual_seed(seed)
    seq = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), seq), generator=gen)
    mask = (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()
    types = torch.randint(0, 2, (len(lengths), seq), generator=gen) * mask
    ids = ids * mask
    return ids.to(device), mask.to(device), types.to(device)


def dropout_logits(
    model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The logits of ``model(*inputs)`` (no grad) in eval mode, then switched to train mode
    (where the model stays): right after ``torch.manual_seed(seed)``, on the next call, and
    after the same seed again. (evaluated, first, second, again): with dropout working, first
    == again, first != second and first != evaluated."""
    with torch.no_grad():
        evaluated = model(*inputs).logits
        model.train()
        torch.manual_seed(seed)
        first = model(*inputs).logits
        second = model(*inputs).logits
        torch.manual_seed(seed)
        again = model(*inputs).logits
    return evaluated, first, second, again


def as_pytorch_bin(folder: Path) -> Path:
    """Turn the model.safetensors of a save_pretrained folder into pytorch_model.bin (the
    legacy format, which transformers 5 no longer writes); returns the new file."""
    from safetensors.torch import load_file

    safetensors = folder / "model.safetensors"
    path = folder / "pytorch_model.bin"
    torch.save(load_file(safetensors), path)
    safetensors.unlink()
    return path


def inference_model(source, **options):
    """A fastbert BertModel for inference whose parameters do not require grad, so its calls
    need no torch.no_grad() to be graphed (the graph tests call it from threads, whose grad
    mode starts on)."""
    import fastbert

    return fastbert.BertModel.from_pretrained(source, **options).requires_grad_(False)


def before_and_after_optimize(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], **options
) -> tuple[object, object]:
    """(``model(**inputs)`` as it is, the same after ``fastbert.optimize(model, **options)``),
    without grad; the model stays optimized."""
    import fastbert

    with torch.no_grad():
        expected = model(**inputs)
        fastbert.optimize(model, **options)
        got = model(**inputs)
    return expected, got
