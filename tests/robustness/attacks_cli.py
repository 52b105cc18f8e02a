"""Command-line cases (issue 40): outputs aimed at inputs, output names the OS refuses, control
characters and markup in trace strings, bad options.

Each ``fn(input_dir, rng) -> plan`` edits ``input_dir`` (``<case>/in``, a copy of
``sample_traces/balanced``) and returns the ``ep-trace`` command line to run in ``<case>`` (outputs go
to ``<case>/out``) with what to check (:mod:`campaign`, :mod:`outcomes`).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from attacks import load_doc, save_doc, sidecars, traces, x_events


def _cli(argv: list[str], expect: str, **extra: Any) -> dict[str, Any]:
    return {"mode": "cli", "argv": argv, "expect": expect, **extra}


def outputs(d: Path, rng: random.Random) -> dict[str, Any]:
    """An output option aimed at an input file, its symbolic or hard link, a trace-named file inside the
    input directory, the input directory itself; or a harmless name there (a hidden file, summary.json)."""
    case = d.parent
    t = rng.choice(traces(d)).name
    s = rng.choice(sidecars(d)).name
    (case / "link").symlink_to(Path("in") / t)
    os.link(d / s, case / "hard")
    refused = [
        ["analyze", "in", "-o", f"in/{t}"],
        ["analyze", "in", "-o", "out/r.html", "--json", f"in/{t}"],
        ["analyze", "in", "-o", "out/r.html", "--record", f"in/{s}"],
        ["analyze", "in", "-o", "link"],
        ["analyze", "in", "-o", "hard"],
        ["analyze", "in", "-o", "out/r.html", "--json", "in/summary_copy.json"],
        ["analyze", "in", "-o", "out/r.html", "--json", "in/sub/r.json.gz"],
        ["analyze", "in", "-o", "out/r.html", "--record", "in/rank9.ep.jsonl"],
        ["analyze", f"in/{t}", "-o", "out/r.html", "--json", "in/rank9.ep.jsonl"],
        ["ingest", "in", "-o", "in"],
        ["annotate", "in", "-o", "in"],
        ["annotate", "in", "-o", "in/annotated"],
        ["compare", "in", "in", "-o", f"in/{t}"],
        ["compare", "in", "in", "--json", "in/diff.json"],
        ["sweep", "in", "in", "-o", "out/s.html", "--json", f"in/{s}"],
    ]
    harmless = [
        ["analyze", "in", "-q", "-o", "in/.report.html", "--json", "in/summary.json"],
        ["ingest", "in", "-q", "-o", "in/tables"],
    ]
    if rng.random() < 0.85:
        return _cli(rng.choice(refused), "refuse", input="in")
    return _cli(rng.choice(harmless), "any", input="in")


def long_names(d: Path, rng: random.Random) -> dict[str, Any]:
    """Output names at and past the file system's limits (255 bytes a name, 4,096 a path), with
    multi-byte characters, or with control characters."""
    n = rng.choice([200, 250, 255, 256, 1_000, 5_000])
    stem = rng.choice(["a" * n, "é" * (n // 2), "a" * (n // 2) + "\x1b[2J\u2028" + "b" * (n // 2)])
    where = rng.choice(["file", "dir", "deep"])
    name = {
        "file": f"out/{stem}.html",
        "dir": f"out/{stem}/r.html",
        "deep": "out/" + "/".join(["d" * 200] * 25) + "/r.html",
    }[where]
    argv = rng.choice(
        [
            ["analyze", "in", "-q", "-o", name],
            ["analyze", "in", "-q", "-o", "out/r.html", "--json", name.replace(".html", ".json")],
            ["analyze", "in", "-q", "-o", "out/r.html", "--record", name.replace(".html", ".yaml")],
            ["ingest", "in", "-q", "-o", name.removesuffix("/r.html").removesuffix(".html")],
            ["annotate", "in", "-o", name.removesuffix("/r.html").removesuffix(".html")],
        ]
    )
    return _cli(argv, "any", input="in", variant=f"{where} {n}")


EVIL = [
    "\x1b]0;pwned\x07",  # OSC: retitles the terminal window
    "\x1b[2J\x1b[H",  # clear the screen
    "\x9d0;pwned\x9c",  # 8-bit OSC ... ST
    "\x9b31m",  # 8-bit CSI
    "\u2028\u2029\x85",  # line / paragraph separators, NEL
    "</script><script>alert(1)</script>",
    "<!--<script>",
    "[/][bold red]x[/bold red]",  # rich markup
    "\r\n\x00\x7f",
]


def control_chars(d: Path, rng: random.Random) -> dict[str, Any]:
    """Control characters, markup and ``</script>`` in a host name, kernel / op names, a sidecar's host
    or a file name: nothing of it may reach the terminal raw or break out of the report's JSON."""
    evil = "".join(rng.sample(EVIL, k=rng.randint(1, 4)))
    where = rng.choice(["host", "names", "sidecar_host", "file_name"])
    if where in ("host", "names"):
        for p in traces(d):
            doc = load_doc(p)
            if where == "host":
                doc["host_name"] = f"vm{evil}"
            else:
                for e in rng.sample(x_events(doc), k=20):
                    e["name"] = f"{e.get('name')}{evil}"
            save_doc(p, doc)
    elif where == "sidecar_host":
        for p in sidecars(d):
            p.write_text(p.read_text().replace('"host":"vm"', '"host":' + json.dumps(f"vm{evil}")))
    else:
        p = rng.choice(traces(d))
        safe = evil.replace("/", "_").replace("\x00", "")
        p.rename(p.with_name(p.name.replace(".pt.trace", f"{safe}.pt.trace")))
    argv = ["analyze", "in", "-o", "out/r.html", "--json", "out/s.json"]
    return _cli(argv, "any", input="in", summary="out/s.json", html="out/r.html", variant=where)


USAGE = [
    ["analyze", "in", "--jobs", "abc"],
    ["analyze", "in", "--jobs", "0"],
    ["analyze", "in", "--jobs", "-3"],
    ["analyze", "in", "--steps", "x:y"],
    ["analyze", "in", "--steps", "5:2"],
    ["analyze", "in", "--steps"],
    ["analyze", "in", "--format", "perfetto"],
    ["analyze", "in", "--engine", "spark"],
    ["analyze", "in", "--rank-map", "garbage"],
    ["analyze", "in", "--rank-map", "x=in/rank0.pt.trace.json.gz"],
    ["analyze", "in", "--stages", "missing.toml"],
    ["analyze", "in", "--keep-going", "true"],
    ["analyze", "in", "--bogus"],
    ["analyze"],
    ["ingest", "in"],
    ["compare", "in"],
    ["sweep", "in"],
    ["sweep", "in", "in", "--label", "nonsense"],
    ["demo", "--ranks", "two"],
    ["no-such-command"],
    ["analyze", "in", "--jobs", "1\u20282"],
    ["analyze", "in", "--steps", "\x1b[2J"],
]


def usage_errors(d: Path, rng: random.Random) -> dict[str, Any]:
    """A bad option value, an unknown option or command, a missing argument: one line, exit 2."""
    argv = list(rng.choice(USAGE))
    return _cli(argv, "refuse", input="in", variant=" ".join(argv[1:3]))
