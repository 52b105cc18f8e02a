"""Topology: which ranks share a node, and the link class of every (source, destination) pair.

A rank's node comes from, best first (``rank_nodes``; each rank's ``source`` says which one decided):

1. the user: ``ep-trace analyze --topology ranks-per-node=N`` (node = rank // N) or ``--topology FILE``
   (:meth:`TopologySpec.from_text`), carried in ``AnalysisConfig.topology``; -> ``override``;
2. the launcher, as the parsers found it (``ranks.node_rank``: torchrun's ``GROUP_RANK`` /
   ``--node-rank``, Slurm's ``SLURM_NODEID``; else ``ranks.local_world_size``: ``LOCAL_WORLD_SIZE`` /
   ``--nproc-per-node`` / ``SLURM_NTASKS_PER_NODE``, node = rank // it) -> ``launcher``. It beats the
   host name because containers on one machine can each report their own host name;
3. the host name (sidecar ``meta.host``, Kineto ``host_name``, Nsight ``TARGET_INFO_SYSTEM_ENV.Hostname``;
   ``ep-trace demo --nodes N`` writes its emulated node's name) -> ``host``;
4. nothing: every rank without a host is put on one node ``<unknown>`` -> ``assumed`` (the report says so).

Link classes (:data:`LINK_CLASSES`): ``same_rank`` (a rank's rows to itself: a local copy),
``same_node`` (another rank of the node: NVLink / shared memory), ``cross_node`` (the network).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from ep_trace.errors import ConfigError

__all__ = ["LINK_CLASSES", "TopologySpec", "rank_nodes", "link_class", "with_link_class", "topology_note"]

#: The link classes of a (source, destination) pair, nearest first.
LINK_CLASSES: tuple[str, ...] = ("same_rank", "same_node", "cross_node")

_RPN = re.compile(r"^\s*ranks[-_]per[-_]node\s*=\s*(\d+)\s*$")
_RANGE = re.compile(r"^(\d+)(?:\s*-\s*(\d+))?$")
#: Largest rank a topology file may name (a typo like ``0-1000000000`` must not allocate a billion rows).
MAX_RANK = 1 << 20


@dataclass(frozen=True)
class TopologySpec:
    """A user's statement of which ranks share a node (``--topology``).

    Attributes:
        ranks_per_node: Node of rank r = r // ranks_per_node (``ranks-per-node=N``); None with ``nodes``.
        nodes: Explicit nodes: ``nodes[i]`` = the ranks of node i (a topology file).
        names: Name of each node of ``nodes`` (``node<i>`` when the file gives none).
        source: What the user passed (for the report): ``ranks-per-node=8`` or the file's path.
    """

    ranks_per_node: int | None = None
    nodes: tuple[tuple[int, ...], ...] = ()
    names: tuple[str, ...] = ()
    source: str = ""

    @staticmethod
    def parse(arg: str, file_text: str | None = None) -> TopologySpec:
        """``--topology``'s value: ``ranks-per-node=N``, or a file's text (``file_text``, read by the CLI).

        Raises:
            ConfigError: naming ``--topology``, the line and the fix.
        """
        m = _RPN.match(arg)
        if m:
            n = int(m.group(1))
            if n < 1:
                raise ConfigError(f"--topology: ranks-per-node must be >= 1, got {arg!r}")
            return TopologySpec(ranks_per_node=n, source=f"ranks-per-node={n}")
        if file_text is None:
            raise ConfigError(
                f"--topology: {arg!r} is neither ranks-per-node=N nor a file; pass e.g. ranks-per-node=8 or a "
                "file with one node per line (docs/placement.md)"
            )
        return TopologySpec.from_text(file_text, arg)

    @staticmethod
    def from_text(text: str, source: str) -> TopologySpec:
        """A topology file: one node per line, ``[NAME:] RANKS`` with RANKS a comma list of ranks and
        ranges (``0-7``, ``0,2,4``); ``#`` starts a comment; blank lines are skipped.

        Raises:
            ConfigError: a malformed line, a rank on two nodes, or a rank beyond :data:`MAX_RANK`.
        """
        nodes: list[tuple[int, ...]] = []
        names: list[str] = []
        seen: dict[int, int] = {}
        for i, raw in enumerate(text.splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            name, sep, ranks_text = line.partition(":")
            if not sep:
                name, ranks_text = f"node{len(nodes)}", line
            ranks = _parse_ranks(ranks_text, source, i)
            for r in ranks:
                if r in seen:
                    raise ConfigError(
                        f"--topology {source}: line {i}: rank {r} is already on line {seen[r]}; give each rank one node"
                    )
                seen[r] = i
            nodes.append(tuple(ranks))
            names.append(name.strip() or f"node{len(nodes) - 1}")
        if not nodes:
            raise ConfigError(f"--topology {source}: no node lines; write one line per node, e.g. 'node0: 0-7'")
        return TopologySpec(nodes=tuple(nodes), names=tuple(names), source=source)


def _parse_ranks(text: str, source: str, line: int) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise ConfigError(
                f"--topology {source}: line {line}: {part.strip()!r} is not a rank or a range A-B; "
                "write e.g. 'node0: 0-7' or 'node1: 8,9,10'"
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo or hi > MAX_RANK:
            raise ConfigError(
                f"--topology {source}: line {line}: bad range {part.strip()!r} (need A <= B <= {MAX_RANK})"
            )
        out.extend(range(lo, hi + 1))
    return out


def rank_nodes(ranks: pl.DataFrame, spec: TopologySpec | None = None) -> pl.DataFrame:
    """Each rank's node.

    Args:
        ranks: Canonical ``ranks`` table (``rank, host``; ``node_rank, local_world_size`` when present).
        spec: The user's override (``AnalysisConfig.topology``).

    Returns:
        ``rank`` (Int32), ``node`` (name, Utf8), ``node_id`` (Int32, dense 0.. in first-rank order),
        ``source`` ('override' | 'launcher' | 'host' | 'assumed'), sorted by rank.

    Raises:
        ConfigError: a topology file that leaves ranks of the trace without a node.
    """
    r = ranks.select(pl.col("rank").cast(pl.Int32)).unique().sort("rank")
    if spec is not None and spec.ranks_per_node:
        node = (pl.col("rank") // spec.ranks_per_node).cast(pl.Int64)
        out = r.with_columns(pl.format("node{}", node).alias("node"), pl.lit("override").alias("source"))
    elif spec is not None and spec.nodes:
        m = pl.DataFrame(
            {
                "rank": [x for n in spec.nodes for x in n],
                "node": [spec.names[i] for i, n in enumerate(spec.nodes) for _ in n],
            },
            schema={"rank": pl.Int32, "node": pl.Utf8},
        )
        out = r.join(m, on="rank", how="left").with_columns(pl.lit("override").alias("source"))
        missing = out.filter(pl.col("node").is_null())["rank"].to_list()
        if missing:
            raise ConfigError(
                f"--topology {spec.source}: ranks {', '.join(map(str, missing[:8]))} of the trace are on no node line; "
                "add them to the file"
            )
    else:
        out = r.join(_recorded(ranks), on="rank", how="left").with_columns(
            pl.col("node").fill_null("<unknown>"), pl.col("source").fill_null("assumed")
        )
    ids = out.group_by("node").agg(pl.col("rank").min().alias("_first")).sort("_first")
    ids = ids.with_row_index("node_id").select(pl.col("node_id").cast(pl.Int32), "node")
    return out.join(ids, on="node", how="left").select("rank", "node", "node_id", "source").sort("rank")


def _recorded(ranks: pl.DataFrame) -> pl.DataFrame:
    """``rank, node, source`` from the launcher columns, else the host name (null where neither)."""
    cols = ranks.columns
    nr = pl.col("node_rank") if "node_rank" in cols else pl.lit(None, pl.Int32)
    lws = pl.col("local_world_size") if "local_world_size" in cols else pl.lit(None, pl.Int32)
    launcher = pl.coalesce(nr.cast(pl.Int64), pl.col("rank").cast(pl.Int64) // lws.cast(pl.Int64).clip(lower_bound=1))
    host = pl.col("host") if "host" in cols else pl.lit(None, pl.Utf8)
    return ranks.select(
        pl.col("rank").cast(pl.Int32),
        pl.when(launcher.is_not_null()).then(pl.format("node{}", launcher)).otherwise(host).alias("node"),
        pl.when(launcher.is_not_null())
        .then(pl.lit("launcher"))
        .when(host.is_not_null())
        .then(pl.lit("host"))
        .otherwise(pl.lit(None, pl.Utf8))
        .alias("source"),
    ).unique("rank", keep="first")


def link_class(src: pl.Expr, dst: pl.Expr, src_node: pl.Expr, dst_node: pl.Expr) -> pl.Expr:
    """The :data:`LINK_CLASSES` value of a pair (an Utf8 expression)."""
    return (
        pl.when(src == dst)
        .then(pl.lit("same_rank"))
        .when(src_node == dst_node)
        .then(pl.lit("same_node"))
        .otherwise(pl.lit("cross_node"))
    )


def with_link_class(pairs: pl.DataFrame, nodes: pl.DataFrame, src: str = "src", dst: str = "dst") -> pl.DataFrame:
    """``pairs`` with a ``link_class`` column (ranks without a node row share the ``<unknown>`` node)."""
    n = nodes.select("rank", "node_id")
    out = pairs.join(n.rename({"rank": src, "node_id": "_ns"}), on=src, how="left", maintain_order="left").join(
        n.rename({"rank": dst, "node_id": "_nd"}), on=dst, how="left", maintain_order="left"
    )
    cls = link_class(pl.col(src), pl.col(dst), pl.col("_ns").fill_null(-1), pl.col("_nd").fill_null(-1))
    return out.with_columns(cls.alias("link_class")).drop("_ns", "_nd")


def topology_note(nodes: pl.DataFrame) -> str | None:
    """A note for the report when some ranks' node was assumed (no host name, no launcher facts)."""
    assumed = nodes.filter(pl.col("source") == "assumed")["rank"].to_list()
    if not assumed:
        return None
    head = ", ".join(map(str, assumed[:8])) + (f" ... (+{len(assumed) - 8} more)" if len(assumed) > 8 else "")
    return (
        f"ranks {head} record no host name and no launcher node: assumed to share one node; pass "
        "--topology ranks-per-node=N or a topology file for cross-node figures"
    )
