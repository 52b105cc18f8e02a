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
    """Build a wheel, install it into a fresh venv (no deps), import ep_trace.parsers from it."""
    dist = tmp_path / "dist"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = next(dist.glob("ep_trace-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("ep_trace-")}
    assert tops == {"ep_trace"}, tops  # no generic top-level parsers / reports package
    assert "ep_trace/parsers/__init__.py" in names
    assert "ep_trace/reports/__init__.py" in names
    assert "ep_trace/py.typed" in names
    target = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    code = f"import sys; sys.path.insert(0, {str(target)!r}); import ep_trace.parsers, ep_trace.reports; print(ep_trace.parsers.__file__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(str(target))
