"""The losses of the heads, as Hugging Face's BERT heads compute them from ``labels``.

Every loss is computed in float32 whatever the logits' dtype (as under Hugging Face's usual
mixed precision, where the loss runs outside autocast's half-precision ops). Labels of the
wrong shape raise ValueError naming the head and both shapes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
# Label value the token-level losses skip (padding, unmasked tokens): PyTorch's default.
IGNORE_INDEX = -100


def _check_shape(what: str, labels: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(labels.shape) != expected:
        raise ValueError(
            f"{what} labels must have shape {list(expected)}, got {list(labels.shape)}"
        )


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of [B, S, vocab] logits against [B, S] token ids; positions labelled
    -100 are skipped."""
    _check_shape("masked-LM", labels, tuple(logits.shape[:-1]))
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        labels.reshape(-1).long(),
        ignore_index=IGNORE_INDEX,
    )


def next_sentence_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of [B, 2] logits against [B] labels (0 = B follows A)."""
    _check_shape("next-sentence", labels, (logits.shape[0],))
    return F.cross_entropy(logits.float(), labels.long())


def problem_type(num_labels: int, labels: torch.Tensor, configured: str | None) -> str:
    """The configured problem type, else Hugging Face's inference from the labels: one
    output is a regression, integer labels a single-label classification, float labels a
    multi-label one."""
    if configured is not None:
        return configured
    if num_labels == 1:
        return "regression"
    if not labels.dtype.is_floating_point:
        return "single_label_classification"
    return "multi_label_classification"


def sequence_classification_loss(
    logits: torch.Tensor, labels: torch.Tensor, configured: str | None = None
) -> torch.Tensor:
    """The loss of [B, num_labels] logits under :func:`problem_type`: mean squared error
    (labels [B] for one output, else [B, num_labels]), cross-entropy (labels [B] class ids)
    or binary cross-entropy with logits (labels [B, num_labels] in [0, 1])."""
    batch, num_labels = logits.shape
    kind = problem_type(num_labels, labels, configured)
    logits = logits.float()
    if kind == "regression":
        if num_labels == 1:
            _check_shape("regression", labels.reshape(-1), (batch,))
            return F.mse_loss(logits.reshape(-1), labels.reshape(-1).float())
        _check_shape("regression", labels, (batch, num_labels))
        return F.mse_loss(logits, labels.float())
    if kind == "single_label_classification":
        _check_shape("single-label classification", labels, (batch,))
        return F.cross_entropy(logits, labels.long())
    _check_shape("multi-label classification", labels, (batch, num_labels))
    return F.binary_cross_entropy_with_logits(logits, labels.float())
