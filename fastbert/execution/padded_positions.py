"""Whether a call must compute the outputs at padded positions.

A padding-free call computes the real tokens only (zeros at padding). A head whose loss reads
padded positions (token-level labels with a target there) needs them computed as Hugging Face
computes them: its thread asks for every position (:func:`every_position_if`), and the
runner (fastbert.execution.runtime) then runs that thread's padded calls dense.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch


class _EveryPosition(threading.local):
    wanted = False


# Whether this thread's padded calls must compute the padded positions (want_every_position).
_every_position = _EveryPosition()


def want_every_position(wanted: bool) -> bool:
    """From now on, this thread's padded calls run dense when ``wanted``: every position,
    padded ones included, computed as Hugging Face computes it, for a head whose loss reads
    them (a packed call gives zeros at padding). Returns the setting it replaces."""
    before = _every_position.wanted
    _every_position.wanted = wanted
    return before


@contextlib.contextmanager
def every_position_if(wanted: bool) -> Iterator[None]:
    """Within the block, this thread's padded calls run dense when ``wanted`` (else as they
    would: an enclosing block's setting holds)."""
    before = want_every_position(wanted or _every_position.wanted)
    try:
        yield
    finally:
        want_every_position(before)


def labels_at_padding(attention_mask: object, labels: object) -> bool:
    """Whether token-level ``labels`` ([B, S], -100 = no target) hold a target at a padded
    position of ``attention_mask`` [B, S] (0 = padding): a loss over them reads the outputs
    there. A host read, made only when both are tensors of that shape."""
    if not isinstance(attention_mask, torch.Tensor) or not isinstance(labels, torch.Tensor):
        return False
    if labels.shape != attention_mask.shape:
        return False
    return bool(((attention_mask == 0) & (labels != -100)).any())


def wanted() -> bool:
    """Whether this thread's padded calls must compute every position now."""
    return _every_position.wanted
