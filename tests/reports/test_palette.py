"""The palette is one colour per stage / cause, and stays distinguishable for colour-vision deficiencies."""

from __future__ import annotations

import numpy as np
import pytest

from ep_trace.reports import palette
from ep_trace.stage_names import STAGES

KINDS = ("normal", "protanopia", "deuteranopia", "tritanopia")


@pytest.mark.parametrize(
    ("lab1", "lab2", "expected"),
    [  # Sharma, Wu & Dalal (2005) test data, pairs 1, 7 and 17
        ((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485), 2.0425),
        ((50.0, 0.0, 0.0), (50.0, -1.0, 2.0), 2.3669),
        ((50.0, 2.5, 0.0), (73.0, 25.0, -18.0), 27.1492),
    ],
)
def test_ciede2000_reference_pairs(lab1, lab2, expected):
    assert palette.delta_e2000_lab(np.array(lab1), np.array(lab2)) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", ["stage", "cause"])
def test_families_stay_apart_under_cvd(family, kind):
    colors = (palette.STAGE_COLORS if family == "stage" else palette.CAUSE_COLORS).values()
    d, a, b = palette.min_distance(colors, kind)
    # ΔE2000 >= 10: clearly different at a glance (2.3 is a just-noticeable difference)
    assert d >= 10.0, (family, kind, a, b, d)


def test_every_stage_and_cause_has_one_colour():
    assert set(STAGES) <= set(palette.STAGE_COLORS)
    assert len(set(palette.STAGE_COLORS.values())) == len(palette.STAGE_COLORS)
    assert len(set(palette.CAUSE_COLORS.values())) == len(palette.CAUSE_COLORS)
    assert (
        palette.cause_color("exposed_comm_ns") == palette.cause_color("exposed") == palette.CAUSE_COLORS["exposed_comm"]
    )
    assert palette.cause_color("wait") == palette.CAUSE_COLORS["barrier_wait"]
    assert palette.stage_color("no_such_stage") == palette.OTHER


def test_simulation_keeps_greys_grey():
    for kind in KINDS[1:]:
        g = palette.simulate_cvd("#808080", kind)
        assert np.ptp(g) < 0.01
