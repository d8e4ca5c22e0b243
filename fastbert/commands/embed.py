"""fastbert embed: embed a corpus (.jsonl, .parquet, .csv, .txt files or folders) with a
BERT-family model folder into Parquet shards with a _manifest.json (see fastbert.embed)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from fastbert.commands.options import (
    CommandError,
    UsageError,
    add_batch_tokens_argument,
    add_inference_arguments,
    positive_int,
)

NAME = "embed"
HELP = "embed a corpus into Parquet shards (resumable; on one machine or on Ray)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help=".jsonl, .parquet, .csv or .txt (one text per line) files, or "
        "folders of them (read in sorted order)",
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="MODEL",
        help="a Hugging Face or sentence-transformers model folder, or a model name: a "
        "packaged model (all-MiniLM-L6-v2, minilm) or a Hugging Face id in its cache "
        "(fastbert models lists them)",
    )
    parser.add_argument(
        "--output",
        required=True,
        metavar="DIR",
        help="folder for the Parquet shards and _manifest.json",
    )
    parser.add_argument(
        "--text-field",
        default="text",
        metavar="NAME",
        help="field holding the text (default: text; not used for .txt)",
    )
    parser.add_argument(
        "--id-field",
        default=None,
        metavar="NAME",
        help="field holding each row's id (default: the row number across all inputs, from 0)",
    )
    add_batch_tokens_argument(parser, "--batch-tokens")
    parser.add_argument(
        "--max-length",
        type=positive_int,
        default=None,
        metavar="N",
        help="truncate texts to N tokens (default: the folder's length as "
        "sentence-transformers reads it: max_seq_length, else the model's limit)",
    )
    parser.add_argument(
        "--pooling",
        default=None,
        metavar="MODE",
        help="replace the folder's pooling with a sentence-transformers pooling mode: mean, "
        "cls, max, mean_sqrt_len_tokens, weightedmean or lasttoken (default: the folder's "
        "Pooling module, else mean)",
    )
    prompts = parser.add_mutually_exclusive_group()
    prompts.add_argument(
        "--prompt-name",
        default=None,
        metavar="NAME",
        help="put the folder's prompt NAME (config_sentence_transformers.json) before every "
        "text (default: the folder's default prompt, if it names one)",
    )
    prompts.add_argument(
        "--prompt",
        default=None,
        metavar="TEXT",
        help="put TEXT before every text instead",
    )
    parser.add_argument(
        "--dimensions",
        type=positive_int,
        default=None,
        metavar="N",
        help="keep each embedding's first N values, renormalised (a model whose card does not "
        "say it is Matryoshka-trained needs --force-dimensions)",
    )
    parser.add_argument(
        "--force-dimensions",
        action="store_true",
        help="cut to --dimensions whatever the model card says",
    )
    parser.add_argument(
        "--max-active-dims",
        type=positive_int,
        default=None,
        metavar="N",
        help="sparse models: keep each vector's N largest values",
    )
    parser.add_argument(
        "--precision",
        choices=("float32", "int8", "uint8", "binary", "ubinary"),
        default="float32",
        help="store dense embeddings quantized as sentence-transformers' quantize_embeddings "
        "does: int8 / uint8 (256 buckets per dimension between the calibration's min and "
        "max), binary / ubinary (packed bits, ceil(dimensions / 8) bytes); the manifest "
        "records it and the int8 / uint8 ranges (default: float32)",
    )
    parser.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="int8 / uint8: take the ranges from the embeddings of every text of FILE (read "
        "as the inputs are; default: the first 1000 rows of the inputs)",
    )
    parser.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="L2-normalise the embeddings (default: when the "
        "sentence-transformers folder has a Normalize module)",
    )
    add_inference_arguments(parser)
    parser.add_argument(
        "--store-dtype",
        choices=("float32", "float16"),
        default="float32",
        help="dtype of the stored embeddings (float16 needs --dtype float16)",
    )
    parser.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip bad rows (no text or id field, an empty text, not UTF-8 or not JSON, a CSV "
        "record with extra fields, an id of another kind) and count them, instead of stopping "
        "at the first",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a finished (or different) run in DIR"
    )
    parser.add_argument(
        "--rows-per-shard",
        type=positive_int,
        default=50_000,
        metavar="N",
        help="input rows per Parquet shard (default: 50000)",
    )
    parser.add_argument(
        "--window-rows",
        type=positive_int,
        default=10_000,
        metavar="N",
        help="rows sorted by length together before batching (bounds memory; default: 10000)",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const=True,
        default=None,
        metavar="ADDRESS",
        help="run on Ray Data: on the cluster at ADDRESS, or on a local Ray "
        "instance when no address is given (then put --ray after the "
        "inputs, or it reads the next one as the address)",
    )
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bar"
    )


def run(args: argparse.Namespace) -> int:
    from fastbert.embedding import api
    from fastbert.embedding.manifest import OutputError
    from fastbert.embedding.options import EmbedOptions
    from fastbert.embedding.readers import InputError, InputPathError

    # Every option of the job but the model (given by position), its name and the int8 ranges,
    # which only the library takes.
    options = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(EmbedOptions)
        if field.name not in ("model", "name", "ranges")
    }
    try:
        summary = api.embed(args.inputs, args.model, output=args.output, ray=args.ray, **options)
    except InputPathError as exc:  # a path given that names nothing to read
        raise UsageError(str(exc)) from exc
    except (InputError, OutputError, OSError) as exc:
        raise CommandError(str(exc)) from exc
    except ImportError as exc:
        raise CommandError(
            f"{exc} (pip install 'fastbert[embed]', or 'fastbert[ray]' for --ray)"
        ) from exc
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    print(summary.line(), file=sys.stderr)
    shards = f"{summary.manifest['rows']} rows in {len(summary.manifest['shards'])} shards"
    if summary.already_complete:
        print(f"{summary.output} holds {shards}")
    else:
        print(f"wrote {shards} to {summary.output}")
    return 0
