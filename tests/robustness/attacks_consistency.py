"""Mutations whose input stays well-formed but contradicts itself (issue 40): sidecars against their
trace or each other, rank sets, a cache made stale behind its key, clocks and times, collectives
renamed on one rank.

Each ``fn(case_dir, rng) -> plan`` edits a copy of ``sample_traces/balanced`` (4 gloo ranks, Kineto
+ sidecars) in place and returns the case's plan (:mod:`campaign`): ``expect = "refuse"`` where the
input is inconsistent, so that an exit 0 must name what it left out.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path
from typing import Any

from attacks import edit_doc, load_doc, save_doc, sidecars, traces, x_events

REFUSE: dict[str, Any] = {"mode": "load", "expect": "refuse"}
ANY: dict[str, Any] = {"mode": "load", "expect": "any"}


def _records(p: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def _write(p: Path, recs: list[dict[str, Any]]) -> None:
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))


# --- sidecars that contradict their trace or each other -------------------------------------------


def sidecar_inconsistent(d: Path, rng: random.Random) -> dict[str, Any]:
    """One of the issue's sidecar contradictions, on one rank's sidecar (or the set of them)."""
    side = sidecars(d)
    p = rng.choice(side)
    recs = _records(p)
    meta = next(r for r in recs if r.get("type") == "meta")
    routing = [r for r in recs if r.get("type") == "routing"]
    a2a = [r for r in recs if r.get("type") == "a2a"]
    kind = rng.choice(
        ["counts_10x", "top_k", "no_experts", "replicated", "foreign_lines", "long_splits", "steps_shifted",
         "huge_layer", "sidecar_deleted", "many_experts"]
    )  # fmt: skip
    if kind == "counts_10x":  # expert counts summing to 10x tokens x top-k, no drops recorded
        for r in routing:
            r["expert_counts"] = [10 * c for c in r["expert_counts"]]
    elif kind == "top_k":
        meta["top_k"] = -2
        for r in routing:
            r["top_k"] = -2
    elif kind == "no_experts":
        meta["num_experts"] = 0
    elif kind == "replicated":  # one expert on three ranks, no replicas declared
        meta["placement"][0] = [0, 1, 2]
    elif kind == "foreign_lines":  # another rank's routing / all-to-all lines appended
        other = next(q for q in side if q != p)
        recs += [r for r in _records(other) if r.get("type") in ("routing", "a2a")]
    elif kind == "long_splits":  # send splits longer than the group
        for r in a2a:
            r["send_splits"] = r["send_splits"] + [1, 1]
    elif kind == "steps_shifted":  # every record's step matches no traced step
        for r in recs:
            if "step" in r:
                r["step"] = r["step"] + 1000
    elif kind == "huge_layer":
        rng.choice(routing)["layer"] = 10**9
    elif kind == "sidecar_deleted":  # one of four sidecars gone: routing figures from 3 ranks
        p.unlink()
        return dict(REFUSE, variant=kind)
    else:  # num_experts 10^6 / 10^7 (the counts keep 8 entries): an allocation past any cap unless refused
        meta["num_experts"] = rng.choice([1_000_000, 10_000_000])
    _write(p, recs)
    return dict(REFUSE, variant=kind)


# --- rank sets ----------------------------------------------------------------------------------


def rank_sets(d: Path, rng: random.Random) -> dict[str, Any]:
    """A job with a rank missing, or rank metadata that disagrees with the files found."""
    kind = rng.choice(["file_missing", "rank_ge_world", "world_string", "ep_rank_differs", "pg_config"])
    if kind == "file_missing":
        victim = rng.choice(traces(d))
        victim.unlink()
        return dict(REFUSE, variant=kind)
    p = rng.choice(traces(d))
    doc = load_doc(p)
    dist = doc.setdefault("distributedInfo", {})
    if kind == "rank_ge_world":
        dist["rank"] = int(dist.get("world_size") or 4) + rng.randrange(3)
    elif kind == "world_string":
        dist["world_size"] = str(dist.get("world_size") or 4)
    elif kind == "ep_rank_differs":
        doc.setdefault("ep_trace", {})["rank"] = (int(dist.get("rank") or 0) + 1) % 4
    else:
        for pg in dist.get("pg_config") or []:
            pg["ranks"] = [0, 1, 2, 3, 4, 5, 6, 7]
            pg["pg_size"] = 8
    save_doc(p, doc)
    return dict(REFUSE, variant=kind)


# --- the ingest cache ---------------------------------------------------------------------------


def cache_stale(d: Path, rng: random.Random) -> dict[str, Any]:
    """A trace or sidecar replaced after a cached analysis by one of the same size, its mtime kept
    (``cp -p`` / ``rsync --times`` of a regenerated file): the next cached analysis must be the new one.

    The worker analyses with a cache, swaps the file (``edits``: bytes from ``.edit/``, mtime restored),
    analyses again with the cache and once without; the two must agree."""
    edit = d / ".edit"
    edit.mkdir()
    if rng.random() < 0.5:
        p = rng.choice(sidecars(d))
        text = p.read_text()
        # same length: every routing count's last digit changes (the imbalance figures change)
        new = re.sub(
            r'("expert_counts":\[)([0-9,]+)', lambda m: m.group(1) + re.sub(r"\d(?=,|$)", "7", m.group(2)), text
        )
    else:
        gz = rng.choice(traces(d))
        p = gz.with_name(gz.name.removesuffix(".gz"))  # a plain .json: same-size edits are possible
        raw = gzip.decompress(gz.read_bytes()).decode()
        gz.unlink()
        p.write_text(raw)
        # same length: each kernel-free CPU op's duration digit 1 -> 9 (step and stage times change)
        new = re.sub(r'("dur": ?)1(\d)', r"\g<1>9\g<2>", raw)
    assert len(new.encode()) == len(p.read_bytes()) and new != p.read_text()
    (edit / p.name).write_text(new)
    return {"mode": "cache", "expect": "any", "edits": [{"file": p.name, "data_from": f".edit/{p.name}"}]}


# --- clocks and times ---------------------------------------------------------------------------


def clocks_times(d: Path, rng: random.Random) -> dict[str, Any]:
    """One rank's clock offset (50 ms, 1 h, random), ProfilerStep numbers reversed in time, every
    ``dur`` = 0, a 200,000-character name: an aligned clock or a one-line error, and sane shares."""
    kind = rng.choice(["offset", "offset", "steps_reversed", "dur_zero", "long_name"])
    p = rng.choice(traces(d))
    doc = load_doc(p)
    evs = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    if kind == "offset":
        shift = rng.choice([50_000.0, 3.6e9, rng.uniform(-5e5, 5e5)])  # µs
        for e in evs:
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] += shift
    elif kind == "steps_reversed":
        steps = sorted((e for e in evs if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
        nums = [e["name"] for e in steps][::-1]
        for e, n in zip(steps, nums, strict=True):
            e["name"] = n
    elif kind == "dur_zero":
        for e in x_events(doc):
            e["dur"] = 0
    else:
        rng.choice(x_events(doc))["name"] = "n" * 200_000
    save_doc(p, doc)
    return dict(ANY, variant=kind)


# --- collectives renamed on one rank -------------------------------------------------------------

_COMM = re.compile(r"^(c10d::|gloo:|nccl:|record_param_comms)")
_OTHER_NAMES = (
    "c10d::allreduce_", "c10d::allgather_", "c10d::broadcast_", "gloo:all_reduce", "gloo:broadcast",
    "gloo:all_gather", "c10d::alltoall_", "renamed_op",
)  # fmt: skip


def renamed_collectives(d: Path, rng: random.Random) -> dict[str, Any]:
    """A fraction of one rank's collective ops / gloo worker ranges renamed to another collective:
    ordinal matching pairs them with the wrong calls (issue 40: replayed steps of -109 ms)."""
    frac = rng.choice([0.05, 0.1, 0.2, 0.5, 1.0])

    def fn(doc: dict[str, Any], rng: random.Random) -> None:
        for e in doc["traceEvents"]:
            if (
                isinstance(e, dict)
                and isinstance(e.get("name"), str)
                and _COMM.match(e["name"])
                and rng.random() < frac
            ):
                e["name"] = rng.choice(_OTHER_NAMES)

    edit_doc(d, rng, fn)
    return dict(ANY, variant=f"{frac:g}")
