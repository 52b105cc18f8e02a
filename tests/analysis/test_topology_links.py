"""Topology (which ranks share a node) and the α–β of each link class, on frames with known answers."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from ep_trace.analysis.config import LinkCost, LinkDefaults
from ep_trace.analysis.link_cost import fit_link_costs, link_bytes
from ep_trace.analysis.topology import TopologySpec, rank_nodes, with_link_class
from ep_trace.errors import ConfigError


def _ranks(hosts: list[str | None], **cols: list[int | None]) -> pl.DataFrame:
    data: dict[str, list[object]] = {"rank": list(range(len(hosts))), "host": list(hosts)}
    schema: dict[str, pl.DataType] = {"rank": pl.Int32(), "host": pl.Utf8()}
    for k, v in cols.items():
        data[k], schema[k] = list(v), pl.Int32()
    return pl.DataFrame(data, schema=schema)


def test_nodes_from_hosts_launcher_and_override():
    t = rank_nodes(_ranks(["a", "a", "b", "b"]))
    assert t["node"].to_list() == ["a", "a", "b", "b"] and t["node_id"].to_list() == [0, 0, 1, 1]
    assert set(t["source"]) == {"host"}
    # the launcher beats the host name: containers on one machine each name their own host
    t = rank_nodes(_ranks(["p0", "p1", "p2", "p3"], local_world_size=[2, 2, 2, 2]))
    assert t["node_id"].to_list() == [0, 0, 1, 1] and set(t["source"]) == {"launcher"}
    t = rank_nodes(_ranks(["x"] * 4, node_rank=[1, 1, 0, 0]))
    assert t["node"].to_list() == ["node1", "node1", "node0", "node0"] and t["node_id"].to_list() == [0, 0, 1, 1]
    t = rank_nodes(_ranks(["a"] * 4), TopologySpec.parse("ranks-per-node=2"))
    assert t["node"].to_list() == ["node0", "node0", "node1", "node1"] and set(t["source"]) == {"override"}


def test_ranks_without_a_host_are_assumed_on_one_node():
    t = rank_nodes(_ranks([None, None]))
    assert t["node"].to_list() == ["<unknown>"] * 2 and set(t["source"]) == {"assumed"}


def test_topology_file():
    spec = TopologySpec.parse("topo.txt", "# two nodes\nnodeA: 0-1\n2,3  # the other\n")
    assert spec.nodes == ((0, 1), (2, 3)) and spec.names == ("nodeA", "node1")
    t = rank_nodes(_ranks(["h"] * 4), spec)
    assert t["node"].to_list() == ["nodeA", "nodeA", "node1", "node1"]


@pytest.mark.parametrize(
    ("arg", "text", "message"),
    [
        (
            "eight",
            None,
            "--topology: 'eight' is neither ranks-per-node=N nor a file; pass e.g. ranks-per-node=8 or a file with one node per line (docs/placement.md)",
        ),
        ("ranks-per-node=0", None, "--topology: ranks-per-node must be >= 1, got 'ranks-per-node=0'"),
        ("t.txt", "a: 0-3\nb: 3-4\n", "--topology t.txt: line 2: rank 3 is already on line 1; give each rank one node"),
        (
            "t.txt",
            "a: 0-x\n",
            "--topology t.txt: line 1: '0-x' is not a rank or a range A-B; write e.g. 'node0: 0-7' or 'node1: 8,9,10'",
        ),
        ("t.txt", "# nothing\n", "--topology t.txt: no node lines; write one line per node, e.g. 'node0: 0-7'"),
    ],
)
def test_topology_errors_word_for_word(arg, text, message):
    with pytest.raises(ConfigError) as e:
        TopologySpec.parse(arg, text)
    assert str(e.value) == message


def test_topology_file_must_cover_the_trace():
    with pytest.raises(ConfigError, match=r"ranks 2, 3 of the trace are on no node line; add them to the file"):
        rank_nodes(_ranks(["h"] * 4), TopologySpec.parse("t.txt", "n: 0-1\n"))


def test_link_class_of_pairs():
    nodes = rank_nodes(_ranks(["a", "a", "b"]))
    pairs = pl.DataFrame({"src": [0, 0, 0], "dst": [0, 1, 2]}, schema={"src": pl.Int32, "dst": pl.Int32})
    assert with_link_class(pairs, nodes)["link_class"].to_list() == ["same_rank", "same_node", "cross_node"]


ALPHA_NS = np.array([0.0, 5_000.0, 50_000.0])
BETA = np.array([100.0, 20.0, 5.0])  # bytes per ns = GB/s


def _obs(rng: np.random.Generator, n: int = 60) -> pl.DataFrame:
    b = rng.integers(1_000, 2_000_000, size=(n, 3)).astype(float)
    b[: n // 3, 1:] = 0.0  # only self bytes: farthest class same_rank
    b[n // 3 : 2 * n // 3, 2] = 0.0  # no cross-node bytes: farthest same_node
    far = np.where(b[:, 2] > 0, 2, np.where(b[:, 1] > 0, 1, 0))
    y = ALPHA_NS[far] + (b / BETA).sum(axis=1)
    return pl.DataFrame({"b_same_rank": b[:, 0], "b_same_node": b[:, 1], "b_cross_node": b[:, 2], "y_ns": y})


def test_alpha_beta_per_class_recovered_exactly():
    costs, table = fit_link_costs(_obs(np.random.default_rng(0)), LinkDefaults())
    assert costs.alpha_ns[1:] == pytest.approx(ALPHA_NS[1:], abs=1e-3)
    assert costs.beta == pytest.approx(BETA, rel=1e-9)
    assert table["alpha_source"].to_list() == ["fitted", "fitted", "fitted"]
    assert table["r2"].to_list() == pytest.approx([1.0, 1.0, 1.0])
    assert table["n"].to_list() == [20, 20, 20]


def test_classes_without_transfers_take_the_defaults():
    obs = _obs(np.random.default_rng(1)).filter(pl.col("b_cross_node") == 0)
    defaults = LinkDefaults(cross_node=LinkCost(25.0, 12.5))
    costs, table = fit_link_costs(obs, defaults)
    row = table.filter(pl.col("link_class") == "cross_node").row(0, named=True)
    assert (row["alpha_us"], row["beta_gbps"], row["alpha_source"], row["beta_source"], row["n"]) == (
        25.0,
        12.5,
        "default",
        "default",
        0,
    )
    assert costs.beta[1] == pytest.approx(20.0, rel=1e-9)
    # priced: the farthest class' α once, then every class' bytes at its bandwidth
    b = np.array([[1e6, 2e6, 4e6]])
    assert costs.price(b)[0] == pytest.approx(25_000.0 + 1e6 / 100.0 + 2e6 / 20.0 + 4e6 / 12.5)


def test_no_transfers_at_all_gives_every_default():
    empty = pl.DataFrame(
        schema={"b_same_rank": pl.Float64, "b_same_node": pl.Float64, "b_cross_node": pl.Float64, "y_ns": pl.Float64}
    )
    _, table = fit_link_costs(empty, LinkDefaults())
    assert set(table["alpha_source"]) == {"default"} and set(table["beta_source"]) == {"default"}


def test_link_bytes_per_layer_and_class():
    cm = pl.DataFrame(
        {
            "step": [0, 0, 0, 1, 1, 1],
            "layer": [0] * 6,
            "direction": ["dispatch"] * 6,
            "src": [0, 0, 0, 0, 0, 0],
            "dst": [0, 1, 2, 0, 1, 2],
            "rows": [10, 20, 30, 30, 40, 50],
            "row_bytes": [100] * 6,
        },
        schema_overrides={"layer": pl.Int32, "src": pl.Int32, "dst": pl.Int32},
    )
    lb = link_bytes(cm, rank_nodes(_ranks(["a", "a", "b"])))
    assert lb.select("link_class", "rows", "bytes").rows() == [
        ("same_rank", 20.0, 2000.0),
        ("same_node", 30.0, 3000.0),
        ("cross_node", 40.0, 4000.0),
    ]
