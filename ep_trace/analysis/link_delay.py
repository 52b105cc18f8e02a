"""Link costs of an emulated network: the transport the ranks share, and the delay each call was given.

``ep-trace demo --nodes N --cross-node-latency-ms A --cross-node-gbps G`` (and ``--link-latency-ms``)
runs every rank on one machine and emulates the network by sleeping before each all-to-all; the sidecar
records the delay each call really waited (``collectives.link_delay_ns``, docs/sidecar.md). Such a trace
has two costs per call that :mod:`~ep_trace.analysis.link_cost`'s one α–β per class would mix:

* the **transport** (``transfer_ns``): gloo's copies, over loopback to the other ranks and in memory
  to the rank itself, the same path whatever node a rank is said to be on. One α–β is fitted for all
  the call's bytes, pooled over the classes, and stands for each: a class the trace has no calls of
  would otherwise take the defaults of a real cluster (NVLink for same-node: a placement that keeps the
  tokens inside a node would then be credited with the gloo copies too, which it does not remove), and
  the classes' bytes rise and fall together in every call (the count exchanges' few bytes to every peer,
  the token all-to-alls' many), so a fit per class splits the cost between them at random (one trace
  gave the rank's own rows 0.18 GB/s and the other ranks' 5.3, and a node-local placement, which turns
  rows to other ranks into the rank's own, was predicted 3 ms slower where it was 8 ms faster);
* the **delay** (``link_delay_ns``): its own α–β per class, fitted on the recorded delays (the
  emulator's ``A`` once per call that crosses plus ``bytes / G``); a class no delayed call was the
  farthest in has none.

A sleep only ends late, and a gloo copy only takes longer, when the scheduler runs something else (a
loaded machine): one-sided noise that would pull a least-squares fit far off (a 136 ms sleep for a 5 ms
delay was seen with 4 ranks on 2 busy cores), so each fit is done again once without the calls beyond
:data:`OVERSHOOT_MADS` median absolute deviations above it.

The costs of each class are the sum (the report's table); :attr:`LinkCosts.delay` keeps the delay's
part so that a what-if moves it in the lead gap before the call, where the sleep sits, and the transport
in the transfer.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ep_trace.analysis.config import LinkCost, LinkDefaults
from ep_trace.analysis.link_cost import LinkCosts, fit_link_costs, table_of
from ep_trace.analysis.topology import LINK_CLASSES

__all__ = ["OVERSHOOT_MADS", "has_delays", "fit_emulated"]

#: Residual (in median absolute deviations) beyond which a delayed call counts as scheduler overshoot.
OVERSHOOT_MADS = 5.0

_B = [f"b_{k}" for k in LINK_CLASSES]
_NO_DELAY = LinkDefaults(*(LinkCost(0.0, float("inf")) for _ in LINK_CLASSES))


def has_delays(obs: pl.DataFrame) -> bool:
    """The observations carry an injected delay (an emulated network)."""
    return "delay_ns" in obs.columns and bool((obs["delay_ns"].fill_null(0.0) > 0).any())


def _fitted(table: pl.DataFrame, col: str) -> np.ndarray:
    return np.array([s == "fitted" for s in table[col]])


def _fit_once_trimmed(obs: pl.DataFrame, defaults: LinkDefaults) -> tuple[LinkCosts, np.ndarray, np.ndarray]:
    """:func:`~ep_trace.analysis.link_cost.fit_link_costs`, then again without the calls that took far
    longer than the fit (module doc); and which α / β were fitted."""
    costs, table = fit_link_costs(obs, defaults)
    b = obs.select(_B).to_numpy().astype(np.float64)
    res = obs["y_ns"].to_numpy().astype(np.float64) - costs.price(b)
    if res.size:
        mad = float(np.median(np.abs(res - np.median(res))))
        keep = res <= np.median(res) + OVERSHOOT_MADS * max(mad, 1.0)  # 1 ns floor: an exact fit's float noise
        if not keep.all() and keep.sum() >= 2:
            costs, table = fit_link_costs(obs.filter(pl.Series(keep)), defaults)
    return costs, _fitted(table, "alpha_source"), _fitted(table, "beta_source")


def _transport(obs: pl.DataFrame, defaults: LinkDefaults) -> tuple[LinkCosts, np.ndarray, np.ndarray]:
    """One α–β for all the bytes of a call, pooled over the classes (module doc), standing for each class
    where fitted (same-rank's α aside: a call moves bytes to other ranks too); and which were fitted."""
    pooled = obs.select(
        pl.lit(0.0).alias("b_same_rank"),
        pl.lit(0.0).alias("b_same_node"),
        pl.sum_horizontal(_B).alias("b_cross_node"),
        "y_ns",
    )
    t, a_fit, b_fit = _fit_once_trimmed(pooled, defaults)
    alpha, beta = t.alpha_ns.copy(), t.beta.copy()
    alpha[1], a_fit[1] = (alpha[2], True) if a_fit[2] else (alpha[1], a_fit[1])
    if b_fit[2]:
        beta[:], b_fit[:] = beta[2], True
    return LinkCosts(alpha, beta), a_fit, b_fit


def fit_emulated(obs: pl.DataFrame, defaults: LinkDefaults) -> tuple[LinkCosts, pl.DataFrame]:
    """The link costs of an emulated network (module doc).

    Args:
        obs: ``b_same_rank, b_same_node, b_cross_node`` (bytes), ``y_ns`` (the wait-free transfer) and
            ``delay_ns`` (the injected delay before the call), one row per (call, rank).
        defaults: The transport costs of classes the fit cannot give.

    Returns:
        The summed :class:`~ep_trace.analysis.link_cost.LinkCosts` (its ``delay`` the delay's part) and
        their :data:`~ep_trace.analysis.link_cost.LINK_COST_SCHEMA` table over ``y_ns + delay_ns``.
    """
    t, ta, tb = _transport(obs, defaults)
    d, da, db = _fit_once_trimmed(obs.select(*_B, pl.col("delay_ns").fill_null(0.0).alias("y_ns")), _NO_DELAY)
    total = LinkCosts(t.alpha_ns + d.alpha_ns, 1.0 / (1.0 / t.beta + 1.0 / d.beta), delay=d)
    y = obs.select(*_B, (pl.col("y_ns") + pl.col("delay_ns").fill_null(0.0)).alias("y_ns"))
    return total, table_of(total, y, ta | da, tb | db)
