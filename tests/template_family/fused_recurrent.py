"""Fused recurrent linear attention: the recurrence in one Triton kernel,
state kept in registers.

One program owns one (batch, head, V-tile): it loads the [K, BV] fp32 state
tile once, walks the T tokens in order (rank-1 update, read-out) and writes
the state back once. The step's tiles and its launch are the linear
families' shared ones (`attention_kernels.linear.recurrent`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..linear.recurrent import launch_step, program_tile, recurrent_token, state_tile, store_state, token_inputs


@triton.jit(do_not_specialize=["T", "H"])
def _fused_recurrent_linear_kernel(
    q, k, v, o, h0, ht, slots, scale, T, H,
    K: tl.constexpr, V: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
    H0_AT_SLOTS: tl.constexpr, HT_AT_SLOTS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr,
):
    # BM covers the whole key dim (padded), BN is this program's slice of
    # value columns
    i_h, o_k, o_v, m_k, m_v, p_h, base_k, base_v = program_tile(T, H, K, V, BM, BN)
    m_h = m_k[:, None] & m_v[None, :]
    b_h = state_tile(h0, slots, p_h, m_h, H, K, V, USE_H0, H0_AT_SLOTS, BM, BN)
    for t in range(0, T):
        b_q, b_k, b_v, p_tk, p_tv = token_inputs(q, k, v, t, base_k, base_v, o_k, o_v, m_k, m_v, scale, H, K, V)
        # no decay: S = S + k v^T, o = S^T (q · scale)
        b_h, b_o = recurrent_token(b_h, 1.0, b_q, b_k, b_v, m_k, K)
        tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_v)
    store_state(ht, slots, p_h, m_h, b_h, H, K, V, STORE_HT, HT_AT_SLOTS)


def fused_recurrent_fwd(q, k, v, o, scale: float, initial_state=None, final_state=None) -> None:
    """Launch the kernel, one program per (V-tile, batch·head), with the
    shared step's tiles.

    q, k: [B, T, H, K]; v, o: [B, T, H, V] (o written); initial_state (read)
    and final_state (written): fp32 [B, H, K, V] or None. All contiguous.
    """
    launch_step(_fused_recurrent_linear_kernel, "template step", (q, k, v), o, scale, initial_state, final_state)


__all__ = ["fused_recurrent_fwd"]
