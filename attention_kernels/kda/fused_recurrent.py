"""Fused recurrent KDA: the gated delta rule in one Triton kernel, the state kept in registers.

One program owns one (batch, head, V-tile): it loads the [K, BN] fp32 state tile once, walks the T
tokens in order, and writes the state back once. Per token, on the tile:

    S ← Diag(e^{g}) S                 decay each key row
    u = β (v - Sᵀ k)                  the prediction error for key k, a [BN] vector (a sum over K)
    S ← S + k uᵀ;   o = Sᵀ (scale·q)  the rank-1 correction and the read-out (`recurrent_token`)

The prediction Sᵀ k sums over the whole key dimension, so a program holds every key row of its value
columns (BM >= K); the value columns are independent, so they split across programs as in GLA's and
Lightning's steps. No D x D intermediate is ever written: with T = 1 this is the decode step, one
read and one write of the state. With use_qk_l2norm_in_kernel, q and k are normalised in registers.

Two constexpr switches give the decode step its own compiled code: STEP (T = 1) drops the token loop, so
every load of the step is issued before the state tile is needed, and EVEN (K a power of two, value tiles
that divide V) replaces the masks with constants the compiler removes.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common import INTERPRET
from ..linear.recurrent import (decode_tiles, launch_step, program_tile, recurrent_token, state_tile, store_state,
                                token_inputs)
from ..launch import pow2_at_least_16
from .reference import L2NORM_EPS


@triton.jit
def _kda_token(b_h, q, k, v, g, beta, o, t, base_k, base_v, base_b, o_k, o_v, m_k, m_v, scale, H,
               K: tl.constexpr, V: tl.constexpr, L2NORM: tl.constexpr, EPS: tl.constexpr):
    """Token t on the program's [BM, BN] state tile: decay, delta-rule correction, read-out (o stored).
    Returns the new tile."""
    b_q, b_k, b_v, p_tk, p_tv = token_inputs(q, k, v, t, base_k, base_v, o_k, o_v, m_k, m_v, 1.0, H, K, V)
    b_g = tl.load(g + p_tk, mask=m_k, other=0.0).to(tl.float32)
    b_beta = tl.load(beta + base_b + t * H).to(tl.float32)
    if L2NORM:
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + EPS)
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + EPS)
    # decay (g <= 0: e^g never overflows, -inf clears the channel), then the error of the prediction
    b_h = b_h * tl.exp(b_g)[:, None]
    b_u = (b_v - tl.sum(b_h * b_k[:, None], axis=0)) * b_beta
    # S += k uᵀ, o = Sᵀ (scale·q): the shared rank-1 update with no further decay
    b_h, b_o = recurrent_token(b_h, 1.0, b_q * scale, b_k, b_u, m_k, K)
    tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_v)
    return b_h


@triton.jit(do_not_specialize=["T", "H"])
def _fused_recurrent_kda_kernel(
    q, k, v, g, beta, o, h0, ht, slots, scale, T, H,
    K: tl.constexpr, V: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
    H0_AT_SLOTS: tl.constexpr, HT_AT_SLOTS: tl.constexpr,
    L2NORM: tl.constexpr, EPS: tl.constexpr, EVEN: tl.constexpr, STEP: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr,
):
    # BM covers the whole key dim (padded), BN is this program's slice of
    # value columns
    i_h, o_k, o_v, m_k, m_v, p_h, base_k, base_v = program_tile(T, H, K, V, BM, BN)
    if EVEN:  # K == BM and BN divides V: masks of constant true, which the compiler drops from every access
        m_k = tl.full([BM], 1, tl.int1)
        m_v = tl.full([BN], 1, tl.int1)
    m_h = m_k[:, None] & m_v[None, :]
    base_b = base_k // K                      # (b·T + 0)·H + h: token 0's β in [B, T, H]
    b_h = state_tile(h0, slots, p_h, m_h, H, K, V, USE_H0, H0_AT_SLOTS, BM, BN)
    if STEP:  # one token (decode): straight-line code, every load issued before the state is needed
        b_h = _kda_token(b_h, q, k, v, g, beta, o, 0, base_k, base_v, base_b, o_k, o_v, m_k, m_v, scale, H,
                         K, V, L2NORM, EPS)
    else:
        for t in range(0, T):
            b_h = _kda_token(b_h, q, k, v, g, beta, o, t, base_k, base_v, base_b, o_k, o_v, m_k, m_v, scale, H,
                             K, V, L2NORM, EPS)
    store_state(ht, slots, p_h, m_h, b_h, H, K, V, STORE_HT, HT_AT_SLOTS)


def kda_step_tiles(K: int, V: int, NBH: int):
    """The shared `decode_tiles`, except with more (batch, head) pairs than 64: then 32 value columns
    on two warps a program. The delta rule reduces over the key axis twice per token (the prediction
    Sᵀ k and the read-out), so few warps a program keep those sums short. On the H200 at B = 64, H = 32,
    K = V = 128 (graph replay, one run, the one-token whole-tile kernel): 73.5 µs with (32, 2), against
    76.4 with (32, 1), 76.8 with (16, 1) or (16, 2), 78.4 with (64, 4) and 98.5 with (8, 1)."""
    if INTERPRET or NBH <= 64:
        return decode_tiles(K, V, NBH)
    return [(pow2_at_least_16(K), 32, 2, 1)]


def fused_recurrent_fwd(q, k, v, g, beta, o, scale: float, initial_state=None, final_state=None,
                        ssm_state_indices=None, final_at_slots: bool = False,
                        l2norm: bool = False) -> None:
    """Launch the fused recurrent kernel: one program per (V-tile, batch·head).

    q, k, g: [B, T, H, K]; v, o: [B, T, H, V] (o written); beta: [B, T, H]; initial_state (read)
    and final_state (written): fp32 [B, H, K, V] or None. All contiguous. After the first call with a
    given (device, dtype, K, V, tile), the compiled kernel is launched directly (`attention_kernels.launch`).
    ssm_state_indices (int [B], contiguous) and final_at_slots: the pool's rows, as `launch_step` takes them.
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    tiles = kda_step_tiles(K, V, B * H)
    BM, BN = tiles[0][:2]
    even, step = K == BM and V % BN == 0, T == 1
    launch_step(_fused_recurrent_kda_kernel, "kda step", (q, k, v, g, beta), o, scale, initial_state, final_state,
                key=(g.dtype, beta.dtype, l2norm, step), tiles=tiles, ssm_state_indices=ssm_state_indices,
                final_at_slots=final_at_slots, L2NORM=l2norm, EPS=L2NORM_EPS,
                EVEN=even, STEP=step)


__all__ = ["fused_recurrent_fwd", "kda_step_tiles"]
