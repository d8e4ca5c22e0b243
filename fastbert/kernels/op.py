"""What an op is: one declaration of its parts, and the wiring every op gets from it, once.

An :class:`Op` declares one hot op (attention, linear, layer_norm, ...):

- ``reference``: its semantics. The float64-exact pure-PyTorch function of
  reference.py, whose signature is the op's public signature and whose docstring is its
  documentation; the tests' oracle.
- ``torch``: the torch backend's implementation (torch_ops.py), same signature, on
  inputs the caller has validated.
- ``prepare``: the public arguments -> the Triton forward's arguments. It validates them for
  the kernel (raising ``ValueError`` / ``TypeError`` that name the bad input), resolves the
  defaults and draws the dropout seed (:func:`dropout_seed`). The forward's last argument,
  ``save``, is added by the wiring.
- ``forward`` / ``backward``: the Triton launchers, each a :class:`Kernel`: its function, its
  ``torch.library`` schema and its fake (meta) implementation. A forward returns a tuple whose
  first item is the result, followed by what its backward needs (the attention's log-sum-exp,
  LayerNorm's row statistics, ...), kept only when called with ``save=True``: None otherwise.
- ``save(ctx, inputs, outputs)`` and ``gradients(ctx, backward, *grad_outputs)``: the autograd
  formula. What to keep on ``ctx``, and the gradients of the forward's arguments (``save``
  excluded) from those of its outputs, ``backward`` being the function to call with the
  backward kernel's arguments (it returns a tuple).
- ``finish``: the forward's outputs -> the public result (default: the first output).

From these, the wiring (this module, written once for every op) makes:

- the custom ops ``torch.ops.fastbert.<name>`` and ``<name>_backward``, so that a model built
  on the ops compiles with ``torch.compile(fullgraph=True)``: each is one opaque graph node
  whose fake implementation gives its outputs' shapes and dtypes; the forward's autograd
  formula calls the backward op, so compiled training steps trace too. Custom-op outputs are
  tensors, so a forward output the launcher left out (None) is a float32 ``[0]`` placeholder
  there, as the fakes declare. The custom ops trust their arguments (``prepare`` validated
  them); their fakes check shapes, so tracing a bad call fails.
- the eager ``torch.autograd.Function`` of the op, from the same ``save`` / ``gradients``,
  calling the launchers directly (the custom-op dispatcher's cost, paid on every op call,
  adds up over a forward: docs/results.md, "Measurements behind the code's choices").
- the public call, :meth:`Op.__call__`: ``prepare``; then while ``torch.compile`` traces, the
  custom op; in eager mode with gradients, the autograd Function; otherwise the forward
  launcher alone, saving nothing.

The op's other functions keep the reference's signature without writing it again:
:func:`implements` gives an implementation (the public Triton function, the torch backend's,
the CPU engine's) the reference's defaults and annotations, and :func:`checked` makes a
backend's public function from its unchecked one and its input checks.

The public functions of fastbert.kernels (``K.linear`` ...) call their op's declaration;
fastbert.execution.backends dispatches to ``op`` (triton) or ``op.torch`` (torch) by reading
the registry :data:`fastbert.kernels.OPS`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import dropout

NAMESPACE = "fastbert"


def first(outputs: tuple) -> torch.Tensor:
    """The default ``finish``: the forward's first output."""
    return outputs[0]


def needs_grad(*args: object) -> bool:
    """True when grad mode is on and a tensor among ``args`` requires grad: the op then runs
    through its autograd Function (or formula), otherwise exactly as in inference."""
    return torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in args
    )


def dropout_seed(dropout_p: float) -> torch.Tensor | None:
    """The dropout seed of one call, as the ops take it: an int64 CPU scalar tensor drawn from
    PyTorch's default generator (``torch.manual_seed`` makes it reproducible; while
    torch.compile traces, a traced random op), or None when nothing is dropped."""
    return dropout.draw_seed_tensor() if dropout_p > 0.0 else None


def implements(reference: Callable[..., Any]) -> Callable[[Callable[..., Any]], Any]:
    """Decorator of an implementation of ``reference`` (fastbert.kernels' public function, the
    torch backend's, the CPU engine's; or an op taking another op's arguments): the parameters
    it shares with the reference by name take the reference's defaults and annotations, so
    that an op's signature is written once, in the reference.

    The implementation lists its parameters without those defaults (and may leave out the
    reference's keyword-only test hooks, such as ``dropout_mask``, or add its own parameters,
    defaults written there). TypeError at import when it names the reference's parameters in
    another order, or writes a default the reference does not have: its signature would then
    not be the op's. The function itself is returned, so a call costs nothing more."""
    expected = inspect.signature(reference).parameters

    def adopt(function: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(function, eval_str=False).parameters
        shared = [name for name in own if name in expected]
        if shared != [name for name in expected if name in own]:
            raise TypeError(
                f"{function.__qualname__} takes {list(own)}, out of the order of "
                f"{reference.__qualname__}'s {list(expected)}"
            )
        parameters = []
        for name, parameter in own.items():
            if name in expected:
                ours, theirs = parameter.default, expected[name].default
                if ours is not parameter.empty and ours != theirs:
                    raise TypeError(
                        f"{function.__qualname__}: {name}={ours!r}, the reference's "
                        f"default is {theirs!r}"
                    )
                parameter = parameter.replace(default=theirs, annotation=expected[name].annotation)
            parameters.append(parameter)
        positional = [p for p in parameters if p.kind is not p.KEYWORD_ONLY]
        tail = [p.default for p in positional if p.default is not p.empty]
        if tail != [p.default for p in positional[len(positional) - len(tail) :]]:
            raise TypeError(
                f"{function.__qualname__}: a parameter without a default follows one with"
            )
        function.__defaults__ = tuple(tail) or None
        function.__kwdefaults__ = {
            p.name: p.default
            for p in parameters
            if p.kind is p.KEYWORD_ONLY and p.default is not p.empty
        } or None
        function.__annotations__ = {
            **{p.name: p.annotation for p in parameters if p.annotation is not p.empty},
            "return": inspect.signature(reference).return_annotation,
        }
        return function

    return adopt


def checked(unchecked: Callable[..., Any], *checks: Callable[..., Any]) -> Callable[..., Any]:
    """``unchecked`` (an op's implementation) behind its input checks: the public function of
    a backend, with ``unchecked``'s signature. Each of ``checks`` is called with the
    arguments it names (by parameter name, defaults filled in), in order, and raises
    ``ValueError`` / ``TypeError`` / ``RuntimeError`` naming the bad input; then ``unchecked``
    runs on the arguments as they were passed."""
    signature = inspect.signature(unchecked)
    parameters = signature.parameters.values()
    positional = [p.name for p in parameters if p.kind is not p.KEYWORD_ONLY]
    defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
    names = [tuple(inspect.signature(check).parameters) for check in checks]

    def call(*args: Any, **kwargs: Any) -> Any:
        # The arguments by name, without inspect's slower Signature.bind (microseconds a
        # call); a call that does not fit the signature gets bind's TypeError.
        arguments = {**defaults, **dict(zip(positional, args)), **kwargs}
        if len(args) > len(positional) or len(arguments) != len(signature.parameters):
            signature.bind(*args, **kwargs)
        for check, wanted in zip(checks, names):
            check(**{name: arguments[name] for name in wanted})
        return unchecked(*args, **kwargs)

    name = unchecked.__name__.removesuffix("_unchecked")
    call.__name__, call.__qualname__, call.__module__ = name, name, unchecked.__module__
    call.__signature__ = signature
    call.__doc__ = f":func:`{unchecked.__name__}`, its inputs checked first."
    call.__wrapped__ = unchecked
    return call


def placeholder(like: torch.Tensor) -> torch.Tensor:
    """What a custom op returns for an output its launcher left out: float32 [0] on ``like``'s
    device (every output of a custom op is a tensor, and no two may share storage)."""
    return torch.empty(0, dtype=torch.float32, device=like.device)


def _tensors_only(outputs: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor, ...]:
    like = next(o for o in outputs if o is not None)
    return tuple(placeholder(like) if o is None else o for o in outputs)


def _as_tuple(outputs: object) -> tuple:
    return outputs if isinstance(outputs, tuple) else (outputs,)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One Triton launcher as the wiring sees it.

    ``run``: the launcher (a tuple of outputs, or one tensor; None for an output it left out);
    ``schema``: its arguments and outputs in ``torch.library`` schema syntax, e.g.
    ``"(Tensor x, Tensor weight, Tensor? bias, str? activation, Tensor? residual, bool save)
    -> (Tensor, Tensor)"``; ``fake``: the same function on fake tensors (shapes, strides and
    dtypes of the outputs, placeholders as float32 [0]); ``tags``: torch.library tags (e.g.
    ``cudagraph_unsafe`` for a launcher that synchronises with the host).
    """

    run: Callable[..., Any]
    schema: str
    fake: Callable[..., Any]
    tags: tuple[torch.Tag, ...] = ()

    def check_arity(self, op_name: str) -> None:
        """TypeError unless ``run`` and ``fake`` take as many positional arguments as the
        schema names (a function taking ``*args`` is not checked)."""
        arguments = self.schema[self.schema.index("(") + 1 : self.schema.index(")")]
        count = len([a for a in arguments.split(",") if a.strip()])
        for function in (self.run, self.fake):
            parameters = inspect.signature(function).parameters.values()
            if any(p.kind is p.VAR_POSITIONAL for p in parameters):
                continue
            positional = [
                p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            if len(positional) != count:
                raise TypeError(
                    f"op {op_name}: {function.__qualname__} takes {len(positional)} positional "
                    f"arguments, its schema {count}: {self.schema}"
                )


@dataclasses.dataclass(frozen=True, eq=False)
class Op:
    """One hot op, declared once (see the module docstring for each part)."""

    name: str
    reference: Callable[..., torch.Tensor]
    torch: Callable[..., torch.Tensor]
    prepare: Callable[..., tuple]
    forward: Kernel
    backward: Kernel | None = None
    save: Callable[[Any, tuple, tuple], None] | None = None
    gradients: Callable[..., tuple] | None = None
    finish: Callable[[tuple], torch.Tensor] = first
    custom_op: Any = dataclasses.field(init=False, repr=False)
    function: type[torch.autograd.Function] | None = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        if (self.backward is None) != (self.save is None) or (self.save is None) != (
            self.gradients is None
        ):
            raise ValueError(f"op {self.name}: backward, save and gradients go together")
        for kernel in (self.forward, self.backward):
            if kernel is not None:
                kernel.check_arity(self.name)
        forward_op = _custom_op(self.name, self.forward)
        function = None
        if self.backward is not None:
            backward_op = _custom_op(f"{self.name}_backward", self.backward)
            forward_op.register_autograd(
                self._formula(_tupled(backward_op)), setup_context=self._setup_context
            )
            function = self._autograd_function(_tupled(self.backward.run))
        object.__setattr__(self, "custom_op", forward_op)
        object.__setattr__(self, "function", function)

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The op on the Triton kernels, with the reference's signature and semantics."""
        prepared = self.prepare(*args, **kwargs)
        save = self.backward is not None and needs_grad(*prepared)
        if torch.compiler.is_compiling():
            outputs = _as_tuple(self.custom_op(*prepared, save))
        elif save:
            outputs = self.function.apply(*prepared, save)
        else:
            outputs = _as_tuple(self.forward.run(*prepared, False))
        return self.finish(outputs)

    def _setup_context(self, ctx: Any, inputs: tuple, output: Any) -> None:
        # torch.library passes ``output`` by keyword.
        self.save(ctx, inputs, _as_tuple(output))

    def _formula(self, backward: Callable[..., tuple]) -> Callable[..., tuple]:
        """``gradients`` calling ``backward``, and no gradient for ``save``."""

        def formula(ctx: Any, *grad_outputs: torch.Tensor | None) -> tuple:
            return (*self.gradients(ctx, backward, *grad_outputs), None)

        return formula

    def _autograd_function(self, backward: Callable[..., tuple]) -> type[torch.autograd.Function]:
        """The eager autograd Function: the custom op's formula, with ``backward`` the
        backward launcher itself instead of the backward custom op."""
        op = self
        formula = self._formula(backward)

        class Function(torch.autograd.Function):
            @staticmethod
            def forward(*args: Any) -> tuple:
                return _as_tuple(op.forward.run(*args))

            @staticmethod
            def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
                ctx.set_materialize_grads(False)
                op.save(ctx, inputs, output)

            @staticmethod
            def backward(ctx: Any, *grad_outputs: torch.Tensor | None) -> tuple:
                if torch.is_grad_enabled():  # create_graph=True: a gradient of the gradient
                    raise RuntimeError(
                        f"fastbert's {op.name} op is differentiable once: its backward kernels "
                        "record no graph, so the gradient of its gradient (create_graph=True, "
                        "a gradient penalty) would be wrong; use backend='torch' for it"
                    )
                return formula(ctx, *grad_outputs)

        Function.__name__ = Function.__qualname__ = f"{_camel(self.name)}Function"
        return Function


def _tupled(function: Callable[..., Any]) -> Callable[..., tuple]:
    """``function`` returning a tuple also when it returns one tensor (a backward's callers
    unpack its gradients)."""

    def run(*args: Any) -> tuple:
        return _as_tuple(function(*args))

    return run


def _custom_op(name: str, kernel: Kernel) -> Any:
    """``torch.ops.fastbert.<name>``: ``kernel.run`` behind ``kernel.schema``, with its fake.

    RuntimeError if the op is registered already: torch.library would replace the first
    registration, and the objects holding it would then call freed memory."""
    if hasattr(getattr(torch.ops, NAMESPACE), name):
        raise RuntimeError(
            f"{NAMESPACE}::{name} is registered already: fastbert's kernels were imported twice "
            "(as fastbert.kernels and under another name?)"
        )

    def real(*args: Any) -> Any:
        outputs = kernel.run(*args)
        return _tensors_only(outputs) if isinstance(outputs, tuple) else outputs

    op = torch.library.custom_op(
        f"{NAMESPACE}::{name}",
        real,
        mutates_args=(),
        schema=kernel.schema,
        tags=kernel.tags or None,
    )
    op.register_fake(kernel.fake)
    return op


def _camel(name: str) -> str:
    return "".join(part.title() for part in name.split("_"))
