"""Which version of its values a tensor holds, counting the writes PyTorch's version counter
misses: a fused optimizer's step (``torch.optim.AdamW(fused=True)``, the Hugging Face Trainer's
default optimizer; SGD, Adam and Adagrad with ``fused=True``) writes the parameters in place
without bumping their counters.

A copy of a parameter's values kept across calls (a packed weight, a quantised copy) is current
while :func:`values_version` is what it was when the copy was made. Every optimizer's step runs
PyTorch's global step hooks, so the steps are counted per parameter of the optimizer's groups
(a parameter without a gradient is counted too: it costs one copy made again).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.weak import WeakIdKeyDictionary

_steps: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _count_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for group in optimizer.param_groups:
        for param in group["params"]:
            _steps[param] = _steps.get(param, 0) + 1


register_optimizer_step_post_hook(_count_step)


def values_version(t: torch.Tensor) -> tuple[int, int]:
    """(PyTorch's version counter of ``t``, the optimizer steps that have written it): a write
    changes one or the other. ``t`` must not be an inference tensor (it has no counter)."""
    return t._version, (_steps.get(t, 0) if _steps else 0)  # no step taken: no lookup
