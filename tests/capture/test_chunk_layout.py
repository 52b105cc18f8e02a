"""The pipelined path's chunk-major layout (workloads.moe._chunk_major) against a brute-force reference."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ep_trace.workloads.moe import _chunk_bounds, _chunk_major, _chunk_splits


def _reference(sizes: list[int], chunks: int) -> list[int]:
    """Chunk c = rows ``_chunk_bounds(n_j)[c] .. [c+1]`` of each peer j's segment, peers in order."""
    offsets = [sum(sizes[:j]) for j in range(len(sizes))]
    bounds = [_chunk_bounds(n, chunks) for n in sizes]
    return [
        offsets[j] + i for c in range(chunks) for j in range(len(sizes)) for i in range(bounds[j][c], bounds[j][c + 1])
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=6), st.integers(1, 9))
def test_chunk_major_is_the_chunks_in_order(sizes: list[int], chunks: int) -> None:
    perm = _chunk_major(torch.tensor(sizes), chunks).tolist()
    assert perm == _reference(sizes, chunks)
    # the splits the calls use: chunk c's slice holds splits[c][j] rows of peer j, peer after peer
    offsets = [sum(sizes[:j]) for j in range(len(sizes))]
    peer_of = [max(j for j in range(len(sizes)) if offsets[j] <= row) for row in perm]
    pos = 0
    for split in _chunk_splits(sizes, chunks):
        part = peer_of[pos : pos + sum(split)]
        assert part == sorted(part) and [part.count(j) for j in range(len(sizes))] == split
        pos += sum(split)
    assert pos == sum(sizes)


def test_worked_example() -> None:
    # peer 0 sends 5 rows, peer 1 sends 3, 2 chunks: chunk 0 = rows 0,1 of peer 0 and row 0 of peer 1
    assert _chunk_major(torch.tensor([5, 3]), 2).tolist() == [0, 1, 5, 2, 3, 4, 6, 7]
    assert _chunk_splits([5, 3], 2) == [[2, 1], [3, 2]]
