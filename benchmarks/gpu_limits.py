"""The GPU's own limits, measured: GEMM TFLOP/s (an 8192-square torch.matmul, cuBLAS) and copy
TB/s (a 1 GiB device-to-device copy) per dtype, by fastbert.bench.ceilings. The GPU run
states each kernel's throughput as a percentage of these.

    python -m benchmarks.gpu_limits --out limits.json [--dtypes bfloat16 float16]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def measure(dtypes: list[str], device: str = "cuda") -> dict:
    """{dtype: {"gemm_tflops", "copy_tbps", ...}} on ``device``, with the GPU's name."""
    from fastbert.bench import ceilings, hardware

    limits = {name: ceilings.measure(device, DTYPES[name]) for name in dtypes}
    return {"gpu": hardware.device_name(torch.device(device)), "limits": limits}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_limits", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument(
        "--dtypes", nargs="+", choices=sorted(DTYPES), default=["bfloat16", "float16"]
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("the GPU's limits need a CUDA GPU", file=sys.stderr)
        return 1
    found = measure(args.dtypes)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=1) + "\n")
    print(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
