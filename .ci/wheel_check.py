"""Check a built wheel against the source tree: every module and data file of ep_trace/, parsers/ and
reports/ is in it, under the ep_trace namespace, and nothing else is at its top level.

Usage:
  python .ci/wheel_check.py build DIST    the sdist and the wheel (`python -m build`) of a pristine copy of the
                                          source tree into DIST (needs the `build` package)
  python .ci/wheel_check.py DIST_OR_WHEEL [SOURCE_ROOT]
                                          the check (exit 1 with the missing files listed)

Why a pristine copy: setuptools adds every file listed in a stale ``ep_trace.egg-info/SOURCES.txt`` (an
editable install leaves one) to the wheel as package data, so a wheel built in a developer's checkout
can hold modules that a clean build leaves out (ep_trace/capture/*.py did, up to stop 35). Run by .ci/run
and by tests/test_packaging.py; the check reads the wheel as a zip and needs nothing installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

#: source folder -> where its files land in the wheel (pyproject.toml's package-dir)
FOLDERS = {"ep_trace": "ep_trace", "parsers": "ep_trace/parsers", "reports": "ep_trace/reports"}
#: what the wheel must carry besides modules (pyproject.toml's package-data)
DATA_SUFFIXES = (".py", ".pyi", ".typed", ".toml", ".js", ".css", ".html", ".LICENSE.txt")
SKIP_PARTS = {"__pycache__"}
#: what a build reads besides the three folders
BUILD_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE")
#: never copied into the pristine tree: build leftovers, compiled objects, caches
_IGNORE = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build", "dist", "*.pyc")


def build(dist: Path, root: Path) -> int:
    """``python -m build`` (sdist, then the wheel from the sdist) of a pristine copy of ``root``."""
    with tempfile.TemporaryDirectory(prefix="ep-trace-src-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for folder in FOLDERS:
            shutil.copytree(root / folder, src / folder, ignore=_IGNORE)
        for name in BUILD_FILES:
            shutil.copy2(root / name, src / name)
        r = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist.resolve()), str(src)])
    return r.returncode


def expected(root: Path) -> set[str]:
    """Wheel paths of every module and package-data file of the source tree."""
    out: set[str] = set()
    for folder, target in FOLDERS.items():
        base = root / folder
        for f in base.rglob("*"):
            if not f.is_file() or SKIP_PARTS.intersection(f.parts) or not f.name.endswith(DATA_SUFFIXES):
                continue
            rel = f.relative_to(base).as_posix()
            if folder == "ep_trace" and rel.split("/")[0] in ("parsers", "reports"):
                continue  # not a source folder of ours (the mapping's targets)
            out.add(f"{target}/{rel}")
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parents[1]
    if argv[0] == "build" and len(argv) == 2:
        return build(Path(argv[1]), root)
    arg = Path(argv[0])
    wheels = sorted(arg.glob("ep_trace-*.whl")) if arg.is_dir() else [arg]
    if len(wheels) != 1:
        print(f"wheel_check: expected one ep_trace wheel in {arg}, found {len(wheels)}", file=sys.stderr)
        return 1
    root = Path(argv[1]) if len(argv) > 1 else root
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    want = expected(root)
    missing = sorted(want - names)
    tops = sorted({n.split("/")[0] for n in names if not n.startswith("ep_trace-")})
    ext = [n for n in names if n.startswith("ep_trace/parsers/_kscan") and n.endswith(".so")]
    problems = []
    if missing:
        noun = "source file" if len(missing) == 1 else "source files"
        problems.append(f"{len(missing)} {noun} missing from the wheel: " + ", ".join(missing[:20]))
    if tops != ["ep_trace"]:
        problems.append(f"top-level entries besides ep_trace: {tops}")
    for p in problems:
        print(f"wheel_check: {wheels[0].name}: {p}", file=sys.stderr)
    if problems:
        return 1
    mods = sum(1 for n in want if n.endswith(".py"))
    print(
        f"wheel_check: {wheels[0].name}: all {mods} modules and {len(want) - mods} data files of the source tree "
        f"present, one top-level package (ep_trace), native scanner {'built' if ext else 'absent (optional)'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
