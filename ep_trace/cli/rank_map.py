"""``--rank-map``: an explicit file -> rank (or nsys pid -> rank) map, the best rank evidence there is.

Forms (repeatable, mixable)::

    --rank-map 0=node0/report_gpu-a_3000.sqlite     # rank R for the file at PATH (or of that name)
    --rank-map pid:3001=1                            # nsys file with several processes: pid -> rank
    --rank-map ranks.txt                             # a file of such lines ('#' comments)

A key matches a trace file by the path as given, its absolute path or its file name
(:func:`ep_trace.parsers.read_pool.read_one`).
"""

from __future__ import annotations

import re
from pathlib import Path

from ep_trace.errors import ConfigError

__all__ = ["parse_rank_map"]

_RANK_PATH = re.compile(r"^\s*(\d+)\s*=\s*(.+?)\s*$")
_PID_RANK = re.compile(r"^\s*pid:(\d+)\s*=\s*(\d+)\s*$")
_HINT = "use R=PATH (e.g. 0=node0/report_a.sqlite), pid:PID=R, or a file of such lines"


def _entry(spec: str, where: str, out: dict[object, int]) -> None:
    m = _PID_RANK.match(spec)
    if m:
        out[m.group(1)] = int(m.group(2))
        return
    m = _RANK_PATH.match(spec)
    if not m:
        raise ConfigError(f"--rank-map: {where}{spec!r} is not a rank mapping; {_HINT}")
    rank, path = int(m.group(1)), m.group(2)
    keys = {path, Path(path).name, str(Path(path).resolve())}
    for k in keys:
        if k in out and out[k] != rank:
            raise ConfigError(f"--rank-map: {where}{path} is given ranks {out[k]} and {rank}; give each file one rank")
        out[k] = rank


def parse_rank_map(values: list[str] | None) -> dict[object, int] | None:
    """The ``rank_map`` for :func:`ep_trace.load` from ``--rank-map`` values (None when none given).

    Raises:
        ConfigError: a value is neither ``R=PATH``, ``pid:PID=R`` nor a readable file of them; two
            ranks for one file; one rank for two files.
    """
    if not values:
        return None
    out: dict[object, int] = {}
    for v in values:
        p = Path(v)
        if "=" not in v and p.is_file():
            for i, line in enumerate(p.read_text().splitlines(), 1):
                line = line.split("#", 1)[0].strip()
                if line:
                    _entry(line, f"{p}:{i}: ", out)
        elif "=" not in v:
            raise ConfigError(f"--rank-map: {v}: no such file; {_HINT}")
        else:
            _entry(v, "", out)
    by_rank: dict[int, str] = {}
    for k, r in out.items():
        if isinstance(k, str) and not k.isdigit() and "/" not in k and not Path(k).is_absolute():
            if r in by_rank and by_rank[r] != k:
                raise ConfigError(f"--rank-map: rank {r} is given to {by_rank[r]} and {k}; give each rank one file")
            by_rank[r] = k
    return out
