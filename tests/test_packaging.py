"""The package layout contract: parsers/ and reports/ import as ep_trace.parsers / ep_trace.reports,
and nothing needs torch to ingest or analyze."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HIDE_TORCH = "import sys; sys.modules['torch'] = None\n"


def test_namespace_mapping() -> None:
    import ep_trace.parsers
    import ep_trace.reports

    assert Path(ep_trace.parsers.__file__).parent.name == "parsers"
    assert Path(ep_trace.reports.__file__).parent.name == "reports"


def test_no_torch_needed_to_import_analysis_and_reports() -> None:
    code = HIDE_TORCH + (
        "import ep_trace, ep_trace.parsers, ep_trace.reports, ep_trace.analysis, ep_trace.schema, ep_trace.cli\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None and m == 'torch']\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.slow
def test_wheel_installs_namespace_packages(tmp_path: Path) -> None:
    """Build the sdist and wheel of a pristine copy of the tree (.ci/wheel_check.py build: a stale egg-info in
    the checkout would mask a package left out of the discovery), check that the wheel holds every module of
    the source tree, install it (no deps) and import ep_trace.parsers and ep_trace.capture from it."""
    dist = tmp_path / "dist"
    r = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "wheel_check.py"), "build", str(dist)], capture_output=True, text=True
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert "deprecat" not in (r.stdout + r.stderr).lower()  # e.g. setuptools' license-table warning
    r = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "wheel_check.py"), str(dist), str(ROOT)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "modules and" in r.stdout and "one top-level package (ep_trace)" in r.stdout
    wheel = next(dist.glob("ep_trace-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "ep_trace/capture/tracer.py" in names  # left out of every wheel up to stop 35
    meta = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info/METADATA")
    assert b"License-Expression: Apache-2.0" in meta
    target = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    code = (
        f"import sys; sys.path.insert(0, {str(target)!r}); import ep_trace.parsers, ep_trace.reports; "
        "from ep_trace.capture.tracer import Tracer; print(ep_trace.parsers.__file__)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(str(target))


def test_wheel_check_names_a_missing_module(tmp_path: Path) -> None:
    """The check fails, naming the file, on a wheel that lacks a module of the tree (the stop-35 bug)."""
    sys.path.insert(0, str(ROOT / ".ci"))
    try:
        import wheel_check
    finally:
        sys.path.pop(0)
    want = sorted(wheel_check.expected(ROOT))
    assert "ep_trace/capture/tracer.py" in want and "ep_trace/parsers/kineto.py" in want
    assert "ep_trace/reports/html.py" in want and not any(n.startswith(("parsers/", "reports/")) for n in want)
    whl = tmp_path / "ep_trace-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for n in want:
            if n != "ep_trace/capture/tracer.py":
                z.writestr(n, "")
    r = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "wheel_check.py"), str(whl), str(ROOT)], capture_output=True, text=True
    )
    assert r.returncode == 1
    assert r.stderr == (f"wheel_check: {whl.name}: 1 source file missing from the wheel: ep_trace/capture/tracer.py\n")
