"""Mamba-2's decode step as one Triton kernel: mamba_ssm's `selective_state_update`, written anew.

A tile is one (batch row, head, slice of BM headdim rows) with the whole dstate width of those rows. For
each tile the kernel reads the [BM, N] fp32 state once, forms dt (bias and softplus inside), decays the
tile by exp(dt·A), adds dt·x ⊗ B, writes the tile back to the same place (in place: no new state
is allocated), and reads out y = h·C + D·x, gated by silu(z). B and C are read from the head's group.
A program takes one tile: programs that took several, reading the next while updating one, were no faster
on the GPU (see `step_tiles`).

The state is mamba_ssm's [slots, nheads, headdim, dstate]: headdim plays the value role and dstate
the key role of the book's [B, H, K, V] state, so the read-out reduces over the last axis (dstate)
here. The kernel takes the state's strides as they are and reads the row's slot from the slot table
(state_batch_indices) when there is one; nothing is transposed or copied.

A is [nheads, headdim, dstate]. A Mamba-2 model passes one scalar per head broadcast with stride 0
(`A[:, None, None].expand(H, P, N)`); the interface sees the zero strides and sets A_SCALAR, and the
kernel then loads one number per program and takes one exp per headdim row instead of one per
state element. A full A (Mamba-1-like, one value per (row, state)) takes the general path. When dt,
dt_bias and D are broadcast over headdim as well (TIE_HDIM), they are numbers too: one softplus and one
exp per tile. EVEN (whole tiles, contiguous rows) drops the state's masks and gives a tile's offsets as
constants.
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
def _selective_state_update_kernel(
    state, x, dt, dt_bias, A, B, C, D, z, y, slots,
    s_sb, s_sh, s_sp, s_sn,            # the state's strides: slot, head, headdim row, dstate column
    s_db, s_dh, s_dp,                  # dt's strides (often 0 on headdim: one dt per head)
    s_bh, s_bp,                        # dt_bias's strides
    s_ah, s_ap, s_an,                  # A's strides (0, 0 on headdim and dstate: one A per head)
    s_Dh, s_Dp,                        # D's strides
    H, P, N, HPG, G,                   # HPG: heads per group
    BM: tl.constexpr, BN: tl.constexpr, EVEN: tl.constexpr, A_SCALAR: tl.constexpr,
    TIE_HDIM: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_SLOTS: tl.constexpr,
):
    # One program, one tile: a (batch row, head, BM headdim rows) slice of
    # the state, BN covering the whole dstate. The row tile varies fastest,
    # then the head, then the batch row.
    n_p = tl.cdiv(P, BM)
    i_bh, i_p = tl.program_id(0) // n_p, tl.program_id(0) % n_p
    i_b, i_h = i_bh // H, i_bh % H
    if HAS_SLOTS:
        slot = tl.load(slots + i_b).to(tl.int64)   # the serving engine's row for batch row i_b
    else:
        slot = i_b.to(tl.int64)
    p_base = state + slot * s_sb + i_h * s_sh + i_p * BM * s_sp   # the tile's first element
    o_m, o_n = tl.arange(0, BM), tl.arange(0, BN)
    o_p = i_p * BM + o_m
    m_p, m_n = o_p < P, o_n < N
    if EVEN:  # the rows of a whole tile back to back: no masks, offsets the compiler folds into the loads
        p_s = p_base + o_m[:, None] * BN + o_n[None, :]
        b_s = tl.load(p_s)
    else:
        p_s = p_base + o_m[:, None] * s_sp + o_n[None, :] * s_sn
        b_s = tl.load(p_s, mask=m_p[:, None] & m_n[None, :], other=0.0)

    p_x = (i_b * H + i_h) * P + o_p                    # x, z and y are contiguous [b, H, P]
    b_x = tl.load(x + p_x, mask=m_p, other=0.0).to(tl.float32)
    if TIE_HDIM:  # one dt per (batch row, head): a number, one softplus, not one per headdim row
        b_dt = tl.load(dt + i_b * s_db + i_h * s_dh).to(tl.float32)
        if HAS_BIAS:
            b_dt += tl.load(dt_bias + i_h * s_bh).to(tl.float32)
    else:
        b_dt = tl.load(dt + i_b * s_db + i_h * s_dh + o_p * s_dp, mask=m_p, other=0.0).to(tl.float32)
        if HAS_BIAS:
            b_dt += tl.load(dt_bias + i_h * s_bh + o_p * s_bp, mask=m_p, other=0.0).to(tl.float32)
    if SOFTPLUS:
        b_dt = _softplus(b_dt)

    i_g = i_h // HPG                                    # the head's group: B and C are shared by HPG heads
    b_B = tl.load(B + (i_b * G + i_g) * N + o_n, mask=m_n, other=0.0).to(tl.float32)
    b_C = tl.load(C + (i_b * G + i_g) * N + o_n, mask=m_n, other=0.0).to(tl.float32)

    if TIE_HDIM:
        b_decay = tl.exp(tl.load(A + i_h * s_ah).to(tl.float32) * b_dt)       # one number for the tile
    elif A_SCALAR:
        # one A per head: the decay is one number per headdim row, [BM, 1]
        b_A = tl.load(A + i_h * s_ah).to(tl.float32)
        b_decay = tl.exp(b_A * b_dt)[:, None]
    else:
        b_A = tl.load(A + i_h * s_ah + o_p[:, None] * s_ap + o_n[None, :] * s_an,
                      mask=m_p[:, None] & m_n[None, :], other=0.0)
        b_decay = tl.exp(b_A.to(tl.float32) * b_dt[:, None])
    b_s = b_s * b_decay + (b_dt * b_x)[:, None] * b_B[None, :]
    if EVEN:
        tl.store(p_s, b_s)
    else:
        tl.store(p_s, b_s, mask=m_p[:, None] & m_n[None, :])

    b_y = tl.sum(b_s * b_C[None, :], axis=1)
    if HAS_D and TIE_HDIM:
        b_y += tl.load(D + i_h * s_Dh).to(tl.float32) * b_x
    elif HAS_D:
        b_y += tl.load(D + i_h * s_Dh + o_p * s_Dp, mask=m_p, other=0.0).to(tl.float32) * b_x
    if HAS_Z:
        b_z = tl.load(z + p_x, mask=m_p, other=0.0).to(tl.float32)
        b_y = b_y * b_z * tl.sigmoid(b_z)
    tl.store(y + p_x, b_y.to(y.dtype.element_ty), mask=m_p)


def step_tiles(P: int, N: int) -> tuple[int, int, int]:
    """(BM, BN, num_warps) for a step at headdim P and dstate N, whatever the batch: BN covers dstate (padded
    to a power of two); one tile of about 512 fp32 values (4 headdim rows at dstate 128) a program, on one
    warp, every tile started at once. On the H200 at 80 heads x 64 x 128 and B = 64 (graph replay, one run),
    one 4-row tile a program took 87.4 µs and one 8-row tile 87.5; programs that took two 4-row tiles, or two
    8-row tiles, reading each tile while the one before was updated, took 88.5 and 88.6, four 8-row tiles 91.3:
    the GPU keeps enough reads in flight by running many programs at once. Under the interpreter, all rows
    at once (fewer programs run faster there)."""
    BN = pow2_at_least_16(N)
    if INTERPRET:
        return max(1, next_power_of_2(P)), BN, 4
    return max(1, min(next_power_of_2(P), 512 // BN)), BN, 1


def selective_state_update_fwd(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, y, a_scalar: bool) -> None:
    """Launch the step: one (headdim slice, batch row, head) tile a program, and after the first call with a
    given key directly (`attention_kernels.launch`). x, z, B, C, y contiguous; state, dt, dt_bias, A, D with any
    strides (they enter the key: the compiled kernel specialises on strides of 1 and on multiples of 16);
    y [b, H, P] written, state updated in place."""
    b, H, P = x.shape
    N, G = state.shape[-1], B.shape[1]
    BM, BN, warps = step_tiles(P, N)
    has = (dt_bias is not None, D is not None, z is not None, slots is not None)
    # an absent optional gets a stand-in tensor (never read: its HAS_ flag is False), so every pointer
    # argument is a tensor and the direct launch applies
    dt_bias_, D_, z_, slots_ = (t if t is not None else x for t in (dt_bias, D, z, slots))
    strides = (*state.stride(), *dt.stride(), *(dt_bias.stride() if has[0] else (0, 0)), *A.stride(),
               *(D.stride() if has[1] else (0, 0)))
    sizes = (H, P, N, H // G, G)
    # EVEN: every tile whole and each tile's rows back to back in memory
    even = P % BM == 0 and N == BN and state.stride(3) == 1 and state.stride(2) == N
    # a model's dt, dt_bias, D and A hold one number per head, broadcast over headdim with stride 0
    tie_hdim = a_scalar and dt.stride(2) == 0 and (not has[0] or dt_bias.stride(1) == 0) and (
        not has[1] or D.stride(1) == 0)
    key = ("mamba2_step", x.device, x.dtype, dt.dtype, A.dtype, dt_bias_.dtype, D_.dtype, slots_.dtype,
           has, a_scalar, dt_softplus, strides, sizes, BM, BN, warps, even)
    launch(_selective_state_update_kernel, lambda BM, BN_: (cdiv(P, BM) * b * H,), [(BM, BN, warps, 1)], key,
           state, x, dt, dt_bias_, A, B, C, D_, z_, y, slots_, *strides, *sizes, EVEN=even, A_SCALAR=a_scalar,
           TIE_HDIM=tie_hdim, HAS_BIAS=has[0], SOFTPLUS=dt_softplus, HAS_D=has[1], HAS_Z=has[2],
           HAS_SLOTS=has[3])


__all__ = ["selective_state_update_fwd", "step_tiles"]
