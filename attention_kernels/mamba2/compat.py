"""mamba_ssm's call on the SSD chunk scan, `mamba_chunk_scan_combined`, onto the book's `ssd_chunk_scan`.

mamba_ssm (mamba_ssm/ops/triton/ssd_combined.py) and the book differ in how packed sequences are named:
there the sequence a row belongs to is seq_idx, a number per row [batch, seqlen], and cu_seqlens is read
only for the per-sequence states (return_varlen_states); here the offsets cu_seqlens say it all. This
module turns one into the other on the host, and applies mamba_ssm's clamp of dt (dt_limit) in PyTorch
before the scan, so that every call mamba_ssm's model code makes gets mamba_ssm's answer.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..checks import check_bool, check_tensor
from .interface import ssd_chunk_scan

NO_LIMIT = (0.0, math.inf)        # mamba_ssm's default dt_limit: dt >= 0, no upper bound
SOFTPLUS_CUTOFF = 20.0            # above it softplus(x) is x, in mamba_ssm and in the book's kernels


def _check_dt_limit(dt_limit) -> tuple[float, float]:
    if not isinstance(dt_limit, (tuple, list)) or len(dt_limit) != 2:
        raise ValueError(f"dt_limit must be a pair (dt_min, dt_max), got {dt_limit!r}")
    low, high = (float(v) for v in dt_limit)
    if not low <= high:
        raise ValueError(f"dt_limit must have dt_min <= dt_max, got {dt_limit!r}")
    return low, high


def _limited_dt(dt, dt_bias, dt_softplus: bool, dt_limit: tuple[float, float]):
    """dt after its bias, the softplus and mamba_ssm's clamp, in fp32, for the scan to take as given.
    None when the clamp changes nothing (the softplus is never negative): the scan then applies the
    bias and the softplus itself."""
    if dt_softplus and dt_limit == NO_LIMIT:
        return None
    dt = dt.float() if dt_bias is None else dt.float() + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt, threshold=SOFTPLUS_CUTOFF)
    return dt.clamp(*dt_limit)


def _row_sequences(seq_idx_row: list[int], cu_seqlens: list[int] | None) -> tuple[list[int], bool]:
    """One batch row's packed sequences as offsets, and whether its first sequence is mamba_ssm's
    sequence 0 (the one the initial state belongs to: mamba_ssm carries it while seq_idx is 0).
    Without cu_seqlens each run of equal numbers is a sequence; with it, seq_idx must agree."""
    if any(b < a for a, b in zip(seq_idx_row[:-1], seq_idx_row[1:])) or min(seq_idx_row, default=0) < 0:
        raise ValueError("seq_idx must be non-decreasing and >= 0 along seqlen (the rows of one sequence "
                         "next to each other, as mamba_ssm's packed calls have them)")
    if cu_seqlens is not None:
        labels = [n for n, (a, b) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])) for _ in range(b - a)]
        if cu_seqlens[0] != 0 or labels != seq_idx_row:
            raise ValueError("seq_idx and cu_seqlens disagree: seq_idx must be n on the rows cu_seqlens[n] to "
                             "cu_seqlens[n + 1]")
        return cu_seqlens, True
    offsets = [0] + [t for t in range(1, len(seq_idx_row)) if seq_idx_row[t] != seq_idx_row[t - 1]]
    return offsets + [len(seq_idx_row)], bool(seq_idx_row) and seq_idx_row[0] == 0


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=NO_LIMIT,
                              return_final_states=False, return_varlen_states=False, state_dtype=None, *,
                              chunk_indices=None, chunk_offsets=None):
    """mamba_ssm's `mamba_chunk_scan_combined` (same arguments, order and returns), on `ssd_chunk_scan`.

    x, z: [batch, seqlen, nheads, headdim]; dt: [batch, seqlen, nheads]; A, dt_bias: [nheads]; B, C:
    [batch, seqlen, ngroups, dstate]; D: [nheads, headdim] or [nheads]; initial_states: [batch, nheads,
    headdim, dstate] (any float dtype, taken as fp32). chunk_size: 16, 32, 64, 128 or 256.
    dt_limit (dt_min, dt_max): dt after its bias and softplus is clamped into it, as mamba_ssm does;
    the default (0, inf) clamps a negative dt (given without the softplus) to 0.

    seq_idx (int [batch, seqlen], the number of the sequence each row belongs to, non-decreasing):
    a new sequence starts where the number changes, and initial_states[b] is the state before the rows
    numbered 0 of batch row b (mamba_ssm's convention); final_states[b] is the state after row b's
    last row. cu_seqlens (int [N + 1]) is read as mamba_ssm reads it: only with seq_idx, which must
    agree with it (seq_idx is n on rows cu_seqlens[n] to cu_seqlens[n + 1], batch 1), or for
    return_varlen_states; without seq_idx the rows of a batch row form one sequence, cu_seqlens or not.
    Both are read on the host (a wait for the GPU).

    Returns y [batch, seqlen, nheads, headdim]; (y, final_states fp32 [batch, nheads, headdim, dstate])
    with return_final_states; (y, varlen_states) with return_varlen_states, varlen_states [N, nheads,
    headdim, dstate] in state_dtype (default C's dtype) the state after each of the N sequences;
    (y, final_states, varlen_states) with both. A sequence's varlen state includes the initial state
    when it is sequence 0 (mamba_ssm leaves it out when that sequence ends in the first chunk).
    state_dtype sets varlen_states' dtype only: the scan keeps its states in fp32 throughout.
    vLLM's chunk_indices and chunk_offsets (keywords) are refused: the scan cuts each sequence into
    chunks from its own first row, so it has no use for them. Differentiable as ssd_chunk_scan is,
    through varlen_states too.
    """
    if chunk_indices is not None or chunk_offsets is not None:
        name = "chunk_indices" if chunk_indices is not None else "chunk_offsets"
        raise ValueError(f"{name} is not taken: the book's scan cuts each packed sequence into chunks from its "
                         "own first row (pass seq_idx and cu_seqlens only)")
    check_bool("return_final_states", return_final_states)
    check_bool("return_varlen_states", return_varlen_states)
    check_bool("dt_softplus", dt_softplus)
    dt_limit = _check_dt_limit(dt_limit)
    if state_dtype is not None and state_dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"state_dtype must be float16, bfloat16, float32 or None, got {state_dtype}")
    check_tensor("x", x, ndim=4)
    batch, seqlen = x.shape[:2]
    if return_varlen_states:
        if cu_seqlens is None:
            raise ValueError("return_varlen_states needs cu_seqlens (the sequences whose states are returned)")
        if seq_idx is None:
            raise ValueError("return_varlen_states needs seq_idx: without it the scan runs across the sequences "
                             "and mamba_ssm's per-sequence states mix them")
    if initial_states is not None:
        initial_states = initial_states.float()
    limited = _limited_dt(dt, dt_bias, dt_softplus, dt_limit)
    if limited is not None:
        dt, dt_bias, dt_softplus = limited, None, False
    if seq_idx is None:
        y, final = ssd_chunk_scan(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                  initial_states=initial_states, return_final_states=True)
        return (y, final) if return_final_states else y

    check_tensor("seq_idx", seq_idx, shape=(batch, seqlen))
    if seq_idx.dtype.is_floating_point or seq_idx.dtype == torch.bool:
        raise TypeError(f"seq_idx must hold integers, got {seq_idx.dtype}")
    offsets_given = None
    if cu_seqlens is not None:
        check_tensor("cu_seqlens", cu_seqlens, ndim=1)
        if batch != 1:
            raise ValueError(f"with cu_seqlens the sequences are packed in one batch row: x must have batch 1, "
                             f"got {batch}")
        offsets_given = cu_seqlens.tolist()
    rows, finals, varlen = [], [], None
    for b, seq_idx_row in enumerate(seq_idx.tolist()):
        offsets, starts_at_zero = _row_sequences(seq_idx_row, offsets_given)
        sequences = len(offsets) - 1
        h0 = None
        if initial_states is not None:       # sequence 0 starts from initial_states[b], the others from 0
            zeros = initial_states.new_zeros(sequences - starts_at_zero, *initial_states.shape[1:])
            h0 = torch.cat([initial_states[b:b + 1], zeros]) if starts_at_zero else zeros
        row = slice(b, b + 1)
        y_b, final_b = ssd_chunk_scan(
            x[row], dt[row], A, B[row], C[row], chunk_size, D=D, z=None if z is None else z[row], dt_bias=dt_bias,
            dt_softplus=dt_softplus, initial_states=h0, return_final_states=True,
            cu_seqlens=torch.tensor(offsets, dtype=torch.int32, device=x.device))
        rows.append(y_b)
        # the state after the row's last row: its last sequence that holds rows
        last = max((n for n in range(sequences) if offsets[n] < offsets[n + 1]), default=sequences - 1)
        finals.append(final_b[last])
        varlen = final_b
    y, final = torch.cat(rows), torch.stack(finals)
    if not return_varlen_states:
        return (y, final) if return_final_states else y
    varlen = varlen.to(C.dtype if state_dtype is None else state_dtype)
    return (y, final, varlen) if return_final_states else (y, varlen)


__all__ = ["mamba_chunk_scan_combined"]
