"""Frameworks' own routing dumps -> the canonical ``routing_counts`` (and ``placement``) tables.

For traces without ep-trace hooks (``ep-trace analyze DIR --routing DUMP``), the exact per-(source
rank, expert) counts come from what the framework itself records. Each format as its source writes it:

* **Megatron-Core router trace** (``--moe-routing-trace-path``; megatron/core/transformer/moe/
  router_trace.py, ``RouterTracer._flush_records_to_disk``): ``router_trace_rank{R}.jsonl``, one JSON
  object per (step, block, layer): ``{"step", "stage": "pre_dispatch", "block": "decoder" | "mtp",
  "layer", "rank", "num_tokens", "topk", "top_indices": [[expert, ...] per token]}`` (``mtp_idx`` on MTP
  records). The counts are the bincount of ``top_indices`` (exact, the source rank's own tokens);
  ``tokens`` / ``top_k`` come along for the conservation check. Records of one (step, layer) after the
  first (micro-batches of a training step) become micro-batches 1, 2, ...; MTP records are left out
  (their layer numbers are not the decoder's) and counted in a warning. Megatron-Core places experts
  contiguously, so no placement is read.
* **SGLang expert distribution recorder**, modes ``per_pass`` / ``per_token`` (python/sglang/srt/eplb/
  expert_distribution.py, ``_DetailAccumulator.dump``): ``expert_distribution_recorder_{time}_{rank}.pt``,
  a ``torch.save`` of ``{"records": [{"forward_pass_id", "rank", "gatherer_key", "global_physical_count":
  [layers, physical experts], ...}], "last_physical_to_logical_map": [layers, physical experts]}``. With
  the default gatherer (``_SelectExpertsSinglePassGatherer.on_select_experts``) a rank counts the
  physical experts its own tokens selected: source counts, mapped to logical experts through the map;
  step = ``forward_pass_id``. The placement: physical slot p sits on EP rank ``p // (P / W)``
  (``_compute_gpu_id_of_physical_expert``), W = the ranks the dumps name. The ``stat`` mode's
  ``expert_distribution_recorder_{time}.pt`` (``_StatAccumulator.dump``: ``logical_count`` all-reduced
  over ranks) has no source rank and is refused with the mode to use instead; so are DeepEP's gatherers,
  which count the receiving side (the record does not say which gatherer ran: record with the default
  ``--moe-a2a-backend none`` path or ``per_token``).
* **vLLM EPLB state** (vllm/distributed/eplb/eplb_state.py, ``EplbModelState``): vLLM writes no file;
  its per-rank ``expert_load_window`` (``[window, layers, physical experts]``, the physical experts this
  rank's tokens selected in each of the last ``window`` steps, filled in ``FusedMoE.select_experts``)
  and ``physical_to_logical_map`` (``[layers, physical experts]``) are read from a ``torch.save`` of a
  dict holding them under those names plus ``rank`` (docs/placement.md gives the two lines). Steps are
  the window's slots in time order when ``expert_load_window_step`` is saved too. With vLLM's naive /
  all-gather backends every rank counts every rank's tokens (eplb_state.py: "multiplied by dp_size"),
  so the counts are per source only with DeepEP / pplx style all-to-alls.

:func:`read_routing_dump` reads one file; :func:`with_routing_dumps` replaces the routing tables of a
trace set by those of the dumps (the sidecar's, when a rank has both, win: they are exact by design).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl

from ep_trace import schema
from ep_trace.errors import TraceFormatError
from ep_trace.parsers.torch_pickle import load_torch_file

__all__ = ["RoutingDump", "read_routing_dump", "with_routing_dumps", "dump_files"]

_MEGATRON = re.compile(r"router_trace_rank(\d+)\.jsonl$")
_SGLANG = re.compile(r"expert_distribution_recorder_[0-9.]+(?:_(\d+))?\.pt$")
_RANK = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class RoutingDump:
    """The canonical routing rows of one dump file.

    Attributes:
        routing_counts: Canonical ``routing_counts`` rows.
        placement: Canonical ``placement`` rows (layer-independent) or empty.
        issues: Warnings (records left out).
    """

    routing_counts: pl.DataFrame
    placement: pl.DataFrame
    issues: tuple[schema.LoadIssue, ...] = ()


def _counts_frame(rows: dict[str, list[Any]]) -> pl.DataFrame:
    df = pl.DataFrame(
        rows,
        schema={
            "rank": pl.Int32,
            "step": pl.Int64,
            "layer": pl.Int32,
            "microbatch": pl.Int32,
            "count": pl.List(pl.Int64),
            "tokens": pl.Int64,
            "top_k": pl.Int32,
        },
    )
    df = df.with_columns(pl.int_ranges(pl.col("count").list.len()).alias("expert")).explode("count", "expert")
    return schema.conform("routing_counts", df.filter(pl.col("count") > 0))


def _megatron(path: Path) -> RoutingDump:
    rows: dict[str, list[Any]] = {k: [] for k in ("rank", "step", "layer", "microbatch", "count", "tokens", "top_k")}
    seen: dict[tuple[int, int, int], int] = {}
    mtp = 0
    idx: list[np.ndarray] = []
    for i, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
            if rec.get("block", "decoder") != "decoder":
                mtp += 1
                continue
            top = np.asarray(rec["top_indices"], dtype=np.int64).reshape(-1, int(rec["topk"]))
            key = (int(rec["rank"]), int(rec["step"]), int(rec["layer"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise TraceFormatError(
                path,
                f"not a Megatron-Core router trace record ({exc})",
                "pass the router_trace_rank{R}.jsonl file as written",
                record=f"line {i}",
            ) from None
        if top.shape[0] != int(rec.get("num_tokens", top.shape[0])) or (top < 0).any():
            raise TraceFormatError(
                path,
                f"top_indices has {top.shape[0]} tokens for num_tokens {rec.get('num_tokens')} (or a negative id)",
                "re-capture the trace",
                record=f"line {i}",
            )
        seen[key] = seen.get(key, -1) + 1
        for k, v in zip(("rank", "step", "layer", "microbatch"), (*key, seen[key]), strict=True):
            rows[k].append(v)
        rows["tokens"].append(top.shape[0])
        rows["top_k"].append(top.shape[1])
        idx.append(top.reshape(-1))
    n_exp = max((int(a.max()) + 1 for a in idx if a.size), default=0)
    rows["count"] = [np.bincount(a, minlength=n_exp).tolist() for a in idx]
    issues = (
        (
            schema.LoadIssue(
                str(path), None, "warning", f"{mtp} MTP router records left out (their layers are not the decoder's)"
            ),
        )
        if mtp
        else ()
    )
    return RoutingDump(_counts_frame(rows), schema.empty("placement"), issues)


def _placement_rows(p2l: np.ndarray, ep_size: int) -> pl.DataFrame:
    """Layer-independent placement rows from a ``[layers, physical]`` map when every layer has the same
    map (the rows of layer 0 otherwise are not a placement of every layer: none is read)."""
    if p2l.ndim != 2 or p2l.shape[1] % max(ep_size, 1) or not (p2l == p2l[:1]).all():
        return schema.empty("placement")
    per = p2l.shape[1] // ep_size
    row = p2l[0]
    df = pl.DataFrame(
        {"expert": row.astype(np.int32), "rank": (np.arange(row.size) // per).astype(np.int32)},
        schema={"expert": pl.Int32, "rank": pl.Int32},
    ).unique(maintain_order=True)
    return schema.conform("placement", df)


def _logical(phys: np.ndarray, p2l: np.ndarray, path: Path) -> np.ndarray:
    """``[layers, logical]`` counts from ``[layers, physical]`` counts and the map."""
    if phys.shape != p2l.shape:
        raise TraceFormatError(
            path,
            f"counts of shape {list(phys.shape)} but a map of shape {list(p2l.shape)}",
            "save the counts with their map",
        )
    n_log = int(p2l.max()) + 1
    out = np.zeros((phys.shape[0], n_log), dtype=np.int64)
    for layer in range(phys.shape[0]):
        np.add.at(out[layer], p2l[layer].astype(np.int64), phys[layer].astype(np.int64))
    return out


def _rows_from_layers(rank: int, step: int, logical: np.ndarray, rows: dict[str, list[Any]]) -> None:
    for layer in range(logical.shape[0]):
        for k, v in zip(("rank", "step", "layer", "microbatch"), (rank, step, layer, 0), strict=True):
            rows[k].append(v)
        rows["count"].append(logical[layer].tolist())
        rows["tokens"].append(None)
        rows["top_k"].append(None)


def _sglang(path: Path, obj: Any) -> tuple[pl.DataFrame, np.ndarray]:
    if not isinstance(obj, dict) or "records" not in obj or "last_physical_to_logical_map" not in obj:
        raise TraceFormatError(
            path,
            "an SGLang stat-mode dump (logical_count summed over ranks: no source rank)"
            if isinstance(obj, dict) and "logical_count" in obj
            else "not an SGLang expert distribution dump",
            "record with --expert-distribution-recorder-mode per_pass (one file per rank, source counts)",
        )
    p2l = np.asarray(obj["last_physical_to_logical_map"])
    rows: dict[str, list[Any]] = {k: [] for k in ("rank", "step", "layer", "microbatch", "count", "tokens", "top_k")}
    for rec in obj["records"]:
        phys = np.asarray(rec["global_physical_count"])
        _rows_from_layers(int(rec["rank"]), int(rec["forward_pass_id"]), _logical(phys, p2l, path), rows)
    return _counts_frame(rows), p2l


def _vllm(path: Path, obj: Any) -> tuple[pl.DataFrame, np.ndarray]:
    if not isinstance(obj, dict) or "expert_load_window" not in obj or "physical_to_logical_map" not in obj:
        raise TraceFormatError(
            path,
            "not a vLLM EPLB state dump",
            "torch.save a dict with expert_load_window, physical_to_logical_map and rank (docs/placement.md)",
        )
    win = np.asarray(obj["expert_load_window"])
    p2l = np.asarray(obj["physical_to_logical_map"])
    m = _RANK.search(path.name)
    rank = int(obj["rank"]) if "rank" in obj else int(m.group(1)) if m else None
    if rank is None or win.ndim != 3:
        raise TraceFormatError(
            path,
            "no rank (key 'rank' or rank<N> in the file name) or expert_load_window is not [window, layers, experts]",
            "save rank with the tensors",
        )
    start = int(obj.get("expert_load_window_step", 0))
    order = [(start + i) % win.shape[0] for i in range(win.shape[0])]  # the ring's oldest slot first
    rows: dict[str, list[Any]] = {k: [] for k in ("rank", "step", "layer", "microbatch", "count", "tokens", "top_k")}
    for step, slot in enumerate(order):
        _rows_from_layers(rank, step, _logical(win[slot], p2l, path), rows)
    return _counts_frame(rows), p2l


def read_routing_dump(path: str | Path, ep_size: int | None = None) -> RoutingDump:
    """One dump file (module doc), recognised by name (Megatron) or content (``.pt``: SGLang / vLLM).

    Args:
        path: The file.
        ep_size: EP ranks, for the placement of a physical-to-logical map (default: no placement).

    Raises:
        TraceFormatError: an unknown or malformed file, naming it and the fix.
    """
    p = Path(path)
    if _MEGATRON.search(p.name) or p.suffix == ".jsonl":
        return _megatron(p)
    obj = load_torch_file(p)
    if isinstance(obj, dict) and "expert_load_window" in obj:
        counts, p2l = _vllm(p, obj)
    else:
        counts, p2l = _sglang(p, obj)
    place = _placement_rows(p2l, ep_size) if ep_size else schema.empty("placement")
    return RoutingDump(counts, place)


def dump_files(paths: list[Path]) -> list[Path]:
    """The dump files of ``paths`` (directories: their Megatron / SGLang / vLLM files), sorted."""
    out: list[Path] = []
    for p in paths:
        if not p.exists():
            raise TraceFormatError(
                p, "no such file or directory", "pass a routing dump file or a directory of them (--routing)"
            )
        if p.is_dir():
            out += sorted(
                f for f in p.iterdir() if _MEGATRON.search(f.name) or _SGLANG.search(f.name) or f.suffix == ".pt"
            )
        else:
            out.append(p)
    return out


def with_routing_dumps(tables: schema.TraceTables, paths: list[Path]) -> schema.TraceTables:
    """``tables`` with the routing counts (and placement) of the dumps at ``paths`` for every rank the
    sidecars gave none.

    Raises:
        TraceFormatError: no dump file at ``paths`` or an unreadable one.
    """
    files = dump_files(paths)
    if not files:
        raise TraceFormatError(
            ", ".join(map(str, paths)),
            "no routing dump found",
            "pass router_trace_rank*.jsonl, expert_distribution_recorder_*.pt or a vLLM EPLB state .pt",
        )
    first = [read_routing_dump(f) for f in files]
    ranks = sorted({int(r) for d in first for r in d.routing_counts["rank"].unique()})
    dumps = [read_routing_dump(f, len(ranks)) for f in files]
    have = set(tables.routing_counts["rank"].unique().to_list())
    rc = pl.concat([d.routing_counts for d in dumps]).filter(~pl.col("rank").is_in(sorted(have)))
    place = (
        tables.placement
        if tables.placement.height
        else pl.concat([d.placement for d in dumps]).unique(maintain_order=True)
    )
    issues = tuple(i for d in dumps for i in d.issues)
    src = ", ".join(map(str, files))
    return replace(
        tables,
        routing_counts=schema.validate("routing_counts", pl.concat([tables.routing_counts, rc]), src),
        placement=schema.validate("placement", place, src),
        load_report=tables.load_report + issues,
    )
