"""Frameworks' routing dumps, each written the way its framework writes it, read into canonical routing rows.

* Megatron-Core: ``RouterTracer._flush_records_to_disk`` (megatron/core/transformer/moe/router_trace.py)
  writes ``json.dumps(rec) + "\\n"`` per record of ``_make_index_record`` with ``top_indices`` as a list.
* SGLang: ``_DetailAccumulator.dump`` (python/sglang/srt/eplb/expert_distribution.py) ``torch.save``s
  ``dict(records=[dict(forward_pass_id, rank, gatherer_key, global_physical_count)], last_physical_to_logical_map)``.
* vLLM: the ``EplbModelState`` tensors under their own names (vllm/distributed/eplb/eplb_state.py).
torch is the capture extra; these tests write with it, the readers never import it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ep_trace.errors import TraceFormatError
from ep_trace.parsers.routing_dumps import read_routing_dump, with_routing_dumps
from ep_trace.parsers.torch_pickle import load_torch_file

torch = pytest.importorskip("torch")


def _megatron_record(step: int, layer: int, rank: int, top: list[list[int]], block: str = "decoder") -> str:
    # RouterTracer._make_index_record + _flush_records_to_disk (rec["top_indices"] = tensor.tolist())
    rec: dict[str, object] = {
        "step": step,
        "stage": "pre_dispatch",
        "block": block,
        "layer": layer,
        "rank": rank,
        "num_tokens": len(top),
        "topk": len(top[0]),
    }
    if block == "mtp":
        rec["mtp_idx"] = 0
    rec["top_indices"] = torch.tensor(top, dtype=torch.int32).tolist()
    return json.dumps(rec) + "\n"


def test_megatron_router_trace(tmp_path: Path):
    f = tmp_path / "router_trace_rank1.jsonl"
    f.write_text(
        _megatron_record(5, 3, 1, [[0, 2], [2, 3], [2, 0]])
        + _megatron_record(5, 3, 1, [[1, 2]])  # a second micro-batch of step 5, layer 3
        + _megatron_record(5, 0, 1, [[0, 1]], block="mtp")
    )
    d = read_routing_dump(f)
    rc = d.routing_counts.sort("microbatch", "expert")
    assert rc.select("rank", "step", "layer", "microbatch", "expert", "count").rows() == [
        (1, 5, 3, 0, 0, 2),
        (1, 5, 3, 0, 2, 3),
        (1, 5, 3, 0, 3, 1),
        (1, 5, 3, 1, 1, 1),
        (1, 5, 3, 1, 2, 1),
    ]
    assert rc.filter(pl.col("microbatch") == 0)["tokens"].unique().to_list() == [3]
    assert rc["top_k"].unique().to_list() == [2]
    assert [i.message for i in d.issues] == ["1 MTP router records left out (their layers are not the decoder's)"]


def test_megatron_bad_record_is_named(tmp_path: Path):
    f = tmp_path / "router_trace_rank0.jsonl"
    f.write_text(_megatron_record(0, 0, 0, [[0, 1]]) + '{"step": 1}\n')
    with pytest.raises(TraceFormatError) as e:
        read_routing_dump(f)
    assert str(e.value) == (
        f"{f}: line 2: not a Megatron-Core router trace record ('top_indices'); pass the router_trace_rank{{R}}.jsonl file as written"
    )


def _sglang_dump(path: Path, rank: int, counts: list[list[list[int]]], p2l: list[list[int]]) -> None:
    # _DetailAccumulator.append / .dump: records carry cpu tensors, the map is the last one
    records = [
        dict(
            forward_pass_id=i,
            rank=rank,
            gatherer_key="primary",
            global_physical_count=torch.tensor(c, dtype=torch.int32),
        )
        for i, c in enumerate(counts)
    ]
    torch.save(dict(records=records, last_physical_to_logical_map=torch.tensor(p2l)), str(path))


def test_sglang_per_pass_dump_maps_physical_to_logical(tmp_path: Path):
    # 2 layers, 3 logical experts on 2 ranks x 2 physical slots: slot 3 is a replica of expert 0
    p2l = [[0, 1, 2, 0], [0, 1, 2, 0]]
    f = tmp_path / "expert_distribution_recorder_1700000000.5_0.pt"
    _sglang_dump(f, 0, [[[4, 1, 2, 3], [0, 0, 5, 1]]], p2l)
    d = read_routing_dump(f, ep_size=2)
    assert d.routing_counts.select("rank", "step", "layer", "expert", "count").sort("layer", "expert").rows() == [
        (0, 0, 0, 0, 7),
        (0, 0, 0, 1, 1),
        (0, 0, 0, 2, 2),
        (0, 0, 1, 0, 1),
        (0, 0, 1, 2, 5),
    ]
    # slot p on EP rank p // 2: expert 0 on ranks 0 and 1
    assert sorted(d.placement.select("expert", "rank").rows()) == [(0, 0), (0, 1), (1, 0), (2, 1)]


def test_sglang_stat_dump_is_refused(tmp_path: Path):
    f = tmp_path / "expert_distribution_recorder_1700000000.5.pt"
    # _StatAccumulator.dump: dict(rank, logical_count (all-reduced), average_utilization_rate_over_window)
    torch.save(
        dict(rank=0, logical_count=torch.ones(3, 2, 4, dtype=torch.int32), average_utilization_rate_over_window=None),
        str(f),
    )
    with pytest.raises(TraceFormatError) as e:
        read_routing_dump(f)
    assert str(e.value) == (
        f"{f}: an SGLang stat-mode dump (logical_count summed over ranks: no source rank); record with "
        "--expert-distribution-recorder-mode per_pass (one file per rank, source counts)"
    )


def test_vllm_eplb_state_in_ring_order(tmp_path: Path):
    f = tmp_path / "eplb_rank3.pt"
    win = torch.zeros(3, 1, 2, dtype=torch.int32)
    win[0, 0] = torch.tensor([1, 1])  # oldest slot is 1 (expert_load_window_step), then 2, then 0
    win[1, 0] = torch.tensor([5, 0])
    win[2, 0] = torch.tensor([0, 7])
    torch.save(
        {"expert_load_window": win, "physical_to_logical_map": torch.tensor([[0, 1]]), "expert_load_window_step": 1},
        str(f),
    )
    d = read_routing_dump(f)
    assert d.routing_counts.select("rank", "step", "expert", "count").sort("step", "expert").rows() == [
        (3, 0, 0, 5),
        (3, 1, 1, 7),
        (3, 2, 0, 1),
        (3, 2, 1, 1),
    ]


def test_dumps_fill_ranks_without_sidecar_counts(tmp_path: Path):
    from ep_trace.schema import TraceTables, empty

    for r in (0, 1):
        (tmp_path / f"router_trace_rank{r}.jsonl").write_text(_megatron_record(0, 0, r, [[r, 1 - r]]))
    t = TraceTables(ranks=empty("ranks"), events=empty("events"), collectives=empty("collectives"))
    out = with_routing_dumps(t, [tmp_path])
    assert sorted(out.routing_counts.select("rank", "expert", "count").rows()) == [
        (0, 0, 1),
        (0, 1, 1),
        (1, 0, 1),
        (1, 1, 1),
    ]
    with pytest.raises(TraceFormatError) as e:
        with_routing_dumps(t, [tmp_path / "nothing"])
    assert (
        str(e.value)
        == f"{tmp_path / 'nothing'}: no such file or directory; pass a routing dump file or a directory of them (--routing)"
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceFormatError, match="no routing dump found"):
        with_routing_dumps(t, [tmp_path / "empty"])


def test_torch_file_reader_without_torch(tmp_path: Path):
    f = tmp_path / "t.pt"
    base = torch.arange(12, dtype=torch.int64).view(3, 4)
    torch.save(
        {"t": base.t(), "half": torch.tensor([1.5], dtype=torch.bfloat16), "s": torch.tensor(7), "x": (1, "a")}, str(f)
    )
    o = load_torch_file(f)
    np.testing.assert_array_equal(o["t"], base.t().numpy())
    assert o["half"].tolist() == [1.5] and int(o["s"]) == 7 and o["x"] == (1, "a")


class _Evil:
    def __reduce__(self):  # what a malicious file would run on a plain torch.load / pickle.load
        return (print, ("ran",))


def test_torch_file_reader_runs_no_code(tmp_path: Path, capsys):
    f = tmp_path / "evil.pt"
    torch.save({"x": _Evil()}, str(f))
    with pytest.raises(TraceFormatError) as e:
        load_torch_file(f)
    assert "the pickle names builtins.print" in str(e.value) or "the pickle names __builtin__.print" in str(e.value)
    assert "ran" not in capsys.readouterr().out
    g = tmp_path / "not.pt"
    g.write_bytes(b"plain text")
    with pytest.raises(TraceFormatError, match="not a torch.save zip archive"):
        load_torch_file(g)
