"""Least-squares lines with their uncertainty: ``y = α + β·x``, r², standard errors, 95 % intervals."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["fit_line", "t95", "significant", "confidence"]

#: Two-sided 95 % Student-t quantiles for 1..30 degrees of freedom (beyond: 1.96).
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def fit_line(x: Sequence[float], y: Sequence[float]) -> dict[str, Any]:
    """Least-squares ``y = α + β·x``.

    Returns:
        ``alpha, beta, r2, n, alpha_se, beta_se, alpha_lo, alpha_hi, fitted`` (list); r², standard
        errors and the 95 % interval of α are None below 3 points (no degrees of freedom left);
        r² is None when y does not vary.
    """
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(xs)
    out: dict[str, Any] = {"n": n, "alpha": None, "beta": None, "r2": None, "alpha_se": None, "beta_se": None,
                           "alpha_lo": None, "alpha_hi": None, "fitted": [None] * n}  # fmt: skip
    if n < 2 or np.ptp(xs) == 0:
        return out
    xm, ym = xs.mean(), ys.mean()
    sxx = float(((xs - xm) ** 2).sum())
    beta = float(((xs - xm) * (ys - ym)).sum() / sxx)
    alpha = float(ym - beta * xm)
    fitted = alpha + beta * xs
    ss_res = float(((ys - fitted) ** 2).sum())
    ss_tot = float(((ys - ym) ** 2).sum())
    out.update(alpha=alpha, beta=beta, fitted=[float(v) for v in fitted])
    if n >= 3:
        out["r2"] = 1.0 - ss_res / ss_tot if ss_tot > 0 else None
        s2 = ss_res / (n - 2)
        out["beta_se"] = math.sqrt(s2 / sxx)
        out["alpha_se"] = math.sqrt(s2 * (1.0 / n + xm * xm / sxx))
        t = t95(n)
        out["alpha_lo"], out["alpha_hi"] = alpha - t * out["alpha_se"], alpha + t * out["alpha_se"]
    return out


def confidence(r2: float | None, n: int) -> str:
    if r2 is None:
        return "none"
    if r2 >= 0.9 and n >= 4:
        return "high"
    return "medium" if r2 >= 0.8 else "low"


def t95(n: int) -> float:
    return _T95[n - 3] if 3 <= n and n - 2 <= len(_T95) else 1.96


def significant(est: float | None, se: float | None, n: int) -> bool:
    """``est`` > 0 at the 95 % level (Student t, n − 2 df); with 2 points (no df) just ``est`` > 0."""
    if est is None:
        return False
    if n < 3 or se is None:
        return est > 0
    return est - t95(n) * se > 0
