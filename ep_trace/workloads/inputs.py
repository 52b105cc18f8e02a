"""The demo's inputs per (rank, step, layer): tokens and the routing bias that realises ``--skew``.

Everything is deterministic from ``seed``: tokens and routing noise from ``(seed, rank, step, layer)``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ep_trace.workloads.knobs import skew_probabilities

if TYPE_CHECKING:
    from ep_trace.workloads.config import DemoConfig

__all__ = ["routing_bias", "step_tokens", "seed_of"]

#: Selection bias that puts an expert into (or keeps it out of) a token's top-k whatever its logit
#: (router logits of the demo are O(1)).
_FORCE = 1e4


def seed_of(*parts: int) -> int:
    """A fixed mixing of ``parts`` into a generator seed (Python's hash() of ints is stable, but be explicit)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFF)) * 1099511628211) % (1 << 63)
    return h


def routing_bias(cfg: DemoConfig, rank: int, step: int, layer: int) -> Any:
    """``[tokens, E]`` selection bias realising the step's routing workload (``cfg.skew_at(step)``).

    ``uniform`` / ``zipf``: Gumbel-top-k over the target distribution (adding Gumbel noise to
    ``log p_e`` and taking the top k samples k distinct experts with probabilities p, without
    replacement). ``hot:E:S`` forces expert E into a token's top-k with probability ``S * k`` (so E
    gets the fraction S of all assignments) and routes the rest uniformly. The hot-set kinds
    (:data:`ep_trace.workloads.knobs.HOT_SET_KINDS`) draw each token's k experts so that expert e
    is chosen with probability exactly ``k * p_e`` (:func:`_exact_choice`), so the load shape of
    :func:`ep_trace.workloads.knobs.skew_probabilities` holds in expectation for every expert.
    """
    import torch

    g = torch.Generator().manual_seed(seed_of(cfg.seed, rank, step, layer))
    sk = cfg.skew_at(step).at(step)
    if sk.hot_set(cfg.experts, step, rank) is not None:
        chosen = _exact_choice(g, cfg.tokens, skew_probabilities(sk, cfg.experts, step, rank), cfg.top_k)
        return torch.full((cfg.tokens, cfg.experts), -_FORCE).scatter_(1, chosen, _FORCE)
    u = torch.rand(cfg.tokens, cfg.experts, generator=g).clamp_(1e-12, 1 - 1e-7)
    gumbel = -torch.log(-torch.log(u))
    if sk.kind == "hot":
        force = torch.rand(cfg.tokens, generator=g) < min(1.0, sk.share * cfg.top_k)
        gumbel[:, sk.expert] += force.to(gumbel.dtype) * _FORCE - (~force).to(gumbel.dtype) * _FORCE
        return gumbel
    logp = torch.tensor([math.log(p) for p in skew_probabilities(sk, cfg.experts)])
    return gumbel + logp


def _exact_choice(g: Any, tokens: int, probs: list[float], k: int) -> Any:
    """``[tokens, k]`` distinct experts per token, expert e included with probability exactly ``k * probs[e]``.

    Systematic sampling: the experts, in a random order per token, tile ``[0, k)`` with intervals of
    length ``pi_e = k * p_e <= 1``; the points ``u, u + 1, ..., u + k - 1`` (u uniform in [0, 1)) hit
    k different intervals (none is longer than the points' spacing), each with probability ``pi_e``.
    A zero-share expert has an empty interval and is never chosen.
    """
    import torch

    pi = torch.tensor(probs, dtype=torch.float64) * k
    perm = torch.argsort(torch.rand(tokens, pi.numel(), generator=g), dim=1)
    cum = torch.cumsum(pi[perm], dim=1)
    points = torch.rand(tokens, 1, generator=g, dtype=torch.float64) + torch.arange(k, dtype=torch.float64)
    idx = torch.searchsorted(cum, points, right=True).clamp_(max=pi.numel() - 1)
    return torch.gather(perm, 1, idx)


def step_tokens(cfg: DemoConfig, rank: int, step: int) -> Any:
    """``[tokens, hidden]`` input activations of ``rank`` at ``step``."""
    import torch

    g = torch.Generator().manual_seed(seed_of(cfg.seed, rank, step, 1 << 20))
    return torch.randn(cfg.tokens, cfg.hidden, generator=g)
