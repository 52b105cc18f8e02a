"""The ingest cache's size cap (parsers.cache_evict) and its use by load_trace_dir."""

from __future__ import annotations

import os
from pathlib import Path

from ep_trace.parsers import cache_evict
from ep_trace.parsers.parquet_io import load_trace_dir


def _entry(root: Path, name: str, size: int, used: float) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "events.parquet").write_bytes(b"x" * size)
    (d / "manifest.json").write_text("{}")
    os.utime(d / "manifest.json", (used, used))
    return d


def test_least_recently_used_go_first_and_the_new_entry_stays(tmp_path):
    a = _entry(tmp_path, "a", 400, 100.0)
    b = _entry(tmp_path, "b", 400, 300.0)
    c = _entry(tmp_path, "c", 400, 200.0)
    new = _entry(tmp_path, "new", 400, 50.0)  # just written (its mtime is not what protects it)
    (tmp_path / ".tmp-write").mkdir()  # a write in progress: not an entry
    removed = cache_evict.evict(tmp_path, keep=new, limit=1000)
    # 1,600 bytes for a cap of 1,000: a (used at 100) then c (200) go; b (300) and the new entry stay
    assert removed == [a, c]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-write", "b", "new"]
    # an entry larger than the cap alone is kept when it is the new one
    assert cache_evict.evict(tmp_path, keep=new, limit=10) == [b] and new.is_dir()


def test_limit_from_the_environment(monkeypatch):
    monkeypatch.setenv("EP_TRACE_CACHE_MAX_BYTES", "12345")
    assert cache_evict.cache_limit() == 12345
    monkeypatch.delenv("EP_TRACE_CACHE_MAX_BYTES")
    assert cache_evict.cache_limit() == 20 << 30


def test_load_trace_dir_keeps_the_cache_under_its_cap(tmp_path, samples_dir, monkeypatch):
    cache = tmp_path / "cache"
    old = _entry(cache, "0" * 64, 5_000_000, 1.0)  # an old entry of another trace directory
    monkeypatch.setenv("EP_TRACE_CACHE_MAX_BYTES", "4000000")
    load_trace_dir(samples_dir / "balanced", cache_dir=cache)
    entries = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert not old.exists() and len(entries) == 1
    # a hit marks the entry as used
    (m := entries[0] / "manifest.json").touch()
    os.utime(m, (5.0, 5.0))
    load_trace_dir(samples_dir / "balanced", cache_dir=cache)
    assert m.stat().st_mtime > 5.0
