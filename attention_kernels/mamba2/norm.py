"""Mamba-2's output norm as one Triton pass each way: the gated RMSNorm a Mamba-2 layer applies after the scan
(mamba_ssm's `RMSNormGated`, written anew).

Each row of x [M, N] is cut into groups of G channels (G divides N; one group is the whole row). Per group,
with silu(z) = z · sigmoid(z):

    norm_before_gate=False   g = x · silu(z),  out = g · rstd(g) · w + b          (a Mamba-2 layer's call)
    norm_before_gate=True    out = (x · rstd(x) · w + b) · silu(z)
    z None                   out = x · rstd(x) · w + b
    rstd(v) = 1 / sqrt(mean over the group of v² + eps)

Forward: a program holds ROWS rows of one group in registers (the group padded to a power of two, BN),
reads x and z once, writes out once and keeps rstd per (row, group), fp32, for the backward. Nothing is
read twice: a group up to MAX_GROUP channels fits a program's registers.

Backward: with v what the norm sees (x, or g when the gate comes first), n = v · rstd(v), dy' the gradient
that reaches n · w + b (dy, or dy · silu(z) when the gate comes last) and dn = dy' · w,

    dv = rstd · (dn - n · mean(dn · n))       (per row and group; rstd read back, not recomputed)

then through the gate: dx = dv · silu(z) and dz = dv · x · silu'(z) when it comes first; dz = dy · (n · w + b) ·
silu'(z) when it comes last. A program walks a run of rows of one group and sums its rows' dw = Σ dy' · n (and
db = Σ dy') in fp32 registers; it writes its partial sums to a [programs, N] buffer, summed after (no atomics:
the result does not depend on the order the programs run in).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import INTERPRET
from ..launch import cdiv, next_power_of_2, on_machine, sm_count

MAX_GROUP = 8192      # channels in one group: a program holds the whole group in registers


@triton.jit
def _gated_rmsnorm_fwd_kernel(x, z, weight, bias, out, rstd, s_x, s_z, s_o, M, G_SIZE, NG, eps,
                              ROWS: tl.constexpr, BN: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
                              NORM_BEFORE_GATE: tl.constexpr):
    i_m, i_g = tl.program_id(0), tl.program_id(1)
    o_m = i_m * ROWS + tl.arange(0, ROWS)
    o_n = tl.arange(0, BN)
    m_m, m_n = o_m < M, o_n < G_SIZE
    m_mn = m_m[:, None] & m_n[None, :]
    o_c = i_g * G_SIZE + o_n                                   # the group's channels in the row
    o_row = o_m.to(tl.int64)[:, None]

    b_x = tl.load(x + o_row * s_x + o_c[None, :], mask=m_mn, other=0.0).to(tl.float32)
    if HAS_Z:
        b_z = tl.load(z + o_row * s_z + o_c[None, :], mask=m_mn, other=0.0).to(tl.float32)
        b_gate = b_z * tl.sigmoid(b_z)
        if not NORM_BEFORE_GATE:
            b_x = b_x * b_gate
    # padded channels hold 0 and add nothing; the mean divides by the group's true size
    b_rstd = tl.rsqrt(tl.sum(b_x * b_x, axis=1) / G_SIZE + eps)
    tl.store(rstd + o_m.to(tl.int64) * NG + i_g, b_rstd, mask=m_m)

    b_w = tl.load(weight + o_c, mask=m_n, other=0.0).to(tl.float32)
    b_o = b_x * b_rstd[:, None] * b_w[None, :]
    if HAS_BIAS:
        b_o += tl.load(bias + o_c, mask=m_n, other=0.0).to(tl.float32)[None, :]
    if HAS_Z and NORM_BEFORE_GATE:
        b_o *= b_gate
    tl.store(out + o_row * s_o + o_c[None, :], b_o.to(out.dtype.element_ty), mask=m_mn)


@triton.jit
def _gated_rmsnorm_bwd_kernel(x, z, weight, bias, rstd, dy, dx, dz, dw_part, db_part,
                              s_x, s_z, s_dy, s_dx, s_dz, M, N, G_SIZE, NG, rows_per_program,
                              ROWS: tl.constexpr, BN: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
                              NORM_BEFORE_GATE: tl.constexpr):
    i_p, i_g = tl.program_id(0), tl.program_id(1)
    o_n = tl.arange(0, BN)
    m_n = o_n < G_SIZE
    o_c = i_g * G_SIZE + o_n
    b_w = tl.load(weight + o_c, mask=m_n, other=0.0).to(tl.float32)
    if HAS_BIAS:
        b_b = tl.load(bias + o_c, mask=m_n, other=0.0).to(tl.float32)
    b_dw = tl.zeros([BN], dtype=tl.float32)
    b_db = tl.zeros([BN], dtype=tl.float32)

    first = i_p * rows_per_program
    end = tl.minimum(first + rows_per_program, M)
    for row in range(first, end, ROWS):
        o_m = row + tl.arange(0, ROWS)
        m_m = o_m < end
        m_mn = m_m[:, None] & m_n[None, :]
        o_row = o_m.to(tl.int64)[:, None]
        b_x = tl.load(x + o_row * s_x + o_c[None, :], mask=m_mn, other=0.0).to(tl.float32)
        b_dy = tl.load(dy + o_row * s_dy + o_c[None, :], mask=m_mn, other=0.0).to(tl.float32)
        b_rstd = tl.load(rstd + o_m.to(tl.int64) * NG + i_g, mask=m_m, other=0.0)
        if HAS_Z:
            b_z = tl.load(z + o_row * s_z + o_c[None, :], mask=m_mn, other=0.0).to(tl.float32)
            b_gate = b_z * tl.sigmoid(b_z)
        b_v = b_x                                                  # what the norm sees
        if HAS_Z and not NORM_BEFORE_GATE:
            b_v = b_x * b_gate
        b_n = b_v * b_rstd[:, None]
        if HAS_Z and NORM_BEFORE_GATE:
            # out = o · silu(z) with o = n · w + b: z's gradient from o, and o's gradient dy · silu(z)
            b_o = b_n * b_w[None, :]
            if HAS_BIAS:
                b_o += b_b[None, :]
            b_sig = tl.sigmoid(b_z)
            b_dz = b_dy * b_o * b_sig * (1.0 + b_z * (1.0 - b_sig))           # silu'(z) = σ(1 + z(1 - σ))
            tl.store(dz + o_row * s_dz + o_c[None, :], b_dz.to(dz.dtype.element_ty), mask=m_mn)
            b_dy = b_dy * b_gate
        b_dw += tl.sum(b_dy * b_n, axis=0)
        if HAS_BIAS:
            b_db += tl.sum(b_dy, axis=0)
        b_dn = b_dy * b_w[None, :]
        b_dv = (b_dn - b_n * (tl.sum(b_dn * b_n, axis=1) / G_SIZE)[:, None]) * b_rstd[:, None]
        if HAS_Z and not NORM_BEFORE_GATE:
            # σ(z) again rather than kept across the row's sums: kept, a 5120-channel group's backward spills
            b_sig = tl.sigmoid(b_z)
            b_dz = b_dv * b_x * b_sig * (1.0 + b_z * (1.0 - b_sig))
            tl.store(dz + o_row * s_dz + o_c[None, :], b_dz.to(dz.dtype.element_ty), mask=m_mn)
            b_dv = b_dv * b_z * b_sig
        tl.store(dx + o_row * s_dx + o_c[None, :], b_dv.to(dx.dtype.element_ty), mask=m_mn)

    tl.store(dw_part + i_p.to(tl.int64) * N + o_c, b_dw, mask=m_n)
    if HAS_BIAS:
        tl.store(db_part + i_p.to(tl.int64) * N + o_c, b_db, mask=m_n)


def norm_tile(group_size: int) -> tuple[int, int, int]:
    """(ROWS, BN, num_warps) for a group of group_size channels, both directions: BN covers the group (a power of
    two); a program takes enough rows for about 4K elements (one row from 4K channels up), and a thread holds
    16 of a tensor's elements (8192 lanes, 16 warps, for a 5120-channel group). Compiled for sm_90a at bf16 and
    5120 channels in one group, the forward takes 32-57 registers, the backward 128 without spilling, but for
    a bias with z (52-76 bytes spilled; a Mamba-2 layer passes no bias). Under the interpreter a few rows a
    program, so that small tests cross programs."""
    bn = next_power_of_2(group_size)
    rows = on_machine(gpu=max(1, 4096 // bn), interpreter=max(1, 16 // bn))
    return rows, bn, min(16, max(1, rows * bn // 256))


def gated_rmsnorm_fwd(x, weight, bias, z, eps: float, group_size: int, norm_before_gate: bool):
    """The forward launch on checked inputs: x, z [M, N] with unit stride in a row; weight, bias [N] contiguous.
    Returns (out [M, N] in x's dtype, rstd fp32 [M, N / group_size])."""
    M, N = x.shape
    ngroups = N // group_size
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    rstd = torch.empty((M, ngroups), dtype=torch.float32, device=x.device)
    if M == 0:
        return out, rstd
    rows, bn, warps = norm_tile(group_size)
    _gated_rmsnorm_fwd_kernel[(cdiv(M, rows), ngroups)](
        x, z, weight, bias, out, rstd, x.stride(0), 0 if z is None else z.stride(0), out.stride(0),
        M, group_size, ngroups, eps, ROWS=rows, BN=bn, HAS_Z=z is not None, HAS_BIAS=bias is not None,
        NORM_BEFORE_GATE=norm_before_gate, num_warps=warps)
    return out, rstd


def _row_programs(M: int, rows: int, ngroups: int, device) -> int:
    """How many programs share the rows in the backward: on the GPU one wave, about one per SM over all groups (a
    program of 16 warps near 128 registers fills an SM's register file), each writing one [N] partial sum of dw;
    two under the interpreter, so that tests sum partials."""
    most = cdiv(M, rows)
    if INTERPRET:
        return min(most, 2)
    return max(1, min(most, cdiv(sm_count(device), ngroups)))


def gated_rmsnorm_bwd(x, weight, bias, z, rstd, dy, group_size: int, norm_before_gate: bool):
    """The backward launch on checked inputs (as the forward's, with rstd from it and dy [M, N] unit stride in a
    row). Returns (dx like x, dweight like weight, dbias like bias or None, dz like z or None)."""
    M, N = x.shape
    ngroups = N // group_size
    dx = torch.empty((M, N), dtype=x.dtype, device=x.device)
    dz = None if z is None else torch.empty((M, N), dtype=z.dtype, device=z.device)
    rows, bn, warps = norm_tile(group_size)
    programs = _row_programs(M, rows, ngroups, x.device) if M else 0
    # every program writes its row of partial sums whole (zeros where its run holds no row)
    dw_part = torch.empty((programs, N), dtype=torch.float32, device=x.device)
    db_part = None if bias is None else torch.empty((programs, N), dtype=torch.float32, device=x.device)
    if M:
        # a program's run of rows is a whole number of its row tiles
        rows_per_program = cdiv(cdiv(M, programs), rows) * rows
        _gated_rmsnorm_bwd_kernel[(programs, ngroups)](
            x, z, weight, bias, rstd, dy, dx, dz, dw_part, db_part,
            x.stride(0), 0 if z is None else z.stride(0), dy.stride(0), dx.stride(0), 0 if dz is None else dz.stride(0),
            M, N, group_size, ngroups, rows_per_program, ROWS=rows, BN=bn, HAS_Z=z is not None,
            HAS_BIAS=bias is not None, NORM_BEFORE_GATE=norm_before_gate, num_warps=warps)
    dweight = dw_part.sum(0).to(weight.dtype)
    dbias = None if bias is None else db_part.sum(0).to(bias.dtype)
    return dx, dweight, dbias, dz


__all__ = ["gated_rmsnorm_fwd", "gated_rmsnorm_bwd", "norm_tile", "MAX_GROUP"]
