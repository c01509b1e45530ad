"""Mamba-2's decode step as one Triton kernel: mamba_ssm's `selective_state_update`, written anew.

One program owns one (batch row, head, slice of BM headdim rows) and the whole dstate width of those
rows: it reads the [BM, N] fp32 state tile once, forms dt (bias and softplus inside), decays the
tile by exp(dt·A), adds dt·x ⊗ B, writes the tile back to the same place (in place: no new state
is allocated), and reads out y = h·C + D·x, gated by silu(z). B and C are read from the head's group.

The state is mamba_ssm's [slots, nheads, headdim, dstate]: headdim plays the value role and dstate
the key role of the book's [B, H, K, V] state, so the read-out reduces over the last axis (dstate)
here. The kernel takes the state's strides as they are and reads the row's slot from the slot table
(state_batch_indices) when there is one; nothing is transposed or copied.

A is [nheads, headdim, dstate]. A Mamba-2 model passes one scalar per head broadcast with stride 0
(`A[:, None, None].expand(H, P, N)`); the interface sees the zero strides and sets A_SCALAR, and the
kernel then loads one number per program and takes one exp per headdim row instead of one per
state element. A full A (Mamba-1-like, one value per (row, state)) takes the general path.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common import INTERPRET
from ..launch import launch


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
    BM: tl.constexpr, BN: tl.constexpr, A_SCALAR: tl.constexpr, HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_SLOTS: tl.constexpr,
):
    # BM: the headdim rows of this program's tile, BN: the whole dstate (padded)
    i_p, i_b, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_p = i_p * BM + tl.arange(0, BM)
    o_n = tl.arange(0, BN)
    m_p, m_n = o_p < P, o_n < N
    m_s = m_p[:, None] & m_n[None, :]
    if HAS_SLOTS:
        slot = tl.load(slots + i_b).to(tl.int64)     # the serving engine's cache row for batch row i_b
    else:
        slot = i_b.to(tl.int64)
    p_s = state + slot * s_sb + i_h * s_sh + o_p[:, None] * s_sp + o_n[None, :] * s_sn
    b_s = tl.load(p_s, mask=m_s, other=0.0)

    p_x = (i_b * H + i_h) * P + o_p                    # x, z and y are contiguous [b, H, P]
    b_x = tl.load(x + p_x, mask=m_p, other=0.0).to(tl.float32)
    b_dt = tl.load(dt + i_b * s_db + i_h * s_dh + o_p * s_dp, mask=m_p, other=0.0).to(tl.float32)
    if HAS_BIAS:
        b_dt += tl.load(dt_bias + i_h * s_bh + o_p * s_bp, mask=m_p, other=0.0).to(tl.float32)
    if SOFTPLUS:
        b_dt = _softplus(b_dt)

    i_g = i_h // HPG                                    # the head's group: B and C are shared by HPG heads
    b_B = tl.load(B + (i_b * G + i_g) * N + o_n, mask=m_n, other=0.0).to(tl.float32)
    b_C = tl.load(C + (i_b * G + i_g) * N + o_n, mask=m_n, other=0.0).to(tl.float32)

    if A_SCALAR:
        # one A per head: the decay is one number per headdim row, [BM, 1]
        b_A = tl.load(A + i_h * s_ah).to(tl.float32)
        b_decay = tl.exp(b_A * b_dt)[:, None]
    else:
        b_A = tl.load(A + i_h * s_ah + o_p[:, None] * s_ap + o_n[None, :] * s_an, mask=m_s, other=0.0)
        b_decay = tl.exp(b_A.to(tl.float32) * b_dt[:, None])
    b_s = b_s * b_decay + (b_dt * b_x)[:, None] * b_B[None, :]
    tl.store(p_s, b_s, mask=m_s)

    b_y = tl.sum(b_s * b_C[None, :], axis=1)
    if HAS_D:
        b_y += tl.load(D + i_h * s_Dh + o_p * s_Dp, mask=m_p, other=0.0).to(tl.float32) * b_x
    if HAS_Z:
        b_z = tl.load(z + p_x, mask=m_p, other=0.0).to(tl.float32)
        b_y = b_y * b_z * tl.sigmoid(b_z)
    tl.store(y + p_x, b_y.to(y.dtype.element_ty), mask=m_p)


def tile_rows(P: int, N: int) -> tuple[int, int, int]:
    """(BM, BN, num_warps): BN covers dstate (padded to a power of two); BM rows of headdim per
    program, so that a tile holds about 512 fp32 values, on one warp (16 per thread). On the H200,
    at 80 heads x 64 x 128 and B = 64 (graph replay), 4 rows on one warp took 94.8 µs, 8 rows 93.5,
    16 rows on 4 warps 96.7, a whole head (64 rows) on 2 warps 95.2; at B = 8, and at 64 heads, 4
    rows were as fast as any. Under the interpreter, all rows at once (fewer programs, faster)."""
    BN = max(16, triton.next_power_of_2(N))
    if INTERPRET:
        return max(1, triton.next_power_of_2(P)), BN, 4
    return max(1, min(triton.next_power_of_2(P), 512 // BN)), BN, 1


def selective_state_update_fwd(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, y, a_scalar: bool) -> None:
    """Launch the step: one program per (headdim slice, batch row, head), and after the first call with
    a given key directly (`kernels.launch`). x, z, B, C, y contiguous; state, dt, dt_bias, A, D with any
    strides (they enter the key: the compiled kernel specialises on strides of 1 and on multiples of 16);
    y [b, H, P] written, state updated in place."""
    b, H, P = x.shape
    N, G = state.shape[-1], B.shape[1]
    BM, BN, warps = tile_rows(P, N)
    has = (dt_bias is not None, D is not None, z is not None, slots is not None)
    # an absent optional gets a stand-in tensor (never read: its HAS_ flag is False), so every pointer
    # argument is a tensor and the direct launch applies
    dt_bias_, D_, z_, slots_ = (t if t is not None else x for t in (dt_bias, D, z, slots))
    ints = (*state.stride(), *dt.stride(), *(dt_bias.stride() if has[0] else (0, 0)), *A.stride(),
            *(D.stride() if has[1] else (0, 0)), H, P, N, H // G, G)
    key = ("mamba2_step", x.device, x.dtype, dt.dtype, A.dtype, dt_bias_.dtype, D_.dtype, slots_.dtype,
           has, a_scalar, dt_softplus, ints, BM, BN, warps)
    launch(_selective_state_update_kernel, lambda BM, BN_: (triton.cdiv(P, BM), b, H), [(BM, BN, warps, 1)], key,
           state, x, dt, dt_bias_, A, B, C, D_, z_, y, slots_, *ints,
           A_SCALAR=a_scalar, HAS_BIAS=has[0], SOFTPLUS=dt_softplus, HAS_D=has[1], HAS_Z=has[2], HAS_SLOTS=has[3])


__all__ = ["selective_state_update_fwd", "tile_rows"]
