"""What the first GPU run's accuracy failures come from (run on a CUDA machine, from the repo
root): python benchmarks/results/gpu-h200-2026-11-30/diagnose.py. Each part prints one block.

1. The row quantisation against the reference, bit for bit, on BERT-base activations: with the
   compile options the launcher now passes (no FMA contraction) and with the compiler's default.
2. LayerNorm of rows at 1000 +- 1 in float32 against float64 (IEEE divisions now).
3. Attention backward, float32, 8 x 512 with BERT-base's heads: each gradient's largest error
   against float64 and PyTorch's own, where dK's largest error sits, and the same with scores a
   quarter as large (is it the exponent's argument?).
4. The custom ops' forward that saves for the backward against the public function's (bits),
   for LayerNorm and the gated linear, the linear also compiled without FMA contraction.
"""

from __future__ import annotations

import torch

from fastbert import kernels as K
from fastbert.kernels import fused_linear, quantized_linear
from fastbert.kernels import reference as R
from tests.op_cases import padded_mask
from tests.test_attention import qkv
from tests.test_custom_ops import CASES, _public_arity, _public_keywords

DEVICE = "cuda"
ROWS = 4096  # of the quantised activations


def quantisation() -> None:
    print("== 1. row quantisation, mismatched int8 codes (of M x K)")
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(ROWS, 768, device=DEVICE, generator=generator).to(dtype)
        expected_q, expected_scale = R.quantize_rows(x)
        for fusion in (False, True):
            m, k = x.shape
            q = torch.empty((m, k), dtype=torch.int8, device=DEVICE)
            scale = torch.zeros(m, dtype=torch.float32, device=DEVICE)
            quantized_linear._quantize_rows_kernel[(m,)](
                x,
                None,
                q,
                scale,
                k,
                x.stride(0),
                x.stride(1),
                HAS_INPUT_SCALE=False,
                QUANT=1,
                BLOCK_K=1024,
                enable_fp_fusion=fusion,
            )
            wrong = (q != expected_q).sum().item()
            print(
                f"  {dtype} fusion={fusion}: {wrong} of {m * k} codes, scales equal "
                f"{torch.equal(scale, expected_scale)}"
            )
        q, _ = quantized_linear.quantize_rows(x)
        print(f"  {dtype} launcher: {(q != expected_q).sum().item()} codes differ")


def layer_norm() -> None:
    print("== 2. LayerNorm, rows at 1000 +- 1, float32")
    generator = torch.Generator(device=DEVICE).manual_seed(2)
    x = 1000.0 + torch.randn(512, 768, device=DEVICE, generator=generator)
    w = 1 + 0.2 * torch.randn(768, device=DEVICE, generator=generator)
    b = torch.randn(768, device=DEVICE, generator=generator)
    ref = R.layer_norm(x.double(), w.double(), b.double(), 1e-12)
    ours = (K.layer_norm(x, w, b, 1e-12).double() - ref).abs().max().item()
    theirs = (torch.nn.functional.layer_norm(x, (768,), w, b, 1e-12).double() - ref).abs().max()
    print(f"  fastbert {ours:.3g}, torch {theirs.item():.3g}")


def _grads(fn, tensors, mask, grad_out):
    leaves = [t.detach().requires_grad_() for t in tensors]
    out = fn(*leaves, mask)
    return torch.autograd.grad(out, leaves, grad_out.to(out.dtype))


def attention_backward() -> None:
    print("== 3. attention backward, float32, 8 x 512, 12 heads of 64")
    lengths = [512, 300, 1, 77, 511, 256, 33, 129]
    for shrink in (1.0, 0.25):
        q, k, v = qkv(8, 12, 512, 512, 64, torch.float32, DEVICE, seed=512, layout="fused")
        q = (q * shrink).detach()
        mask = padded_mask(lengths, 512, device=DEVICE)
        grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(99)).to(DEVICE)

        ours = _grads(K.attention, (q, k, v), mask, grad_out)
        torch_ = _grads(R.attention, (q, k, v), mask, grad_out)
        ref = _grads(R.attention, (q.double(), k.double(), v.double()), mask, grad_out)
        for name, a, t, r in zip(("dq", "dk", "dv"), ours, torch_, ref):
            err, torch_err = (a.double() - r).abs(), (t.double() - r).abs()
            print(
                f"  shrink {shrink} {name}: fastbert {err.max().item():.3g} (mean "
                f"{err.mean().item():.3g}), torch {torch_err.max().item():.3g} (mean "
                f"{torch_err.mean().item():.3g}), |ref| max {r.abs().max().item():.3g}"
            )
        err = (ours[1].double() - ref[1]).abs()
        where = torch.nonzero(err == err.max())[0].tolist()
        print(
            f"  shrink {shrink} dk's largest error at (batch, head, key, d) {where}, "
            f"that sequence's length {lengths[where[0]]}"
        )


def custom_ops() -> None:
    print("== 4. custom op (saving) against the public function, bits")
    original = fused_linear._linear_fwd_kernel.run
    for fusion in (True, False):
        if not fusion:
            fused_linear._linear_fwd_kernel.run = lambda *a, **kw: original(
                *a, enable_fp_fusion=False, **kw
            )
        for case in ("layer_norm-grad", "linear-gated-grad", "linear-full"):
            op, make_args = CASES[case]
            args = make_args(DEVICE)
            name = op.__name__.split(".")[-1]
            with torch.no_grad():
                expected = getattr(K, name)(
                    *args[: _public_arity(name)], **_public_keywords(name, op, args)
                )
                got = op(*args)
            got = got[0] if isinstance(got, tuple) else got
            diff = (got.double() - expected.double()).abs()
            print(
                f"  linear fusion={fusion} {case}: {(diff > 0).sum().item()} of "
                f"{diff.numel()} differ, max {diff.max().item():.3g}"
            )
    fused_linear._linear_fwd_kernel.run = original


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__)
    for part in (quantisation, layer_norm, attention_backward, custom_ops):
        try:
            part()
        except Exception as exc:  # report and go on: one run on a borrowed GPU
            print(f"  {part.__name__} failed: {type(exc).__name__}: {exc}"[:600])
