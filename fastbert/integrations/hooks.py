"""What an optimized model cannot run on the modules its encoder bypasses, refused by name.

A fastbert-optimized base model computes its output from its modules' parameters without
calling those modules (the embeddings, the layers, their linears, activations and LayerNorms,
the pooler), so whatever would change what one of them returns would be skipped without a
word: a hook registered on it (``register_forward_hook`` and the like: the Trainer's NEFTune
noise on the input embeddings), a global module hook, a ``forward`` replaced on the instance
(a monkeypatch, accelerate's ``add_hook_to_module``), or the module replaced by one of
another class (a ReLU for the GELU, a subclass of the pooler, a LoRA layer around a linear).
Such a call raises ValueError naming the module and what was done to it. The hooks Hugging
Face itself registers that change nothing fastbert computes are let through:
:data:`PASSIVE_HOOKS`; a linear or an embedding replaced by another of its kind is read anew.
The linears, embeddings and LayerNorms must be PyTorch's own, computing what those compute:
a subclass (fake-quantised training's linears, one with a forward of its own) or an
embedding with ``max_norm`` (which renormalizes its rows as it reads them),
``scale_grad_by_freq`` or ``sparse`` gradients is refused when bound.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules import module as torch_module

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
# PyTorch's global module hooks (torch.nn.modules.module.register_module_forward_hook, ...),
# which every module call runs.
_GLOBAL_HOOKS = (
    ("forward ", torch_module._global_forward_hooks),
    ("forward pre-", torch_module._global_forward_pre_hooks),
    ("backward ", torch_module._global_backward_hooks),
    ("backward pre-", torch_module._global_backward_pre_hooks),
)
_REFUSED = (
    "that a fastbert-optimized model would not run: its encoder reads the module's parameters "
    "without calling it"
)


class BypassedModules:
    """The modules under an optimized base model (not the base itself, whose call is
    PyTorch's), as bound: their hook dicts and attribute dicts listed once, so that a call's
    check is a few ``any`` over them (PyTorch fills and empties each dict in place), and their
    classes by path, for :meth:`refuse_replaced`."""

    def __init__(self, base: nn.Module):
        name = type(base).__name__
        # Paths start with base's class name (``BertModel.encoder.layer.1.output``).
        self.modules = [(f"{name}.{path}", m) for path, m in base.named_modules() if path]
        self._dicts = [dict_ for _, module in self.modules for _, dict_ in _hook_dicts(module)]
        self._attributes = [vars(module) for _, module in self.modules]
        self._classes = {path: type(module) for path, module in base.named_modules() if path}
        self._name = name
        for path, module in self.modules:
            problem = _unlike_plain(module)
            if problem is not None:
                raise ValueError(
                    f"{path} {problem}: fastbert's encoder reads its parameters and computes "
                    "what PyTorch's own module does. Use that module, or call the model "
                    "without fastbert.optimize"
                )

    def refuse_skipped_hooks(self) -> None:
        """ValueError when one of the modules holds a forward or backward hook other than
        :data:`PASSIVE_HOOKS`, or a forward of its own (the instance's), or a global module
        hook is registered; naming the module and the hook."""
        if any(self._dicts) or any(hooks for _, hooks in _GLOBAL_HOOKS):
            for path, module in [*self.modules, ("every module (a global hook)", None)]:
                dicts = _hook_dicts(module) if module is not None else _GLOBAL_HOOKS
                for kind, hooks in dicts:
                    for hook in hooks.values():
                        name = _name(hook)
                        if name not in PASSIVE_HOOKS:
                            what = KNOWN_HOOKS.get(name, name)
                            raise ValueError(
                                f"{path} has a {kind}hook ({what}) {_REFUSED}. Remove the "
                                "hook, or call the model without fastbert.optimize"
                            )
        if any("forward" in attributes for attributes in self._attributes):
            path = next(p for (p, _), a in zip(self.modules, self._attributes) if "forward" in a)
            raise ValueError(
                f"{path} has a forward of its own (a replaced forward, or accelerate's "
                f"add_hook_to_module) {_REFUSED}. Restore the module's forward, or call the "
                "model without fastbert.optimize"
            )

    def refuse_replaced(self, base: nn.Module, owners: set[str]) -> None:
        """ValueError when a module at one of the bound paths under ``base`` is now of another
        class: the encoder computes what the bound class computes (a linear or an embedding
        at one of ``owners``, the paths of the modules whose parameters it reads, may be
        replaced by another of its kind: the parameters are read anew)."""
        for path, module in base.named_modules():
            bound = self._classes.get(path)
            if bound is None or type(module) is bound:
                continue
            plain = type(module) in (nn.Linear, nn.Embedding) and _unlike_plain(module) is None
            if path in owners and plain:
                continue
            now = f"{type(module).__module__}.{type(module).__qualname__}"
            hint = (
                " (an adapter such as LoRA? merge the adapters into the weights, PEFT's "
                "merge_and_unload, and call that model)"
                if path in owners
                else ""
            )
            raise ValueError(
                f"{self._name}.{path} is now a {now}, where the model was bound to a "
                f"{bound.__qualname__}{hint}: fastbert's encoder computes what the "
                f"{bound.__qualname__} did, not the new module. Call the model without "
                "fastbert, or fastbert.optimize a model built with the new module's computation"
            )


def _unlike_plain(module: nn.Module) -> str | None:
    """How ``module``, a linear, embedding or LayerNorm, may compute other than PyTorch's own
    nn.Linear, nn.Embedding or nn.LayerNorm does (None: it does not, or it is none of them)."""
    plain = (nn.Linear, nn.Embedding, nn.LayerNorm)
    if not isinstance(module, plain):
        return None
    if type(module) not in plain:
        kind = next(c for c in plain if isinstance(module, c))
        return (
            f"is a {type(module).__module__}.{type(module).__qualname__}, a subclass of "
            f"nn.{kind.__name__}"
        )
    if isinstance(module, nn.Embedding):
        options = [
            f"{option}={getattr(module, option)!r}"
            for option, plain_value in (
                ("max_norm", None),
                ("scale_grad_by_freq", False),
                ("sparse", False),
            )
            if getattr(module, option) != plain_value
        ]
        if options:
            return f"is an nn.Embedding with {', '.join(options)}"
    return None


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
