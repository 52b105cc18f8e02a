"""Present layer: HTML report, JSON summary and annotated traces from an ``Analysis``."""

from __future__ import annotations
