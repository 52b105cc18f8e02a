"""Ground truth of a demo trace directory, computed from the sidecars alone (no torch).

Used to write the sample_traces READMEs and by tests that check analysis results against what the
workload actually did. This is deliberately independent of ``ep_trace.parsers`` so that it can act
as a cross-check of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

__all__ = ["LayerTruth", "read_sidecar", "layer_truth", "format_truth_table"]


@dataclass(frozen=True)
class LayerTruth:
    """Routing facts of one (step, layer), summed over all ranks.

    Attributes:
        step, layer: Keys.
        expert_counts: n_e, assignments routed to each global expert.
        rank_load: L_r, assignments processed by each rank: the column sums of ``count_matrix`` (the
            rows each rank received, replicas included; any placement, ``--alt-placement`` steps too).
        imbalance_expert: I_e = max_e n_e / mean_e n_e.
        imbalance_rank: I_r = max_r L_r / mean_r L_r.
        count_matrix: C[i][j] = token rows sent from rank i to rank j by the forward dispatch
            all-to-all(s) (chunks summed; backward transposes excluded).
    """

    step: int
    layer: int
    expert_counts: tuple[int, ...]
    rank_load: tuple[int, ...]
    imbalance_expert: float
    imbalance_rank: float
    count_matrix: tuple[tuple[int, ...], ...]


def read_sidecar(path: str | Path) -> list[dict]:
    """All records of one ``rank{r}.ep.jsonl`` (a cut-short last line is dropped)."""
    lines = Path(path).read_bytes().splitlines()
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            if i != len(lines) - 1:
                raise
    return out


def layer_truth(trace_dir: str | Path) -> list[LayerTruth]:
    """Per (step, layer) routing ground truth of a demo directory, sorted by (step, layer)."""
    files = sorted(Path(trace_dir).glob("rank*.ep.jsonl"), key=lambda p: int(p.name[4:].split(".")[0]))
    recs = {int(p.name[4:].split(".")[0]): read_sidecar(p) for p in files}
    meta = next(r for r in recs[min(recs)] if r["type"] == "meta")
    world = meta["world_size"]
    counts: dict[tuple[int, int], np.ndarray] = {}
    matrix: dict[tuple[int, int], np.ndarray] = {}
    for rank, rs in recs.items():
        for r in rs:
            key = (int(r.get("step") or 0), int(r.get("layer") or 0))
            if r["type"] == "routing" and r.get("microbatch", 0) == 0:
                counts[key] = counts.get(key, 0) + np.asarray(r["expert_counts"], dtype=np.int64)
            elif r["type"] == "a2a" and r["direction"] == "dispatch" and r.get("phase", "fwd") == "fwd":
                m = matrix.setdefault(key, np.zeros((world, world), dtype=np.int64))
                m[rank] += np.asarray(r["send_splits"], dtype=np.int64)
    out = []
    for key in sorted(counts):
        n = counts[key]
        c = matrix.get(key, np.zeros((world, world), dtype=np.int64))
        load = c.sum(0)
        out.append(
            LayerTruth(
                step=key[0],
                layer=key[1],
                expert_counts=tuple(int(v) for v in n),
                rank_load=tuple(int(v) for v in load),
                imbalance_expert=float(n.max() / n.mean()),
                imbalance_rank=float(load.max() / load.mean()),
                count_matrix=tuple(tuple(int(v) for v in row) for row in c),
            )
        )
    return out


def format_truth_table(truth: list[LayerTruth]) -> str:
    """A Markdown table: step, layer, I_e, I_r, n_e, L_r (used in sample_traces READMEs)."""
    rows = ["| step | layer | I_e | I_r | n_e (experts 0..E-1) | L_r (ranks 0..W-1) |", "|---|---|---|---|---|---|"]
    for t in truth:
        rows.append(
            f"| {t.step} | {t.layer} | {t.imbalance_expert:.4f} | {t.imbalance_rank:.4f} | "
            f"{' '.join(map(str, t.expert_counts))} | {' '.join(map(str, t.rank_load))} |"
        )
    return "\n".join(rows)
