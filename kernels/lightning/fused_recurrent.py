"""Fused recurrent Lightning Attention: the recurrence in one Triton kernel, state kept in registers.

One program owns one (batch, head, V-tile): it loads the [K, BV] fp32 state tile once, walks the
T tokens in order (decay by λ_h, rank-1 update, read-out), and writes the state back once. With
T = 1 this is the decode step: one HBM read and one write of the state. The decay is one number
per head, λ_h = exp(-s_h), computed once per program, not loaded per token and channel as GLA's is.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common import INTERPRET
from ..launch import launch, pow2_at_least_16
from ..linear.recurrent import program_tile, recurrent_token, state_tile, store_state, token_inputs


def decode_tiles(K: int, V: int, NBH: int):
    """(BM, BN, num_warps, num_stages) for the step: BM = the key rows (K padded to a power of two),
    BN = the value columns of one program's tile. The choices are GLA's step's H200 picks (the same
    state tile and the same traffic): narrow tiles and many warps when few (batch, head) pairs must
    fill 132 SMs, wider ones when there are plenty. The tile is kept at <= 128 fp32 registers per
    thread, and never wider than V needs."""
    BM = pow2_at_least_16(K)
    if INTERPRET:
        return [(BM, min(32, pow2_at_least_16(V)), 4, 1)]
    bn, warps = (16, 8) if NBH <= 64 else (64, 2) if NBH <= 512 else (32, 4)
    bn = min(bn, pow2_at_least_16(V))
    while BM * bn > 128 * 32 * warps and bn > 16:
        bn //= 2
    while BM * bn > 128 * 32 * warps and warps < 8:
        warps *= 2
    return [(BM, bn, warps, 3)]


@triton.jit(do_not_specialize=["T", "H"])
def _fused_recurrent_lightning_kernel(
    q, k, v, slopes, o, h0, ht, scale, T, H,
    K: tl.constexpr, V: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr,
):
    # BM covers the whole key dim (padded), BN is this program's slice of value columns
    i_h, o_k, o_v, m_k, m_v, p_h, base_k, base_v = program_tile(T, H, K, V, BM, BN)
    m_h = m_k[:, None] & m_v[None, :]
    # the head's decay λ = e^{-s}: one scalar for the whole program (s >= 0, so λ <= 1)
    b_lam = tl.exp(-tl.load(slopes + i_h))
    # the [BM, BN] state tile: fp32, in registers for the whole sequence
    b_h = state_tile(h0, p_h, m_h, USE_H0, BM, BN)
    for t in range(0, T):
        b_q, b_k, b_v, p_tk, p_tv = token_inputs(q, k, v, t, base_k, base_v, o_k, o_v, m_k, m_v, scale, H, K, V)
        # kv = λ kv + k v^T, o = kv^T (q · scale)
        b_h, b_o = recurrent_token(b_h, b_lam, b_q, b_k, b_v)
        tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_v)
    store_state(ht, p_h, m_h, b_h, STORE_HT)


def fused_recurrent_fwd(q, k, v, slopes, o, scale: float, initial_state=None, final_state=None) -> None:
    """Launch the fused recurrent kernel: one program per (V-tile, batch·head).

    q, k: [B, T, H, K]; v, o: [B, T, H, V] (o written); slopes: fp32 [H]; initial_state (read) and
    final_state (written): fp32 [B, H, K, V] or None. All contiguous. After the first call with a
    given (device, dtype, K, V, tile), the compiled kernel is launched directly (`kernels.launch`).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    tiles = decode_tiles(K, V, B * H)
    use_h0, store_ht = initial_state is not None, final_state is not None
    # an unused state pointer gets a stand-in tensor (never read nor written: USE_H0 / STORE_HT are
    # False), so every argument is a tensor and the direct launch path applies
    h0 = initial_state if use_h0 else o
    ht = final_state if store_ht else o
    launch(_fused_recurrent_lightning_kernel, lambda BM, BN: (triton.cdiv(V, BN), B * H), tiles,
           ("lightning step", q.device, q.dtype, K, V, use_h0, store_ht, tiles[0]),
           q, k, v, slopes, o, h0, ht, float(scale), T, H, K=K, V=V, USE_H0=use_h0, STORE_HT=store_ht)


__all__ = ["fused_recurrent_fwd", "decode_tiles"]
