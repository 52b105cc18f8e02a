"""Real-looking Kineto chrome traces for the step tests: modern keys (``baseTimeNanoseconds``, relative µs),
``user_annotation`` / ``gpu_user_annotation`` / ``cuda_runtime`` / ``kernel`` / ``gpu_memcpy`` rows linked by
``args.correlation`` as torch.profiler writes them (kineto libkineto/src/output_json.cpp). Names are real:

* SGLang's forward range ``step[DECODE bs=16]`` (sgl-project/sglang python/sglang/srt/utils/profile_utils.py
  ``build_step_span_name``), vLLM's ``execute_context_1(512)_generation_0(0)`` (vllm/v1/worker/gpu_worker.py
  ``annotate_profile``);
* NVIDIA kernels of the B300 TraceLens MoE traces (../shared/external/kineto/tracelens_moe_micro):
  ``nvjet_sm103_tst_64x8_64x16_1x4_h_bz_TNT``, ``softmax_warp_forward``; MI300X kernels of AMD's SGLang
  decode trace (tests/data/tracelens_rocm): ``_ZN5aiter24add_rmsnorm_quant_kernel...``, ``Cijk_Alik_Bljk_...``,
  ``rotary_embedding_kernel``;
* runtime calls: ``cudaGraphLaunch`` / ``cudaLaunchKernel`` / ``cudaMemcpyAsync`` (CUDA runtime),
  ``hipGraphLaunch`` / ``hipLaunchKernel`` (HIP, as roctracer names them in the MI300X traces).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

BASE = 1_700_000_000_000_000_000
HOST_PID, HOST_TID = 4242, 4242

NV_KERNELS = (
    "nvjet_sm103_tst_64x8_64x16_1x4_h_bz_TNT",
    "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 1, false, false>"
    "(c10::BFloat16*, c10::BFloat16 const*, int, int, int, bool const*, int, bool)",
    "nvjet_sm103_tst_256x8_64x6_2x1_v_bz_NNT",
    "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)",
)
AMD_KERNELS = (
    "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi64ELi8ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
    "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT64x32x256_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1",
    "void rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*, "
    "c10::BFloat16 const*, int, long, long, long, int, int, int)",
    "void (anonymous namespace)::store_kvcache<2048l, 4, false, long>((anonymous namespace)::StoreKVCacheParams)",
)


class Trace:
    """One rank's events, built call by call (times in µs from the trace start)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._corr = 1000

    def x(self, cat: str, name: str, ts: float, dur: float, pid: Any = HOST_PID, tid: Any = HOST_TID, **args: Any):
        ev: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
        if args:
            ev["args"] = args
        self.events.append(ev)
        return self

    def annotation(self, name: str, ts: float, dur: float, gpu: tuple[float, float] | None = None, stream: int = 7):
        """A ``record_function`` range and, where it launched device work, its GPU copy over that work."""
        self.x("user_annotation", name, ts, dur)
        if gpu is not None:
            self.x("gpu_user_annotation", name, gpu[0], gpu[1] - gpu[0], pid=0, tid=stream)
        return self

    def launch(self, call: str, ts: float, dur: float, work: list[tuple[str, float, float]], stream: int = 7):
        """One runtime call (``cudaGraphLaunch`` replays several kernels, all with its correlation id) and
        the device rows ``(name, start, end)`` it launched (``Memcpy ...`` names are copies)."""
        self._corr += 1
        self.x("cuda_runtime", call, ts, dur, correlation=self._corr)
        for name, s, e in work:
            cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
            self.x(cat, name, s, e - s, pid=0, tid=stream, correlation=self._corr, stream=stream, device=0)
        return self

    def write(self, path: Path, rank: int = 0, world_size: int = 1, **header: Any) -> Path:
        doc = {
            "schemaVersion": 1,
            "deviceProperties": [],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
            "traceEvents": self.events,
            "baseTimeNanoseconds": BASE,
            **header,
        }
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
        return path


def us(t: float) -> int:
    """µs from the trace start -> the ns the parser gives it."""
    return BASE + round(t * 1000)
