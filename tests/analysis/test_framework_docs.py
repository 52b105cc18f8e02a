"""docs/frameworks.md lists every kernel-family, preset and comm regex the code uses."""

from __future__ import annotations

from pathlib import Path

from ep_trace.analysis.kernel_families import KERNEL_FAMILIES
from ep_trace.analysis.stages import load_presets
from ep_trace.comm_classifier import COMM_KERNEL_PATTERNS
from ep_trace.parsers.serving_steps import FRAME_MARKERS, ITERATION_MARKERS

DOC = (Path(__file__).resolve().parents[2] / "docs" / "frameworks.md").read_text()


def _in_doc(rx: str) -> bool:
    return f"`{rx.replace('|', chr(92) + '|')}`" in DOC


def test_every_regex_is_in_the_framework_table():
    presets = load_presets()
    missing = [f.regex for f in KERNEL_FAMILIES if not _in_doc(f.regex)]
    missing += [rx for _, rx in COMM_KERNEL_PATTERNS if not _in_doc(rx)]
    missing += [p["pattern"] for p in presets if not _in_doc(p["pattern"])]
    missing += [rx for rx, _, _ in {**ITERATION_MARKERS, **FRAME_MARKERS}.values() if not _in_doc(rx)]
    assert missing == []
    assert all(f.source for f in KERNEL_FAMILIES)
