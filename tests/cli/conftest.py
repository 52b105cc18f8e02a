"""CLI tests reuse the report test helpers (tests/reports/fake_analysis.py)."""

from __future__ import annotations

import sys
from pathlib import Path

_REPORTS = str(Path(__file__).resolve().parents[1] / "reports")
if _REPORTS not in sys.path:
    sys.path.insert(0, _REPORTS)
