"""Per-rank worker of the GPU check: one MoE EP workload, timed under one capture mode.

Modes: ``none`` (no capture), ``kineto`` (:class:`ep_trace.Tracer`), ``cupti``
(:class:`ep_trace.capture.cupti.collector.CuptiCollector`). The workload is the reference EP layer of
``ep_trace.workloads.moe`` (route -> ep_moe_forward per layer) when it runs on the device; if it
raises there (it was written and tested on gloo/CPU), a built-in EP layer with the same stages and
the same ``stage()`` names is used instead and the result says so. With more ranks than GPUs, NCCL
cannot run (one device per rank), so communication falls back to gloo with CUDA compute, the
tensors staged through host memory (what the issue allows).

Runs inside ``torch.multiprocessing`` children started by ``check.py``; writes
``<job_dir>/timing_rank{r}.json``; traces go to ``<job_dir>/trace/`` (only trace files there, so
the directory reader sees nothing else).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Job:
    """One (world size, capture mode) run."""

    world: int
    mode: str  # none | kineto | cupti
    job_dir: str
    port: int
    device: str  # cuda | cpu
    steps: int = 20
    warmup: int = 5
    tokens: int = 4096
    hidden: int = 1024
    ffn: int = 2048
    experts: int = 8
    top_k: int = 2
    layers: int = 2
    keep_raw: bool = False
    workload: str = "auto"  # auto (reference, else builtin) | reference | builtin


def _backend(job: Job) -> str:
    if job.device == "cuda" and torch.cuda.device_count() >= job.world:
        return "nccl"
    return "gloo"


def _a2a(
    out: torch.Tensor, inp: torch.Tensor, out_splits: list[int] | None, in_splits: list[int] | None, staged: bool
) -> None:
    """all_to_all_single; with ``staged`` (gloo + CUDA tensors) through host copies."""
    if not staged:
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        return
    host_out = torch.empty(out.shape, dtype=out.dtype)
    dist.all_to_all_single(host_out, inp.cpu(), out_splits, in_splits)
    out.copy_(host_out.to(out.device))


def builtin_step(job: Job, dev: torch.device, staged: bool) -> Callable[[], torch.Tensor]:
    """A self-contained EP MoE forward (route, permute, dispatch, expert, combine, unpermute)."""
    from ep_trace.capture.stages import stage

    W, E, k, H, F, T = job.world, job.experts, job.top_k, job.hidden, job.ffn, job.tokens
    L = E // W
    me = dist.get_rank()
    g = torch.Generator().manual_seed(7)
    layers = []
    for _ in range(job.layers):
        router = (torch.randn(H, E, generator=g) / H**0.5).to(dev)
        w1 = (torch.randn(E, H, F, generator=g) / H**0.5)[me * L : (me + 1) * L].contiguous().to(dev)
        w2 = (torch.randn(E, F, H, generator=g) / F**0.5)[me * L : (me + 1) * L].contiguous().to(dev)
        layers.append((router, w1, w2))
    x0 = torch.randn(T, H, generator=torch.Generator().manual_seed(100 + me)).to(dev)
    local_ids = torch.arange(L, device=dev).repeat(W)

    def step() -> torch.Tensor:
        x = x0
        for li, (router, w1, w2) in enumerate(layers):
            with stage("route", li):
                logits = x @ router
                ids = logits.topk(k, dim=-1).indices
                gate = torch.softmax(logits.gather(1, ids), dim=-1)
            with stage("permute", li):
                flat = ids.reshape(-1)
                order = torch.argsort(flat, stable=True)
                counts = torch.bincount(flat, minlength=E)
                send_x = x.index_select(0, order // k)
            with stage("dispatch", li):
                recv_counts = torch.empty_like(counts)
                _a2a(recv_counts, counts, None, None, staged)
                # Host sync on the split sizes, as every variable-size EP dispatch does.
                send_splits = counts.view(W, L).sum(1).tolist()
                recv_splits = recv_counts.view(W, L).sum(1).tolist()
                recv_x = x.new_empty(sum(recv_splits), H)
                _a2a(recv_x, send_x, recv_splits, send_splits, staged)
            with stage("expert", li):
                eid = torch.repeat_interleave(local_ids, recv_counts)
                per_e = torch.bincount(eid, minlength=L).tolist()
                o = torch.argsort(eid, stable=True)
                out = torch.empty_like(recv_x)
                start = 0
                for e, n in enumerate(per_e):
                    if n:
                        idx = o[start : start + n]
                        out[idx] = torch.nn.functional.gelu(recv_x.index_select(0, idx) @ w1[e]) @ w2[e]
                        start += n
            with stage("combine", li):
                back = x.new_empty(T * k, H)
                _a2a(back, out, send_splits, recv_splits, staged)
            with stage("unpermute", li):
                slots = torch.empty_like(back)
                slots[order] = back
                x = (slots.view(T, k, H) * gate.unsqueeze(-1)).sum(1)
        return x

    return step


def reference_step(job: Job, dev: torch.device) -> Callable[[], torch.Tensor]:
    """The project's reference EP layer (``ep_trace.workloads.moe``) on ``dev``."""
    from ep_trace.capture.stages import stage
    from ep_trace.workloads.moe import ep_moe_forward, local_experts, make_layer_weights, route

    W, me = job.world, dist.get_rank()
    L = job.experts // W
    ws = []
    for li in range(job.layers):
        w = local_experts(make_layer_weights(job.hidden, job.ffn, job.experts, seed=0, layer=li), me * L, L)
        ws.append(type(w)(w.router.to(dev), w.w1.to(dev), w.w2.to(dev), w.first_expert))
    x0 = torch.randn(job.tokens, job.hidden, generator=torch.Generator().manual_seed(100 + me)).to(dev)

    def step() -> torch.Tensor:
        x = x0
        for li, w in enumerate(ws):
            with stage("route", li):
                ids, gate = route(x, w.router, job.top_k)
            x = ep_moe_forward(x, w, ids, gate, num_experts=job.experts, layer=li)  # type: ignore[assignment]
        return x

    return step


def _install_cupti_stage_hook() -> bool:
    """Make ``stage()`` push/pop CUPTI external-correlation ranges, unless ep_trace already does.

    ``ep_trace.capture.stages`` has the ``_CUPTI`` slot since the integration; this shim only matters when the
    check runs against an older checkout without it.
    """
    import inspect

    from ep_trace.capture import stages
    from ep_trace.capture.cupti.collector import active

    if "cupti" in inspect.getsource(stages):
        return False
    enter, exit_ = stages.stage.__enter__, stages.stage.__exit__

    def __enter__(self: Any) -> Any:
        r = enter(self)
        c = active()
        if c is not None:
            c.range_push(self.name)
        return r

    def __exit__(self: Any, *exc: object) -> None:
        c = active()
        if c is not None:
            c.range_pop()
        exit_(self, *exc)

    stages.stage.__enter__ = __enter__  # type: ignore[method-assign]
    stages.stage.__exit__ = __exit__  # type: ignore[method-assign]
    return True


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def worker(rank: int, job: Job) -> None:
    """Entry point of one rank (``torch.multiprocessing`` passes ``rank`` first)."""
    root = Path(job.job_dir)
    out = root / "trace"
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"rank": rank, "job": asdict(job), "times_ns": [], "flush_ns": [], "error": None}
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(job.port), LOCAL_RANK=str(rank))
        backend = _backend(job)
        if job.device == "cuda":
            dev = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(dev)
        else:
            dev = torch.device("cpu")
        dist.init_process_group(backend, rank=rank, world_size=job.world)
        staged = backend == "gloo" and dev.type == "cuda"
        res.update(backend=backend, device=str(dev), staged_comm=staged)
        step = None
        if job.workload in ("auto", "reference"):
            try:
                step = reference_step(job, dev)
                step()
                res["workload"] = "ep_trace.workloads.moe"
            except Exception as exc:  # the reference layer may not run on CUDA yet: say so, use the built-in one
                if job.workload == "reference":
                    raise
                step = None
                res["reference_error"] = f"{type(exc).__name__}: {exc}"[:500]
        if step is None:
            res["workload"] = "builtin"
            step = builtin_step(job, dev, staged)
        for _ in range(job.warmup):
            step()
        _sync(dev)
        dist.barrier()
        times, flushes = res["times_ns"], res["flush_ns"]
        if job.mode == "none":
            for _ in range(job.steps):
                t0 = time.perf_counter_ns()
                step()
                _sync(dev)
                times.append(time.perf_counter_ns() - t0)
        elif job.mode == "kineto":
            from ep_trace.capture.tracer import Tracer

            tracer = Tracer(out, job_id=f"gpu-check-{job.world}")
            for _ in range(job.steps):
                with tracer.step():
                    t0 = time.perf_counter_ns()
                    step()
                    _sync(dev)
                    times.append(time.perf_counter_ns() - t0)
            t0 = time.perf_counter_ns()
            tracer.close()
            res["export_ns"] = time.perf_counter_ns() - t0
        elif job.mode == "cupti":
            from ep_trace.capture.cupti.collector import CuptiCollector, CuptiConfig

            res["stage_hook_installed_by_check"] = _install_cupti_stage_hook()
            c = CuptiCollector(
                out, rank, CuptiConfig(keep_raw=job.keep_raw), world_size=job.world, job_id=f"gpu-check-{job.world}"
            )
            c.start()
            try:
                for s in range(job.steps):
                    t0 = time.perf_counter_ns()
                    step()
                    _sync(dev)
                    times.append(time.perf_counter_ns() - t0)
                    t1 = time.perf_counter_ns()
                    c.step_end(s)
                    flushes.append(time.perf_counter_ns() - t1)
            finally:
                c.stop()
            res["clock_offset_ns"] = c.clock_offset_ns
            if job.keep_raw:
                raw = {"rank": rank, "clock_offset_ns": c.clock_offset_ns, **c.raw}
                (root / f"cupti_records_rank{rank}.json").write_text(json.dumps(raw))
        dist.barrier()
        dist.destroy_process_group()
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
    (root / f"timing_rank{rank}.json").write_text(json.dumps(res))
