"""The request bodies of every route, as pydantic models: Hugging Face text-embeddings-inference's
shapes (``/embed``, ``/embed_sparse``, ``/embed_all``, ``/rerank``, ``/predict``, ``/tokenize``),
OpenAI's (``/v1/embeddings``) and Cohere's (``/v1/rerank``, ``/v2/embed``). They validate
each request and document it in the OpenAPI schema. Unknown fields are ignored, as these APIs'
servers do; a known field with a wrong type or value is a 422."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr

# A text, or its token ids (used as given: special tokens included).
TokenIds = list[StrictInt]
# TEI's and OpenAI's `inputs`: a text, a list of texts, one list of token ids, or a list of them
# (texts and token-id lists may mix).
Inputs = StrictStr | TokenIds | list[StrictStr | TokenIds]
Direction = Annotated[
    Literal["right", "left", "Right", "Left"] | None,
    Field(
        description="default: the side the model's tokenizer cuts from, as "
        "sentence-transformers cuts (right for most models)"
    ),
]
Dimensions = Annotated[
    StrictInt, Field(ge=1, description="keep the first N values, then normalise")
]
Truncate = Annotated[StrictBool | None, Field(description="default: the server's --auto-truncate")]
PromptName = Annotated[
    StrictStr | None,
    Field(description="one of the model's prompts (GET /info); default: its default prompt"),
]


class TeiEmbedRequest(BaseModel):
    """What TEI's embedding routes share: ``inputs``, ``truncate``, ``truncation_direction``
    and ``prompt_name``."""

    inputs: Inputs
    truncate: Truncate = None
    truncation_direction: Direction = None
    prompt_name: PromptName = None


class EmbedRequest(TeiEmbedRequest):
    """``POST /embed`` (TEI). Returns ``[[float]]``, one embedding per input."""

    normalize: StrictBool = True
    dimensions: Dimensions | None = None


class EmbedSparseRequest(TeiEmbedRequest):
    """``POST /embed_sparse`` (TEI, sparse models). Returns, per input, its non-zero entries
    ``[{index, value}]`` over the vocabulary, by index."""


class EmbedAllRequest(TeiEmbedRequest):
    """``POST /embed_all`` (TEI, multi-vector models). Returns ``[[[float]]]``: per input, the
    vector of every token the model scores."""


class OpenAIEmbeddingsRequest(BaseModel):
    """``POST /v1/embeddings`` (OpenAI). Embeddings are normalised, as OpenAI's are."""

    input: Inputs
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Dimensions | None = None
    user: StrictStr | None = None


EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]


class CohereEmbedRequest(BaseModel):
    """``POST /v2/embed`` (Cohere's shape, texts). Returns ``{id, embeddings: {type:
    [[...]]}, texts, meta}``."""

    texts: list[StrictStr]
    model: StrictStr | None = None
    input_type: (
        Literal["search_document", "search_query", "classification", "clustering"] | None
    ) = None
    embedding_types: Annotated[list[EmbeddingType], Field(min_length=1)] = ["float"]
    truncate: Literal["NONE", "START", "END"] = "END"
    output_dimension: Dimensions | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None


class RerankRequest(BaseModel):
    """``POST /rerank`` (TEI). Returns ``[{index, score, text?}]``, best first."""

    query: StrictStr
    texts: list[StrictStr]
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    truncate: StrictBool | None = None
    truncation_direction: Direction = None


class Document(BaseModel):
    text: StrictStr


class CohereRerankRequest(BaseModel):
    """``POST /v1/rerank`` (Cohere's shape). Returns ``{results: [{index, relevance_score,
    document?}]}``, best first."""

    query: StrictStr
    documents: list[StrictStr | Document]
    top_n: Annotated[StrictInt, Field(ge=1)] | None = None
    return_documents: StrictBool = False
    model: StrictStr | None = None
    truncate: Truncate = None  # not Cohere's: pairs over the limit on a --no-auto-truncate server


# A text, or a pair of texts (a cross-encoder's two sides).
Sequence = StrictStr | Annotated[list[StrictStr], Field(min_length=1, max_length=2)]


class PredictRequest(BaseModel):
    """``POST /predict`` (TEI): ``inputs`` is a text, a pair ``[a, b]``, or a list of either.
    Returns ``[{score, label}]`` per input, best first (a list of those for a list)."""

    inputs: Sequence | list[Sequence]
    raw_scores: StrictBool = False
    truncate: StrictBool | None = None
    truncation_direction: Direction = None


class TokenizeRequest(BaseModel):
    """``POST /tokenize`` (TEI). Returns, per input after the prompt ``prompt_name`` names
    (default: the model's default prompt, as ``/embed``), ``[{id, text, special, start,
    stop}]``."""

    inputs: StrictStr | list[StrictStr]
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = None
