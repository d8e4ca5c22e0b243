"""A faster call of @triton.jit helpers under Triton's interpreter, for the test run.

A launch under the interpreter swaps triton.language's builtins (tl.load, tl.dot, the tensor
operators...) for interpreted ones and puts them back when the launch ends. Every call of a
@triton.jit helper from inside the kernel swaps them again (Triton 3.6 to 3.9:
``interpreter._patch_lang``, an ``inspect.getmembers`` walk of tl, tl.tensor and tl.math,
~0.4 ms a call), though the launch's swap is still in place, and the helper's swap is never
undone on its own. The kernels call helpers in their inner loops (the GELU, the tile
position, the segment search), so the model-level tests spent a third of their time there.

:func:`install` makes the swap a no-op where it is already in place: every triton.language
module the function sees has its interpreted builtins (``tl.load`` is no longer the
builtin). The interpreted functions are the same, so results are too; a launch still swaps
and restores as before. Nothing changes where Triton has no ``_patch_lang``.
"""

from __future__ import annotations

import inspect


def _languages(fn) -> list:
    """The triton.language modules (tl or tl.core) in ``fn``'s globals, as Triton finds them."""
    import triton.language as tl

    return [v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)]


def install() -> bool:
    """Skip the interpreter's swap where it is in place; whether it was installed."""
    import triton.language as tl
    from triton.runtime import interpreter

    swap = getattr(interpreter, "_patch_lang", None)
    if swap is None or hasattr(swap, "triton_swap"):
        return False

    def swap_unless_in_place(fn):
        languages = _languages(fn)
        if languages and not any(tl.core.is_builtin(lang.load) for lang in languages):
            return interpreter._LangPatchScope()  # nothing swapped, nothing to restore
        return swap_unless_in_place.triton_swap(fn)

    swap_unless_in_place.triton_swap = swap  # Triton's own, for the tests
    interpreter._patch_lang = swap_unless_in_place
    return True
