"""The report's colours: one colour per EP stage and one per cause, the same in every figure.

Both families are chosen to stay apart for the common colour-vision deficiencies
(deuteranopia, protanopia, tritanopia): stages use the Okabe-Ito palette (Okabe & Ito 2008,
"Color Universal Design"), causes Paul Tol's "muted" scheme (Tol 2021, "Colour Schemes", SRON
technical note). The checks are numeric, not by eye: :func:`min_distance` simulates each
deficiency with the Machado, Oliveira & Fernandes (2009) matrices (severity 1) and measures
CIEDE2000 ΔE between every pair of a family (tests/reports/test_palette.py asserts the minimum).

Heatmaps use a sequential scale that starts at white for zero (:data:`SEQUENTIAL`) and a
diverging blue-white-red scale centred on the mean (:data:`DIVERGING`, Tol's "BuRd").
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = [
    "STAGE_COLORS",
    "CAUSE_COLORS",
    "OTHER",
    "SEQUENTIAL",
    "DIVERGING",
    "stage_color",
    "cause_color",
    "simulate_cvd",
    "delta_e2000",
    "delta_e2000_lab",
    "min_distance",
]

#: EP stage -> colour (Okabe-Ito; ``attn`` grey: not an EP stage).
STAGE_COLORS: dict[str, str] = {
    "route": "#CC79A7",  # reddish purple
    "permute": "#56B4E9",  # sky blue
    "dispatch": "#E69F00",  # orange
    "expert": "#009E73",  # bluish green
    "combine": "#D55E00",  # vermillion
    "unpermute": "#0072B2",  # blue
    "shared_expert": "#F0E442",  # yellow
    "attn": "#000000",  # black
}

#: Cause / time part -> colour (Tol muted + pale grey for idle). Used by the breakdown, the
#: timeline tracks, the overlap and wait figures and the critical path.
CAUSE_COLORS: dict[str, str] = {
    "compute": "#117733",  # green
    "copy": "#999933",  # olive
    "overlapped_comm": "#44AA99",  # teal
    "exposed_comm": "#882255",  # wine
    "barrier_wait": "#CC6677",  # rose
    "transfer": "#332288",  # indigo
    "host_stall": "#DDCC77",  # sand
    "launch_gap": "#88CCEE",  # cyan
    "queued": "#000000",  # black: the device waited on something other than its host (the only free hue ΔE ≥ 10)
    "unexplained": "#AA4499",  # purple
    "idle": "#DDDDDD",  # pale grey
}
#: Anything else (an unknown stage name, a generic comm track).
OTHER = "#999999"

#: Zero = white, then Tol's "YlOrBr"-free single-hue blue ramp (no false hot spots at zero).
SEQUENTIAL: list[list[float | str]] = [[0.0, "#FFFFFF"], [0.25, "#C6DBEF"], [0.6, "#4292C6"], [1.0, "#08306B"]]
#: Below the mean blue, at the mean white, above red (Tol "BuRd", the ends of his diverging scheme).
DIVERGING: list[list[float | str]] = [
    [0.0, "#2166AC"],
    [0.25, "#92C5DE"],
    [0.5, "#F7F7F7"],
    [0.75, "#F4A582"],
    [1.0, "#B2182B"],
]

_ALIASES = {"wait": "barrier_wait", "exposed": "exposed_comm", "overlapped": "overlapped_comm", "comm": "transfer"}


def stage_color(stage: str) -> str:
    """The colour of an EP stage (:data:`OTHER` for names outside the vocabulary)."""
    return STAGE_COLORS.get(stage, OTHER)


def cause_color(cause: str) -> str:
    """The colour of a cause / time part; accepts the column names (``exposed_comm_ns``) and track names."""
    key = cause.removesuffix("_ns").removesuffix("_comm_ns")
    key = _ALIASES.get(key, key)
    return CAUSE_COLORS.get(key, OTHER)


# --- colour science (numpy; used by the palette test and documented for reuse) -----------------

#: Machado, Oliveira & Fernandes (2009), "A Physiologically-based Model for Simulation of Color
#: Vision Deficiency", IEEE TVCG 15(6), table for severity 1.0 (linear RGB).
_MACHADO = {
    "protanopia": np.array(
        [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]]
    ),
    "deuteranopia": np.array(
        [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]]
    ),
    "tritanopia": np.array(
        [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]]
    ),
}


def _rgb(hex_color: str) -> np.ndarray:
    h = hex_color.lstrip("#")
    return np.array([int(h[i : i + 2], 16) / 255.0 for i in (0, 2, 4)])


def _to_linear(c: np.ndarray) -> np.ndarray:
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _to_srgb(c: np.ndarray) -> np.ndarray:
    c = np.clip(c, 0.0, 1.0)
    return np.where(c <= 0.0031308, c * 12.92, 1.055 * c ** (1 / 2.4) - 0.055)


def simulate_cvd(hex_color: str, kind: str) -> np.ndarray:
    """sRGB (0..1) of ``hex_color`` as seen with the deficiency ``kind`` ('normal', 'protanopia',
    'deuteranopia', 'tritanopia')."""
    c = _rgb(hex_color)
    if kind == "normal":
        return c
    return _to_srgb(_MACHADO[kind] @ _to_linear(c))


def _lab(srgb: np.ndarray) -> np.ndarray:
    lin = _to_linear(srgb)
    m = np.array(
        [[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750], [0.0193339, 0.1191920, 0.9503041]]
    )
    xyz = m @ lin / np.array([0.95047, 1.0, 1.08883])  # D65 white
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def delta_e2000(a: np.ndarray, b: np.ndarray) -> float:
    """CIEDE2000 colour difference of two sRGB colours (0..1); ~2.3 is a just-noticeable difference."""
    return delta_e2000_lab(_lab(a), _lab(b))


def delta_e2000_lab(lab1: np.ndarray, lab2: np.ndarray) -> float:
    """CIEDE2000 ΔE of two CIELAB colours (Sharma, Wu & Dalal 2005, the formula as published)."""
    l1, a1, b1 = (float(x) for x in lab1)
    l2, a2, b2 = (float(x) for x in lab2)
    c1, c2 = np.hypot(a1, b1), np.hypot(a2, b2)
    cm = (c1 + c2) / 2
    g = 0.5 * (1 - np.sqrt(cm**7 / (cm**7 + 25**7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = np.hypot(a1p, b1), np.hypot(a2p, b2)
    h1p, h2p = np.degrees(np.arctan2(b1, a1p)) % 360, np.degrees(np.arctan2(b2, a2p)) % 360
    dlp, dcp = l2 - l1, c2p - c1p
    dh = h2p - h1p
    if c1p * c2p == 0:
        dh = 0.0
    elif dh > 180:
        dh -= 360
    elif dh < -180:
        dh += 360
    dhp = 2 * np.sqrt(c1p * c2p) * np.sin(np.radians(dh / 2))
    lm, cpm = (l1 + l2) / 2, (c1p + c2p) / 2
    if c1p * c2p == 0:
        hm = h1p + h2p
    elif abs(h1p - h2p) <= 180:
        hm = (h1p + h2p) / 2
    else:
        hm = (h1p + h2p + 360) / 2 if h1p + h2p < 360 else (h1p + h2p - 360) / 2
    t = (
        1
        - 0.17 * np.cos(np.radians(hm - 30))
        + 0.24 * np.cos(np.radians(2 * hm))
        + 0.32 * np.cos(np.radians(3 * hm + 6))
        - 0.20 * np.cos(np.radians(4 * hm - 63))
    )
    sl = 1 + 0.015 * (lm - 50) ** 2 / np.sqrt(20 + (lm - 50) ** 2)
    sc, sh = 1 + 0.045 * cpm, 1 + 0.015 * cpm * t
    rt = -2 * np.sqrt(cpm**7 / (cpm**7 + 25**7)) * np.sin(np.radians(60 * np.exp(-(((hm - 275) / 25) ** 2))))
    return float(np.sqrt((dlp / sl) ** 2 + (dcp / sc) ** 2 + (dhp / sh) ** 2 + rt * (dcp / sc) * (dhp / sh)))


def min_distance(colors: Iterable[str], kind: str) -> tuple[float, str, str]:
    """The smallest CIEDE2000 ΔE between two colours of ``colors`` seen with ``kind``, and the pair."""
    cs = list(colors)
    best = (float("inf"), "", "")
    for i, x in enumerate(cs):
        for y in cs[i + 1 :]:
            d = delta_e2000(simulate_cvd(x, kind), simulate_cvd(y, kind))
            if d < best[0]:
                best = (d, x, y)
    return best
