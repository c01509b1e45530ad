"""Mamba-2's decode step as one Triton kernel: mamba_ssm's `selective_state_update`, written anew.

A tile is one (batch row, head, slice of BM headdim rows) with the whole dstate width of those rows. For
each tile the kernel reads the [BM, N] fp32 state once, forms dt (bias and softplus inside), decays the
tile by exp(dt·A), adds dt·x ⊗ B, writes the tile back to the same place (in place: no new state
is allocated), and reads out y = h·C + D·x, gated by silu(z). B and C are read from the head's group.
A program takes UNITS consecutive tiles and reads each one while the one before is still being updated
(on the GPU one tile a program is fastest: see `step_tiles`).

The state is mamba_ssm's [slots, nheads, headdim, dstate]: headdim plays the value role and dstate
the key role of the book's [B, H, K, V] state, so the read-out reduces over the last axis (dstate)
here. The kernel takes the state's strides as they are and reads the row's slot from the slot table
(state_batch_indices) when there is one; nothing is transposed or copied.

A is [nheads, headdim, dstate]. A Mamba-2 model passes one scalar per head broadcast with stride 0
(`A[:, None, None].expand(H, P, N)`); the interface sees the zero strides and sets A_SCALAR, and the
kernel then loads one number per program and takes one exp per headdim row instead of one per
state element. A full A (Mamba-1-like, one value per (row, state)) takes the general path. When dt,
dt_bias and D are broadcast over headdim as well (TIE_HDIM), they are numbers too: one softplus and one
exp per tile. EVEN (whole tiles, contiguous rows, as many tiles as the programs take) drops the state's
masks and gives a tile's offsets as constants.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common import INTERPRET
from ..launch import cdiv, launch, next_power_of_2, pow2_at_least_16


@triton.jit
def _softplus(x):
    # log(1 + e^x), and x itself above 20 (where they agree in fp32 and e^x would overflow later)
    return tl.where(x <= 20.0, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))), x)


@triton.jit
def _unit_tile(u, slots, state, s_sb, s_sh, s_sp, b, H, n_p, BM: tl.constexpr, HAS_SLOTS: tl.constexpr):
    """Where unit u lies: its batch row, head and first headdim row (the row tile varies fastest, then the
    head, then the batch row), and the address of its state tile's first element."""
    i_p, i_bh = u % n_p, u // n_p
    i_b, i_h = i_bh // H, i_bh % H
    if HAS_SLOTS:
        slot = tl.load(slots + i_b, mask=i_b < b, other=0).to(tl.int64)   # the serving engine's row for i_b
    else:
        slot = i_b.to(tl.int64)
    return i_b, i_h, i_p * BM, state + slot * s_sb + i_h * s_sh + i_p * BM * s_sp


@triton.jit
def _load_tile(p, p0, i_b, b, P, m_n, o_m, wanted, EVEN: tl.constexpr):
    # wanted: one flag for the whole tile (false past a program's last unit). EVEN: every tile whole and every
    # unit real, so there is no per-element mask to compute or to predicate on
    if EVEN:
        return tl.load(p, mask=wanted, other=0.0)
    else:
        return tl.load(p, mask=wanted & ((p0 + o_m < P) & (i_b < b))[:, None] & m_n[None, :], other=0.0)


@triton.jit(do_not_specialize=["b"])
def _selective_state_update_kernel(
    state, x, dt, dt_bias, A, B, C, D, z, y, slots,
    s_sb, s_sh, s_sp, s_sn,            # the state's strides: slot, head, headdim row, dstate column
    s_db, s_dh, s_dp,                  # dt's strides (often 0 on headdim: one dt per head)
    s_bh, s_bp,                        # dt_bias's strides
    s_ah, s_ap, s_an,                  # A's strides (0, 0 on headdim and dstate: one A per head)
    s_Dh, s_Dp,                        # D's strides
    b, H, P, N, HPG, G,                # HPG: heads per group
    BM: tl.constexpr, BN: tl.constexpr, UNITS: tl.constexpr, EVEN: tl.constexpr, A_SCALAR: tl.constexpr,
    TIE_HDIM: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_SLOTS: tl.constexpr,
):
    # A unit is one (batch row, head, BM headdim rows) tile of the state, BN
    # covering the whole dstate. A program takes UNITS consecutive units and
    # loads each tile while it still updates the one before, so one read
    # stays in flight while it computes and writes.
    o_m, o_n = tl.arange(0, BM), tl.arange(0, BN)
    m_n = o_n < N
    if EVEN:  # the rows of a tile back to back: offsets the compiler knows, folded into the loads
        p_tile = o_m[:, None] * BN + o_n[None, :]
    else:
        p_tile = o_m[:, None] * s_sp + o_n[None, :] * s_sn  # a tile's offsets from its first element
    n_p = tl.cdiv(P, BM)
    u0 = tl.program_id(0) * UNITS
    i_b, _, p0, p_base = _unit_tile(u0, slots, state, s_sb, s_sh, s_sp, b, H, n_p, BM, HAS_SLOTS)
    b_next = _load_tile(p_base + p_tile, p0, i_b, b, P, m_n, o_m, True, EVEN)
    for i in range(UNITS):
        i_b, i_h, p0, p_base = _unit_tile(u0 + i, slots, state, s_sb, s_sh, s_sp, b, H, n_p, BM, HAS_SLOTS)
        b_s = b_next
        # the next tile's read (none after the last), issued before this one
        # is updated and written; one load on every pass, so that the
        # compiler keeps a single copy of the tile in flight
        i_bn, _, p0n, p_next = _unit_tile(u0 + i + 1, slots, state, s_sb, s_sh, s_sp, b, H, n_p, BM, HAS_SLOTS)
        b_next = _load_tile(p_next + p_tile, p0n, i_bn, b, P, m_n, o_m, i + 1 < UNITS, EVEN)
        o_p = p0 + o_m
        # `!= 0` keeps the masks boolean under Triton's interpreter, which
        # widens a broadcast scalar comparison (i_b < b) to int32, a mask its
        # 3.9 refuses (compiled, the test adds no instruction)
        m_p = ((o_p < P) & (i_b < b)) != 0

        p_x = (i_b * H + i_h) * P + o_p                    # x, z and y are contiguous [b, H, P]
        b_x = tl.load(x + p_x, mask=m_p, other=0.0).to(tl.float32)
        if TIE_HDIM:  # one dt per (batch row, head): a number, one softplus, not one per headdim row
            b_dt = tl.load(dt + i_b * s_db + i_h * s_dh, mask=i_b < b, other=0.0).to(tl.float32)
            if HAS_BIAS:
                b_dt += tl.load(dt_bias + i_h * s_bh).to(tl.float32)
        else:
            b_dt = tl.load(dt + i_b * s_db + i_h * s_dh + o_p * s_dp, mask=m_p, other=0.0).to(tl.float32)
            if HAS_BIAS:
                b_dt += tl.load(dt_bias + i_h * s_bh + o_p * s_bp, mask=m_p, other=0.0).to(tl.float32)
        if SOFTPLUS:
            b_dt = _softplus(b_dt)

        i_g = i_h // HPG                                    # the head's group: B and C are shared by HPG heads
        m_bc = (m_n & (i_b < b)) != 0
        b_B = tl.load(B + (i_b * G + i_g) * N + o_n, mask=m_bc, other=0.0).to(tl.float32)
        b_C = tl.load(C + (i_b * G + i_g) * N + o_n, mask=m_bc, other=0.0).to(tl.float32)

        if TIE_HDIM:
            b_decay = tl.exp(tl.load(A + i_h * s_ah).to(tl.float32) * b_dt)       # one number for the tile
        elif A_SCALAR:
            # one A per head: the decay is one number per headdim row, [BM,
            # 1]
            b_A = tl.load(A + i_h * s_ah).to(tl.float32)
            b_decay = tl.exp(b_A * b_dt)[:, None]
        else:
            b_A = tl.load(A + i_h * s_ah + o_p[:, None] * s_ap + o_n[None, :] * s_an,
                          mask=m_p[:, None] & m_n[None, :], other=0.0)
            b_decay = tl.exp(b_A.to(tl.float32) * b_dt[:, None])
        b_s = b_s * b_decay + (b_dt * b_x)[:, None] * b_B[None, :]
        if EVEN:
            tl.store(p_base + p_tile, b_s)
        else:
            tl.store(p_base + p_tile, b_s, mask=m_p[:, None] & m_n[None, :])

        b_y = tl.sum(b_s * b_C[None, :], axis=1)
        if HAS_D and TIE_HDIM:
            b_y += tl.load(D + i_h * s_Dh).to(tl.float32) * b_x
        elif HAS_D:
            b_y += tl.load(D + i_h * s_Dh + o_p * s_Dp, mask=m_p, other=0.0).to(tl.float32) * b_x
        if HAS_Z:
            b_z = tl.load(z + p_x, mask=m_p, other=0.0).to(tl.float32)
            b_y = b_y * b_z * tl.sigmoid(b_z)
        tl.store(y + p_x, b_y.to(y.dtype.element_ty), mask=m_p)


def step_tiles(P: int, N: int) -> tuple[int, int, int, int]:
    """(BM, BN, UNITS, num_warps) for a step at headdim P and dstate N, whatever the batch: BN covers dstate
    (padded to a power of two); one tile of about 512 fp32 values (4 headdim rows at dstate 128) a program, on
    one warp, every tile started at once. On the H200 at 80 heads x 64 x 128 and B = 64 (graph replay, one run),
    one 4-row tile a program took 87.4 µs, one 8-row tile 87.5, two 4-row tiles 88.5, two 8-row tiles 88.6, four
    8-row tiles 91.3 and two 16-row tiles on 2 warps 95.6: more than one tile a program only adds work. Under
    the interpreter, all rows at once and two tiles a program (fewer programs run faster there, and the
    read-ahead is exercised)."""
    BN = pow2_at_least_16(N)
    if INTERPRET:
        return max(1, next_power_of_2(P)), BN, 2, 4
    return max(1, min(next_power_of_2(P), 512 // BN)), BN, 1, 1


def selective_state_update_fwd(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, y, a_scalar: bool) -> None:
    """Launch the step: UNITS (headdim slice, batch row, head) tiles per program, and after the first call
    with a given key directly (`attention_kernels.launch`). x, z, B, C, y contiguous; state, dt, dt_bias, A, D with any
    strides (they enter the key: the compiled kernel specialises on strides of 1 and on multiples of 16);
    y [b, H, P] written, state updated in place."""
    b, H, P = x.shape
    N, G = state.shape[-1], B.shape[1]
    BM, BN, units, warps = step_tiles(P, N)
    has = (dt_bias is not None, D is not None, z is not None, slots is not None)
    # an absent optional gets a stand-in tensor (never read: its HAS_ flag is False), so every pointer
    # argument is a tensor and the direct launch applies
    dt_bias_, D_, z_, slots_ = (t if t is not None else x for t in (dt_bias, D, z, slots))
    strides = (*state.stride(), *dt.stride(), *(dt_bias.stride() if has[0] else (0, 0)), *A.stride(),
               *(D.stride() if has[1] else (0, 0)))
    sizes = (H, P, N, H // G, G)
    tiles = cdiv(P, BM) * b * H
    # EVEN: every tile whole, every program's units real and each tile's rows back to back in memory
    even = P % BM == 0 and N == BN and tiles % units == 0 and state.stride(3) == 1 and state.stride(2) == N
    # a model's dt, dt_bias, D and A hold one number per head, broadcast over headdim with stride 0
    tie_hdim = a_scalar and dt.stride(2) == 0 and (not has[0] or dt_bias.stride(1) == 0) and (
        not has[1] or D.stride(1) == 0)
    key = ("mamba2_step", x.device, x.dtype, dt.dtype, A.dtype, dt_bias_.dtype, D_.dtype, slots_.dtype,
           has, a_scalar, dt_softplus, strides, sizes, BM, BN, units, warps, even)
    launch(_selective_state_update_kernel, lambda BM, BN_: (cdiv(tiles, units),), [(BM, BN, warps, 1)], key,
           state, x, dt, dt_bias_, A, B, C, D_, z_, y, slots_, *strides, b, *sizes, UNITS=units, EVEN=even,
           A_SCALAR=a_scalar, TIE_HDIM=tie_hdim, HAS_BIAS=has[0], SOFTPLUS=dt_softplus, HAS_D=has[1],
           HAS_Z=has[2], HAS_SLOTS=has[3])


__all__ = ["selective_state_update_fwd", "step_tiles"]
