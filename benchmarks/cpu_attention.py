"""The CPU engine's attention per run of equal-length sequences: SDPA or the math path.

``python -m benchmarks.cpu_attention [--rounds 7] [--heads 12]`` times, on one thread, for
float32 and bfloat16 at head dimensions 32 and 64, on a grid of sequence lengths L and
sequence counts n, the two ways ``attention_varlen`` can run one run of n sequences of L
tokens ([n, H, L, D] views of packed [T, H, D] tensors, written back to the packed layout):

- SDPA: ``F.scaled_dot_product_attention`` (PyTorch's CPU flash kernel) and the copy back;
- math: ``cpu_engine_attention.math_attention``: float32 scores, softmax and P @ V in chunks
  that keep the scores in cache, rounded once into the packed output.

Each is timed in CPU time (``time.process_time``: the process's own, so other load on a
shared machine disturbs it less than wall time), round-robin (one round of each in turn), the
best round kept. Each one's error is measured too: the relative RMS error against float64 SDPA
on the same inputs. Prints a Markdown table with the path ``attention_by_length`` picks
(``cpu_engine_attention.MATH_ATTENTION_MAX_LENGTH``), then, per dtype and head dimension, the
length up to which taking the math path saves the most (:func:`best_cut`, on the mean ratio
over the n). Speed is measured here, never asserted in a test.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from fastbert.kernels import cpu_engine_attention

LENGTHS = (*range(8, 129, 4), 160, 192, 256)
TOKENS_PER_RUN = (256, 2048)  # n = max(1, tokens // L): a short and a long run of sequences


def packed(n: int, length: int, heads: int, head_dim: int, dtype, seed: int = 0):
    """q, k, v [n, H, L, D] views of packed [n * L, H, D] tensors, and the packed output's
    view; q and k scaled to give attention of realistic sharpness."""
    g = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(n * length, heads, head_dim, generator=g) for _ in range(3)]
    tensors[0] *= 2.0
    q, k, v = (t.to(dtype).view(n, length, heads, head_dim).transpose(1, 2) for t in tensors)
    out = torch.empty(n * length, heads, head_dim, dtype=dtype)
    return q, k, v, out.view(n, length, heads, head_dim).transpose(1, 2)


def sdpa_path(q, k, v, out) -> None:
    out.copy_(F.scaled_dot_product_attention(q, k, v))


def math_path(q, k, v, out) -> None:
    cpu_engine_attention.math_attention(q, k, v, None, None, out)


def relative_error(path, q, k, v, out) -> float:
    path(q, k, v, out)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    return float((out.double() - expected).norm() / expected.norm())


def best_times(paths, args, rounds: int, budget_s: float = 0.01) -> list[float]:
    """Seconds per call of each path: the best of ``rounds`` rounds of CPU time, one round
    of each in turn, each round as many calls as fill about ``budget_s``."""
    calls = []
    for path in paths:
        path(*args)
        start = time.process_time()
        path(*args)
        calls.append(max(1, int(budget_s / max(time.process_time() - start, 1e-6))))
    best = [float("inf")] * len(paths)
    for _ in range(rounds):
        for i, path in enumerate(paths):
            start = time.process_time()
            for _ in range(calls[i]):
                path(*args)
            best[i] = min(best[i], (time.process_time() - start) / calls[i])
    return best


def best_cut(ratios: dict[int, float]) -> int:
    """The length T (0: none) for which taking the math path at every L <= T saves the most:
    the minimum over T of the sum of (math / SDPA - 1) over the measured L <= T, which one
    noisy point does not move as much as the first L where SDPA wins."""
    best, best_sum, total = 0, 0.0, 0.0
    for length in sorted(ratios):
        total += ratios[length] - 1.0
        if total < best_sum:
            best, best_sum = length, total
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds per path")
    parser.add_argument("--heads", type=int, default=12, help="attention heads H")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, 1 thread, ", end=""
    )
    print(f"H = {args.heads}; times in ms of CPU time, errors relative RMS against float64\n")
    print("| dtype | D | L | n | SDPA ms | math ms | math / SDPA | SDPA err | math err | picks |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    cuts = []
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        for head_dim in args.head_dims:
            ratios: dict[int, float] = {}
            for length in args.lengths:
                ratios[length] = 0.0
                for tokens in TOKENS_PER_RUN:
                    n = max(1, tokens // length)
                    views = packed(n, length, args.heads, head_dim, dtype)
                    sdpa_s, math_s = best_times((sdpa_path, math_path), views, args.rounds)
                    sdpa_err = relative_error(sdpa_path, *views)
                    math_err = relative_error(math_path, *views)
                    takes = cpu_engine_attention.takes_math(views[0], n, length, 0.0)
                    picks = "math" if takes else "SDPA"
                    ratios[length] += math_s / sdpa_s / len(TOKENS_PER_RUN)
                    print(
                        f"| {name} | {head_dim} | {length} | {n} | {sdpa_s * 1e3:.3f} "
                        f"| {math_s * 1e3:.3f} | {math_s / sdpa_s:.2f} | {sdpa_err:.2e} "
                        f"| {math_err:.2e} | {picks} |",
                        flush=True,
                    )
            cuts.append((name, head_dim, best_cut(ratios)))
    print()
    for name, head_dim, cut in cuts:
        cuts_set = cpu_engine_attention.MATH_ATTENTION_MAX_LENGTH
        longest = cuts_set.get((getattr(torch, name), head_dim), 0)
        print(f"- {name}, D = {head_dim}: math saves most up to L = {cut} (set: {longest})")


if __name__ == "__main__":
    main()
