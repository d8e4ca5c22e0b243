"""Griffe extension: the signatures of ``fastbert.kernels``' implemented functions.

A function decorated with ``@implements(reference.<op>)`` (fastbert/kernels/op.py) writes its
parameters without the reference's defaults and annotations, which the decorator gives it at
import; griffe reads the source, so the extension gives them to it here too, and the pages
show the signature a call sees.
"""

from __future__ import annotations

from typing import Any

import griffe


class ImplementedSignatures(griffe.Extension):
    """Give every ``implements``-decorated function of fastbert.kernels its reference's
    defaults and annotations."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name == "fastbert":
            kernels = pkg.members["kernels"]
            _adopt_implemented(kernels, kernels)


def _adopt_implemented(package: griffe.Module, module: griffe.Module) -> None:
    """Every function of ``module`` (and its submodules) decorated with ``implements(f)``
    takes f's defaults and annotations for the parameters it shares with f, and f's return
    annotation, as fastbert/kernels/op.py's ``implements`` gives them at import."""
    for member in list(module.members.values()):
        if member.is_alias:
            continue
        if member.is_module:
            _adopt_implemented(package, member)
        elif member.is_function:
            _adopt(package, member)


def _adopt(package: griffe.Module, function: griffe.Function) -> None:
    for decorator in function.decorators:
        call = decorator.value
        if not (isinstance(call, griffe.ExprCall) and str(call.function) == "implements"):
            continue
        path = call.arguments[0].canonical_path  # fastbert.kernels.<module>.<function>
        reference = package[path.removeprefix(f"{package.path}.")]
        _adopt(package, reference)  # a reference may itself implement another
        shared = {p.name: p for p in reference.parameters}
        for parameter in function.parameters:
            if parameter.name in shared:
                parameter.default = shared[parameter.name].default
                parameter.annotation = shared[parameter.name].annotation
        function.returns = reference.returns
