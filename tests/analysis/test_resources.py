"""Hidden fraction of a rank's transfers from its cores (analysis.resources)."""

from __future__ import annotations

import polars as pl

from ep_trace.analysis.resources import transfer_hiding

CPU4 = dict.fromkeys(range(4), "cpu")


def _ranks(rows: list[tuple[int, str | None, int | None, int | None]]) -> pl.DataFrame:
    schema = {"rank": pl.Int32, "host": pl.Utf8, "cpu_cores": pl.Int32, "host_cores": pl.Int32}
    return pl.DataFrame(rows, schema=schema, orient="row")


def test_gpu_ranks_hide_everything():
    h, unknown = transfer_hiding(_ranks([(0, "a", 2, 2), (1, "a", 2, 2)]), {0: "gpu", 1: "gpu"})
    assert h == {0: 1.0, 1: 1.0} and unknown == []


def test_cpu_ranks_sharing_the_host():
    # 2 cores shared by 2 ranks: 1 core each, nothing hides; by 4 ranks: half a core each, nothing
    assert transfer_hiding(_ranks([(0, "a", 2, 2), (1, "a", 2, 2)]), {0: "cpu", 1: "cpu"})[0] == {0: 0.0, 1: 0.0}
    assert transfer_hiding(_ranks([(r, "a", 2, 2) for r in range(4)]), CPU4)[0] == dict.fromkeys(range(4), 0.0)
    # 8 cores for 2 ranks: all of it; 6 cores for 4 ranks: 1.5 each, half of each transfer hides
    assert transfer_hiding(_ranks([(0, "a", 8, 8), (1, "a", 8, 8)]), {0: "cpu", 1: "cpu"})[0] == {0: 1.0, 1: 1.0}
    assert transfer_hiding(_ranks([(r, "a", 6, 6) for r in range(4)]), CPU4)[0] == dict.fromkeys(range(4), 0.5)


def test_cpu_ranks_pinned_and_on_two_hosts():
    # pinned to 2 cores each of a 16-core host: 2 each -> all hides; one core of its own on host b -> none
    pinned = _ranks([(0, "a", 2, 16), (1, "a", 2, 16), (2, "a", 2, 16), (3, "b", 1, 4)])
    assert transfer_hiding(pinned, CPU4)[0] == {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0}


def test_unknown_cores_assume_a_spare_core_and_say_so():
    h, unknown = transfer_hiding(_ranks([(0, "a", None, None), (1, "a", 4, 4)]), {0: "cpu", 1: "cpu"})
    assert h == {0: 1.0, 1: 1.0} and unknown == [0]
    h, unknown = transfer_hiding(pl.DataFrame({"rank": [0], "host": ["a"]}), {0: "cpu"})
    assert h == {0: 1.0} and unknown == [0]
