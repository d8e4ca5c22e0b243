"""Following the parameters a model reads, cheaply enough to check on every call.

Two things can change under a model between calls:

- which tensors are its parameters: a parameter assigned (``module.weight = nn.Parameter(...)``,
  ``load_state_dict(..., assign=True)``) or a submodule replaced. Every such change registers
  a parameter, which bumps :func:`registration_generation` (a global PyTorch hook), so the
  list of parameters is rebuilt only then;
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


def _count_registration(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
    global _generation
    _generation += 1


torch.nn.modules.module.register_module_parameter_registration_hook(_count_registration)


def registration_generation() -> int:
    """A number that changes whenever a parameter is registered on any module."""
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


def refuse_gradients(what: str, requiring: str | None) -> None:
    """Raise when a forward of ``what`` would need gradients, which fastbert cannot give.

    ``requiring``: the name of a parameter or input that requires grad (None: none does).
    Call only with grad mode on.
    """
    if requiring is None:
        return
    raise RuntimeError(
        f"{what} runs inference only (it has no backward), but this call would need "
        f"gradients: grad mode is on and {requiring} requires grad. For inference, call it "
        "under torch.inference_mode() or torch.no_grad(), or call model.requires_grad_(False) "
        "first; to train, use the model without fastbert."
    )


def check_inference_only(watch: ParameterWatch, attention_mask: torch.Tensor | None) -> None:
    """Raise when a call of ``watch.module`` would need gradients: grad mode on and one of
    its parameters (or the float ``attention_mask``) requiring grad."""
    if not torch.is_grad_enabled():
        return
    if attention_mask is not None and attention_mask.requires_grad:
        requiring = "attention_mask"
    elif torch.compiler.is_compiling():  # named_parameters traces; the cached list does not
        requiring = next((n for n, p in watch.module.named_parameters() if p.requires_grad),
                         None)
    else:
        requiring = watch.first_requiring_grad()
    refuse_gradients(f"fastbert.{type(watch.module).__name__}", requiring)
