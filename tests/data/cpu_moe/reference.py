"""Reference stage busy times of the two CPU MoE traces of this folder, from the trace alone.

Standard library only; no ep-trace code. Written from the model code of ``generate.py``: which ops each
line of the MoE forward calls, so which stage each top-level op of the compute thread belongs to.
CPU busy of a stage = the summed duration of its top-level ops (they do not overlap on one thread), ns.

* ``switch_frames`` (``SwitchMoE`` frames): ops before the first ``FeedForward`` frame of the block
  (the ``SwitchGate`` frame's) -> route, inside a ``FeedForward`` frame -> expert, after the last one
  (stack, gate-weighted multiply, sum) -> unpermute.
* ``mixtral_ops`` (no router / expert module): per MoE call, from the gate ``aten::linear`` right before
  ``aten::softmax`` + ``aten::topk`` to the layer's last ``aten::index_add_``: the gate linear, softmax,
  topk and the renormalisation -> route; from ``aten::one_hot`` to an expert's first ``aten::linear``
  -> permute; ``linear``, ``silu``, ``linear`` -> expert; after an expert, up to its ``aten::index_add_``
  (the weight gather, multiply, index_add_) -> unpermute.

Layers are numbered per profiler step in call order. Run ``python tests/data/cpu_moe/reference.py``;
it writes ``<trace>/reference.json``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(folder: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """(top-level cpu ops, python frames, profiler steps) of the compute thread, ``s`` / ``e`` in ns."""
    ev = json.loads(gzip.decompress((folder / "rank0.pt.trace.json.gz").read_bytes()))["traceEvents"]
    x = [e for e in ev if e.get("ph") == "X"]
    for e in x:
        e["s"], e["e"] = round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)
    steps = sorted((e for e in x if e["name"].startswith("ProfilerStep#")), key=lambda e: e["s"])
    tid = steps[0]["tid"]
    ops = sorted((e for e in x if e.get("cat") == "cpu_op" and e["tid"] == tid), key=lambda e: (e["s"], -e["e"]))
    top, end = [], -1
    for o in ops:
        if o["s"] >= end or o["e"] > end:
            top.append(o)
            end = max(end, o["e"])
    frames = [e for e in x if e.get("cat") == "python_function" and e["tid"] == tid]
    return top, frames, steps


def _step(t: int, steps: list[dict]) -> int | None:
    for s in steps:
        if s["s"] <= t <= s["e"]:
            return int(s["name"].split("#")[1])
    return None


def _add(out: dict, step: int | None, layer: int, stage: str, ns: int) -> None:
    if step is not None:
        key = (step, layer, stage)
        out[key] = out.get(key, 0) + ns


def switch_frames() -> dict:
    top, frames, steps = _load(HERE / "switch_frames")
    blocks = sorted((f for f in frames if f["name"].startswith("nn.Module: SwitchMoE_")), key=lambda f: f["s"])
    experts = [f for f in frames if f["name"].startswith("nn.Module: FeedForward_")]
    out: dict = {}
    count: dict = {}
    for b in blocks:
        step = _step(b["s"], steps)
        layer = count.get(step, 0)
        count[step] = layer + 1
        mine = sorted((f for f in experts if b["s"] <= f["s"] and f["e"] <= b["e"]), key=lambda f: f["s"])
        for o in top:
            if not (b["s"] <= o["s"] and o["e"] <= b["e"]):
                continue
            if o["s"] < mine[0]["s"]:
                stage = "route"
            elif o["s"] >= mine[-1]["e"]:
                stage = "unpermute"
            else:
                stage = "expert"
            _add(out, step, layer, stage, o["e"] - o["s"])
    return out


def mixtral_ops(experts: int = 4) -> dict:
    """Per call: the gate ``linear`` .. the op before ``one_hot`` -> route; then per expert (``experts``
    = generate.py's EXPERTS, every expert runs): ``select`` of its ``w1`` .. its second ``linear``
    -> expert, the ops after it up to its ``index_add_`` -> unpermute, the ops before it (``mask[e]``,
    ``where``, the token gather) -> permute."""
    top, _, steps = _load(HERE / "mixtral_ops")
    names = [o["name"] for o in top]
    out: dict = {}
    count: dict = {}
    i = 0
    while i < len(top):
        # a call starts at the gate linear right before softmax + topk
        if names[i : i + 3] != ["aten::linear", "aten::softmax", "aten::topk"]:
            i += 1
            continue
        step = _step(top[i]["s"], steps)
        layer = count.get(step, 0)
        count[step] = layer + 1
        stage_of: dict[int, str] = {}
        hot = names.index("aten::one_hot", i)
        stage_of.update({j: "route" for j in range(i, hot)})
        j = hot
        for _ in range(experts):
            first = names.index("aten::linear", j)
            second = names.index("aten::linear", first + 1)
            done = names.index("aten::index_add_", second)
            stage_of.update({k: "permute" for k in range(j, first - 1)})
            stage_of.update({k: "expert" for k in range(first - 1, second + 1)})
            stage_of.update({k: "unpermute" for k in range(second + 1, done + 1)})
            j = done + 1
        for k, stage in stage_of.items():
            _add(out, step, layer, stage, top[k]["e"] - top[k]["s"])
        i = j
    return out


def _write(folder: str, rows: dict) -> None:
    doc = {
        "source": "tests/data/cpu_moe/reference.py (standard library only)",
        "unit": "ns",
        "stages": [
            {"step": s, "layer": layer, "stage": st, "busy_ns": ns} for (s, layer, st), ns in sorted(rows.items())
        ],
    }
    (HERE / folder / "reference.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    _write("switch_frames", switch_frames())
    _write("mixtral_ops", mixtral_ops())
