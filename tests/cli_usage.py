"""A test that a benchmark script's command line refuses bad arguments as argparse does: exit
2 and its usage on stderr."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest


def usage_error_test(
    main: Callable[[list[str]], int], cases: Sequence[list[str]]
) -> Callable[..., None]:
    """A test, parametrised over ``cases`` (each the arguments after ``--out DIR``; an empty
    list means no ``--out`` at all), that ``main`` exits 2 with its usage: assign it to a
    module-level ``test_...`` name."""

    @pytest.mark.parametrize("argv", cases, ids=[" ".join(c) or "no --out" for c in cases])
    def test(tmp_path, argv: list[str], capsys) -> None:
        out = [] if argv == [] else ["--out", str(tmp_path)]
        with pytest.raises(SystemExit) as exit_info:
            main([*out, *argv])
        assert exit_info.value.code == 2
        assert "usage:" in capsys.readouterr().err

    return test
