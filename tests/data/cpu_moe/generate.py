"""Generate the two CPU-only plain-PyTorch MoE traces of this folder (torch.profiler, no ep-trace hooks).

* ``switch_frames/rank0.pt.trace.json.gz``: a Switch-Transformer MoE in the style of
  kyegomez/SwitchTransformers (``SwitchGate`` = linear + softmax + top-1 + capacity mask,
  ``FeedForward`` experts in an ``nn.ModuleList`` run densely on every token, then the gate-weighted
  sum of the stacked outputs), profiled with ``with_stack=True``: the ``nn.Module`` frames are there.
* ``mixtral_ops/rank0.pt.trace.json.gz``: a Mixtral-style top-2 MoE written with functional ops
  (gate ``linear`` -> ``softmax`` -> ``topk`` -> renormalise -> ``one_hot``; per expert ``where``,
  ``index``, ``linear`` / ``silu`` / ``linear``, the weighting and ``index_add_``), the experts' weights
  plain parameters of one ``Layer`` module: no router or expert module frame exists, only the ops
  (tier ``cpu_op``); ``with_stack=True`` and ``record_shapes=True`` as asked.

Each model has two MoE layers with a dense attention-like block (linear, softmax, linear) before each,
so a softmax and linears outside the MoE layers exist and must get no MoE stage. Three profiler steps
(after one warm-up step the schedule does not record). Run from the repository root::

    python tests/data/cpu_moe/generate.py

then ``python tests/data/cpu_moe/reference.py`` for the reference figures. Written with torch 2.13 (CPU).
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
DIM, HIDDEN, EXPERTS, TOKENS = 64, 128, 4, 256


class Attention(nn.Module):
    """A dense block with a softmax and linears outside every MoE layer."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return x + self.out(torch.softmax(q @ k.t() / DIM**0.5, dim=-1) @ v)


class SwitchGate(nn.Module):
    def __init__(self, capacity_factor: float = 1.25) -> None:
        super().__init__()
        self.w_gate = nn.Linear(DIM, EXPERTS)
        self.capacity = int(capacity_factor * TOKENS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = F.softmax(self.w_gate(x), dim=-1)
        _, idx = scores.topk(1, dim=-1)
        mask = torch.zeros_like(scores).scatter_(1, idx, 1)
        masked = scores * mask
        return masked / (masked.sum(0, keepdim=True) + 1e-6) * self.capacity


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SwitchMoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = SwitchGate()
        self.experts = nn.ModuleList([FeedForward() for _ in range(EXPERTS)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate(x)
        stacked = torch.stack([e(x) for e in self.experts], dim=-1)
        return torch.sum(gate.unsqueeze(-2) * stacked, dim=-1)


class Layer(nn.Module):
    """Mixtral-style top-2 MoE with functional ops (no router or expert sub-module)."""

    def __init__(self) -> None:
        super().__init__()
        self.wg = nn.Parameter(torch.randn(EXPERTS, DIM) / DIM**0.5)
        self.w1 = nn.Parameter(torch.randn(EXPERTS, HIDDEN, DIM) / DIM**0.5)
        self.w2 = nn.Parameter(torch.randn(EXPERTS, DIM, HIDDEN) / HIDDEN**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(F.linear(x, self.wg), dim=-1)
        weights, sel = torch.topk(probs, 2, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        mask = F.one_hot(sel, EXPERTS).permute(2, 1, 0)
        out = torch.zeros_like(x)
        for e in range(EXPERTS):
            slot, tok = torch.where(mask[e])
            h = F.linear(F.silu(F.linear(x[tok], self.w1[e])), self.w2[e])
            out.index_add_(0, tok, h * weights[tok, slot, None])
        return out


def _profile(model: nn.Module, out: Path) -> None:
    x = torch.randn(TOKENS, DIM)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "rank0.pt.trace.json"
    sched = torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1)
    with (
        torch.no_grad(),
        torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=sched,
            on_trace_ready=lambda p: p.export_chrome_trace(str(raw)),
            with_stack=True,
            record_shapes=True,
        ) as prof,
    ):
        for _ in range(5):
            model(x)
            prof.step()
    with raw.open("rb") as src, gzip.open(out / "rank0.pt.trace.json.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    switch = nn.Sequential(Attention(), SwitchMoE(), Attention(), SwitchMoE())
    mixtral = nn.Sequential(Attention(), Layer(), Attention(), Layer())
    _profile(switch, HERE / "switch_frames")
    _profile(mixtral, HERE / "mixtral_ops")


if __name__ == "__main__":
    main()
