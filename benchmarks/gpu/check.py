"""GPU verification of ep-trace's capture paths (run by ``benchmarks/gpu_check.sh``).

For world size 1 (NCCL) and, when possible, world size 2 (NCCL with >= 2 GPUs, else gloo with CUDA
compute), runs the MoE EP workload with no capture, with the Kineto ``Tracer`` and with the CUPTI
collector (separate processes: both backends own CUPTI's activity buffers), then:

* step times -> overhead ratios (median over the measured steps, rank 0);
* ingests both outputs (``read_kineto`` / ``read_cupti``) and compares the kernel lists of the same
  steps (names per step, durations and start offsets of paired kernels);
* checks Kineto ``gpu_user_annotation`` spans against the envelopes of the kernels launched inside
  the ``stage()`` ranges, and compares per-stage envelope durations of both backends;
* counts communication kernels with ``ep_trace.comm_classifier``;
* captures a small real CUDA trace (Kineto + sidecar, CUPTI Parquet, raw CUPTI records) into
  ``<out>/tests_data_cuda/cuda_trace.tar.gz`` for committing under ``tests/data/``;
* writes ``results.json`` and prints / writes ``results.md`` (the block for benchmarks/README.md).

``--dry-run`` runs the same pipeline on CPU with gloo and tiny sizes (the CUPTI mode then records
the collector's missing-dependency error), to check the script without a GPU.
"""

from __future__ import annotations

import argparse
import io
import json
import socket
import statistics
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402  (script directory on sys.path)

MODES = ("none", "kineto", "cupti")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(job: Any, timeout_s: float) -> list[dict[str, Any]]:
    """Spawn ``job.world`` ranks of ``workload.worker``; returns their timing records."""
    import torch.multiprocessing as mp
    import workload

    Path(job.job_dir).mkdir(parents=True, exist_ok=True)
    ctx = mp.start_processes(workload.worker, args=(job,), nprocs=job.world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            break
    out = []
    for r in range(job.world):
        f = Path(job.job_dir) / f"timing_rank{r}.json"
        out.append(
            json.loads(f.read_text())
            if f.exists()
            else {"rank": r, "error": f"no result (timeout {timeout_s:.0f} s or crash)"}
        )
    return out


def _median_ms(ns: list[int]) -> float | None:
    return round(statistics.median(ns) / 1e6, 3) if ns else None


def _p95_ms(ns: list[int]) -> float | None:
    return round(sorted(ns)[max(0, int(0.95 * len(ns)) - 1)] / 1e6, 3) if ns else None


def ingest(job_dir: Path, mode: str, rank: int = 0) -> Any:
    """Read rank ``rank``'s output of one job into canonical tables."""
    if mode == "kineto":
        from ep_trace.parsers.kineto import read_kineto

        return read_kineto(job_dir / "trace" / f"rank{rank}.pt.trace.json.gz")
    from ep_trace.parsers.cupti import read_cupti

    return read_cupti(job_dir / "trace" / f"rank{rank}.ep-events.parquet")


def _comm_kernels(events: Any) -> int:
    import polars as pl

    from ep_trace.comm_classifier import is_comm_expr

    return events.filter((pl.col("kind") == "gpu_kernel") & is_comm_expr(pl.col("name"))).height


def _analysis_summary(job_dir: Path) -> str:
    """Run the project's ingest + analysis on a trace directory; one line of per-step medians (ns)."""
    try:
        import polars as pl

        from ep_trace.analysis import analyze
        from ep_trace.parsers import read_trace_dir

        a = analyze(read_trace_dir(job_dir))
        steps = a.steps.filter(pl.col("rank") == 0)
        cols = [
            c
            for c in ("step_time_ns", "comm_ns", "compute_ns", "overlapped_ns", "exposed_comm_ns")
            if c in steps.columns
        ]
        med = {c: int(steps[c].median()) for c in cols} if steps.height else {}
        return f"ok: {steps.height} steps, {a.stages.height} stage rows, rank-0 medians {med}"[:400]
    except Exception as exc:  # the check reports what is missing instead of dying
        return f"not run: {type(exc).__name__}: {exc}"[:300]


def compare_world(work: Path, world: int) -> dict[str, Any]:
    """Kineto vs CUPTI on rank 0 of one world size."""
    res: dict[str, Any] = {}
    try:
        kin = ingest(work / f"kineto_w{world}", "kineto").events
        res["kineto_events"] = kin.height
        res["gpu_annotations"] = compare.check_gpu_annotations(kin)
        res["kineto_comm_kernels"] = _comm_kernels(kin)
        res["kineto_stage_ns"] = compare.stage_durations(kin).rows()
        kin_k = compare.step_kernels(kin)
    except Exception as exc:
        res["kineto_error"] = f"{type(exc).__name__}: {exc}"[:500]
        return res
    try:
        cup = ingest(work / f"cupti_w{world}", "cupti").events
        res["cupti_events"] = cup.height
        res["cupti_comm_kernels"] = _comm_kernels(cup)
        res["cupti_stage_ns"] = compare.stage_durations(cup).rows()
        res["kernels_kineto_vs_cupti"] = compare.compare_kernel_lists(kin_k, compare.step_kernels(cup))
    except Exception as exc:
        res["cupti_error"] = f"{type(exc).__name__}: {exc}"[:500]
    res["analysis_kineto"] = _analysis_summary(work / f"kineto_w{world}" / "trace")
    res["analysis_cupti"] = _analysis_summary(work / f"cupti_w{world}" / "trace")
    return res


def capture_test_data(base: Any, work: Path, out: Path, timeout_s: float) -> dict[str, Any]:
    """A 3-step world-1 capture with both backends, packed as tests_data_cuda/cuda_trace.tar.gz (< 2 MB)."""
    small = dict(steps=3, warmup=2, tokens=256, hidden=128, ffn=256, experts=4, top_k=2, layers=1)
    info: dict[str, Any] = {"sizes": small}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for mode in ("kineto", "cupti"):
            job = replace(
                base,
                world=1,
                mode=mode,
                job_dir=str(work / f"testdata_{mode}"),
                port=_free_port(),
                keep_raw=(mode == "cupti"),
                **small,
            )
            r = run_job(job, timeout_s)[0]
            info[mode] = r.get("error") or "ok"
            files = sorted((Path(job.job_dir) / "trace").glob("rank0.*")) + sorted(
                Path(job.job_dir).glob("cupti_records*")
            )
            for f in files:
                tar.add(f, arcname=f"{mode}/{f.name}")
        cmd = (
            "bash benchmarks/gpu_check.sh  (benchmarks/gpu/check.py capture_test_data: world 1, "
            f"{small}, modes kineto and cupti, device {base.device})\n"
        ).encode()
        ti = tarfile.TarInfo("COMMAND.txt")
        ti.size = len(cmd)
        tar.addfile(ti, io.BytesIO(cmd))
    data = buf.getvalue()
    info["tar_bytes"] = len(data)
    if len(data) < 2 * 1024 * 1024:
        (out / "tests_data_cuda").mkdir(parents=True, exist_ok=True)
        (out / "tests_data_cuda" / "cuda_trace.tar.gz").write_bytes(data)
    else:
        info["skipped"] = "tarball >= 2 MB, not copied"
    return info


def environment(device: str) -> dict[str, Any]:
    import platform
    from importlib import metadata

    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "device": device}
    for dist_name in ("cupti-python", "polars", "ep-trace"):
        try:
            env[dist_name] = metadata.version(dist_name)
        except metadata.PackageNotFoundError:
            env[dist_name] = None
    if device == "cuda":
        env["gpus"] = torch.cuda.device_count()
        env["gpu_name"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            env["nccl"] = None
    return env


def results_block(res: dict[str, Any]) -> str:
    """The markdown block pasted into the cupti section of benchmarks/README.md."""
    env = res["env"]
    lines = [
        f"GPU check {res['date']}: {env.get('gpu_name', 'CPU dry run')} x{env.get('gpus', 0)}, torch {env['torch']}, "
        f"CUDA {env.get('cuda')}, NCCL {env.get('nccl')}, cupti-python {env.get('cupti-python')}; "
        f"{res['steps']} measured steps after {res['warmup']} warm-up, median / p95 of rank 0.",
        "",
        "| world | comm | workload | mode | median step ms | p95 ms | overhead vs none | flush ms (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for world, modes in res["jobs"].items():
        base = modes.get("none", {}).get("median_ms")
        for mode, m in modes.items():
            ratio = f"{m['median_ms'] / base:.3f}" if base and m.get("median_ms") else "-"
            lines.append(
                f"| {world} | {m.get('backend', '-')}{' (host-staged)' if m.get('staged_comm') else ''} | {m.get('workload', '-')} "
                f"| {mode} | {m.get('median_ms') or '-'} | {m.get('p95_ms') or '-'} | {ratio} | {m.get('flush_median_ms') or '-'} |"
            )
            if m.get("error"):
                lines.append(f"|  |  |  | {mode} error | {m['error'][:160]} |  |  |  |")
    for world, c in res["compare"].items():
        lines += ["", f"World {world}, rank 0, Kineto vs CUPTI:"]
        k = c.get("kernels_kineto_vs_cupti")
        if k:
            lines.append(
                f"- kernels: {k['steps']} steps, {k['kernels_a']} (Kineto) vs {k['kernels_b']} (CUPTI) kernels; "
                f"same name multiset in {k['same_multiset_steps']}/{k['steps']} steps, same order in "
                f"{k['same_sequence_steps']}; {k['paired_kernels']} paired kernels: |d duration| median "
                f"{k['median_abs_dur_diff_ns']} ns, p95 {k['p95_abs_dur_diff_ns']} ns; |d start offset in step| "
                f"median {k['median_abs_rel_start_diff_ns']} ns, p95 {k['p95_abs_rel_start_diff_ns']} ns; "
                f"duration ratio CUPTI/Kineto median {k['median_dur_ratio']}"
            )
        g = c.get("gpu_annotations")
        if g:
            lines.append(
                f"- gpu_user_annotation vs stage ranges: {g['spans']} ep: spans, {g['envelopes']} expected envelopes, "
                f"{g['matched']} matched; span - envelope start {g['start_dev_ns']} ns, end {g['end_dev_ns']} ns"
            )
        lines.append(
            f"- comm kernels (comm_classifier): Kineto {c.get('kineto_comm_kernels')}, CUPTI {c.get('cupti_comm_kernels')}"
        )
        kin_st, cup_st = (
            dict((n, v) for n, _, v in c.get("kineto_stage_ns", [])),
            dict((n, v) for n, _, v in c.get("cupti_stage_ns", [])),
        )
        if kin_st or cup_st:
            lines.append(
                "- stage envelope median us (Kineto / CUPTI): "
                + ", ".join(
                    f"{n} {kin_st.get(n, 0) / 1e3:.1f} / {cup_st.get(n, 0) / 1e3:.1f}"
                    for n in sorted(set(kin_st) | set(cup_st))
                )
            )
        for key in ("kineto_error", "cupti_error", "analysis_kineto", "analysis_cupti"):
            if c.get(key):
                lines.append(f"- {key}: {c[key]}")
    if res.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(res["skipped"])]
    td = res.get("test_data")
    if td:
        lines += ["", f"Test data: {td}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="results folder ($OUT on the device machine)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/ep_gpu_check"), help="scratch folder for traces")
    ap.add_argument("--dry-run", action="store_true", help="CPU + gloo, tiny sizes; checks the script without a GPU")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument(
        "--workload",
        choices=("auto", "reference", "builtin"),
        default="auto",
        help="auto: ep_trace.workloads.moe, else the built-in layer if it fails on the device",
    )
    ap.add_argument("--budget", type=float, default=420.0, help="seconds; later jobs are skipped (and listed) past it")
    ap.add_argument("--no-test-data", action="store_true", help="skip the small capture for tests/data")
    ap.add_argument("--job-timeout", type=float, default=120.0, help="seconds per (world, mode) job")
    args = ap.parse_args(argv)

    import torch
    from workload import Job

    device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not args.dry_run:
        print("no CUDA device visible: run with --dry-run on CPU machines", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, int] = {}
    if args.dry_run:
        sizes = dict(tokens=64, hidden=32, ffn=64, experts=4, top_k=2, layers=1)
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
    n_gpu = torch.cuda.device_count() if device == "cuda" else 0
    worlds = [1, 2] if args.dry_run else ([1, min(n_gpu, 4)] if n_gpu >= 2 else [1, 2])
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "env": environment(device),
        "steps": args.steps,
        "warmup": args.warmup,
        "sizes": sizes or "defaults of workload.Job",
        "jobs": {},
        "compare": {},
    }
    t_all = time.monotonic()
    res["skipped"] = []
    for world in worlds:
        res["jobs"][world] = {}
        for mode in MODES:
            if time.monotonic() - t_all > args.budget:
                res["skipped"].append(f"world {world} {mode}: over the {args.budget:.0f} s budget")
                continue
            job = Job(
                world=world,
                mode=mode,
                job_dir=str(args.work / f"{mode}_w{world}"),
                port=_free_port(),
                device=device,
                steps=args.steps,
                warmup=args.warmup,
                workload=args.workload,
                **sizes,
            )
            t0 = time.monotonic()
            ranks = run_job(job, args.job_timeout)
            r0 = ranks[0]
            m = {
                k: r0.get(k)
                for k in (
                    "backend",
                    "device",
                    "staged_comm",
                    "workload",
                    "reference_error",
                    "clock_offset_ns",
                    "export_ns",
                    "stage_hook_installed_by_check",
                    "error",
                )
            }
            m.update(
                median_ms=_median_ms(r0.get("times_ns", [])),
                p95_ms=_p95_ms(r0.get("times_ns", [])),
                flush_median_ms=_median_ms(r0.get("flush_ns", [])),
                wall_s=round(time.monotonic() - t0, 1),
                rank_errors=[r.get("error") for r in ranks if r.get("error")],
            )
            res["jobs"][world][mode] = m
            print(
                f"[gpu-check] world {world} {mode}: {m['median_ms']} ms/step, wall {m['wall_s']} s, error {m['error']}",
                flush=True,
            )
            _save(args.out, res, t_all)  # partial results survive a kill by the outer timeout
        res["compare"][world] = compare_world(args.work, world)
        _save(args.out, res, t_all)
    if not args.no_test_data and time.monotonic() - t_all < args.budget:
        res["test_data"] = capture_test_data(
            Job(world=1, mode="kineto", job_dir="", port=0, device=device, workload=args.workload),
            args.work,
            args.out,
            args.job_timeout,
        )
    elif not args.no_test_data:
        res["skipped"].append("test-data capture: over budget")
    block = _save(args.out, res, t_all)
    print("\n----- results block for benchmarks/README.md (cupti section) -----\n" + block, flush=True)
    return 0


def _save(out: Path, res: dict[str, Any], t_all: float) -> str:
    res["total_s"] = round(time.monotonic() - t_all, 1)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    block = results_block(res)
    (out / "results.md").write_text(block + "\n")
    return block


if __name__ == "__main__":
    raise SystemExit(main())
