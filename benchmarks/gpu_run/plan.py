"""The stages of the GPU run, in order of value, each with its command and time cap.

Every stage is one command run from the repository root. The results go to one folder
(``results``, archived at the end); ``scratch`` holds what is only needed while the run lasts
(the served model folder). A stage's cap is the most seconds it may run; its floor is the
time kept back for it while earlier stages run, so that a slow start never leaves the
valuable later stages without time. The caps of the stages that always run add up to the
budget (540 s, the install included); the last four stages take whatever time is left.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path

BUDGET_S = 540
BENCH_SHAPES = "1x128,32x128,8x512,64x512,64x512p"
FASTBERT_PEERS = "fastbert,fastbert-padfree,fastbert-graphs,fastbert-padfree-graphs"
SERVED_SHAPE = "bert-base"
# Test processes: Triton compiling kernels on the CPU is most of the tests' time.
DEFAULT_WORKERS = 12


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step of the run: ``command`` (argv) for at most ``cap_s`` seconds."""

    name: str
    cap_s: int
    command: tuple[str, ...]
    floor_s: int = 0
    what: str = ""
    leftover: bool = False  # runs only on the time the others left
    # Modules it imports that a GPU machine's image may lack: the install stage brings them
    # from the wheels in .whl (benchmarks/gpu_run/wheels.py); the dry run checks for them.
    needs: tuple[str, ...] = ()
    # Earlier stages whose output it reads: it is skipped unless they ran to the end.
    after: tuple[str, ...] = ()


def _python_module(python: str, module: str, *args: str) -> tuple[str, ...]:
    return (python, "-m", module, *args)


def _pytest(python: str, *args: str) -> tuple[str, ...]:
    # The project's addopts (pyproject.toml) are replaced: the stage says all it needs.
    return (python, "-m", "pytest", "-o", "addopts=", "-q", "-rfE", "-p", "no:cacheprovider", *args)


def _workers(count: int) -> tuple[str, ...]:
    if count <= 1 or importlib.util.find_spec("xdist") is None:
        return ()
    return ("-n", str(count), "--dist", "load")


def _gpu_tests(python: str, grid: str, junit: Path, workers: int) -> tuple[str, ...]:
    return _pytest(
        python,
        "-p",
        "benchmarks.gpu_run.grid",
        "--gpu-grid",
        grid,
        "--continue-on-collection-errors",
        *_workers(workers),
        f"--junitxml={junit}",
        "tests",
    )


def _bench(python: str, out: Path, shapes: str, peers: str, append: bool) -> tuple[str, ...]:
    args = ["bench", "--out", str(out), "--model", "bert-base", "--dtype", "float16"]
    args += ["--shapes", shapes, "--peers", peers, "--warmup", "5", "--reps", "30"]
    args += ["--max-time", "1"]  # timed seconds a cell at most, so the caps hold
    return _python_module(python, "fastbert.cli", *args, *(["--append"] if append else []))


def stages(
    results: Path, scratch: Path, python: str, workers: int = DEFAULT_WORKERS
) -> list[Stage]:
    """The run, in order."""
    bench = results / "bench"
    served = scratch / f"{SERVED_SHAPE}-random"
    return [
        Stage(
            "install",
            40,
            _python_module(python, "benchmarks.gpu_run.install", "--python", python),
            what="fastbert, editable (else run from the tree: benchmarks/gpu_run/install.py)",
        ),
        Stage(
            "environment",
            20,
            _python_module(python, "benchmarks.gpu_run.environment", "--out", str(results)),
            what="GPU, driver, versions, commit, fastbert info, nvidia-smi, pip freeze",
        ),
        Stage(
            "gpu-tests",
            150,
            _gpu_tests(python, "core", results / "gpu-tests.xml", workers),
            floor_s=60,
            what="the covering core of the GPU test grid (benchmarks/gpu_run/grid.py)",
        ),
        Stage(
            "bench",
            50,
            _bench(python, bench, BENCH_SHAPES, FASTBERT_PEERS + ",hf-eager,hf-sdpa", False),
            floor_s=30,
            what=f"fastbert bench, BERT-base fp16, {BENCH_SHAPES}",
        ),
        Stage(
            "bench-compile",
            80,
            _bench(python, bench, "32x128", "hf-compile-max,hf-compile", True),
            floor_s=40,
            what="torch.compile max-autotune and default at 32x128",
        ),
        Stage(
            "corpus",
            30,
            _python_module(
                python,
                "benchmarks.corpus_tokens",
                "--out",
                str(results / "corpus"),
                "--model",
                "bert-base",
                "--dtypes",
                "float16,bfloat16",
                "--cuda-graphs",
                "auto,false",
            ),
            floor_s=20,
            what="tokens/s, padding-free, s512 and mixed lengths, fp16 and bf16, CUDA graphs "
            "auto and off, with a pass's time by part",
        ),
        Stage(
            "limits",
            15,
            _python_module(python, "benchmarks.gpu_limits", "--out", str(results / "limits.json")),
            floor_s=10,
            what="bf16 GEMM TFLOP/s and copy TB/s of this GPU",
        ),
        Stage(
            "kernels",
            45,
            _pytest(
                python,
                "benchmarks/test_kernels_bench.py",
                "--bench-models",
                "bert-base",
                "--bench-dtypes",
                "float16,bfloat16",
                "--bench-shapes",
                "32x128,8x512,64x512",
                "--bench-warmup",
                "5",
                "--bench-reps",
                "30",
                f"--benchmark-json={bench / 'kernels-bench.json'}",
            ),
            floor_s=25,
            what="the kernel suite against PyTorch's ops, BERT-base, fp16 and bf16",
        ),
        Stage(
            "train-step",
            30,
            _python_module(
                python,
                "benchmarks.train_step",
                "--out",
                str(results / "train-step"),
                "--model",
                "bert-base",
                "--shapes",
                "32x128",
                "--contenders",
                "hf-eager,hf-sdpa,fastbert",
                "--warmup",
                "2",
                "--reps",
                "10",
                "--profile",
            ),
            floor_s=20,
            what="one fine-tuning step, BERT-base 32x128, bf16 autocast, with where it goes",
        ),
        Stage(
            "serve-model",
            15,
            _python_module(
                python, "benchmarks.random_folder", "--out", str(served), "--shape", SERVED_SHAPE
            ),
            floor_s=10,
            what="a random BERT-base sentence-transformers folder with an offline tokenizer",
        ),
        Stage(
            "serve",
            55,
            _python_module(
                python,
                "benchmarks.serve_bench",
                "--contenders",
                "fastbert",
                "--mixes",
                "batch32",
                "--device",
                "cuda",
                "--concurrency",
                "1,16,64",
                "--open",
                "",
                "--seconds",
                "6",
                "--warmup",
                "2",
                "--model",
                str(served),
                "--output",
                str(results / "serve"),
            ),
            floor_s=30,
            what="fastbert serve, 32 sentences a request, at 1, 16 and 64 clients",
            needs=("fastapi", "uvicorn", "orjson"),
            after=("serve-model",),
        ),
        Stage(
            "host-overhead",
            BUDGET_S,
            _python_module(
                python,
                "benchmarks.host_overhead",
                "--out",
                str(results / "host-overhead"),
                "--model",
                "bert-base",
                "--shapes",
                "1x128,32x128,32x512",
            ),
            what="where an eager forward's host time goes: fastbert's launchers, Triton's "
            "launcher, synchronisations (1x128, 32x128 and the corpus's 32x512)",
            leftover=True,
        ),
        Stage(
            "gpu-tests-rest",
            BUDGET_S,
            _gpu_tests(python, "rest", results / "gpu-tests-rest.xml", workers),
            what="the rest of the GPU test grid",
            leftover=True,
        ),
        Stage(
            "bench-compile-rest",
            BUDGET_S,
            _bench(python, bench, "1x128,8x512,64x512,64x512p", "hf-compile", True),
            what="torch.compile default at the other shapes",
            leftover=True,
        ),
        Stage(
            "splade-head",
            BUDGET_S,
            _python_module(
                python,
                "benchmarks.splade_head",
                "--device",
                "cuda",
                "--dtype",
                "float16",
                "--sequences",
                "32",
                "--length",
                "128",
                "--rounds",
                "20",
                "--out",
                str(results / "splade-head"),
            ),
            what="the fused SPLADE head (splade_max) against the unfused one, 4,096 tokens, fp16",
            leftover=True,
        ),
        Stage(
            "gemm-configs",
            BUDGET_S,
            _python_module(
                python, "benchmarks.gemm_configs", "--out", str(results / "gemm-configs")
            ),
            what="every linear config on BERT-base's projections, fp16",
            leftover=True,
        ),
        Stage(
            "e2e-suite",
            BUDGET_S,
            _pytest(
                python,
                "benchmarks/test_end_to_end_bench.py",
                "--bench-models",
                "bert-large,minilm-l6,mpnet-base,modernbert-base",
                "--bench-dtypes",
                "float16",
                "--bench-reps",
                "30",
                f"--benchmark-json={results / 'e2e-bench.json'}",
            ),
            what="the end-to-end suite: BERT-large, MiniLM-L6, MPNet-base, ModernBERT-base",
            leftover=True,
        ),
    ]


def workers_here() -> int:
    """Test processes for this machine: DEFAULT_WORKERS, fewer on a machine with fewer cores
    (``GPU_TEST_WORKERS`` overrides)."""
    if "GPU_TEST_WORKERS" in os.environ:
        return int(os.environ["GPU_TEST_WORKERS"])
    return max(1, min(DEFAULT_WORKERS, (os.cpu_count() or 1) - 2))
