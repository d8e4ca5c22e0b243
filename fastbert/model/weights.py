"""Following the parameters a model reads, cheaply enough to check on every call.

Two things can change under a model between calls:

- which tensors are its parameters: a parameter assigned (``module.weight = nn.Parameter(...)``,
  ``load_state_dict(..., assign=True)``) or a submodule replaced. Every such change registers
  a parameter or a module (a replacement made by ``copy.deepcopy``, or built before, registers
  no parameter now), which bumps :func:`registration_generation` (global PyTorch hooks), so
  the list of parameters is rebuilt only then;
- where their values live: ``.half()``, ``.to()`` and ``p.data = ...`` keep the parameter
  objects but give them new storage. :meth:`ParameterWatch.storage_key` (one pointer per
  parameter, about 0.1 us each) tells.

Nothing here is needed while the values change in place (``p.data.copy_(...)``, an optimizer
step): readers of the storage see those.
"""

from __future__ import annotations

import torch
from torch import nn

_generation = 0


def _count_registration(
    parent: nn.Module, name: str, child: nn.Parameter | nn.Module | None
) -> None:
    global _generation
    _generation += 1


torch.nn.modules.module.register_module_parameter_registration_hook(_count_registration)
torch.nn.modules.module.register_module_module_registration_hook(_count_registration)


def registration_generation() -> int:
    """A number that changes whenever a parameter or a submodule is registered on any
    module."""
    return _generation


class ParameterWatch:
    """The named parameters of ``module``, re-listed only after a registration."""

    def __init__(self, module: nn.Module):
        self.module = module
        self._generation = -1
        self._named: list[tuple[str, nn.Parameter]] = []
        self._params: list[nn.Parameter] = []

    def named(self) -> list[tuple[str, nn.Parameter]]:
        if self._generation != _generation:
            self._named = list(self.module.named_parameters())
            self._params = [p for _, p in self._named]
            self._generation = _generation
        return self._named

    def storage_key(self) -> tuple:
        """Where every parameter's values live: equal keys mean the same memory is read.

        The dtype of the first parameter is part of it: storage freed by a cast and reused
        for another dtype could otherwise give an equal key.
        """
        self.named()
        params = self._params
        return (params[0].dtype if params else None, *map(torch.Tensor.data_ptr, params))

    def first_requiring_grad(self) -> str | None:
        """The name of the first parameter with ``requires_grad``, or None."""
        for name, p in self.named():
            if p.requires_grad:
                return name
        return None
