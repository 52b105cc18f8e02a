"""Reference stage busy times of the three vLLM MoE traces of this folder, from the trace alone.

Standard library only; no ep-trace code. Busy = |union of the stage's kernel intervals| per MoE layer,
ns (``ts`` / ``dur`` are µs with a ns fraction: rounded to ns).

* ``b200_eager`` (vLLM, gpt-oss, NVIDIA B200, FlashInfer trtllm-gen MoE, eager, ``with_stack``): a layer
  is one ``nn.Module: MLPBlock_<n>`` frame (gpt-oss's MoE block in vllm/model_executor/models/gpt_oss.py:
  ``self.router = torch.nn.Linear``, ``self.experts = FusedMoE``). A kernel belongs to the frame that
  encloses its launch (the ``cuda_runtime`` / ``cuda_driver`` row with the kernel's ``correlation``) on
  the launching thread. route = the kernels launched inside the ``nn.Module: Linear_<n>`` router frame,
  and ``routingIndicesHistogramScoresKernel`` (top-k); permute = ``routingIndicesHistogramKernel``,
  ``routingIndicesOffsetsKernel``; unpermute = ``moe::dev::finalize::*``; combine = the
  ``multimem_all_reduce_kernel`` (the tensor-parallel reduction of the layer's output); expert = every
  other kernel launched inside the ``FusedMoE`` frame (activation quantisation, the two ``bmm_*`` GEMMs).
* ``mi300_decode_graph`` / ``mi300_prefilldecode_graph`` (vLLM, gpt-oss, AMD gfx942, triton_kernels MoE,
  HIP-graph replay: no launch rows): a layer runs from a ``_topk_forward`` kernel to the next
  ``_finalize_matmul*``; route = ``_topk_forward``; permute = ``_sum_bitmatrix_rows``,
  ``_combined_routing_*``; expert = ``_matmul_ogs_*``; unpermute = ``_finalize_matmul*``
  (triton-lang/triton python/triton_kernels).

Run ``python tests/data/tracelens_vllm/reference.py``; it writes ``<trace folder>/reference.json``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _events(path: Path) -> list[dict]:
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    x = [e for e in ev if e.get("ph") == "X"]
    for e in x:
        e["s"], e["e"] = round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)
    return x


def _union(ivs: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(ivs):
        if end is None or s > end:
            total, end = total + e - s, e
        elif e > end:
            total, end = total + e - end, e
    return total


def _rows(layers: list[dict[str, list[tuple[int, int]]]]) -> list[dict]:
    return [
        {"layer": i, "stage": st, "busy_ns": _union(ivs)}
        for i, layer in enumerate(layers)
        for st, ivs in sorted(layer.items())
    ]


def b200_eager() -> list[dict]:
    x = _events(HERE / "b200_eager" / "eager_trace.json.gz")
    launch = {
        e["args"]["correlation"]: (e["s"], e["tid"])
        for e in x
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    frames = [e for e in x if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")]
    blocks = sorted((f for f in frames if f["name"].startswith("nn.Module: MLPBlock_")), key=lambda f: f["s"])
    kernels = [k for k in x if k.get("cat") == "kernel" and k.get("args", {}).get("correlation") in launch]
    layers = []
    for b in blocks:
        inside = [f for f in frames if f["tid"] == b["tid"] and b["s"] <= f["s"] and f["e"] <= b["e"]]
        router = [f for f in inside if f["name"].startswith("nn.Module: Linear_")]
        experts = [f for f in inside if f["name"].startswith("nn.Module: FusedMoE_")]
        layer: dict[str, list[tuple[int, int]]] = {}
        for k in kernels:
            t, tid = launch[k["args"]["correlation"]]
            if tid != b["tid"] or not b["s"] <= t <= b["e"]:
                continue
            n = k["name"]
            if any(f["s"] <= t <= f["e"] for f in router) or "routingIndicesHistogramScoresKernel" in n:
                stage = "route"
            elif "routingIndicesHistogramKernel<" in n or "routingIndicesOffsetsKernel<" in n:
                stage = "permute"
            elif "moe::dev::finalize::" in n:
                stage = "unpermute"
            elif "multimem_all_reduce_kernel" in n:
                stage = "combine"
            elif any(f["s"] <= t <= f["e"] for f in experts):
                stage = "expert"
            else:
                continue
            layer.setdefault(stage, []).append((k["s"], k["e"]))
        layers.append(layer)
    return _rows(layers)


def graph(folder: str) -> list[dict]:
    x = _events(HERE / folder / "graph_execution.json.gz")
    kernels = sorted((k for k in x if k.get("cat") == "kernel"), key=lambda k: k["s"])
    stage_of = {
        "_topk_forward": "route",
        "_sum_bitmatrix_rows": "permute",
        "_combined_routing_": "permute",
        "_matmul_ogs_": "expert",
        "_finalize_matmul": "unpermute",
    }
    layers: list[dict[str, list[tuple[int, int]]]] = []
    open_ = False
    for k in kernels:
        stage = next((st for prefix, st in stage_of.items() if k["name"].startswith(prefix)), None)
        if stage == "route":
            layers.append({})
            open_ = True
        if open_ and stage is not None:
            layers[-1].setdefault(stage, []).append((k["s"], k["e"]))
        if stage == "unpermute":
            open_ = False
    return _rows(layers)


def _write(folder: str, rows: list[dict]) -> None:
    doc = {"source": "tests/data/tracelens_vllm/reference.py (standard library only)", "unit": "ns", "stages": rows}
    (HERE / folder / "reference.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    _write("b200_eager", b200_eager())
    _write("mi300_decode_graph", graph("mi300_decode_graph"))
    _write("mi300_prefilldecode_graph", graph("mi300_prefilldecode_graph"))
