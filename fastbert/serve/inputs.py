"""A request's inputs -> the token ids the model runs: texts tokenised (in the tokenizer
threads), token-id inputs checked against the vocabulary, every input held to the model's
limit (cut when truncating, else a 422), and the request held to its size limit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fastbert.embedding.readers import text_problem
from fastbert.embedding.text_model import InputTooLong, Prompting, TextModel
from fastbert.embedding.tokenize import Tokens
from fastbert.serve.errors import EmptyInput, ValidationFailed


@dataclass(frozen=True)
class Limits:
    """``max_inputs``: inputs per request; ``truncate``: the server's default for cutting
    inputs over the model's limit."""

    max_inputs: int
    truncate: bool


def as_list(inputs: object) -> list:
    """TEI's and OpenAI's ``inputs``: a text or one list of token ids is one input; any other
    list is a list of inputs."""
    if isinstance(inputs, str):
        return [inputs]
    if isinstance(inputs, list) and inputs and all(isinstance(i, int) for i in inputs):
        return [inputs]
    return list(inputs)


def check_count(items: Sequence, limits: Limits, field: str) -> None:
    """EmptyInput for no inputs or an empty one; ValidationFailed for too many, or for a text
    that is not Unicode (:func:`check_text`)."""
    if not items:
        raise EmptyInput(f"{field} is empty: give at least one input", param=field)
    for i, item in enumerate(items):
        if isinstance(item, str):
            check_text(item, f"{field}[{i}]", field)
        elif isinstance(item, list) and not item:
            raise EmptyInput(f"{field}[{i}] is empty", param=field)
    check_size(items, limits, field)


def check_size(items: Sequence, limits: Limits, field: str) -> None:
    """ValidationFailed for more inputs than the server takes in one request."""
    if len(items) > limits.max_inputs:
        raise ValidationFailed(
            f"{field} has {len(items)} inputs, more than this server's limit of "
            f"{limits.max_inputs} per request (--max-client-batch-size)",
            param=field,
        )


def check_text(text: str, name: str, field: str) -> None:
    """EmptyInput for a blank text; ValidationFailed for one that is not Unicode (a lone
    surrogate, which JSON's \\ud800 escapes parse to: nothing can tokenise it)."""
    problem = text_problem(text, "text")
    if problem == "empty text":
        raise EmptyInput(f"{name} is empty", param=field)
    if problem is not None:
        raise ValidationFailed(f"{name}: {problem}", param=field)


# What an input over the limit can do, on every route: OpenAI's request has no truncate field,
# Cohere's /v2/embed takes START / END / NONE, the others a bool.
TOO_LONG = (
    "shorten it, or send truncate=true (on /v2/embed truncate END or START; OpenAI's "
    "/v1/embeddings has no such field: the server cuts its inputs unless started with "
    "--no-auto-truncate)"
)


def characters(items: list[str | list[int] | None]) -> int:
    """How long the inputs are, as the cost of tokenising them: characters of the texts,
    ids of the token-id inputs (which are only checked)."""
    return sum(len(item) for item in items if item is not None)


def side(model: TextModel, direction: str | None) -> str:
    """ "right" or "left": ``direction`` in either case, or None for the side the model's
    tokenizer cuts from."""
    return direction.lower() if direction else model.text_tokenizer.truncation_side


def tokenize(
    model: TextModel,
    items: list[str | list[int]],
    truncate: bool,
    direction: str | None,
    field: str,
    prompting: Prompting | None = None,
) -> list[list[int]]:
    """Token ids of each input: texts tokenised as the model tokenises, after the prompt
    ``prompting`` names (None: the model's default); token-id inputs used as given (the
    prompt is not added), checked (every id within the vocabulary) and cut to the limit from
    ``direction`` when truncating. The limit: the model's, or the prompt's task's (a
    multi-vector model's query or document length). ValidationFailed naming the input over
    the limit (without truncation) or holding an unknown id."""
    texts = [(i, item) for i, item in enumerate(items) if isinstance(item, str)]
    ids: list[list[int]] = [[] for _ in items]
    limit = (prompting.max_length if prompting else None) or model.max_length
    if texts:
        tokens = _tokenize_texts(
            model,
            [t for _, t in texts],
            None,
            truncate,
            direction,
            field,
            [i for i, _ in texts],
            prompting,
        )
        for (i, _), row in zip(texts, tokens.ids):
            ids[i] = row
    vocab = model.vocabulary(prompting)
    for i, item in enumerate(items):
        if isinstance(item, list):
            ids[i] = _checked_ids(model, item, truncate, direction, f"{field}[{i}]", limit, vocab)
    return ids


def tokenize_pairs(
    model: TextModel,
    firsts: list[str],
    seconds: list[str | None],
    truncate: bool,
    direction: str | None,
    field: str,
) -> tuple[list[list[int]], list[list[int]]]:
    """(token ids, token types) of texts (``seconds[i]`` None) and text pairs, in order."""
    ids: list[list[int]] = [[] for _ in firsts]
    types: list[list[int]] = [[] for _ in firsts]
    singles = [i for i, s in enumerate(seconds) if s is None]
    pairs = [i for i, s in enumerate(seconds) if s is not None]
    if singles:
        tokens = _tokenize_texts(
            model, [firsts[i] for i in singles], None, truncate, direction, field, singles
        )
        for i, row in zip(singles, tokens.ids):
            ids[i], types[i] = row, [0] * len(row)
    if pairs:
        tokens = _tokenize_texts(
            model,
            [firsts[i] for i in pairs],
            [seconds[i] for i in pairs],
            truncate,
            direction,
            field,
            pairs,
        )
        type_ids = tokens.type_ids or [[0] * len(row) for row in tokens.ids]
        for i, row, row_types in zip(pairs, tokens.ids, type_ids):
            ids[i], types[i] = row, row_types
    return ids, types


def _tokenize_texts(
    model: TextModel,
    texts: list[str],
    pairs: list[str] | None,
    truncate: bool,
    direction: str | None,
    field: str,
    positions: list[int],
    prompting: Prompting | None = None,
) -> Tokens:
    """The model's tokens of ``texts`` (and ``pairs``), the request's inputs at
    ``positions`` of ``field``; ValidationFailed naming the input over the limit."""
    try:
        return model.tokenize(
            texts,
            pairs,
            truncate=truncate,
            side=side(model, direction),
            prompt=prompting.text if prompting else None,
            max_length=prompting.max_length if prompting else None,
            static=prompting.static if prompting else False,
        )
    except InputTooLong as exc:
        name = f"{field}[{positions[exc.index]}]"
        raise ValidationFailed(
            f"{name}: {exc.length} tokens, more than the limit of {exc.limit}; {TOO_LONG}",
            param=name,
        ) from exc


def check_ids(ids: list[int], vocab: int, name: str) -> None:
    """ValidationFailed when ``ids`` (the input ``name``) hold a token id outside the
    vocabulary (0 .. ``vocab`` - 1)."""
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise ValidationFailed(
            f"{name}: token id {bad} is outside the vocabulary (0 .. {vocab - 1})", param=name
        )


def _checked_ids(
    model: TextModel,
    ids: list[int],
    truncate: bool,
    direction: str | None,
    field: str,
    limit: int,
    vocab: int,
) -> list[int]:
    check_ids(ids, vocab, field)
    if len(ids) <= limit:
        return ids
    if not truncate:
        raise ValidationFailed(
            f"{field}: {len(ids)} tokens, more than the limit of {limit}; {TOO_LONG}",
            param=field,
        )
    return ids[-limit:] if side(model, direction) == "left" else ids[:limit]
