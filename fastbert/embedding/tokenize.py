"""Tokenising ahead of the model: a background thread turns rows into token ids, chunk by
chunk, into a bounded queue, so that tokenisation (the Rust tokenizers release the GIL)
overlaps the forward passes, and no more than ``depth`` chunks wait in memory. Rows that fill
one chunk at most are tokenised in the caller's thread: there is nothing to overlap."""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastbert.embedding.readers import Row

CHUNK_ROWS = 256  # rows tokenised together, ahead of the model, in the background thread


@dataclass
class Chunk:
    """Consecutive input rows, tokenised. ``rows``/``tokens``: the good rows and their token
    ids (special tokens included, truncated to the maximum length); ``bad``: the rows with a
    problem; ``cut``: whether each good row was truncated; ``end``: the index after the last row
    read (every row before it is in this chunk or an earlier one)."""

    rows: list[Row] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    bad: list[Row] = field(default_factory=list)
    cut: list[bool] = field(default_factory=list)
    end: int = 0


@dataclass
class Tokens:
    """Tokenised inputs: ``ids`` (special tokens included), ``type_ids`` (for text pairs whose
    tokenizer makes token types, else None) and ``cut`` (whether each input was truncated),
    one entry per input."""

    ids: list[list[int]]
    type_ids: list[list[int]] | None
    cut: list[bool]


class TextTokenizer:
    """texts (or text pairs) -> token ids, with the tokenizer's own ``truncation=True,
    max_length=max_length`` (special tokens included, as sentence-transformers tokenises).

    ``tokenizer``: a transformers tokenizer (a sentence-transformers folder's, set up by
    fastbert.embedding.model.load_tokenizer); ``max_length``: the most tokens per input;
    ``add_special_tokens``: False for ids without them (a SparseStaticEmbedding's). A
    prompt (``prefix``) goes before each text, inside the limit. Safe to
    call from several threads at once: each call borrows a copy of the tokenizer that no other
    call is using (made when none is free; as many exist as calls ever overlapped), since a Rust
    tokenizer refuses a call while another changes its truncation settings.
    """

    def __init__(self, tokenizer: Any, max_length: int, add_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.add_special_tokens = add_special_tokens
        self._lock = threading.Lock()
        self._free: dict[str, list[Any]] = {"right": [], "left": []}

    def __call__(
        self, texts: list[str], prefix: str = "", max_length: int | None = None
    ) -> tuple[list[list[int]], list[bool]]:
        tokens = self.encode(texts, prefix=prefix, max_length=max_length)
        return tokens.ids, tokens.cut

    def encode(
        self,
        texts: list[str],
        pairs: list[str] | None = None,
        *,
        truncate: bool = True,
        side: str | None = None,
        prefix: str = "",
        max_length: int | None = None,
    ) -> Tokens:
        """Token ids of ``prefix + text`` for each of ``texts`` (with ``pairs``: of the pairs
        (texts[i], pairs[i]), with token types). ``truncate``: cut each input to
        ``max_length`` tokens (default: the tokeniser's) from ``side`` ("right" or "left"; None:
        the tokenizer's own ``truncation_side``, as sentence-transformers cuts); without it,
        inputs keep every token (the caller checks the limit)."""
        if prefix:
            texts = [prefix + text for text in texts]
        with self._borrowed(side or self.truncation_side) as tokenizer:
            return self._encode(tokenizer, texts, pairs, truncate, max_length or self.max_length)

    @property
    def truncation_side(self) -> str:
        """The side the tokenizer cuts long inputs from unless told otherwise."""
        return getattr(self.tokenizer, "truncation_side", None) or "right"

    def prompt_length(self, prompt: str) -> int:
        """How many tokens ``prompt`` puts at the start of an input (its leading special token
        included, a trailing one not), as sentence-transformers measures it to leave a prompt
        out of pooling."""
        if not prompt:
            return 0
        ids = self.encode([prompt]).ids[0]
        special = set(getattr(self.tokenizer, "all_special_ids", ()))
        return len(ids) - 1 if ids and ids[-1] in special else len(ids)

    def _encode(
        self,
        tokenizer: Any,
        texts: list[str],
        pairs: list[str] | None,
        truncate: bool,
        max_length: int,
    ) -> Tokens:
        batch = tokenizer(
            texts,
            pairs,
            truncation=truncate,
            max_length=max_length if truncate else None,
            # A pair's token types as the tokenizer makes them: none where its model takes
            # none (a BERT checkpoint given a DistilBERT tokenizer runs every token as type 0).
            return_token_type_ids=pairs is not None and makes_token_types(tokenizer),
            return_attention_mask=False,
            add_special_tokens=self.add_special_tokens,
            verbose=False,
        )
        ids = batch["input_ids"]
        type_ids = batch.get("token_type_ids") if pairs is not None else None
        if not truncate:
            cut = [False] * len(ids)
        elif batch.encodings is not None:  # a fast tokenizer keeps what truncation cut off
            cut = [bool(e.overflowing) for e in batch.encodings]
        else:
            full = tokenizer(
                texts,
                pairs,
                truncation=False,
                add_special_tokens=self.add_special_tokens,
                verbose=False,
            )["input_ids"]
            cut = [len(row) > max_length for row in full]
        return Tokens(ids, type_ids, cut)

    def decode(self, rows: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """The text of each row of token ids, as the tokenizer decodes it (special tokens left
        out with ``skip_special_tokens``)."""
        with self._borrowed("right") as tokenizer:
            return tokenizer.batch_decode(rows, skip_special_tokens=skip_special_tokens)

    def details(self, texts: list[str], add_special_tokens: bool = True) -> list[list[dict]]:
        """Every token of each text, untruncated: ``{id, text, special, start, stop}`` (start
        and stop: character offsets into the text; None for special tokens), as TEI gives
        them: ``text`` is the text's characters from start to stop (the vocabulary's token
        for a special token, or where the tokenizer gives no offsets)."""
        with self._borrowed("right") as tokenizer:
            batch = tokenizer(
                texts,
                add_special_tokens=add_special_tokens,
                return_offsets_mapping=tokenizer.is_fast,
                return_special_tokens_mask=True,
                return_attention_mask=False,
                return_token_type_ids=False,
                verbose=False,
            )
            names = [tokenizer.convert_ids_to_tokens(ids) for ids in batch["input_ids"]]
        out = []
        for row, ids in enumerate(batch["input_ids"]):
            special = batch["special_tokens_mask"][row]
            offsets = batch["offset_mapping"][row] if "offset_mapping" in batch else None
            tokens = []
            for i, token_id in enumerate(ids):
                start, stop = (None, None)
                if not special[i] and offsets is not None:
                    start, stop = offsets[i]
                text = names[row][i] if start is None else texts[row][start:stop]
                tokens.append(
                    {
                        "id": token_id,
                        "text": text,
                        "special": bool(special[i]),
                        "start": start,
                        "stop": stop,
                    }
                )
            out.append(tokens)
        return out

    @contextlib.contextmanager
    def _borrowed(self, side: str) -> Iterator[Any]:
        """A copy of the tokenizer truncating from ``side`` that no other call is using."""
        if side not in self._free:
            raise ValueError(f"truncation side must be 'right' or 'left', got {side!r}")
        with self._lock:
            free = self._free[side]
            tokenizer = free.pop() if free else None
        if tokenizer is None:
            tokenizer = copy.deepcopy(self.tokenizer)
            tokenizer.truncation_side = side
        try:
            yield tokenizer
        finally:
            with self._lock:
                self._free[side].append(tokenizer)


def makes_token_types(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` gives token type ids unless told otherwise (they are among its
    model's inputs), as sentence-transformers and Hugging Face call it."""
    return "token_type_ids" in getattr(tokenizer, "model_input_names", ("token_type_ids",))


def tokenise_ahead(
    rows: Iterable[Row],
    tokenise: Callable[[list[str]], tuple[list, list[bool]]],
    chunk_rows: int = CHUNK_ROWS,
    depth: int = 8,
) -> Iterator[Chunk]:
    """The chunks of ``rows`` (``chunk_rows`` rows each), tokenised in a background thread;
    a sequence of at most ``chunk_rows`` rows (one short list) in the caller's thread, as
    starting and joining a thread would add about a millisecond to a call that has no forward
    pass to overlap.

    An exception in the thread (a reader's InputError) is raised here, in the caller's thread.
    Closing the iterator stops the thread.
    """
    if isinstance(rows, Sequence) and len(rows) <= chunk_rows:
        for chunk in _chunks(rows, chunk_rows):
            yield _tokenised(chunk, tokenise)
        return
    out: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for chunk in _chunks(rows, chunk_rows):
                if not put(_tokenised(chunk, tokenise)):
                    return
            put(done)
        except BaseException as exc:  # handed to the consumer, which raises it
            put(exc)

    thread = threading.Thread(target=work, name="fastbert-tokenise", daemon=True)
    thread.start()
    try:
        while True:
            item = out.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def _tokenised(chunk: Chunk, tokenise: Callable[[list[str]], tuple[list, list[bool]]]) -> Chunk:
    good = [r.text for r in chunk.rows]
    if good:
        chunk.tokens, chunk.cut = tokenise(good)
    return chunk


def _chunks(rows: Iterable[Row], size: int) -> Iterator[Chunk]:
    chunk = Chunk()
    count = 0
    for row in rows:
        (chunk.rows if row.problem is None else chunk.bad).append(row)
        chunk.end = row.index + 1
        count += 1
        if count == size:
            yield chunk
            chunk, count = Chunk(), 0
    if count:
        yield chunk
