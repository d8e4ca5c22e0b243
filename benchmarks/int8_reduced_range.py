"""What int8 would lose with 7 bits on one side: the accuracy of the two ways an int8 product
can stay exact on a CPU without int8 dot products.

    python -m benchmarks.int8_reduced_range --out benchmarks/results/int8-reduced-range-DATE

Without VNNI or AMX (an AVX2-only CPU) oneDNN's fast int8 product multiplies uint8 rows by
int8 weights and adds the products in pairs in 16 bits: 2 x 255 x 127 overflows, so the sum is
exact only when one operand keeps to 7 bits (activations in [-63, 63], or weights). fastbert
keeps 8 bits on both sides there and runs the exact product as float32 GEMMs instead
(docs/cpu.md, "bfloat16 and int8 on an AVX2-only CPU"). This measures what each 7-bit variant
would cost: the corpus benchmark's texts (benchmarks/embed_bench.py) embedded by the packaged
all-MiniLM-L6-v2 with ``quantize="int8"``, as fastbert quantises (8 bits), with the
activations' rows quantised to 63 levels a side, and with the weights' rows so, each against
fastbert's float32 embeddings (the same as sentence-transformers' to a cosine of 1.000000):
least and mean cosine, against int8's bound in the corpus benchmark. The variants replace the
quantising functions for the run (the activations' on PyTorch's ops, the compiled passes off);
it measures accuracy only, not speed. Writes int8-reduced-range.json and .md into --out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from unittest import mock

import torch

from benchmarks import embed_bench, reporting

SEVEN_BITS = 63.0
STEM = "int8-reduced-range"


def quantized_rows(levels: float) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """``quantize_rows`` with ``levels`` a side instead of 127: q = round(row * levels / a),
    scale = a / levels (a = the row's largest magnitude)."""

    def quantize(
        x: torch.Tensor, input_scale: torch.Tensor | None = None, quantize: str = "int8"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = x.float() if input_scale is None else x.float() * input_scale
        largest = rows.abs().amax(dim=-1)
        inverse = torch.where(largest > 0, largest.new_tensor(levels) / largest, 0.0)
        return torch.round(rows * inverse[..., None]).to(torch.int8), largest / levels

    return quantize


@contextlib.contextmanager
def seven_bit_activations() -> Iterator[None]:
    from fastbert.kernels import cpu_int8, torch_ops

    with (
        cpu_int8.turned_off(),
        mock.patch.object(torch_ops, "quantize_rows", quantized_rows(SEVEN_BITS)),
    ):
        yield


@contextlib.contextmanager
def seven_bit_weights() -> Iterator[None]:
    from fastbert.model import quantization

    seven = quantized_rows(SEVEN_BITS)
    with mock.patch.object(quantization, "quantize_weight", lambda w, q="int8": seven(w.detach())):
        yield


VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "int8 as fastbert quantises (8-bit activations and weights)": contextlib.nullcontext,
    "7-bit activations (63 levels a side), 8-bit weights": seven_bit_activations,
    "8-bit activations, 7-bit weights (63 levels a side)": seven_bit_weights,
}


def cosines(vectors: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    similarity = torch.nn.functional.cosine_similarity(vectors.double(), reference.double())
    return {"least": similarity.min().item(), "mean": similarity.mean().item()}


def main(argv: list[str] | None = None) -> int:
    cli = reporting.parser("int8_reduced_range", __doc__.split("\n\n")[0], 1000, None)
    args = cli.parse_args(argv)
    if args.docs < 1:
        cli.error("--docs: at least 1")

    import fastbert
    from fastbert.bench import environment

    texts = embed_bench.corpus(args.docs)
    folder = str(embed_bench.model_folder("minilm"))
    reference = torch.as_tensor(fastbert.embed(texts, model=folder, progress=False))
    rows = {}
    for name, variant in VARIANTS.items():
        with variant():
            model = fastbert.load(folder, quantize="int8")
            vectors = torch.as_tensor(model.embed(texts))
        rows[name] = cosines(vectors, reference)
        print(f"{name}: least cosine {rows[name]['least']:.6f}")
    bound = embed_bench.CONTENDERS["fastbert-int8"].min_cosine
    report = {
        "docs": args.docs,
        "bound": bound,
        "rows": rows,
        "environment": environment.capture(),
    }
    lines = [
        f"# int8 with 7 bits on one side: {args.docs} docs, all-MiniLM-L6-v2 (packaged)",
        "",
        "Cosine of each variant's embeddings to fastbert's float32 embeddings (the corpus "
        f"benchmark's texts); int8's bound in the corpus benchmark: least cosine {bound}.",
        "",
        *reporting.table(
            ["variant", "least cosine", "mean cosine", "within the bound"],
            "lrrl",
            [
                (n, f"{r['least']:.6f}", f"{r['mean']:.6f}", "yes" if r["least"] >= bound else "no")
                for n, r in rows.items()
            ],
        ),
        "",
        reporting.cpu_line(report["environment"]),
        "",
    ]
    reporting.write_report(args.out, STEM, report, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
