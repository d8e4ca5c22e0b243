"""Fit the exact-GELU epilogue coefficients of fastbert/kernels/fused_linear.py (``_normal_tail``).

``python -m benchmarks.fit_gelu`` prints them (needs numpy and scipy). The kernel computes
Phi(-u) (u = |y|, Phi the standard normal CDF) as ``(w / 2) * exp2(r(x) - K u^2)`` with
``w = 1 / (1 + A u)``, ``K = log2(e) / 2`` and ``x = -S u w`` in [-1, 0] for u in [0, U]
(``S = (1 + A U) / U``), so that

    r(x) = log2(2 Phi(-u)) + K u^2 - log2(w)

is smooth and small: r(0) = 0, r(-1) = -1.77, and r tends to log2(2 A / sqrt(2 pi)) as u
grows (w takes out the 1/u of the Mills ratio, as in Numerical Recipes' erfc). r is fitted as
x * P(x), P of degree ``DEGREE - 1``, minimising the largest absolute error on [-1, 0] (a
linear programme on ``POINTS`` Chebyshev points from a least-squares start, in the basis
x * T_j(2x + 1)), then converted to monomials and rounded to float32. 2A, 2S and K enter as
the kernel's float32 constants. An absolute error of r is a relative error of Phi(-u) of
ln(2) times as much.
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial import chebyshev, polynomial

A = 0.3
U = 14.4  # |y| clamp: GELU(-14.4) ~ 3.6e-46 rounds to 0 in float32
DEGREE = 9
POINTS = 4000
# The constants as the kernel holds them (float32), so that r absorbs their rounding: K's
# alone, left out, would bias Phi(-u) by 1e-6 relative at u = 12.
TWO_A = float(np.float32(2 * A))
TWO_S = float(np.float32(2 * (1 + A * U) / U))
K = float(np.float32(np.log2(np.e) / 2))


def target(x: np.ndarray) -> np.ndarray:
    """r at x in [-1, 0], in float64."""
    from scipy.special import log_ndtr

    a = TWO_A / 2
    uw = -2 * x / TWO_S  # u w = u / (1 + A u)
    u = uw / (1 - a * uw)
    return (log_ndtr(-u) + np.log(2)) / np.log(2) + K * u * u + np.log2(1 + a * u)


def fit() -> tuple[np.ndarray, float]:
    """Monomial coefficients [c1..cn] of r ~ x * P(x), float64, and the largest error."""
    from scipy.optimize import linprog

    t = np.cos(np.linspace(0, np.pi, POINTS))
    x = (t - 1) / 2
    y = target(x)
    basis = x[:, None] * chebyshev.chebvander(t, DEGREE - 1)
    c = np.linalg.lstsq(basis, y, rcond=None)[0]
    for _ in range(2):  # minimax of the residual, rescaled so the solver's tolerances bite
        resid = y - basis @ c
        scale = 1 / np.abs(resid).max()
        rows = basis * scale
        ones = np.ones((POINTS, 1))
        a_ub = np.vstack([np.hstack([rows, -ones]), np.hstack([-rows, -ones])])
        b_ub = np.concatenate([resid * scale, -resid * scale])
        cost = np.zeros(DEGREE + 1)
        cost[-1] = 1
        bounds = [(None, None)] * DEGREE + [(0, None)]
        c = c + linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs").x[:DEGREE]
    in_t = chebyshev.cheb2poly(c)
    in_x = np.zeros(1)
    for coef in in_t[::-1]:  # substitute t = 2x + 1
        in_x = polynomial.polyadd(polynomial.polymul(in_x, [1.0, 2.0]), [coef])
    coefs = np.asarray(in_x[:DEGREE], dtype=np.float64)
    rounded = coefs.astype(np.float32).astype(np.float64)
    error = np.abs(y - x * polynomial.polyval(x, rounded)).max()
    return coefs, float(error)


def main() -> None:
    coefs, error = fit()
    print(f"2 A = {TWO_A!r}, 2 S = {TWO_S!r}, K = {K!r} (float32), U = {U}")
    for k, coef in enumerate(coefs, start=1):
        print(f"c{k} = {float(np.float32(coef))!r}")
    print(f"max |r - x P(x)| with float32 coefficients: {error:.3e} ({error / 2**-24:.2f} x 2^-24)")


if __name__ == "__main__":
    main()
