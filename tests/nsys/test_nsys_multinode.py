"""Per-process Nsight exports of a multi-node job: 3 hosts x 2 processes, one .sqlite per process,
host and pid in the file name and no rank anywhere but in the recorded launcher environment (or the
NCCL init line of the captured stdout). Exact expected rank / host / local-rank map."""

from __future__ import annotations

from pathlib import Path

import pytest

from ep_trace.errors import RankConflictError
from ep_trace.parsers.dispatch import read_trace_dir

from .test_nsys_synthetic import STRINGS, gpid, gtid

HOSTS = ["gpu-node-a", "gpu-node-b", "gpu-node-c"]


def _env(host: int, local: int) -> dict[str, str]:
    g = 2 * host + local
    # each host's launcher spells the rank its own way: SLURM (srun), Open MPI (mpirun), torchrun
    if host == 0:
        vars_ = {"SLURM_PROCID": g, "SLURM_LOCALID": local, "SLURM_NTASKS": 6, "SLURM_JOB_ID": 4242}
    elif host == 1:
        vars_ = {"OMPI_COMM_WORLD_RANK": g, "OMPI_COMM_WORLD_LOCAL_RANK": local, "OMPI_COMM_WORLD_SIZE": 6}
    else:
        vars_ = {"RANK": g, "LOCAL_RANK": local, "WORLD_SIZE": 6, "PMI_RANK": 99}  # RANK wins over PMI_RANK
    return {"PATH": "/usr/bin", **{k: str(v) for k, v in vars_.items()}}


def _export(make_export, folder: str, host: int, local: int, *, env: bool = True, stdout: str = "") -> Path:
    pid = 3000 + 10 * host + local
    sysenv = {"Hostname": HOSTS[host]}
    if env:
        sysenv["DeviceEnvironment"] = ";".join(f"{k}={v}" for k, v in _env(host, local).items())
    return make_export(
        f"{folder}/report_{HOSTS[host]}_{pid}.sqlite",
        strings=STRINGS,
        kernels=[(2000, 2100, local, 7, 1, gpid(pid), 1)],
        runtime=[(1900, 1910, 0, gtid(pid), 1, 3)],
        system_env=sysenv,
        streams=[(gpid(pid), f"/tmp/nvidia/streams/pid_{pid}_stdout.log", stdout)],
    )


def test_ranks_from_recorded_environment_on_three_hosts(make_export, tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    for h in range(3):
        for lr in range(2):
            _export(make_export, "job", h, lr)
    t = read_trace_dir(tmp_path / "job")
    got = t.ranks.sort("rank").select("rank", "host", "local_rank", "world_size", "rank_source").rows()
    assert got == [
        (0, "gpu-node-a", 0, 6, "environment"),
        (1, "gpu-node-a", 1, 6, "environment"),
        (2, "gpu-node-b", 0, 6, "environment"),
        (3, "gpu-node-b", 1, 6, "environment"),
        (4, "gpu-node-c", 0, 6, "environment"),
        (5, "gpu-node-c", 1, 6, "environment"),
    ]
    assert [Path(f).name for f in t.ranks.sort("rank")["source_file"]] == [
        "report_gpu-node-a_3000.sqlite",
        "report_gpu-node-a_3001.sqlite",
        "report_gpu-node-b_3010.sqlite",
        "report_gpu-node-b_3011.sqlite",
        "report_gpu-node-c_3020.sqlite",
        "report_gpu-node-c_3021.sqlite",
    ]


def test_rank_from_nccl_init_line_in_captured_stdout(make_export, tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    for h in range(3):
        for lr in range(2):
            g = 2 * h + lr
            line = (
                f"{HOSTS[h]}:{3000 + g}:{3100 + g} [{lr}] NCCL INFO comm 0x55d5c0{g} rank {g} nranks 6 cudaDev {lr} "
                f"nvmlDev {lr} busId 47000 commId 0x8f2d4e1b9a - Init COMPLETE\n"
            )
            sub = f"{HOSTS[h]} NCCL INFO comm 0x77aa rank 0 nranks 2 cudaDev 0 busId 1 commId 0x11 - Init COMPLETE\n"
            _export(make_export, "job", h, lr, env=False, stdout=sub + line)
    t = read_trace_dir(tmp_path / "job")
    assert t.ranks.sort("rank").select("rank", "host", "world_size", "job_id", "rank_source").rows() == [
        (g, HOSTS[g // 2], 6, "0x8f2d4e1b9a", "nccl_init") for g in range(6)
    ]


def test_no_rank_evidence_is_refused_not_rank_zero(make_export, tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    a = _export(make_export, "job", 0, 0, env=False)
    b = _export(make_export, "job", 1, 0, env=False)
    with pytest.raises(RankConflictError) as e:
        read_trace_dir(tmp_path / "job")
    assert str(e.value) == (
        f"2 files carry no rank ({a}, {b}); looked for: --rank-map, MPI_RANKS / 'MPI Rank N' thread names, "
        "RANK / OMPI_COMM_WORLD_RANK / PMIX_RANK / PMI_RANK / SLURM_PROCID in the recorded environment, the NCCL "
        "init line in captured stdout, 'rank<N>' in the file name; pass --rank-map R=PATH for each file "
        "(or --rank-map FILE)"
    )
    # an explicit map resolves it
    t = read_trace_dir(tmp_path / "job", rank_map={a.name: 1, b.name: 0})
    assert t.ranks.sort("rank").select("rank", "host", "rank_source").rows() == [
        (0, "gpu-node-b", "rank_map"),
        (1, "gpu-node-a", "rank_map"),
    ]


def test_files_of_two_jobs_list_the_groups(make_export, tmp_path: Path) -> None:
    (tmp_path / "mixed").mkdir()
    a0 = _export(make_export, "mixed", 0, 0)
    a1 = _export(make_export, "mixed", 0, 1)
    c0 = _export(make_export, "mixed", 2, 0)  # WORLD_SIZE 6 too; give it another size
    import sqlite3

    con = sqlite3.connect(c0)
    con.execute(
        "UPDATE TARGET_INFO_SYSTEM_ENV SET value = replace(value, 'WORLD_SIZE=6', 'WORLD_SIZE=8') "
        "WHERE name = 'DeviceEnvironment'"
    )
    con.commit()
    con.close()
    with pytest.raises(RankConflictError) as e:
        read_trace_dir(tmp_path / "mixed")
    assert str(e.value) == (
        f"files from different jobs: world sizes differ (6: {a0}, {a1}; 8: {c0}); put one job per directory"
    )
