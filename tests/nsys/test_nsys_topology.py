"""Which ranks share a node, from what an Nsight export records of the launcher (parsers/nsys_ranks.py
``launcher_topology``): the recorded environment (torchrun's GROUP_RANK / LOCAL_WORLD_SIZE, Slurm's
SLURM_NODEID) and, when nsys profiled the launcher itself, torchrun's arguments."""

from __future__ import annotations

from pathlib import Path

from ep_trace.analysis.topology import rank_nodes
from ep_trace.parsers.dispatch import read_trace_dir
from ep_trace.parsers.nsys import read_nsys

from .test_nsys_synthetic import STRINGS, gpid, gtid


def _export(make_export, folder: str, rank: int, env: dict[str, int]) -> Path:
    pid = 4000 + rank
    vars_ = {"RANK": rank, "WORLD_SIZE": 4, **env}
    return make_export(
        f"{folder}/report_{pid}.sqlite",
        strings=STRINGS,
        kernels=[(2000, 2100, rank % 2, 7, 1, gpid(pid), 1)],
        runtime=[(1900, 1910, 0, gtid(pid), 1, 3)],
        # every container names the same host: only the launcher tells the nodes apart
        system_env={"Hostname": "pod", "DeviceEnvironment": ";".join(f"{k}={v}" for k, v in vars_.items())},
    )


def test_torchrun_group_rank_and_local_world_size(make_export, tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    for r in range(4):
        _export(make_export, "job", r, {"GROUP_RANK": r // 2, "LOCAL_WORLD_SIZE": 2})
    t = read_trace_dir(tmp_path / "job")
    assert t.ranks.sort("rank").select("rank", "host", "node_rank", "local_world_size").rows() == [
        (0, "pod", 0, 2),
        (1, "pod", 0, 2),
        (2, "pod", 1, 2),
        (3, "pod", 1, 2),
    ]
    nodes = rank_nodes(t.ranks)
    assert nodes.select("rank", "node", "source").rows() == [
        (0, "node0", "launcher"),
        (1, "node0", "launcher"),
        (2, "node1", "launcher"),
        (3, "node1", "launcher"),
    ]


def test_slurm_ntasks_per_node_alone(make_export, tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    for r in range(4):
        p = _export(make_export, "job", r, {})
        # SLURM_NTASKS_PER_NODE as Slurm spells a uniform layout: "2(x2)"
        import sqlite3

        con = sqlite3.connect(p)
        con.execute(
            "UPDATE TARGET_INFO_SYSTEM_ENV SET value = value || ';SLURM_NTASKS_PER_NODE=2(x2)' WHERE name = 'DeviceEnvironment'"
        )
        con.commit()
        con.close()
    t = read_trace_dir(tmp_path / "job")
    assert rank_nodes(t.ranks)["node_id"].to_list() == [0, 0, 1, 1]


def test_torchrun_arguments_of_a_profiled_launcher(external_dir: Path) -> None:
    # `nsys profile torchrun --nnodes=1 --nproc_per_node=2 ...`: META_DATA_CAPTURE PROCESS_0:ARGUMENT_1
    t = read_nsys(external_dir / "nsys/nsys_ai_2gpu/mfu_2gpu_before.sqlite")
    assert t.ranks.select("rank", "host", "node_rank", "local_world_size").rows() == [
        (0, "modal", None, 2),
        (1, "modal", None, 2),
    ]
    assert rank_nodes(t.ranks).select("node", "source").rows() == [("node0", "launcher"), ("node0", "launcher")]
