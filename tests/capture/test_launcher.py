"""The demo launcher's machine settings: one core per rank, huge-page malloc for the spawned ranks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ep_trace.workloads.launcher import HUGE_PAGE_TUNABLE, huge_page_malloc


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
