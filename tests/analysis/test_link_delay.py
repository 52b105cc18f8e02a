"""Link costs of an emulated network (ep-trace demo --nodes): transport and injected delay fitted apart.

Synthetic (call, rank) observations whose answer is known: every call's bytes go through one transport
(α 100 µs, 1 GB/s for all its bytes, to itself and to the other ranks: gloo's copies on one machine), and
a call that moves bytes across nodes
first sleeps 5 ms + its cross-node bytes at 0.5 GB/s (the emulator's A + bytes / G); a few sleeps end
far too late (a loaded machine).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from ep_trace.analysis.config import LinkDefaults
from ep_trace.analysis.link_cost import fit_link_costs
from ep_trace.analysis.link_delay import fit_emulated, has_delays

T_ALPHA, T_BETA = 100_000.0, 1.0  # ns, bytes / ns
D_ALPHA, D_BETA = 5_000_000.0, 0.5


def _obs(
    rng: np.random.Generator, n: int = 90, late: int = 4, inside: int = 30, t_alpha: float = T_ALPHA
) -> pl.DataFrame:
    b = rng.integers(10_000, 1_000_000, size=(n, 3)).astype(float)
    b[:inside, 2] = 0.0  # calls that stay inside the node: no delay
    transfer = t_alpha + b.sum(axis=1) / T_BETA
    delay = np.where(b[:, 2] > 0, D_ALPHA + b[:, 2] / D_BETA, 0.0)
    delay[n - late :] += 40e6  # overshoot of a few sleeps
    return pl.DataFrame(
        {"b_same_rank": b[:, 0], "b_same_node": b[:, 1], "b_cross_node": b[:, 2], "y_ns": transfer, "delay_ns": delay}
    )


def test_transport_is_shared_and_the_delay_is_its_own_part():
    obs = _obs(np.random.default_rng(0))
    assert has_delays(obs) and not has_delays(obs.with_columns(pl.lit(0.0).alias("delay_ns")))
    costs, table = fit_emulated(obs, LinkDefaults())
    assert costs.delay is not None
    assert costs.delay.alpha_ns[2] == pytest.approx(D_ALPHA, rel=1e-6)  # the late sleeps left out
    assert costs.delay.beta[2] == pytest.approx(D_BETA, rel=1e-6)
    assert costs.delay.alpha_ns[1] == 0.0  # no delayed call stays inside a node: none
    assert costs.alpha_ns[1] == pytest.approx(T_ALPHA, rel=1e-6)  # the transport fitted over the classes
    assert costs.beta == pytest.approx([T_BETA, T_BETA, 1.0 / (1.0 / T_BETA + 1.0 / D_BETA)], rel=1e-6)
    assert costs.alpha_ns[2] == pytest.approx(T_ALPHA + D_ALPHA, rel=1e-6)
    assert table.filter(pl.col("link_class") == "cross_node")["alpha_us"][0] == pytest.approx((T_ALPHA + D_ALPHA) / 1e3)
    # a call moved from across the nodes to inside one: the delay's part of the change is the delay it skips
    across, inside = np.array([[0.0, 0.0, 2e5]]), np.array([[0.0, 2e5, 0.0]])
    skipped = costs.price_delay(across) - costs.price_delay(inside)
    assert skipped[0] == pytest.approx(D_ALPHA + 2e5 / D_BETA, rel=1e-6)
    assert (costs.price(across) - costs.price(inside))[0] == pytest.approx(skipped[0], rel=1e-6)  # same transport


def test_one_cost_per_class_credits_the_transport_to_a_node_local_move():
    # what the emulated fit avoids: where every call crosses (affinity routing), one α–β per class over
    # transfer + delay leaves same-node's α at the default of a real cluster (NVLink), so moving a call
    # inside the node would also skip the fixed cost of its gloo copy (600 µs here)
    obs = _obs(np.random.default_rng(1), late=0, inside=0, t_alpha=600_000.0)
    one, _ = fit_link_costs(obs.with_columns(pl.col("y_ns") + pl.col("delay_ns")), LinkDefaults())
    two, _ = fit_emulated(obs, LinkDefaults())
    across, inside = np.array([[0.0, 0.0, 2e5]]), np.array([[0.0, 2e5, 0.0]])
    truth = D_ALPHA + 2e5 / D_BETA
    assert (two.price(across) - two.price(inside))[0] == pytest.approx(truth, rel=1e-6)
    assert (one.price(across) - one.price(inside))[0] == pytest.approx(truth + 600_000.0 - 10_000.0, rel=1e-6)


def test_near_collinear_classes_keep_the_class_that_carries_the_cost():
    # the calls of an affinity-routed run: count exchanges move 16 / 16 / 32 bytes, token all-to-alls ~18 K
    # to the rank itself, ~20 K inside the node and ~490 K across; only the cross-node bytes cost (1 ms +
    # 0.125 GB/s, the emulator's 1 ms + 1 Gbit/s) plus 1 ms of noise. Dropping every insignificant slope at
    # once lost the cross-node one with the others (its standard error blurred by theirs: this seed gave
    # every class the defaults); one at a time, the least significant first, keeps it.
    rng = np.random.default_rng(1)
    n = 72
    count = np.arange(n) % 3 == 0
    b = np.where(
        count[:, None],
        np.array([16.0, 16.0, 32.0]),
        np.stack([rng.normal(18e3, 3e3, n), rng.normal(20e3, 3e3, n), rng.normal(490e3, 8e3, n)], axis=1),
    )
    y = 1e6 + b[:, 2] / 0.125 + rng.normal(0.0, 1e6, n)
    obs = pl.DataFrame({"b_same_rank": b[:, 0], "b_same_node": b[:, 1], "b_cross_node": b[:, 2], "y_ns": y})
    costs, table = fit_link_costs(obs, LinkDefaults())
    row = table.filter(pl.col("link_class") == "cross_node").row(0, named=True)
    assert (row["alpha_source"], row["beta_source"]) == ("fitted", "fitted")
    assert costs.beta[2] == pytest.approx(0.125, rel=0.2)
