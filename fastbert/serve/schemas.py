"""The request bodies of every route, as pydantic models: Hugging Face text-embeddings-inference's
shapes (``/embed``, ``/embed_sparse``, ``/embed_all``, ``/similarity``, ``/rerank``,
``/predict``, ``/tokenize``, ``/decode``), OpenAI's (``/v1/embeddings``) and Cohere's
(``/v1/rerank``, ``/v2/embed``). They validate
each request and document it in the OpenAPI schema. A known field with a wrong type or value is
a 422, and so is a field the route does not take: a misspelt option (``normalise``,
``dimension``) left out would change the answer without a word. OpenAI's API refuses unknown
fields too; TEI ignores them (what Hugging Face's clients send beside TEI's fields is taken:
see :class:`TeiRequest`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

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


class RequestBody(BaseModel):
    """A request body: a field it does not declare is a 422 (``unknown_field``) naming the
    field and the ones it takes."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_fields_only(cls, body: Any) -> Any:
        if isinstance(body, dict):
            unknown = [name for name in body if name not in cls.model_fields]
            if unknown:
                raise PydanticCustomError(
                    "unknown_field",
                    "{unknown}: not a field of this request (it takes {fields})",
                    {"unknown": ", ".join(unknown), "fields": cls.field_names()},
                )
        return body

    @classmethod
    def field_names(cls) -> str:
        """The fields a body of this request may have, its route's own first."""
        return ", ".join(sorted(cls.model_fields, key=lambda name: name in CLIENT_FIELDS))


# What Hugging Face's Inference API clients send beside TEI's fields (see TeiRequest).
CLIENT_FIELDS = ("options", "parameters")


class TeiRequest(RequestBody):
    """A TEI route's body, which also takes what Hugging Face's Inference API clients send
    beside TEI's fields: ``options`` (``wait_for_model``, ``use_cache``: how to reach a model,
    not what it computes) and an empty ``parameters`` (``InferenceClient.text_classification``
    sends ``{}`` when given no arguments). Options inside ``parameters`` are a 422: TEI's are
    top-level fields, and one left unread would change the answer without a word."""

    options: dict[str, Any] | None = None
    parameters: dict[str, Any] | None = None

    @field_validator("parameters")
    @classmethod
    def _no_parameters(cls, parameters: Any) -> Any:
        if isinstance(parameters, dict) and parameters:  # a route's own parameters: checked
            raise PydanticCustomError(
                "unknown_field",
                "{names}: TEI's options are fields of the body itself, not of parameters "
                "(this request takes {fields})",
                {"names": ", ".join(parameters), "fields": cls.field_names()},
            )
        return parameters


class TeiEmbedRequest(TeiRequest):
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


class SimilarityInput(RequestBody):
    source_sentence: StrictStr
    sentences: list[StrictStr]


class SimilarityParameters(RequestBody):
    truncate: Truncate = None
    truncation_direction: Direction = None
    prompt_name: PromptName = None


class SimilarityRequest(RequestBody):
    """``POST /similarity`` (TEI, dense models): the cosine similarity of
    ``inputs.source_sentence`` to each of ``inputs.sentences``, each embedded as ``/embed``
    embeds it with ``parameters``. Returns ``[float]``, one per sentence."""

    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None
    options: dict[str, Any] | None = None  # the Inference API clients' (see TeiRequest)


class DecodeRequest(TeiRequest):
    """``POST /decode`` (TEI): the text of token ids, one list of them or a list of such
    lists, as the model's tokenizer decodes them. Returns ``[str]``, one per list."""

    ids: list[StrictInt] | list[list[StrictInt]]
    skip_special_tokens: StrictBool = True


class OpenAIEmbeddingsRequest(RequestBody):
    """``POST /v1/embeddings`` (OpenAI). Embeddings are normalised, as OpenAI's are."""

    input: Inputs
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Dimensions | None = None
    user: StrictStr | None = None


EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]


class CohereEmbedRequest(RequestBody):
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
    images: Any = None  # Cohere's other inputs: refused when given (fastbert embeds text)
    inputs: Any = None

    @field_validator("images", "inputs")
    @classmethod
    def _texts_only(cls, given: Any) -> Any:
        if given is not None:
            raise PydanticCustomError(
                "not_texts", "fastbert embeds texts: give them as texts (a list of strings)"
            )
        return given


class RerankRequest(TeiRequest):
    """``POST /rerank`` (TEI). Returns ``[{index, score, text?}]``, best first."""

    query: StrictStr
    texts: list[StrictStr]
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    truncate: StrictBool | None = None
    truncation_direction: Direction = None


class Document(BaseModel):
    text: StrictStr


class CohereRerankRequest(RequestBody):
    """``POST /v1/rerank`` (Cohere's shape). Returns ``{results: [{index, relevance_score,
    document?}]}``, best first."""

    query: StrictStr
    documents: list[StrictStr | Document]
    top_n: Annotated[StrictInt, Field(ge=1)] | None = None
    return_documents: StrictBool = False
    model: StrictStr | None = None
    rank_fields: list[Literal["text"]] | None = None  # what a document is ranked by: its text
    truncate: Truncate = None  # not Cohere's: pairs over the limit on a --no-auto-truncate server


# A text, or a pair of texts (a cross-encoder's two sides).
Sequence = StrictStr | Annotated[list[StrictStr], Field(min_length=1, max_length=2)]


class PredictParameters(RequestBody):
    """What Hugging Face's ``InferenceClient.text_classification`` sends in ``parameters``:
    ``top_k`` (the best k labels of each input) and ``function_to_apply`` ("softmax",
    "sigmoid", or "none" for the logits; default: softmax, sigmoid for one label)."""

    top_k: Annotated[StrictInt, Field(ge=1)] | None = None
    function_to_apply: Literal["softmax", "sigmoid", "none"] | None = None


class PredictRequest(TeiRequest):
    """``POST /predict`` (TEI): ``inputs`` is a text, a pair ``[a, b]``, or a list of either.
    Returns ``[{score, label}]`` per input, best first (a list of those for a list);
    ``parameters``: :class:`PredictParameters`."""

    inputs: Sequence | list[Sequence]
    raw_scores: StrictBool = False
    truncate: StrictBool | None = None
    truncation_direction: Direction = None
    parameters: PredictParameters | None = None

    @field_validator("inputs", mode="before")
    @classmethod
    def _one_list_of_strings_is_one_input(cls, inputs: Any) -> Any:
        # As TEI reads it: three texts in one list would otherwise be a batch, and a pair
        # given one text too many would be scored as three unrelated texts.
        if isinstance(inputs, list) and len(inputs) > 2 and isinstance(inputs[0], str):
            raise PydanticCustomError(
                "predict_inputs",
                "a list of texts is one input, a text [a] or a pair [a, b], not {count}; a "
                "batch is a list of inputs ([[a], [b, c]])",
                {"count": len(inputs)},
            )
        return inputs


class TokenizeRequest(TeiRequest):
    """``POST /tokenize`` (TEI). Returns, per input after the prompt ``prompt_name`` names
    (default: the model's default prompt, as ``/embed``), ``[{id, text, special, start,
    stop}]``."""

    inputs: StrictStr | list[StrictStr]
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = None
