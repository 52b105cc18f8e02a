"""How far each what-if's saving has been checked against a rerun: the measured error the report shows.

A saving is a figure people act on, so the report says next to it how well the model's prediction
of that scenario has matched reality, and where it has not been checked at all. The figures come from
``benchmarks/whatif_validate.py`` (paired demo runs with the same seed, A with the cause and B without
it; benchmarks/README.md, section "whatif-validation"): 2 gloo ranks on the 2-vCPU CI VM, ranks on
jemalloc. They are figures of this model on that machine, not a bound for every trace; a GPU job has
not been checked (no GPU was lent). Update them here, and only here, when a stop re-measures them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RerunCheck", "RERUN_CHECKS", "check_text", "rerun_error_pct"]


@dataclass(frozen=True)
class RerunCheck:
    """The rerun check of one what-if.

    Attributes:
        scenario: ``whatif.scenario``.
        error_lo_pct: Smallest |predicted - measured| / |measured| over the sets of runs, percent.
        error_hi_pct: Largest, percent.
        pair: The A/B pair the figures come from, in words.
        caveat: What the error means for the figure ('' when nothing beyond the range).
    """

    scenario: str
    error_lo_pct: float
    error_hi_pct: float
    pair: str
    caveat: str = ""

    @property
    def range_text(self) -> str:
        """The error range as the report prints it, e.g. ``'2-12 %'``."""
        return f"{self.error_lo_pct:.0f}-{self.error_hi_pct:.0f} %"


#: Stop 22-26 figures (benchmarks/README.md "Stop 23" .. "Stop 26"), 2-vCPU AMD EPYC VM, 2026-12-03 .. 2026-12-06.
#: ``no_straggler`` and ``balanced_routing``: every set since stop 22 (the model is unchanged; since stop 25
#: the demo runs gloo's threads on SCHED_FIFO). ``chunked_pipeline``: the sets since stop 25 (the model
#: prices the calls' post since then, and the demo's pipeline has no per-chunk gather), measured as the
#: median of neighbouring-step differences since stop 26 (the two kept stop-25 sets re-measured so).
#: ``placement`` and ``node_local``: stop 27 (2026-12-06, in-run A/B of the proposal written by
#: ``--propose-placement``, 5 runs x 10 steps, quiet machine but for ~45 s of one other process).
RERUN_CHECKS: dict[str, RerunCheck] = {
    c.scenario: c
    for c in (
        RerunCheck(
            "no_straggler", 0.7, 17.3, "--straggler 1:30 vs none on 2 ranks, and the README example on 4, 5 + 5 runs"
        ),
        RerunCheck("balanced_routing", 4.0, 25.6, "--skew hot:1:0.45 vs uniform on 2 ranks, 40-160 steps each"),
        RerunCheck(
            "chunked_pipeline",
            1.4,
            32.2,
            "--chunks 4 / 8 vs 1 on 2 ranks, 60-100 neighbouring step pairs",
            "at 4 chunks and 2048 tokens 1.4-12.7 % in 4 of 4 sets; at 512 tokens the measured cost was 1.12-1.30x "
            "the predicted one (small pieces of an expert's rows cost more per row than a 1-chunk trace shows), at "
            "8 chunks 0.76-0.89x: read the saving to about ±30 %",
        ),
        RerunCheck(
            "placement",
            4.1,
            22.0,
            "the proposal vs contiguous experts on 2 ranks at 2048 tokens, hot / hotset / zipf:1.2 routing, 50 step pairs",
            "under uniform routing predicted 0.0 ms and measured 3.1 ms slower; the model prices moved rows at the "
            "receiving rank's measured cost per row, which moves with other load on the machine",
        ),
        RerunCheck(
            "node_local",
            0.8,
            7.8,
            "the proposal vs contiguous experts on 4 ranks in 2 emulated nodes (1-5 ms per cross-node call), 50 step pairs",
        ),
    )
}


def check_text(scenario: str) -> str:
    """One line for the report: the measured error of ``scenario``'s saving, or that it is unchecked."""
    c = RERUN_CHECKS.get(scenario)
    if c is None:
        return "not checked against a rerun"
    text = f"{c.range_text} error ({c.pair}; gloo, benchmarks/README.md)"
    return f"{text}; {c.caveat}" if c.caveat else text


def rerun_error_pct(scenario: str) -> list[float] | None:
    """``[lowest, highest]`` measured error of ``scenario``'s saving against reruns, percent; None
    when it has not been checked (the summary's ``whatif[].rerun_error_pct``)."""
    c = RERUN_CHECKS.get(scenario)
    return None if c is None else [c.error_lo_pct, c.error_hi_pct]
