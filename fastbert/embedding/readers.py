"""Reading a corpus: input files (.jsonl, .parquet, .csv, .txt) -> rows, in input order.

Every row of every input gets a global index (its row number across all inputs, counted from
0), whether it is good or bad, so that a range of indices names the same rows on every run:
this is what makes shards and resuming exact. A bad row (no text field, an empty text, a line
that is not UTF-8 or not JSON) is a :class:`Row` with ``problem`` set; the caller raises or
skips it. A file that cannot be opened raises :class:`InputError` when the inputs are listed,
before anything is read.
"""

from __future__ import annotations

import csv
import io
import json
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMATS = (".jsonl", ".parquet", ".csv", ".txt")
LIST_SOURCE = "<texts>"  # the source of in-memory texts: rows are named texts[i]


class InputError(ValueError):
    """An input that cannot be read: the message names the file (and the row)."""


class InputPathError(InputError):
    """An input path that names no file to read (none there, a type not read, an empty or
    unreadable one): found before anything runs (the command's usage error)."""


MISSING = object()  # a record's value of a field it does not have (None: the value null)


@dataclass(frozen=True)
class Row:
    """One input row. ``index``: its row number across all inputs; ``id``: the id field's value
    or None; ``text``: the text, or None when ``problem`` says why the row is bad;
    ``source``/``line``: the file and the row number in it (1-based, for messages)."""

    index: int
    id: Any
    text: str | None
    source: str
    line: int
    problem: str | None = None

    def output_id(self) -> Any:
        """The id the output holds for this row: its id field's value, else its row number."""
        return self.index if self.id is None else self.id

    def where(self) -> str:
        if self.source == LIST_SOURCE:
            return f"texts[{self.line}]"
        return f"{self.source}, row {self.line}"


class ListRows(Sequence[Row]):
    """The rows of an in-memory list of texts, row i being ``texts[i]`` (its own id), each
    made when it is read: a sequence of known length without a Row object per text held."""

    def __init__(self, texts: Sequence[str]):
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]  # negative indices, and IndexError past the end
        return Row(i, i, self.texts[i], LIST_SOURCE, i)


def list_inputs(inputs: Sequence[str | Path]) -> list[Path]:
    """Files (and the files of folders, sorted, of the types in FORMATS) -> the files to read.

    Raises InputError for a path that does not exist, a file of another type, or a folder with
    no readable file.
    """
    files: list[Path] = []
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            entries = sorted(path.iterdir())
            found = [p for p in entries if p.is_file() and p.suffix.lower() in FORMATS]
            if not found:
                raise InputPathError(f"{path}: the folder holds no {', '.join(FORMATS)} file")
            left = [p.name + ("/" if p.is_dir() else "") for p in entries if p not in found]
            if left:
                warnings.warn(
                    f"{path}: not read (subfolders and files of other types): "
                    f"{', '.join(left[:10])}{' ...' if len(left) > 10 else ''}",
                    stacklevel=2,
                )
            files.extend(found)
        elif not path.exists():
            raise InputPathError(f"{path}: no such file or folder")
        elif path.suffix.lower() not in FORMATS:
            raise InputPathError(
                f"{path}: unknown input type {path.suffix!r} (expected one of {', '.join(FORMATS)})"
            )
        else:
            files.append(path)
    for path in files:
        _check_readable(path)
    return files


def _check_readable(path: Path) -> None:
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise InputPathError(f"{path}: cannot be read ({exc.strerror or exc})") from exc


def count_rows(path: Path) -> int:
    """How many rows :func:`read_rows` reads from ``path`` (lines of .txt / .jsonl, records of
    .csv, rows of .parquet), good and bad."""
    if _format(path) == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if _format(path) == ".csv":
        return sum(1 for _ in _read_csv(path, "", None))
    count, last = 0, b"\n"
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def read_rows(
    files: Sequence[Path],
    text_field: str,
    id_field: str | None,
    first_index: int = 0,
    ids: IdKind | None = None,
) -> Iterator[Row]:
    """The rows of ``files`` in order, indexed across them from ``first_index``. In a .txt
    file every line is a text (``text_field`` does not apply, and ``id_field`` must be
    None). ``ids``: what learns the kind of the ids (see :class:`IdKind`; a new one when
    None)."""
    if id_field is not None:
        for path in files:
            if _format(path) == ".txt":
                raise InputError(
                    f"{path}: a .txt file has no fields, so no id field "
                    f"{id_field!r} (leave the id field out to number the rows)"
                )
    index = first_index
    ids = IdKind() if ids is None else ids
    for path in files:
        for line, text, row_id, problem in _READERS[_format(path)](path, text_field, id_field):
            if problem is None:
                problem = text_problem(text, text_field)
            if id_field is not None:
                if row_id is MISSING or row_id is None:
                    id_problem = text_problem(row_id, id_field)
                else:
                    id_problem = ids.problem(row_id)
                problem = problem or id_problem
            row_id = None if row_id is MISSING else row_id
            yield Row(index, row_id, text if problem is None else None, str(path), line, problem)
            index += 1


class IdKind:
    """The kind of a job's ids (an id column holds one type): set by the first id of a kind
    an output can hold (a string, a 64-bit integer, a number), that every later id must
    have; ``kind`` given: that kind, found beforehand (:func:`first_id_kind`)."""

    def __init__(self, kind: type | None = None) -> None:
        self.kind = kind

    def problem(self, row_id: Any) -> str | None:
        """Why ``row_id`` cannot be an id of the job, or None (then it sets the kind if unset)."""
        kind = type(row_id)
        if kind not in (str, int, float):
            return f"its id {row_id!r} is not a string or a number"
        if kind is int and not -(2**63) <= row_id < 2**63:
            return f"its id {row_id} does not fit in 64 bits"
        if kind is str and _has_surrogate(row_id):
            return "its id holds a lone surrogate, not Unicode text"
        if self.kind is None:
            self.kind = kind
        elif kind is not self.kind:
            names = {str: "a string", int: "an integer", float: "a number"}
            return f"its id {row_id!r} is {names[kind]} where the first id is {names[self.kind]}"
        return None


def first_id_kind(files: Sequence[Path], text_field: str, id_field: str) -> type | None:
    """The kind of the ids of a job reading ``files`` in order (that of its first id an output
    can hold), or None when no row has one: what :class:`IdKind` learns from the whole job,
    found without reading past that id (readers running apart, file by file, start from it)."""
    ids = IdKind()
    for _ in read_rows(files, text_field, id_field, ids=ids):
        if ids.kind is not None:
            break
    return ids.kind


def text_problem(text: Any, text_field: str) -> str | None:
    """Why ``text`` cannot be embedded (None, not a string, blank, not Unicode), or None when
    it can."""
    if text is MISSING:
        return f"no {text_field!r} field"
    if text is None:
        return f"its {text_field!r} is null"
    if not isinstance(text, str):
        return f"{text_field!r} is a {type(text).__name__}, not a string"
    if not text.strip():
        return "empty text"
    at = _surrogate_at(text)
    if at is not None:
        return f"a lone surrogate at character {at}, not Unicode text"
    return None


Record = tuple[int, Any, Any, "str | None"]  # line, text, id, problem


def _read_txt(path: Path, text_field: str, id_field: str | None) -> Iterator[Record]:
    with path.open("rb") as handle:
        for line, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8-sig" if line == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                yield line, None, None, "not UTF-8"
                continue
            yield line, text, None, None


def _read_jsonl(path: Path, text_field: str, id_field: str | None) -> Iterator[Record]:
    with path.open("rb") as handle:
        for line, raw in enumerate(handle, start=1):
            try:
                record = json.loads(raw.decode("utf-8-sig" if line == 1 else "utf-8"))
            except UnicodeDecodeError:
                yield line, None, None, "not UTF-8"
                continue
            except json.JSONDecodeError as exc:
                yield line, None, None, f"not JSON ({exc.msg})"
                continue
            if not isinstance(record, dict):
                yield line, None, None, "not a JSON object"
                continue
            yield line, _field(record, text_field), _field(record, id_field), None


def _read_csv(path: Path, text_field: str, id_field: str | None) -> Iterator[Record]:
    # Bytes that are not UTF-8 decode to lone surrogates, which mark their record bad.
    text = path.read_bytes().decode("utf-8-sig", errors="surrogateescape")
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))  # texts of any length
    # A record short of the header's fields has none of the last ones.
    reader = csv.DictReader(io.StringIO(text, newline=""), restval=MISSING)
    for row, record in enumerate(reader, start=1):
        if None in record:  # DictReader's key for the fields past the header's
            extra = len(record[None])
            yield row, None, None, f"{extra} more field(s) than the header (an unquoted comma?)"
            continue
        if any(_escaped(value) for value in record.values()):
            yield row, None, None, "not UTF-8"
            continue
        yield row, _field(record, text_field), _field(record, id_field), None


def _escaped(value: Any) -> bool:
    """Whether a decoded CSV value holds bytes that were not UTF-8 (surrogate escapes)."""
    return isinstance(value, str) and _has_surrogate(value)


def _has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (JSON's escapes can give one; so do the
    escapes of bytes that are not UTF-8): no Unicode text."""
    return _surrogate_at(text) is not None


def _surrogate_at(text: str) -> int | None:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _read_parquet(path: Path, text_field: str, id_field: str | None) -> Iterator[Record]:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises its own ArrowInvalid / OSError kinds
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from exc
    names = table.schema_arrow.names
    columns = [c for c in (text_field, id_field) if c is not None and c in names]
    row = 0
    for batch in table.iter_batches(columns=columns or None, batch_size=4096):
        missing = [MISSING] * batch.num_rows
        texts = batch.column(text_field).to_pylist() if text_field in names else missing
        ids = batch.column(id_field).to_pylist() if id_field in names else missing
        for i in range(batch.num_rows):
            row += 1
            yield row, texts[i], ids[i], None


def _field(record: dict, name: str | None) -> Any:
    """``record``'s value of the field ``name`` (None when no field is asked for); MISSING
    when it has no such field."""
    if name is None:
        return None
    return record.get(name, MISSING)


_READERS = {".txt": _read_txt, ".jsonl": _read_jsonl, ".csv": _read_csv, ".parquet": _read_parquet}


def _format(path: Path) -> str:
    """The input type of ``path``: its extension, in any case."""
    return path.suffix.lower()
