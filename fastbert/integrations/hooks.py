"""The module hooks an optimized model cannot run, refused at each call.

A fastbert-optimized base model computes its output from its modules' parameters without
calling those modules (the embeddings, the layers, their linears and LayerNorms), so a hook
registered on one of them (``register_forward_hook`` and the like) would never run: a hook
that changes what the module returns (the Trainer's NEFTune noise on the input embeddings, an
edit of a layer's output) would be skipped without a word. Such a call raises ValueError
naming the module and the hook. The hooks Hugging Face itself registers that change nothing
fastbert computes are let through: :data:`PASSIVE_HOOKS`.
"""

from __future__ import annotations

from torch import nn

# Hugging Face's hooks that change nothing a fastbert encoder computes, by function name:
# activation checkpointing's (``enable_input_require_grads``: the embeddings' output requires
# grad, for checkpointed layers whose parameters are all frozen; fastbert's encoder checkpoints
# its own layers, whose inputs carry the gradient the parameters need), and the output
# recorders transformers installs for output_attentions / output_hidden_states (which a
# fastbert-optimized model refuses, so they record nothing).
PASSIVE_HOOKS = ("make_inputs_require_grads", "output_capturing_hook")
# Why a known hook is there, for the error message.
KNOWN_HOOKS = {
    "neftune_post_forward_hook": "NEFTune's noise (the Trainer's neftune_noise_alpha)",
}


class BypassedModules:
    """The modules under an optimized base model (not the base itself, whose hooks run: its
    call is PyTorch's), with their hook dicts listed once, so that a call's check is one
    ``any`` over them (PyTorch fills and empties each dict in place)."""

    def __init__(self, base: nn.Module):
        name = type(base).__name__
        # Paths start with base's class name (``BertModel.encoder.layer.1.output``).
        self.modules = [(f"{name}.{path}", m) for path, m in base.named_modules() if path]
        self._dicts = [dict_ for _, module in self.modules for _, dict_ in _hook_dicts(module)]

    def refuse_skipped_hooks(self) -> None:
        """ValueError when one of the modules holds a forward or backward hook other than
        :data:`PASSIVE_HOOKS`, naming the module and the hook."""
        if not any(self._dicts):
            return
        for path, module in self.modules:
            for kind, hooks in _hook_dicts(module):
                for hook in hooks.values():
                    name = _name(hook)
                    if name in PASSIVE_HOOKS:
                        continue
                    what = KNOWN_HOOKS.get(name, name)
                    raise ValueError(
                        f"{path} has a {kind}hook ({what}) that a fastbert-optimized model "
                        "would not run: its encoder reads the module's parameters without "
                        "calling it. Remove the hook, or call the model without "
                        "fastbert.optimize"
                    )


def _hook_dicts(module: nn.Module) -> tuple[tuple[str, dict], ...]:
    """(kind, dict) of each of ``module``'s hook dicts."""
    return (
        ("forward ", module._forward_hooks),
        ("forward pre-", module._forward_pre_hooks),
        ("backward ", module._backward_hooks),
        ("backward pre-", module._backward_pre_hooks),
    )


def _name(hook: object) -> str:
    """A hook's function name (a functools.partial's function's)."""
    function = getattr(hook, "func", hook)
    return getattr(function, "__name__", type(function).__name__)
