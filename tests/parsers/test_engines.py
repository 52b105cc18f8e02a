"""Batched reads on any Executor, the pool-size choice, partitioned ingest, and Ray (skipped without ray)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

import ep_trace
from ep_trace.errors import TraceFormatError
from ep_trace.parsers import engines
from ep_trace.parsers.dispatch import read_trace_dir
from ep_trace.parsers.parquet_io import ingest_to, is_ingest_dir, read_parquet
from ep_trace.parsers.read_pool import plan_batches

TABLES = ("ranks", "events", "collectives", "routing_counts", "routing_matrix", "placement", "stages")
BAD = b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": -5, "pid": 0, "tid": 0}]}'


def _same(a, b):
    for name in TABLES:
        assert a.table(name).equals(b.table(name)), name
    assert a.load_report == b.load_report


@pytest.fixture(scope="module")
def dlrm(external_dir) -> Path:
    return external_dir / "kineto" / "param_dlrm_8rank"


@pytest.fixture
def dlrm_bad(dlrm, tmp_path) -> Path:
    d = tmp_path / "dlrm_bad"
    shutil.copytree(dlrm, d)
    (d / "worker3_step_12.1694128201557.pt.trace.json.gz").unlink()
    (d / "worker3_bad.pt.trace.json").write_bytes(BAD)
    return d


def test_choose_workers_only_when_a_pool_pays(monkeypatch):
    monkeypatch.delattr(engines.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(engines.os, "getloadavg", lambda: (1.0, 1.0, 1.0))  # only this process runs
    monkeypatch.setattr(engines.os, "cpu_count", lambda: 2)
    assert engines.choose_workers(8, 0.5, 8) == 1  # 8 small files: a worker's start-up costs more
    assert engines.choose_workers(8, 2.9, 8) == 1  # 2 CPUs: 1.5 + 2.9 / 2 = 2.95 > 2.9
    assert engines.choose_workers(2, 3.1, 8) == 2
    monkeypatch.setattr(engines.os, "getloadavg", lambda: (2.2, 1.0, 1.0))  # another job holds a CPU
    assert engines.choose_workers(2, 60.0, 8) == 1
    monkeypatch.setattr(engines.os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    monkeypatch.setattr(engines.os, "cpu_count", lambda: 16)
    assert engines.choose_workers(8, 2.9, 8) == 8  # 1.5 + 2.9 / 8 < 2.9
    assert engines.choose_workers(4, 60.0, 3) == 3  # never more workers than batches
    assert engines.choose_workers(1, 60.0, 99) == 1


def test_plan_batches_groups_small_files_and_splits_for_workers(tmp_path):
    files = []
    for i, size in enumerate([10, 10, 10, 100, 10]):
        p = tmp_path / f"r{i}.json"
        p.write_bytes(b" " * size)
        files.append((p, "kineto"))
    assert plan_batches(files, batch_bytes=30) == [[0, 1, 2], [3], [4]]
    assert plan_batches(files, batch_bytes=1000, batch_files=2) == [[0, 1], [2, 3], [4]]
    # 2 workers: batches of at most 140 / 8 bytes, so every file alone here
    assert plan_batches(files, workers=2, batch_bytes=1000) == [[0], [1], [2], [3], [4]]
    # a big file is a task of its own, the small ones around it stay batched (Ray's plan)
    assert plan_batches(files, batch_bytes=1000, alone_bytes=50) == [[0, 1, 2], [3], [4]]
    assert plan_batches(files, batch_bytes=1000, alone_bytes=0) == [[0], [1], [2], [3], [4]]


def test_any_executor_gives_the_serial_tables(samples_dir, dlrm):
    for d in (samples_dir / "balanced", dlrm):
        with ThreadPoolExecutor(2) as pool:
            _same(read_trace_dir(d, executor=pool), read_trace_dir(d))


def test_small_batches_give_the_same_tables(dlrm, monkeypatch):
    from ep_trace.parsers import read_pool

    whole = read_trace_dir(dlrm)
    monkeypatch.setattr(read_pool, "BATCH_FILES", 3)  # 3 + 3 + 2 files: the merge across batches
    _same(read_trace_dir(dlrm), whole)


def test_bad_file_same_error_and_keep_going_on_executor(dlrm_bad):
    with pytest.raises(TraceFormatError) as serial:
        read_trace_dir(dlrm_bad)
    with ThreadPoolExecutor(2) as pool, pytest.raises(TraceFormatError) as pooled:
        read_trace_dir(dlrm_bad, executor=pool)
    assert str(pooled.value) == str(serial.value)
    assert str(serial.value).endswith(
        "worker3_bad.pt.trace.json: traceEvents[0]: negative duration (dur=-5.0); the trace is corrupt; re-export it"
    )
    with ThreadPoolExecutor(2) as pool:
        _same(read_trace_dir(dlrm_bad, on_error="skip", executor=pool), read_trace_dir(dlrm_bad, on_error="skip"))


def test_streaming_ingest_partitions_and_analyze_reads_it_back(dlrm, tmp_path, monkeypatch):
    from ep_trace.parsers import read_pool

    monkeypatch.setattr(read_pool, "BATCH_FILES", 3)
    res = ingest_to(dlrm, tmp_path / "out")
    assert not res.from_cache and is_ingest_dir(tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out" / "events").iterdir()) == [
        "part-000000.parquet",
        "part-000001.parquet",
        "part-000002.parquet",
    ]
    whole = read_trace_dir(dlrm)
    back = read_parquet(tmp_path / "out")
    _same(back, whole)
    assert res.rows == {n: whole.table(n).height for n in TABLES}
    man = orjson.loads((tmp_path / "out" / "manifest.json").read_bytes())
    assert man["layout"] == "partitioned-v1" and man["tables"]["ranks"] == 8
    # analyze accepts the ingest directory: same summary, no parsing
    monkeypatch.setattr(read_pool, "decode_batch", lambda s: pytest.fail("parsed an ingest directory"))
    assert ep_trace.load(tmp_path / "out").rank_summary.height == 8


def test_analyze_of_ingest_dir_equals_analyze_of_traces(dlrm, tmp_path):
    ingest_to(dlrm, tmp_path / "out")
    a, b = ep_trace.load(dlrm), ep_trace.load(tmp_path / "out")
    assert a.summary() == b.summary()


# --- Ray: a local Ray with 2 CPUs, started once for the module (~5-10 s) ---


@pytest.fixture(scope="module")
def ray_pool():
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'ep-trace[ray]')")
    try:
        pool = engines.RayExecutor(num_cpus=2)
    except Exception as exc:  # noqa: BLE001 - ray.init raises a bare Exception when its node start-up times out
        pytest.skip(f"a local Ray did not start here (machine overloaded?): {str(exc)[:120]}")
    yield pool
    pool.shutdown()


def _count_tasks(pool, monkeypatch) -> list[int]:
    """Spy on ``pool.submit``: the returned list grows by one per Ray task."""
    tasks: list[int] = []
    real = pool.submit
    monkeypatch.setattr(pool, "submit", lambda fn, *a, **k: tasks.append(1) or real(fn, *a, **k))
    return tasks


@pytest.mark.parametrize("alone_bytes", [engines.RAY_ALONE_BYTES, 0])
def test_ray_summary_identical_to_local(ray_pool, samples_dir, dlrm, monkeypatch, alone_bytes):
    """Default plan (small files batched) and one task per rank file give the local summary."""
    monkeypatch.setattr(ray_pool, "alone_bytes", alone_bytes)
    tasks = _count_tasks(ray_pool, monkeypatch)
    for d in (samples_dir / "balanced", dlrm):
        tasks.clear()
        assert ep_trace.load(d, executor=ray_pool).summary() == ep_trace.load(d).summary(), d
        n_files = len([f for f in d.iterdir() if ".pt.trace.json" in f.name])
        if alone_bytes == 0:
            assert len(tasks) == n_files, d
        else:  # small files batched: at most one task per file
            assert 1 <= len(tasks) <= n_files, d


def test_ray_one_task_per_big_rank_file(ray_pool, dlrm, tmp_path, monkeypatch):
    """Files of at least ``alone_bytes`` of JSON are one task (and one partition) each."""
    monkeypatch.setattr(ray_pool, "alone_bytes", 1)  # every rank file counts as big here
    tasks = _count_tasks(ray_pool, monkeypatch)
    res = ingest_to(dlrm, tmp_path / "out", executor=ray_pool)
    assert len(tasks) == 8 and len(list((tmp_path / "out" / "events").iterdir())) == 8
    _same(read_parquet(tmp_path / "out"), read_trace_dir(dlrm))
    assert res.rows["ranks"] == 8


@pytest.mark.parametrize("alone_bytes", [engines.RAY_ALONE_BYTES, 0])
def test_ray_bad_file_same_one_line_error_and_keep_going(ray_pool, dlrm_bad, tmp_path, monkeypatch, alone_bytes):
    monkeypatch.setattr(ray_pool, "alone_bytes", alone_bytes)
    with pytest.raises(TraceFormatError) as serial:
        read_trace_dir(dlrm_bad)
    with pytest.raises(TraceFormatError) as on_ray:
        ingest_to(dlrm_bad, tmp_path / "out", executor=ray_pool)
    assert str(on_ray.value) == str(serial.value)
    assert not is_ingest_dir(tmp_path / "out")  # no manifest: never reused
    res = ingest_to(dlrm_bad, tmp_path / "out", on_error="skip", executor=ray_pool)
    local = read_trace_dir(dlrm_bad, on_error="skip")
    assert res.load_report == local.load_report and res.rows["ranks"] == 7
    _same(read_parquet(tmp_path / "out"), local)


def test_cli_engine_ray(ray_pool, dlrm_bad, dlrm, tmp_path, capsys):
    from ep_trace.cli import main
    from ep_trace.cli.outputs import write_json

    args = ["analyze", str(dlrm), "-o", str(tmp_path / "r.html"), "--json", str(tmp_path / "s.json"), "-q"]
    assert main([*args, "--engine", "ray"]) == 0  # joins the module's Ray
    bad = ["analyze", str(dlrm_bad), "-o", str(tmp_path / "b.html"), "-q"]
    assert main([*bad, "--engine", "ray"]) == 2
    err_ray = capsys.readouterr().err
    assert main(bad) == 2
    assert capsys.readouterr().err == err_ray and "worker3_bad.pt.trace.json: traceEvents[0]" in err_ray
    write_json(ep_trace.load(dlrm).summary(), tmp_path / "local.json")
    assert orjson.loads((tmp_path / "s.json").read_bytes()) == orjson.loads((tmp_path / "local.json").read_bytes())


def test_engine_errors_are_one_line_config_errors(monkeypatch):
    from ep_trace.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--engine: unknown engine 'spark'; use local or ray$"):
        engines.make_executor("spark")
    with pytest.raises(ConfigError, match=r"^--address: only with --engine ray$"):
        engines.make_executor("local", address="auto")

    def boom(**kw):
        raise Exception("The current node timed out during startup.\nmore lines")  # what ray.init raises

    monkeypatch.setattr(engines, "RayExecutor", boom)
    with pytest.raises(ConfigError) as exc:
        engines.make_executor("ray", 2)
    assert str(exc.value) == (
        "--engine ray: could not start or join a local Ray (The current node timed out during startup.); "
        "check --address / RAY_ADDRESS, or use --engine local"
    )
