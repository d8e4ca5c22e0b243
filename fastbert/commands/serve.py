"""fastbert serve: serve a model folder over HTTP (Hugging Face text-embeddings-inference's,
OpenAI's and Cohere's routes), on one machine or as a Ray Serve deployment."""

from __future__ import annotations

import argparse
from pathlib import Path

from fastbert.commands.options import (
    CommandError,
    UsageError,
    add_batch_tokens_argument,
    add_inference_arguments,
    inference_options,
    positive_int,
)

NAME = "serve"
HELP = (
    "serve embeddings (dense, sparse, multi-vector), rerank scores and classifications over "
    "HTTP (TEI-, OpenAI- and Cohere-compatible)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from fastbert.serve.options import (
        API_KEY_VARIABLE,
        LOG_LEVELS,
        OMP_SPIN_VARIABLE,
        default_tokenize_workers,
    )

    parser.add_argument(
        "--model",
        required=True,
        metavar="MODEL",
        help="a model name (fastbert models lists them) or folder (a dense model: /embed, "
        "/similarity, /v1/embeddings and /v2/embed; sparse: /embed_sparse; multi-vector: "
        "/embed_all; a cross-encoder: /rerank, /v1/rerank and /predict; any: /tokenize and "
        "/decode)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=_port, default=8080, help="port (default: 8080; 0: any free)"
    )
    add_inference_arguments(parser)
    add_batch_tokens_argument(parser, "--max-batch-tokens")
    parser.add_argument(
        "--max-client-batch-size",
        type=positive_int,
        default=32,
        metavar="N",
        help="inputs per request (default: 32)",
    )
    parser.add_argument(
        "--max-concurrent-requests",
        type=positive_int,
        default=512,
        metavar="N",
        help="inputs admitted and not yet answered, across requests; past it a request gets "
        "429 (default: 512)",
    )
    parser.add_argument(
        "--max-queued-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="tokens of those inputs (default: --max-concurrent-requests x --max-input-length)",
    )
    parser.add_argument(
        "--max-input-length",
        type=positive_int,
        default=None,
        metavar="N",
        help="most tokens per input (default: the model's)",
    )
    parser.add_argument(
        "--auto-truncate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="cut inputs over --max-input-length (default); with --no-auto-truncate they get 422 "
        "unless the request asks to truncate",
    )
    parser.add_argument(
        "--payload-limit",
        type=positive_int,
        default=2_000_000,
        metavar="BYTES",
        help="most bytes in a request body (default: 2000000)",
    )
    parser.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model name the OpenAI and Cohere routes answer with and accept (default: "
        "the name --model gave, or the folder's name)",
    )
    parser.add_argument(
        "--accept-any-model-name",
        action="store_true",
        help="answer requests whose model field names another model (default: 404 "
        "model_not_found, as OpenAI answers; GET /v1/models lists the served name)",
    )
    parser.add_argument(
        "--openai-token-ids",
        action="store_true",
        help="read token-id inputs on /v1/embeddings as this model's token ids, as /embed "
        "reads them (default: refused with 400, since OpenAI's API reads them as its own "
        "tokenizer's: LangChain's OpenAIEmbeddings sends those unless "
        "check_embedding_ctx_length=False)",
    )
    parser.add_argument(
        "--allow-any-dimensions",
        action="store_true",
        help="let requests cut embeddings to fewer dimensions (dimensions, output_dimension) "
        "whatever the model card says (default: only a model whose card says it is "
        "Matryoshka-trained; others get 422, since cut embeddings of such a model lose more "
        "accuracy)",
    )
    parser.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="dense models: take the int8 / uint8 ranges of /v2/embed from the embeddings of "
        "FILE's lines, computed once at start (default: 512 sentences of Python's help "
        "texts; GET /info shows the ranges)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help=f"bearer token every route but /health and /metrics asks for (default: "
        f"${API_KEY_VARIABLE}; prefer the variable on a shared host: a command line is "
        "visible to every user)",
    )
    parser.add_argument(
        "--workers-tokenize",
        type=positive_int,
        default=default_tokenize_workers(),
        metavar="N",
        help="tokenizer threads (default: half the cores, 1 to 4)",
    )
    parser.add_argument(
        "--omp-spin",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="CPU: keep the model's OpenMP threads the process's only team, so that they "
        "spin-wait between parallel regions (OMP_WAIT_POLICY and GOMP_SPINCOUNT tune it); "
        f"--no-omp-spin: they sleep after ~100 spins (default: ${OMP_SPIN_VARIABLE}, else on)",
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="info: a line per request and one at shutdown; warning: neither; debug: "
        "uvicorn's access log besides (default: info)",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS",
        help="run as a Ray Serve deployment (a local Ray instance, or the cluster at ADDRESS)",
    )
    parser.add_argument(
        "--replicas",
        type=positive_int,
        default=None,
        metavar="N",
        help="Ray Serve replicas (default: one per GPU, or per two CPUs)",
    )


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be between 0 and 65535, got {text!r}")
    return value


def options_from(args: argparse.Namespace):
    """The ServeOptions of parsed arguments; UsageError for a bad combination."""
    from fastbert.embedding.options import EmbedOptions
    from fastbert.serve.options import ServeOptions
    from fastbert.settings import API_KEY

    if args.replicas is not None and args.ray is None:
        raise UsageError("--replicas needs --ray")
    api_key = API_KEY.read()
    if args.api_key is not None:
        if not args.api_key.strip():  # "$KEY" with KEY unset: a server without one was meant?
            raise UsageError(
                "--api-key is empty; give the token, or leave the option out to serve without one"
            )
        api_key = args.api_key.strip()  # as a request's token is read
    try:
        model = EmbedOptions(
            model=args.model,
            **inference_options(args),
            batch_tokens=args.max_batch_tokens,
            max_length=args.max_input_length,
            progress=False,
        )
        _check_input_length(model)
        return ServeOptions(
            model=model,
            host=args.host,
            port=args.port,
            served_model_name=args.served_model_name,
            max_client_batch_size=args.max_client_batch_size,
            max_concurrent_requests=args.max_concurrent_requests,
            max_queued_tokens=args.max_queued_tokens,
            auto_truncate=args.auto_truncate,
            payload_limit=args.payload_limit,
            api_key=api_key or None,
            tokenize_workers=args.workers_tokenize,
            allow_any_dimensions=args.allow_any_dimensions,
            accept_any_model=args.accept_any_model_name,
            openai_token_ids=args.openai_token_ids,
            calibration=args.calibration,
            log_level=args.log_level,
            **({} if args.omp_spin is None else {"omp_spin": args.omp_spin}),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _check_input_length(options) -> None:
    """ValueError for a --max-input-length beyond the model's positions (a value that cannot
    work: said before the model loads)."""
    from fastbert.embedding.model import read_config

    if options.max_length is None:
        return
    positions = read_config(Path(options.model)).max_sequence_length
    if options.max_length > positions:
        raise ValueError(
            f"--max-input-length {options.max_length} exceeds the model's {positions} positions"
        )


def run(args: argparse.Namespace) -> int:
    options = options_from(args)
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise CommandError(
            f"fastbert serve needs {exc.name}: pip install 'fastbert[serve]'"
        ) from exc
    from fastbert.serve.server import ListenError

    try:
        if args.ray is not None:
            _serve_on_ray(options, args)
        else:
            from fastbert.serve.server import serve

            serve(options)
    except ListenError as exc:  # the port is taken, the host unknown: said before the load
        raise CommandError(str(exc)) from exc
    except ValueError as exc:  # a model the folder cannot load, a setting it cannot run
        raise UsageError(str(exc)) from exc
    return 0


def _serve_on_ray(options, args: argparse.Namespace) -> None:
    from fastbert.serve import ray_serve

    address = None if args.ray == "auto" else args.ray
    try:
        ray_serve.serve(options, address=address, replicas=args.replicas)
    except ImportError as exc:  # Ray Serve is not installed (its message names the extra)
        raise CommandError(str(exc)) from exc
    except ConnectionError as exc:  # no Ray cluster at ADDRESS
        raise CommandError(str(exc)) from exc
