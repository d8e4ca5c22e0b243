"""The per-op kernel tests' bad-input cases: each op is called with valid arguments but for
one or more changed ones, and must refuse them with a given exception and message."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

# A bad-input case: (changes, exception type, message pattern). ``changes`` maps the name of an
# argument to a function of the valid arguments that returns its bad value.
BadCase = tuple[dict[str, Callable[[dict], object]], type[Exception], str]


def float64_case(*names: str) -> BadCase:
    """The case of the named arguments in float64, which every kernel refuses."""
    return {name: (lambda a, name=name: a[name].double()) for name in names}, TypeError, "float64"


def meta_case(name: str) -> BadCase:
    """The case of the named argument on the meta device, which no kernel mixes with others."""
    return {name: lambda a: a[name].to("meta")}, ValueError, "device mismatch"


def rows_case(name: str, rows: int, shape: tuple[int, ...]) -> BadCase:
    """The case of the named argument cut to its first ``rows`` rows, refused with a message
    naming the ``shape`` it must have."""
    expected = re.escape(str(shape))
    return {name: lambda a: a[name][:rows]}, ValueError, f"{name} must have shape {expected}"


def with_changes(args: dict[str, object], changes: dict[str, Callable[[dict], object]]) -> dict:
    """``args`` with each argument named in ``changes`` replaced by ``change(args)`` (every
    change sees the valid arguments)."""
    return {**args, **{name: change(args) for name, change in changes.items()}}


def assert_refused(op: Callable[..., object], args: dict[str, object], case: BadCase) -> None:
    """``op(**args)`` with the ``case``'s changes made raises the case's exception, with a
    message matching its pattern. The bad arguments are made before the call, so a change that
    itself raises fails the test."""
    changes, exc, match = case
    bad_args = with_changes(args, changes)
    with pytest.raises(exc, match=match):
        op(**bad_args)


def bad_input_test(
    op: Callable[..., object],
    valid_args: Callable[[str], dict[str, object]],
    cases: dict[str, BadCase],
) -> Callable[..., None]:
    """A test, parametrised over the named ``cases``, that ``op`` refuses each: assign it to a
    module-level ``test_...`` name. ``valid_args(device)``: keyword arguments ``op`` accepts."""

    @pytest.mark.parametrize("case", cases, ids=list(cases))
    def test(device: str, case: str) -> None:
        assert_refused(op, valid_args(device), cases[case])

    return test


def interpreter_needed_test(
    op: Callable[..., object], valid_args: Callable[[str], dict[str, object]]
) -> Callable[..., None]:
    """A test that ``op`` on CPU tensors, with the Triton interpreter off, says to set
    TRITON_INTERPRET=1: assign it to a module-level ``test_...`` name."""

    def test(interpreter_off: None) -> None:
        with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
            op(**valid_args("cpu"))

    return test
