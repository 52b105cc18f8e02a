"""The demo launcher's machine settings: one core per rank, the ranks' allocator (jemalloc or huge-page glibc)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ep_trace.errors import ConfigError
from ep_trace.workloads.launcher import (
    HUGE_PAGE_TUNABLE,
    JEMALLOC_CONF,
    find_jemalloc,
    huge_page_malloc,
    rank_allocator,
)

_ALLOC_ENV = ("LD_PRELOAD", "MALLOC_CONF", "GLIBC_TUNABLES", "EP_TRACE_JEMALLOC")


@pytest.fixture
def clean_alloc_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for k in _ALLOC_ENV:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_rank_allocator_preloads_jemalloc_without_decay_and_restores(
    clean_alloc_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    clean_alloc_env.setenv("EP_TRACE_JEMALLOC", str(lib))
    assert find_jemalloc() == lib
    with rank_allocator("auto") as used:
        assert used == "jemalloc"
        assert os.environ["LD_PRELOAD"] == str(lib)
        assert os.environ["MALLOC_CONF"] == JEMALLOC_CONF == "dirty_decay_ms:-1,muzzy_decay_ms:-1"
        assert "GLIBC_TUNABLES" not in os.environ  # glibc's tunable is for glibc malloc only
    assert not {"LD_PRELOAD", "MALLOC_CONF"} & set(os.environ)


def test_rank_allocator_keeps_the_users_preload_and_conf(clean_alloc_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    clean_alloc_env.setenv("EP_TRACE_JEMALLOC", str(lib))
    clean_alloc_env.setenv("LD_PRELOAD", "/opt/libfoo.so")
    clean_alloc_env.setenv("MALLOC_CONF", "narenas:2")
    with rank_allocator("jemalloc") as used:
        assert used == "jemalloc"
        assert os.environ["LD_PRELOAD"] == f"{lib} /opt/libfoo.so"
        assert os.environ["MALLOC_CONF"] == "dirty_decay_ms:-1,muzzy_decay_ms:-1,narenas:2"  # theirs last: theirs win
    assert (os.environ["LD_PRELOAD"], os.environ["MALLOC_CONF"]) == ("/opt/libfoo.so", "narenas:2")
    # an allocator the user preloads is left alone
    clean_alloc_env.setenv("LD_PRELOAD", "/usr/lib/libtcmalloc_minimal.so.4")
    with rank_allocator("auto") as used:
        assert used == "preloaded"
        assert os.environ["LD_PRELOAD"] == "/usr/lib/libtcmalloc_minimal.so.4"
        assert os.environ["MALLOC_CONF"] == "narenas:2"


def test_find_jemalloc_is_linux_only(clean_alloc_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    clean_alloc_env.setenv("EP_TRACE_JEMALLOC", str(lib))
    clean_alloc_env.setattr(sys, "platform", "darwin")  # LD_PRELOAD means nothing there
    assert find_jemalloc() is None


def test_rank_allocator_glibc_and_missing_jemalloc(clean_alloc_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_alloc_env.setenv("EP_TRACE_JEMALLOC", str(tmp_path / "absent.so"))
    assert find_jemalloc() is None
    with rank_allocator("auto") as used:  # falls back to glibc on huge pages
        assert used == "glibc"
        assert os.environ["GLIBC_TUNABLES"] == HUGE_PAGE_TUNABLE
        assert "LD_PRELOAD" not in os.environ
    with rank_allocator("glibc", huge_pages=False) as used:
        assert used == "glibc"
        assert "GLIBC_TUNABLES" not in os.environ
    with pytest.raises(ConfigError) as e, rank_allocator("jemalloc"):
        pass
    assert str(e.value) == (
        "--allocator jemalloc: no libjemalloc found; install it (Debian: apt install libjemalloc2) "
        "or set EP_TRACE_JEMALLOC to its path"
    )
    with pytest.raises(ConfigError) as e, rank_allocator("tcmalloc"):
        pass
    assert str(e.value) == "--allocator: 'tcmalloc' is not one of auto, jemalloc, glibc"


@pytest.mark.skipif(find_jemalloc() is None, reason="no libjemalloc on this machine (apt install libjemalloc2)")
def test_a_child_under_rank_allocator_runs_on_jemalloc(clean_alloc_env: pytest.MonkeyPatch) -> None:
    code = "from ep_trace.workloads.launcher import loaded_allocator; print(loaded_allocator())"
    with rank_allocator("auto"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "jemalloc\n"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "glibc\n"


def test_huge_page_malloc_sets_the_tunable_for_children_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    with huge_page_malloc():
        assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1" == HUGE_PAGE_TUNABLE
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ['GLIBC_TUNABLES'])"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert child.stdout == "glibc.malloc.hugetlb=1\n"
    assert "GLIBC_TUNABLES" not in os.environ


def test_huge_page_malloc_keeps_the_users_tunables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    with huge_page_malloc():
        assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")  # the user's own choice wins
    with huge_page_malloc():
        assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"
    with huge_page_malloc(enabled=False):
        assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"


def test_huge_page_malloc_off_leaves_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    with huge_page_malloc(enabled=False):
        assert "GLIBC_TUNABLES" not in os.environ


def test_pin_to_core_takes_rank_modulo_the_mask() -> None:
    # in a child process: pinning is for the whole process and cannot be undone by a test
    code = (
        "import os; from ep_trace.workloads.launcher import pin_to_core; "
        "cores = sorted(os.sched_getaffinity(0)); c = pin_to_core(len(cores) + 1); "
        "print(c == cores[1 % len(cores)], os.sched_getaffinity(0) == {c})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "True True\n"
