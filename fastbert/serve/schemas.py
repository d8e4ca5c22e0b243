"""The request bodies of every route, as pydantic models: Hugging Face text-embeddings-inference's
shapes (``/embed``, ``/rerank``, ``/predict``, ``/tokenize``), OpenAI's (``/v1/embeddings``) and
Cohere's (``/v1/rerank``). They validate each request and document it in the OpenAPI schema.
Unknown fields are ignored, as both APIs' servers do; a known field with a wrong type or value
is a 422."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr

# A text, or its token ids (used as given: special tokens included).
TokenIds = list[StrictInt]
# TEI's and OpenAI's `inputs`: a text, a list of texts, one list of token ids, or a list of them
# (texts and token-id lists may mix).
Inputs = StrictStr | TokenIds | list[StrictStr | TokenIds]
Direction = Literal["right", "left", "Right", "Left"]
Dimensions = Annotated[
    StrictInt, Field(ge=1, description="keep the first N values, then normalise")
]


class EmbedRequest(BaseModel):
    """``POST /embed`` (TEI). Returns ``[[float]]``, one embedding per input."""

    inputs: Inputs
    normalize: StrictBool = True
    truncate: StrictBool | None = Field(None, description="default: the server's --auto-truncate")
    truncation_direction: Direction = "right"
    dimensions: Dimensions | None = None


class OpenAIEmbeddingsRequest(BaseModel):
    """``POST /v1/embeddings`` (OpenAI). Embeddings are normalised, as OpenAI's are."""

    input: Inputs
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Dimensions | None = None
    user: StrictStr | None = None


class RerankRequest(BaseModel):
    """``POST /rerank`` (TEI). Returns ``[{index, score, text?}]``, best first."""

    query: StrictStr
    texts: list[StrictStr]
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    truncate: StrictBool | None = None
    truncation_direction: Direction = "right"


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


# A text, or a pair of texts (a cross-encoder's two sides).
Sequence = StrictStr | Annotated[list[StrictStr], Field(min_length=1, max_length=2)]


class PredictRequest(BaseModel):
    """``POST /predict`` (TEI): ``inputs`` is a text, a pair ``[a, b]``, or a list of either.
    Returns ``[{score, label}]`` per input, best first (a list of those for a list)."""

    inputs: Sequence | list[Sequence]
    raw_scores: StrictBool = False
    truncate: StrictBool | None = None
    truncation_direction: Direction = "right"


class TokenizeRequest(BaseModel):
    """``POST /tokenize`` (TEI). Returns, per input, ``[{id, text, special, start, stop}]``."""

    inputs: StrictStr | list[StrictStr]
    add_special_tokens: StrictBool = True
