"""The sidecar's ``placement`` records (docs/sidecar.md): a layer re-placed from a step on.

The canonical ``placement`` table keeps them beside ``meta.placement`` (``first_step``), and the
analysis resolves the placement in force at each (step, layer) by the documented rule: the last record
of the layer with ``step`` <= s, else the meta's. Known answers, written by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from ep_trace import schema
from ep_trace.analysis.placement_in_force import in_force
from ep_trace.errors import TraceFormatError
from ep_trace.parsers import read_trace_dir

START = [[0], [0], [1], [1]]  # experts 0, 1 on rank 0; 2, 3 on rank 1
MOVED = [[0], [0, 1], [1], [0]]  # expert 1 replicated on rank 1, expert 3 moved to rank 0


def _write(d: Path, kt, records: list[dict]) -> None:
    kt.write_trace(d / "rank0.pt.trace.json", [kt.x("cpu_op", "a", 1, 1)], world_size=2)
    meta = {"type": "meta", "v": 1, "rank": 0, "world_size": 2, "num_experts": 4, "placement": START}
    (d / "rank0.ep.jsonl").write_text("\n".join(json.dumps(r) for r in [meta, *records]) + "\n")


def _record(step: int, layer: int, placement: list[list[int]]) -> dict:
    extra = sum(len(o) for o in placement) - len(placement)
    return {
        "type": "placement",
        "v": 1,
        "step": step,
        "layer": layer,
        "placement": placement,
        "redundant_experts": extra,
    }


def test_records_are_rows_with_their_layer_and_first_step(tmp_path, kt):
    _write(tmp_path, kt, [_record(2, 1, MOVED), _record(3, 1, START)])
    t = read_trace_dir(tmp_path).placement.sort("first_step", "layer", "expert", "rank", nulls_last=False)
    assert t.columns == ["layer", "expert", "rank", "first_step"]
    meta_rows = t.filter(pl.col("first_step").is_null())
    assert meta_rows.select("layer", "expert", "rank").rows() == [
        (None, 0, 0),
        (None, 1, 0),
        (None, 2, 1),
        (None, 3, 1),
    ]
    assert t.filter(pl.col("first_step") == 2).select("layer", "expert", "rank").rows() == [
        (1, 0, 0),
        (1, 1, 0),
        (1, 1, 1),
        (1, 2, 1),
        (1, 3, 0),
    ]
    assert t.filter(pl.col("first_step") == 3).height == 4


def test_the_placement_in_force_at_each_step_and_layer(tmp_path, kt):
    _write(tmp_path, kt, [_record(2, 1, MOVED), _record(3, 1, START), _record(3, 0, MOVED)])
    t = read_trace_dir(tmp_path).placement
    keys = pl.DataFrame({"step": [s for s in range(5) for _ in (0, 1)], "layer": [0, 1] * 5})
    f = in_force(t, keys, 4, [0, 1])
    per = f.per_key().group_by("step", "layer").agg(pl.col("expert"), pl.col("rank"))
    got = {
        (s, layer): [sorted(r for e2, r in zip(es, rs, strict=True) if e2 == e) for e in range(4)]
        for s, layer, es, rs in per.iter_rows()
    }
    want = {
        (0, 0): START, (0, 1): START, (1, 0): START, (1, 1): START,
        (2, 0): START, (2, 1): MOVED,  # layer 1 re-placed from step 2
        (3, 0): MOVED, (3, 1): START,  # layer 1 back, layer 0 re-placed from step 3
        (4, 0): MOVED, (4, 1): START,  # in force until the next record of the layer
    }  # fmt: skip
    assert got == want
    assert f.recorded and f.distinct == 2
    assert f.main.owners == tuple(tuple(o) for o in START)  # 6 of the 10 (step, layer)s ran it


def test_without_a_complete_recorded_placement_the_default_is_assumed():
    # a record that leaves expert 3 on no rank is no placement of the layer: its steps keep the meta's
    rows = [(None, e, o[0], None) for e, o in enumerate(START)] + [(0, 0, 0, 1), (0, 1, 0, 1), (0, 2, 1, 1)]
    t = schema.conform("placement", pl.DataFrame(rows, schema=schema.PLACEMENT, orient="row"))
    keys = pl.DataFrame({"step": [0, 1], "layer": [0, 0]})
    f = in_force(t, keys, 4, [0, 1])
    assert f.keys["recorded"].to_list() == [True, True] and f.distinct == 1
    none = in_force(t.head(0), keys, 4, [0, 1])
    assert not none.recorded and none.per_key(recorded_only=True).is_empty()
    assert none.main.owners == ((0,), (0,), (1,), (1,))  # contiguous blocks


def test_a_record_with_replicas_it_does_not_declare_is_refused(tmp_path, kt):
    # expert 1 on both ranks, the record says no replicas: the same rule as meta.placement's, with its own count
    bad = dict(_record(2, 1, MOVED), redundant_experts=0)
    _write(tmp_path, kt, [_record(1, 0, MOVED), bad])
    with pytest.raises(TraceFormatError) as e:
        read_trace_dir(tmp_path)
    assert str(e.value) == (
        f"{tmp_path / 'rank0.ep.jsonl'}: line 3: 'placement' holds 5 expert copies for 4 experts (expert 1 on "
        "ranks 0, 1) but 'redundant_experts' is 0: each expert has one rank plus the declared replicas; declare "
        "the replicas as the record's 'redundant_experts' (docs/sidecar.md), or re-capture the sidecar "
        "(--keep-going leaves it out)"
    )


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ({"step": 2, "layer": 1}, "'placement' is 'None', not a list of rank lists"),
        ({"step": 2, "layer": -1, "placement": START}, "'layer' is -1; it must be at least 0"),
        ({"step": "2", "layer": 1, "placement": START}, "'step' is '2' (str), not an integer"),
        ({"step": 2, "layer": 1, "placement": [[0], [0], [1]]}, "'placement' has 3 entries but 'num_experts' is 4"),
        ({"step": 2, "layer": 1, "placement": [[0], [0], [1], [5]]}, "'placement[3]' holds 5, outside [0, 2)"),
    ],
)
def test_malformed_records_are_refused_with_their_line(tmp_path, kt, record, problem):
    _write(tmp_path, kt, [{"type": "placement", "v": 1, **record}])
    with pytest.raises(TraceFormatError, match="line 2: ") as e:
        read_trace_dir(tmp_path)
    assert problem in str(e.value)


def test_a_second_record_of_a_step_and_layer_is_refused(tmp_path, kt):
    _write(tmp_path, kt, [_record(2, 1, MOVED), _record(2, 1, START)])
    with pytest.raises(TraceFormatError, match=r"line 3: a second record for step 2 layer 1 \(the first is line 2\)"):
        read_trace_dir(tmp_path)
