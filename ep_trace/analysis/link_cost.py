"""The α–β cost of each link class, fitted from the trace's own all-to-all transfers.

An all-to-all call moves, on rank r, ``B_k`` bytes over each link class k (:data:`~ep_trace.analysis.
topology.LINK_CLASSES`; ``B_k`` = max(bytes sent to, bytes received from) the class' peers, a full-
duplex link). Its wait-free transfer (``call_ranks.transfer_ns``, plus the injected link delay the
sidecar recorded before it, ``ep-trace demo --nodes``) is modelled as

    T = α_far + Σ_k B_k / β_k        (far = the farthest class the rank's call touches)

a fixed cost paid once, at the farthest link, and each class' bytes at its bandwidth (the classes
are charged in series: a bound for a GPU whose NVLink and NIC copies overlap, the rule for gloo,
whose worker copies them one after the other). One least-squares fit over every (call, rank) of the
dispatch / combine calls gives all α and β at once (numpy ``lstsq``, one row per (call, rank)). A
class' β counts as fitted when the class carries bytes in at least :data:`MIN_CALLS` calls with at
least two sizes and the slope is positive at the 95 % level; its α when the class is the farthest in
at least :data:`MIN_CALLS` calls and the intercept is not significantly negative (a
slightly negative one counts as 0); one failing coefficient is fixed to its default at a time, the least
significant first, and the fit redone. A coefficient the calls cannot tell apart from the others (its
column a combination of theirs: e.g. a workload whose every rank sends each peer the same count
exchange, where the same-rank and same-node bytes move in lock-step with the cross-node ones) is not
fitted, the α first kept, then the β of the classes that carry the most bytes; without this one
collinear column sank the whole fit to the defaults. What is not fitted takes the
user's default (``AnalysisConfig.link_defaults``), with the fit redone on what remains; r² is per
class over the calls it is the farthest in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ep_trace.analysis.config import LinkDefaults
from ep_trace.analysis.matching import splits_long
from ep_trace.analysis.topology import LINK_CLASSES, with_link_class
from ep_trace.dtypes import itemsize_expr

__all__ = [
    "MIN_CALLS",
    "LinkCosts",
    "call_class_bytes",
    "fit_link_costs",
    "table_of",
    "link_bytes",
    "LINK_COST_SCHEMA",
]

#: Calls a class needs before its α or β is fitted (fewer: the default).
MIN_CALLS = 3
_K = len(LINK_CLASSES)

LINK_COST_SCHEMA = {
    "link_class": pl.Utf8,
    "alpha_us": pl.Float64,
    "beta_gbps": pl.Float64,
    "alpha_source": pl.Utf8,
    "beta_source": pl.Utf8,
    "r2": pl.Float64,
    "n": pl.Int64,
}


@dataclass(frozen=True)
class LinkCosts:
    """α (ns) and β (bytes / ns = GB/s) per link class, in :data:`LINK_CLASSES` order; ``delay``: the
    part of them that is an injected delay before the call (an emulated network,
    :mod:`~ep_trace.analysis.link_delay`), None where there is none."""

    alpha_ns: np.ndarray
    beta: np.ndarray
    delay: LinkCosts | None = None

    def price_delay(self, b: np.ndarray) -> np.ndarray:
        """The injected delay's part of :meth:`price` (0 without one)."""
        return self.delay.price(b) if self.delay is not None else np.zeros(b.shape[0])

    def price(self, b: np.ndarray) -> np.ndarray:
        """Modelled transfer (ns) of each row of ``b`` (bytes per class, ``[n, 3]``): α of the farthest
        class with bytes + Σ bytes / β; 0 for a row without bytes."""
        has = b > 0
        far = np.where(has.any(axis=1), _K - 1 - np.argmax(has[:, ::-1], axis=1), -1)
        alpha = np.where(far >= 0, self.alpha_ns[np.maximum(far, 0)], 0.0)
        return np.asarray(alpha + (b / self.beta[None, :]).sum(axis=1))


def call_class_bytes(matched: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """Bytes per link class of every (matched call, rank) with split lists.

    Args:
        matched: ``MatchPass.matched`` (collectives with ``match_id``, ``_gr``).
        nodes: :func:`~ep_trace.analysis.topology.rank_nodes`.

    Returns:
        ``match_id, rank, b_same_rank, b_same_node, b_cross_node`` (bytes, Float64), one row per
        (call, rank) whose lists are known.
    """
    m = matched.filter(pl.col("match_id").is_not_null())
    rb = pl.coalesce("row_bytes", itemsize_expr(pl.col("dtype"))).cast(pl.Float64)
    meta = m.select("rank", "coll_id", "match_id", rb.alias("_rb"))
    parts = []
    for which, col in (("in_splits", "_s"), ("out_splits", "_r")):
        long = splits_long(m, which).rename({"rows": col})
        parts.append(long.join(meta, on=["rank", "coll_id"]))
    if all(p.is_empty() for p in parts):
        return pl.DataFrame(
            schema={"match_id": pl.Int64, "rank": pl.Int32, **{f"b_{k}": pl.Float64 for k in LINK_CLASSES}}
        )
    keys = ["match_id", "rank", "peer", "_rb"]
    both = parts[0].select(*keys, "_s").join(parts[1].select(*keys, "_r"), on=keys, how="full", coalesce=True)
    both = with_link_class(both.with_columns(pl.col("rank").cast(pl.Int32)), nodes, "rank", "peer")
    b = pl.max_horizontal(pl.col("_s").fill_null(0), pl.col("_r").fill_null(0)) * pl.col("_rb").fill_null(0)
    agg = both.group_by("match_id", "rank").agg(
        *[b.filter(pl.col("link_class") == k).sum().alias(f"b_{k}") for k in LINK_CLASSES]
    )
    return agg.with_columns(pl.col(f"b_{k}").cast(pl.Float64) for k in LINK_CLASSES).sort("match_id", "rank")


def fit_link_costs(obs: pl.DataFrame, defaults: LinkDefaults) -> tuple[LinkCosts, pl.DataFrame]:
    """Fit α, β per link class (module doc) on ``obs``.

    Args:
        obs: ``b_same_rank, b_same_node, b_cross_node`` (bytes) and ``y_ns`` (the transfer), one row
            per (call, rank).
        defaults: The costs of classes the fit cannot give.

    Returns:
        The :class:`LinkCosts` and a frame of :data:`LINK_COST_SCHEMA` (one row per class).
    """
    b = obs.select([f"b_{k}" for k in LINK_CLASSES]).to_numpy().astype(np.float64) if obs.height else np.zeros((0, _K))
    y = obs["y_ns"].to_numpy().astype(np.float64) if obs.height else np.zeros(0)
    keep = b.sum(axis=1) > 0
    b, y = b[keep], y[keep]
    alpha = np.array([defaults.of(k).alpha_us * 1e3 for k in LINK_CLASSES])
    beta = np.array([defaults.of(k).beta_gbps for k in LINK_CLASSES])
    far = _farthest(b)
    a_fit = np.array([(far == k).sum() >= MIN_CALLS for k in range(_K)])
    b_fit = np.array([_varies(b[:, k]) for k in range(_K)])
    a_fit, b_fit = _identifiable(b, far, a_fit, b_fit)
    coef: np.ndarray | None = None
    for _ in range(2 * _K + 1):  # each pass fixes one more α or β to its default, or stops
        coef, se = _solve(b, y, far, a_fit, b_fit, alpha, beta)
        if coef is None or se is None:
            a_fit[:], b_fit[:] = False, False
            break
        slope = coef[_K:]
        bad_b = b_fit & ~((slope > 0) & (slope - 1.96 * se[_K:] > 0))
        bad_a = a_fit & (coef[:_K] + 1.96 * se[:_K] < -1.0)  # significantly negative (1 ns of float noise)
        bad = np.concatenate([bad_a, bad_b])
        if not bad.any():
            break
        # the least significant one only: near-collinear classes (a count exchange's few same-node bytes
        # beside its cross-node ones, the same calls' large ones beside theirs) blur each other's slope,
        # and dropping every blurred one at once dropped the class that carries the cost too
        t = np.where(bad, coef / np.maximum(se, 1e-300), np.inf)
        worst = int(np.argmin(t))
        (a_fit if worst < _K else b_fit)[worst % _K] = False
    if coef is not None:
        alpha = np.where(a_fit, np.maximum(coef[:_K], 0.0), alpha)
        beta = np.where(b_fit, 1.0 / np.where(b_fit, coef[_K:], 1.0), beta)
    costs = LinkCosts(alpha, beta)
    return costs, _table(costs, b, y, far, a_fit, b_fit)


def table_of(costs: LinkCosts, obs: pl.DataFrame, a_fit: np.ndarray, b_fit: np.ndarray) -> pl.DataFrame:
    """The :data:`LINK_COST_SCHEMA` table of ``costs`` on ``obs`` (as :func:`fit_link_costs` takes it), the
    α / β of the classes marked in ``a_fit`` / ``b_fit`` said fitted."""
    b = obs.select([f"b_{k}" for k in LINK_CLASSES]).to_numpy().astype(np.float64) if obs.height else np.zeros((0, _K))
    y = obs["y_ns"].to_numpy().astype(np.float64) if obs.height else np.zeros(0)
    keep = b.sum(axis=1) > 0
    return _table(costs, b[keep], y[keep], _farthest(b[keep]), a_fit, b_fit)


def _farthest(b: np.ndarray) -> np.ndarray:
    has = b > 0
    return np.where(has.any(axis=1), _K - 1 - np.argmax(has[:, ::-1], axis=1), -1)


def _identifiable(
    b: np.ndarray, far: np.ndarray, a_fit: np.ndarray, b_fit: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The α / β candidates kept as free coefficients, one at a time while each adds a direction the
    kept ones do not span (module doc): α first, then β by the bytes their class carries."""
    cols = [(False, k, (far == k).astype(np.float64)) for k in range(_K) if a_fit[k]]
    cols += [(True, int(k), b[:, k]) for k in sorted(np.flatnonzero(b_fit), key=lambda k: -b[:, k].sum())]
    keep_a, keep_b = np.zeros(_K, dtype=bool), np.zeros(_K, dtype=bool)
    kept: list[np.ndarray] = []
    for is_beta, k, col in cols:
        x = np.stack([*kept, col / max(float(np.abs(col).max()), 1e-30)], axis=1)
        if np.linalg.matrix_rank(x) > len(kept):
            kept.append(x[:, -1])
            (keep_b if is_beta else keep_a)[k] = True
    return keep_a, keep_b


def _varies(col: np.ndarray) -> bool:
    nz = col[col > 0]
    return bool(nz.size >= MIN_CALLS and np.unique(col).size >= 2)


def _solve(
    b: np.ndarray,
    y: np.ndarray,
    far: np.ndarray,
    a_fit: np.ndarray,
    b_fit: np.ndarray,
    alpha: np.ndarray,
    beta: np.ndarray,
) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """Least squares of the free α / 1/β with the others fixed: ``(coef[2K], se[2K])`` (0 where fixed)."""
    ind = np.stack([(far == k).astype(np.float64) for k in range(_K)], axis=1)
    fixed = (ind[:, ~a_fit] * alpha[~a_fit]).sum(axis=1) + (b[:, ~b_fit] / beta[~b_fit]).sum(axis=1)
    x = np.concatenate([ind[:, a_fit], b[:, b_fit]], axis=1)
    n, p = x.shape
    if p == 0 or n <= p:
        return None, None
    t = y - fixed
    scale = np.maximum(np.abs(x).max(axis=0), 1e-30)  # bytes ~1e6, indicators 1: conditioning
    coef_s, *_ = np.linalg.lstsq(x / scale, t, rcond=None)
    res = t - (x / scale) @ coef_s
    s2 = float(res @ res) / (n - p)
    xs = x / scale
    try:
        cov = s2 * np.linalg.inv(xs.T @ xs)
    except np.linalg.LinAlgError:
        return None, None
    se_s = np.sqrt(np.maximum(np.diag(cov), 0.0))
    coef, se = np.zeros(2 * _K), np.zeros(2 * _K)
    idx = np.concatenate([np.flatnonzero(a_fit), _K + np.flatnonzero(b_fit)])
    coef[idx], se[idx] = coef_s / scale, se_s / scale
    return coef, se


def _table(
    costs: LinkCosts, b: np.ndarray, y: np.ndarray, far: np.ndarray, a_fit: np.ndarray, b_fit: np.ndarray
) -> pl.DataFrame:
    pred = costs.price(b) if b.size else np.zeros(0)
    rows = []
    for k, name in enumerate(LINK_CLASSES):
        sel = far == k
        yk = y[sel]
        ss_tot = float(((yk - yk.mean()) ** 2).sum()) if yk.size else 0.0
        r2 = 1.0 - float(((yk - pred[sel]) ** 2).sum()) / ss_tot if yk.size >= MIN_CALLS and ss_tot > 0 else None
        rows.append(
            (
                name,
                float(costs.alpha_ns[k]) / 1e3,
                float(costs.beta[k]),
                "fitted" if a_fit[k] else "default",
                "fitted" if b_fit[k] else "default",
                r2 if (a_fit[k] or b_fit[k]) else None,
                int(sel.sum()),
            )
        )
    return pl.DataFrame(rows, schema=LINK_COST_SCHEMA, orient="row")


def link_bytes(count_matrix: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """Each layer's dispatch / combine bytes per link class, mean per step.

    Args:
        count_matrix: ``Analysis.count_matrix`` (``step, layer, direction, src, dst, rows, row_bytes``).
        nodes: :func:`~ep_trace.analysis.topology.rank_nodes`.

    Returns:
        ``layer, direction, link_class, rows, bytes`` (rows and bytes: mean per step, Float64), with
        every class of :data:`LINK_CLASSES` present per (layer, direction) (0 where none).
    """
    cm = count_matrix.filter(pl.col("direction").is_in(["dispatch", "combine"]))
    schema = {"layer": pl.Int32, "direction": pl.Utf8, "link_class": pl.Utf8, "rows": pl.Float64, "bytes": pl.Float64}
    if cm.is_empty():
        return pl.DataFrame(schema=schema)
    cm = with_link_class(cm.with_columns(pl.col("src").cast(pl.Int32), pl.col("dst").cast(pl.Int32)), nodes)
    n_steps = cm.group_by("layer", "direction").agg(pl.col("step").n_unique().alias("_n"))
    per = cm.group_by("layer", "direction", "link_class").agg(
        pl.col("rows").sum().cast(pl.Float64).alias("rows"),
        (pl.col("rows") * pl.col("row_bytes").fill_null(0)).sum().cast(pl.Float64).alias("bytes"),
    )
    grid = n_steps.join(pl.DataFrame({"link_class": list(LINK_CLASSES)}), how="cross")
    out = grid.join(per, on=["layer", "direction", "link_class"], how="left", nulls_equal=True).with_columns(
        (pl.col("rows").fill_null(0.0) / pl.col("_n")).alias("rows"),
        (pl.col("bytes").fill_null(0.0) / pl.col("_n")).alias("bytes"),
    )
    order = pl.col("link_class").replace_strict(list(LINK_CLASSES), list(range(_K)), return_dtype=pl.Int32)
    return (
        out.with_columns(order.alias("_o"))
        .sort(["layer", "direction", "_o"], nulls_last=True)
        .select(pl.col("layer").cast(pl.Int32), "direction", "link_class", "rows", "bytes")
    )
