"""Packed sequences for the linear families (GLA, Lightning, KDA): several sequences concatenated along T in
one batch row, their offsets in `cu_seqlens` (int32 [N + 1], as flash-attn's and fla's packed calls take them),
one initial and one final state per sequence ([N, H, K, V]).

Each sequence is a recurrence of its own: no state crosses from one sequence into the next, and each one's
chunks start at its first token, wherever that falls in the packed row. Two ways run them:

- The chunk form's kernels, forward and backward, read the offsets themselves (`packed_chunks`): one launch
  each over every sequence's chunks, the state passes one program per sequence and head, as fla's varlen
  kernels do (`prepare_chunk_indices` in fla/ops/utils/index.py). The chunk table is built on the host from
  one read of the offsets.
- The recurrent forms read the offsets on the host once per call and run the unpacked launches on each
  sequence's rows (views: the rows of one sequence in a batch-1 tensor are contiguous): one set of launches
  per sequence, which many short sequences feel.

Both wait for the GPU before the first launch (the host read), so a packed call cannot be captured in a CUDA
graph; a packed training step reads the offsets twice, in its forward and in its backward.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from ..checks import check_offset_values
from ..launch import cdiv
from .chunk import CHUNK


def sequences(cu_seqlens: torch.Tensor, T: int) -> list[tuple[int, int]]:
    """The packed sequences' (first row, end row), from one host read of the offsets, their values checked."""
    offsets = cu_seqlens.tolist()
    check_offset_values(offsets, T, name="q")
    return list(zip(offsets[:-1], offsets[1:]))


class PackedChunks(NamedTuple):
    """Packed sequences cut into chunks that each start at their sequence's first token CHUNK·i: cu_seqlens
    (int32 [N + 1]); chunk_indices (int32 [NC, 2]), chunk c's (sequence, index in it), in order; chunk_offsets
    (int32 [N + 1]), each sequence's first chunk among the NC; n_chunks = NC; n_sequences = N."""
    cu_seqlens: torch.Tensor
    chunk_indices: torch.Tensor
    chunk_offsets: torch.Tensor
    n_chunks: int
    n_sequences: int


def packed_chunks(cu_seqlens: torch.Tensor | None, T: int) -> PackedChunks | None:
    """The chunk table of packed sequences, from one host read of their offsets (checked against T, the
    packed length): what the chunk kernels' `chunk_at` and `sequence_at` read. An empty sequence has no chunk.
    cu_seqlens None (a dense batch): None, which the chunk kernels' launchers take as no table.

        >>> packed_chunks(torch.tensor([0, 70, 70, 100], dtype=torch.int32), 100).chunk_indices.tolist()
        [[0, 0], [0, 1], [2, 0]]
    """
    if cu_seqlens is None:
        return None
    spans = sequences(cu_seqlens, T)
    counts = [cdiv(end - start, CHUNK) for start, end in spans]
    offsets = [0]
    for n in counts:
        offsets.append(offsets[-1] + n)
    table = [(i, c) for i, n in enumerate(counts) for c in range(n)]
    device = cu_seqlens.device
    indices = torch.tensor(table, dtype=torch.int32).reshape(-1, 2).to(device)
    return PackedChunks(cu_seqlens.to(torch.int32).contiguous(), indices,
                        torch.tensor(offsets, dtype=torch.int32, device=device), offsets[-1], len(spans))


def _rows(tensors, start: int, end: int) -> tuple:
    return tuple(t[:, start:end] for t in tensors)


def forward_per_sequence(forward: Callable, rows: tuple, v: torch.Tensor, h0, output_final_state: bool,
                         cu_seqlens: torch.Tensor):
    """Run `forward(rows_n, h0_n, output_final_state) -> (o_n, ht_n)` on each packed sequence.

    rows: the per-token tensors (q, k, v and the gates, [1, T, ...]), cut to each sequence's rows; v gives
    o's shape and dtype; h0: fp32 [N, H, K, V] or None. Returns (o [1, T, H, V], final states fp32
    [N, H, K, V] or None). An empty sequence ends in the state it starts from.
    """
    H, K, V = rows[0].shape[2], rows[0].shape[3], v.shape[3]
    spans = sequences(cu_seqlens, v.shape[1])
    o = torch.empty_like(v)
    ht = torch.empty(len(spans), H, K, V, dtype=torch.float32, device=v.device) if output_final_state else None
    for n, (start, end) in enumerate(spans):
        h0_n = None if h0 is None else h0[n:n + 1]
        if start == end:
            if ht is not None:
                ht[n] = 0.0 if h0_n is None else h0_n[0]
            continue
        o_n, ht_n = forward(_rows(rows, start, end), h0_n, output_final_state)
        o[:, start:end] = o_n
        if ht is not None:
            ht[n] = ht_n[0]
    return o, ht


__all__ = ["PackedChunks", "packed_chunks", "sequences", "forward_per_sequence"]
