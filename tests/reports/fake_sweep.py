"""Hand-built sweep runs whose exact answer is known (shared by the analysis and browser tests)."""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from ep_trace.analysis.run_facts import _TIMES_SCHEMA
from ep_trace.analysis.sweep import SweepRun

PLACEMENT = ((0, (0,)), (1, (0,)), (2, (1,)), (3, (1,)))


def _run(
    label: str,
    x: float,
    *,
    dispatch: Callable[[float], float],
    combine: Callable[[float], float],
    expert_mean: Callable[[float], float],
    expert_max: Callable[[float], float],
    other: float = 1e6,
    knobs: dict | None = None,
    identity: dict | None = None,
    bytes_per_token: float = 256.0,
) -> SweepRun:
    d, c, em, ex = dispatch(x), combine(x), expert_mean(x), expert_max(x)
    layer = d + c + ex + other
    rows = [
        ("dispatch", d, d, 2.0, x * bytes_per_token),
        ("combine", c, c, 1.0, x * bytes_per_token),
        ("expert", ex, em, None, None),
        ("moe_layer", layer, layer, None, None),
    ]
    recs = []
    for layer_id in (0, None):
        for stage, t, tm, calls, b in rows:
            recs.append({"stage": stage, "layer": layer_id, "t_ns": t, "t_p25_ns": t * 0.99, "t_p75_ns": t * 1.01,
                         "t_mean_ns": tm, "n": 5, "a2a_calls": calls, "bytes": b, "bytes_mean": b})  # fmt: skip
    recs.append({"stage": "step", "layer": None, "t_ns": layer + 2e6, "t_p25_ns": layer + 2e6, "t_p75_ns": layer + 2e6,
                 "t_mean_ns": layer + 2e6, "n": 5, "a2a_calls": None, "bytes": None, "bytes_mean": None})  # fmt: skip
    step = layer + 2e6
    k = {"tokens": x, "top_k": 2, "hidden": 64, "ep_size": 2, "dtype": "float32", "chunks": 1, "experts": 4,
         "moe_layers": 1, **(knobs or {})}  # fmt: skip
    figures = {"step_time_ns": step, "step_p25_ns": step * 0.99, "step_p75_ns": step * 1.01,
               "tokens_per_step": 2 * x, "tokens_per_s": 2 * x / (step / 1e9), "exposed_comm_ratio": 0.3, "I_r": 1.0}  # fmt: skip
    ident = {"world_size": 2, "placement": PLACEMENT, **(identity or {})}
    return SweepRun(label, k, ident, {"skew": "uniform"}, pl.DataFrame(recs, schema=_TIMES_SCHEMA), figures)


TOKENS = (128, 512, 2048)


def _latency_runs(alpha_ms: float = 20.0) -> list[SweepRun]:
    a = alpha_ms * 1e6
    return [
        _run(
            f"t{x}",
            x,
            dispatch=lambda x: 2 * a + 100 * x,
            combine=lambda x: a + 100 * x,
            expert_mean=lambda x: 1000 * x,
            expert_max=lambda x: 1050 * x,
        )  # fmt: skip
        for x in TOKENS
    ]
