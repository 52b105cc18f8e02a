"""The layers of docs/architecture.md, checked on the installed package's import graph.

Every module of ``ep_trace`` (with ``ep_trace.parsers`` and ``ep_trace.reports``, which live in
``parsers/`` and ``reports/``) is parsed, and each import it makes at run time -- at module level
or inside a function, but not under ``if TYPE_CHECKING:`` -- is an edge. The graph must have no
cycle, and no layer may import a later one: capture and ingest never import analysis or reports,
analysis never imports the parsers, the reports or torch, the shared contract imports only itself.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import ep_trace

_ROOTS = ("ep_trace", "ep_trace.parsers", "ep_trace.reports")
#: The shared contract at ep_trace's root (docs/architecture.md).
_CONTRACT = {
    "ep_trace.schema",
    "ep_trace.errors",
    "ep_trace.dtypes",
    "ep_trace.stage_names",
    "ep_trace.comm_classifier",
    "ep_trace.knowledge",
    "ep_trace.trace_files",
    "ep_trace.expert_placement",
}


def _layer(mod: str) -> str:
    if mod == "ep_trace" or mod == "ep_trace.__main__":
        return "api"
    if mod in _CONTRACT:
        return "contract"
    for prefix, layer in (
        ("ep_trace.capture", "capture"),
        ("ep_trace.workloads", "workload"),
        ("ep_trace.parsers", "ingest"),
        ("ep_trace.analysis", "analysis"),
        ("ep_trace.reports", "present"),
        ("ep_trace.cli", "cli"),
    ):
        if mod == prefix or mod.startswith(prefix + "."):
            return layer
    return "unknown"


#: layer -> layers it must never import (``torch`` = any torch module).
_FORBIDDEN = {
    "contract": {"capture", "workload", "ingest", "analysis", "present", "cli", "api", "torch"},
    "capture": {"workload", "ingest", "analysis", "present", "cli"},
    "workload": {"ingest", "analysis", "present", "cli"},
    "ingest": {"capture", "workload", "analysis", "present", "cli", "torch"},
    "analysis": {"capture", "workload", "ingest", "present", "cli", "torch"},
    "present": {"capture", "workload", "ingest", "cli", "torch"},
    "cli": {"torch"},
    "api": {"torch"},
}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for root in _ROOTS:
        pkg = importlib.import_module(root)
        out[root] = Path(pkg.__file__ or "")
        for info in pkgutil.walk_packages(pkg.__path__, root + "."):
            if info.name.count(".") > 1 and any(
                info.name.startswith(r + ".") for r in _ROOTS if r != root and r.startswith(root)
            ):
                continue
            spec = importlib.util.find_spec(info.name)
            if spec is not None and spec.origin and spec.origin.endswith(".py"):
                out[info.name] = Path(spec.origin)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(mod: str, path: Path, known: frozenset[str] = frozenset()) -> set[str]:
    """Modules ``mod`` imports at run time (absolute names; relative imports resolved).

    ``from pkg import name`` is an import of the module ``pkg.name`` when that is one of ``known``
    (the package itself is then only its implicit parent), else of ``pkg``.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for n in node.orelse:
                visit(n)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in known or not known else base)
                if not known:
                    found.add(base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    edges: dict[str, set[str]] = {}
    for m, p in mods.items():
        targets = set()
        for imp in _imports(m, p, frozenset(mods)):
            if imp.split(".")[0] == "torch":
                targets.add("torch")
            elif imp in mods and imp != m:
                targets.add(imp)
        edges[m] = targets
    return edges


def test_every_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    assert len(graph) > 60
    assert [m for m in graph if _layer(m) == "unknown"] == []


def test_no_layer_imports_a_later_one(graph: dict[str, set[str]]) -> None:
    bad = sorted(
        f"{m} ({_layer(m)}) imports {t} ({'torch' if t == 'torch' else _layer(t)})"
        for m, ts in graph.items()
        for t in ts
        if ("torch" if t == "torch" else _layer(t)) in _FORBIDDEN[_layer(m)]
    )
    assert bad == []


def test_the_contract_root_holds_only_the_contract() -> None:
    root = Path(ep_trace.__file__).parent
    modules = {p.stem for p in root.glob("*.py")} - {"__init__", "__main__"}
    assert {f"ep_trace.{m}" for m in modules} == _CONTRACT


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    # Tarjan's strongly connected components; any component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w == "torch":
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    assert cycles == []


def test_the_checker_sees_a_cycle_and_a_layer_breach(tmp_path: Path) -> None:
    # the checker itself: a function-level import counts, a TYPE_CHECKING one does not
    a = tmp_path / "a.py"
    a.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ep_trace.reports.html\n"
        "def f():\n    from ep_trace.parsers import dispatch\n"
    )
    assert _imports("ep_trace.analysis.a", a) >= {"ep_trace.parsers.dispatch", "ep_trace.parsers"}
    assert "ep_trace.reports.html" not in _imports("ep_trace.analysis.a", a)


#: The public API (README): moving internals must never break these names.
PUBLIC_API = {
    "ep_trace": [
        "Analysis",
        "AnalysisConfig",
        "EpTraceError",
        "TraceTables",
        "Tracer",
        "__version__",
        "analyze",
        "load",
        "read_trace_dir",
        "record_a2a",
        "record_routing",
        "stage",
    ],
    "ep_trace.capture": ["Tracer", "record_a2a", "record_routing", "stage"],
    "ep_trace.analysis": ["Analysis", "AnalysisConfig", "Finding", "analyze"],
    "ep_trace.parsers": [
        "LoadIssue",
        "Sidecar",
        "TraceTables",
        "default_cache_dir",
        "detect_format",
        "discover",
        "ingest",
        "load_trace_dir",
        "merge_sidecar",
        "read_kineto",
        "read_parquet",
        "read_sidecar",
        "read_trace_dir",
        "read_trace_dirs",
        "write_parquet",
    ],
}


@pytest.mark.parametrize("module", sorted(PUBLIC_API))
def test_public_api_is_pinned(module: str) -> None:
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC_API[module])
    for name in mod.__all__:
        assert getattr(mod, name) is not None, f"{module}.{name}"


def test_readme_imports_work() -> None:
    from ep_trace import Tracer, record_a2a, record_routing, stage  # noqa: F401
    from ep_trace.analysis import analyze  # noqa: F401
    from ep_trace.parsers import read_trace_dir  # noqa: F401

    assert ep_trace.load.__module__ == "ep_trace"


def test_analysis_and_reports_never_read_the_events_frame_directly() -> None:
    # With the events left on disk (an ingest directory, the ingest cache) ``TraceTables.events`` is
    # empty and the rows come from ``scan_events()`` / ``table("events")``; a direct read would see no
    # events and answer wrong, silently. Only the per-rank pass (which checks for the scan) may.
    root = Path(ep_trace.__file__).parent
    allowed = {root / "analysis" / "rank_pass.py"}
    reports = Path(str(importlib.import_module("ep_trace.reports").__file__)).parent
    files = [*(root / "analysis").rglob("*.py"), *reports.rglob("*.py")]
    bad = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "events":
                owner = node.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if name == "tables" and f not in allowed:
                    bad.append(f"{f.name}:{node.lineno}")
    assert files and not bad, f"read tables.events directly (use scan_events() / table('events')): {bad}"
