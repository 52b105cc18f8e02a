"""Decode plotly figure data (plotly >= 6 encodes numpy arrays as base64 'bdata') for assertions."""

from __future__ import annotations

import base64

import numpy as np


def arr(x: object) -> np.ndarray:
    """A trace attribute from ``fig.to_dict()`` as a numpy array (typed-array dicts decoded)."""
    if isinstance(x, dict) and "bdata" in x:
        a = np.frombuffer(base64.b64decode(x["bdata"]), dtype=np.dtype(x["dtype"]))
        return (
            a.reshape(x["shape"])
            if "shape" in x and isinstance(x["shape"], (list, tuple))
            else (a.reshape([int(s) for s in str(x["shape"]).split(",")]) if "shape" in x else a)
        )
    return np.asarray(x)


def traces(fig) -> dict[str, dict]:  # noqa: ANN001
    """Traces of a figure by name."""
    return {t.get("name"): t for t in fig.to_dict()["data"]}
