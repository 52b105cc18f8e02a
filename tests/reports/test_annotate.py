"""`ep-trace annotate` keeps each rank's original trace and adds ep-trace's tracks (issue 13.5).

Checked on real traces: the original document survives byte for byte (events, flows, metadata,
distributedInfo, deviceProperties, schemaVersion, timestamps); the extra tracks sit in their own
process and line up with the original kernels; HTA's TraceAnalysis reads the result and computes
the same overlap as on the originals; Perfetto's trace processor loads it when its shell binary is
available (else the Chrome JSON trace-event schema Perfetto's importer accepts is checked);
Nsight input gives a Chrome trace with the same tracks; a critical path is drawn when present.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
from pathlib import Path

import orjson
import polars as pl
import pytest

import ep_trace
from ep_trace.cli.annotate import _Originals, original_files
from ep_trace.cli.outputs import write_annotated
from ep_trace.parsers.kineto_original import read_original
from ep_trace.reports.annotate import ANALYSIS_PID, TRACK_TIDS

DLRM = "kineto/param_dlrm_8rank"


def _load_gz(p: Path) -> dict:
    raw = p.read_bytes()
    return orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


@pytest.fixture(scope="module")
def dlrm(external_dir, tmp_path_factory):
    src = external_dir / DLRM
    a = ep_trace.load(src)
    out = tmp_path_factory.mktemp("ann")
    write_annotated(a, out, originals=_Originals(original_files(a.tables.ranks)))
    return a, src, out


def test_original_document_is_kept_and_tracks_are_appended(dlrm):
    a, src, out = dlrm
    orig_file = next(src.glob("worker0_*.json.gz"))
    orig = _load_gz(orig_file)
    ann = _load_gz(out / "rank0.ep-annotated.json.gz")
    assert set(ann) == set(orig) and "distributedInfo" in ann and "deviceProperties" in ann and "schemaVersion" in ann
    for key in orig:
        if key != "traceEvents":
            assert ann[key] == orig[key], key
    n = len(orig["traceEvents"])
    assert ann["traceEvents"][:n] == orig["traceEvents"]  # every event, flow and M record, same timestamps
    flows = sum(1 for e in orig["traceEvents"] if e.get("ph") in ("s", "f"))
    assert flows > 0 and flows == sum(1 for e in ann["traceEvents"] if e.get("ph") in ("s", "f"))
    # byte for byte: the annotated document is the original with the extra events spliced in
    raw = gzip.decompress(orig_file.read_bytes())
    new = gzip.decompress((out / "rank0.ep-annotated.json.gz").read_bytes())
    cut = read_original(orig_file).insert_at
    assert new[:cut] == raw[:cut] and new.endswith(raw[cut:])
    extra = ann["traceEvents"][n:]
    assert extra and all(e["pid"] == ANALYSIS_PID for e in extra)
    names = {e["args"]["name"] for e in extra if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {
        "EP stages",
        "barrier wait",
        "transfer (wait-free)",
        "exposed comm (not overlapped)",
        "critical path",
    } <= names


def test_extra_tracks_line_up_with_the_original_kernels(dlrm):
    a, _, out = dlrm
    ann = _load_gz(out / "rank0.ep-annotated.json.gz")
    nccl = {(e["ts"], e["dur"]) for e in ann["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"]}
    comm = [
        e
        for e in ann["traceEvents"]
        if e.get("pid") == ANALYSIS_PID and e.get("tid") == TRACK_TIDS["comm"] and e["ph"] == "X"
    ]
    assert len(comm) == a.call_ranks.filter(pl.col("rank") == 0).height > 0
    # a single-kernel collective's comm slice is exactly its NCCL kernel (same µs, same time base)
    assert sum((e["ts"], e["dur"]) in nccl for e in comm) >= len(comm) - 3
    ts = [e["ts"] for e in ann["traceEvents"] if e.get("ph") == "X" and e.get("pid") != ANALYSIS_PID]
    assert all(min(ts) <= e["ts"] <= max(ts) for e in comm)


def test_hta_reads_the_annotated_traces_and_agrees_with_the_originals(dlrm, tmp_path):
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    _, src, out = dlrm
    shutil.copytree(src, tmp_path / "orig")
    o = TraceAnalysis(trace_dir=str(tmp_path / "orig")).get_comm_comp_overlap(visualize=False)
    n = TraceAnalysis(trace_dir=str(out)).get_comm_comp_overlap(visualize=False)
    assert sorted(n["rank"].tolist()) == list(range(8))
    assert n.sort_values("rank").reset_index(drop=True).equals(o.sort_values("rank").reset_index(drop=True))


_PH = set("XBEiIMCsftbneOPNDp")


def _check_chrome_trace_schema(doc: dict) -> None:
    """The JSON trace-event format as Perfetto's JSON importer reads it (json_trace_parser.cc):
    an object with a traceEvents list; every event an object with a known ph; X events with
    numeric ts and dur >= 0 and integer (or string, as Kineto writes "Spans") pid / tid; M events with a name and args."""
    assert isinstance(doc["traceEvents"], list)
    for e in doc["traceEvents"]:
        assert isinstance(e, dict) and e.get("ph") in _PH, e
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            assert isinstance(e["pid"], (int, str)) and isinstance(e["tid"], (int, str)), e
            assert isinstance(e["name"], str), e
        if e["ph"] == "M":
            assert isinstance(e["name"], str) and isinstance(e.get("args"), dict), e


def test_perfetto_loads_the_annotated_trace(dlrm):
    _, _, out = dlrm
    path = out / "rank0.ep-annotated.json.gz"
    doc = json.loads(gzip.decompress(path.read_bytes()))  # the strict stdlib parser accepts it too
    _check_chrome_trace_schema(doc)
    shell = os.environ.get("EP_TRACE_PERFETTO_SHELL")
    if not shell:
        pytest.skip("no trace_processor_shell (set EP_TRACE_PERFETTO_SHELL; it is not on PyPI): schema checked only")
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    tp = TraceProcessor(trace=str(path), config=TraceProcessorConfig(bin_path=shell))
    n = tp.query("select count(*) as n from slice where category = 'ep-trace'").as_pandas_dataframe()["n"][0]
    assert n == sum(1 for e in doc["traceEvents"] if e.get("cat") == "ep-trace" and e["ph"] == "X")


def test_nsight_input_gives_a_chrome_trace_with_the_same_tracks(external_dir, tmp_path):
    a = ep_trace.load(external_dir / "nsys" / "nsys_ai_2gpu" / "mfu_2gpu_before.sqlite")
    assert original_files(a.tables.ranks) == {}  # no Kineto JSON to keep
    paths = write_annotated(a, tmp_path)
    doc = _load_gz(paths[0])
    _check_chrome_trace_schema(doc)
    tracks = {e["args"]["track"] for e in doc["traceEvents"] if e.get("pid") == ANALYSIS_PID and e["ph"] == "X"}
    assert {"comm", "transfer", "exposed_comm", "stage"} <= tracks
    kernels = [e for e in doc["traceEvents"] if e["ph"] == "X" and 1_000_000 <= e["pid"] < ANALYSIS_PID]
    assert kernels


def test_critical_path_and_finding_tracks(samples_dir, tmp_path):
    src = samples_dir / "skewed_straggler"
    a = ep_trace.load(src)
    st = a.steps.filter(pl.col("rank") == 1).sort("step").row(1, named=True)
    cp = pl.DataFrame(
        {
            "step": [st["step"]] * 2,
            "seq": [0, 1],
            "rank": [1, 1],
            "start_ns": [st["start_ns"], st["start_ns"] + 1_000_000],
            "end_ns": [st["start_ns"] + 1_000_000, st["start_ns"] + 3_000_000],
            "cause": ["compute", "barrier_wait"],
            "stage": ["expert", "dispatch"],
            "name": ["aten::mm", "gloo:all_to_all"],
        }
    )
    b = dataclasses.replace(a, critical_path=cp)
    write_annotated(b, tmp_path, originals=_Originals(original_files(b.tables.ranks)))
    doc = _load_gz(tmp_path / "rank1.ep-annotated.json.gz")
    ours = [e for e in doc["traceEvents"] if e.get("pid") == ANALYSIS_PID and e["ph"] == "X"]
    crit = [e for e in ours if e["tid"] == TRACK_TIDS["critical_path"]]
    assert [e["name"] for e in crit] == ["compute: expert aten::mm", "barrier_wait: dispatch gloo:all_to_all"]
    assert [e["dur"] for e in crit] == [1000.0, 2000.0]  # µs
    all_findings = [
        e
        for r in range(4)
        for e in _load_gz(tmp_path / f"rank{r}.ep-annotated.json.gz")["traceEvents"]
        if e.get("pid") == ANALYSIS_PID and e.get("tid") == TRACK_TIDS["finding"] and e["ph"] == "X"
    ]
    assert len(all_findings) == len(a.findings) and all_findings[0]["name"].startswith("F")
