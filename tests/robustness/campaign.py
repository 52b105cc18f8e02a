"""The robustness campaign's classes: the format mutations of :mod:`attacks` (issue 12) and the
classes of issue 40 (:mod:`attacks_consistency`, :mod:`attacks_bounds`, :mod:`attacks_cli`), each
made into a case directory with its plan (``<case>/.case.json``, a hidden name discovery skips).

A plan says how the worker (:mod:`fuzz_worker`) runs the case and what the classifier
(:mod:`outcomes`) expects:

* ``mode``: ``load`` (``ep_trace.load`` of ``input``, on_error ``skip`` for odd seeds), ``cli``
  (``ep-trace <argv>`` run in the case directory; outputs under ``out/``) or ``cache`` (a cached
  analysis, the ``edits`` applied with the files' size and mtime kept, a second cached analysis that
  must equal a fresh one);
* ``expect``: ``refuse`` (an inconsistent input: an exit 0 must name what it left out) or ``any``;
* ``input``: the trace set, relative to the case; ``summary`` / ``html``: outputs to check (cli).

Classes marked :data:`NEEDS_PARSER_CHECKS` rely on the parser-boundary checks of issue 40 items 1, 2
and 4 (sidecar / rank-set consistency, the cache key, bounded parsing); before those land they end
in ``wrong``, ``hang`` or ``blowup``.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attacks
import attacks_bounds
import attacks_cli
import attacks_consistency

PlanFn = Callable[[Path, random.Random], "dict[str, Any] | None"]

#: class -> (source set, layout, mutation): ``flat`` = the case directory is the trace set, ``in`` =
#: the trace set is ``<case>/in`` (command-line classes: outputs go to ``<case>/out``).
NEW_CLASSES: dict[str, tuple[str, str, PlanFn]] = {
    "sidecar_inconsistent": ("demo", "flat", attacks_consistency.sidecar_inconsistent),
    "rank_sets": ("demo", "flat", attacks_consistency.rank_sets),
    "cache_stale": ("demo", "flat", attacks_consistency.cache_stale),
    "clocks_times": ("demo", "flat", attacks_consistency.clocks_times),
    "renamed_collectives": ("demo", "flat", attacks_consistency.renamed_collectives),
    "nesting": ("demo", "flat", attacks_bounds.nesting),
    "small_event_bomb": ("demo", "flat", attacks_bounds.small_event_bomb),
    "trailing_data": ("demo", "flat", attacks_bounds.trailing_data),
    "sqlite_views": ("nsys_ext", "flat", attacks_bounds.sqlite_views),
    "outputs": ("demo", "in", attacks_cli.outputs),
    "long_names": ("demo", "in", attacks_cli.long_names),
    "control_chars": ("demo", "in", attacks_cli.control_chars),
    "usage_errors": ("demo", "in", attacks_cli.usage_errors),
}

#: Classes whose contract is kept by the parser checks of issue 40 items 1, 2 and 4 (another branch).
NEEDS_PARSER_CHECKS = frozenset(
    {"sidecar_inconsistent", "rank_sets", "cache_stale", "nesting", "small_event_bomb", "trailing_data", "sqlite_views"}
)

#: Every class of the campaign, in table order.
CLASSES: tuple[str, ...] = (*attacks.CLASSES, *NEW_CLASSES)

PLAN = ".case.json"


def _copy_source(source: str, dest: Path, workdir: Path) -> None:
    if source == "parquet":
        template = workdir / "_parquet_template"
        if not (template / "manifest.json").exists():
            from ep_trace.parsers.parquet_io import ingest

            ingest(attacks.SOURCES["demo"], template, use_cache=False)
        dest.mkdir(parents=True)
        shutil.copytree(template, dest / "tables")
    elif source == "cupti":
        dest.mkdir(parents=True)
        attacks.write_cupti(dest)
    else:
        shutil.copytree(attacks.SOURCES[source], dest, ignore=shutil.ignore_patterns("README.md"))


def make_case(cls: str, seed: int, workdir: Path) -> Path:
    """A fresh mutated copy of the class's source under ``workdir`` with its plan; returns the case
    directory (the worker reads the plan from it)."""
    case = workdir / f"{cls}-{seed}"
    if case.exists():
        shutil.rmtree(case)
    rng = random.Random(f"{cls}:{seed}")
    if cls in attacks.CLASSES:
        source, fn = attacks.CLASSES[cls]
        _copy_source(source, case, workdir)
        fn(case, rng)
        plan: dict[str, Any] = {"mode": "load", "expect": "any", "parquet": source == "parquet"}
    else:
        source, layout, new = NEW_CLASSES[cls]
        target = case / "in" if layout == "in" else case
        _copy_source(source, target, workdir)
        plan = new(target, rng) or {"mode": "load", "expect": "any"}
        if layout == "in":
            (case / "out").mkdir(exist_ok=True)
    plan.setdefault("input", ".")
    (case / PLAN).write_text(json.dumps(plan))
    return case


def read_plan(case: Path) -> dict[str, Any]:
    """The plan written by :func:`make_case` (``load`` of the case for a case without one)."""
    p = case / PLAN
    return json.loads(p.read_text()) if p.is_file() else {"mode": "load", "expect": "any", "input": "."}
