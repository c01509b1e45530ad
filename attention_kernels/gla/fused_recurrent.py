"""Fused recurrent GLA: the recurrence in one Triton kernel, state kept in registers.

One program owns one (batch, head, V-tile): it loads the [K, BN] fp32 state tile once,
walks the T tokens in order (decay, rank-1 update, read-out), and writes the state back
once. With T = 1 this is the decode step: one HBM read and one write of the state. The
tiles are the shared step's (`decode_tiles`, picked from this kernel's H200 runs), and
after the first call the compiled kernel is launched directly (`launch_step`).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..linear.recurrent import launch_step, program_tile, recurrent_token, state_tile, store_state, token_inputs


@triton.jit(do_not_specialize=["T", "H"])
def _fused_recurrent_gla_kernel(
    q, k, v, gk, o, h0, ht, slots, scale, T, H,
    K: tl.constexpr, V: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
    H0_AT_SLOTS: tl.constexpr, HT_AT_SLOTS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr,
):
    # BM covers the whole key dim (padded), BN is this program's slice of
    # value columns
    i_h, o_k, o_v, m_k, m_v, p_h, base_k, base_v = program_tile(T, H, K, V, BM, BN)
    m_h = m_k[:, None] & m_v[None, :]
    # the [BM, BN] state tile: fp32, in registers for the whole sequence
    b_h = state_tile(h0, slots, p_h, m_h, H, K, V, USE_H0, H0_AT_SLOTS, BM, BN)
    for t in range(0, T):
        b_q, b_k, b_v, p_tk, p_tv = token_inputs(q, k, v, t, base_k, base_v, o_k, o_v, m_k, m_v, scale, H, K, V)
        b_g = tl.load(gk + p_tk, mask=m_k, other=0.0).to(tl.float32)
        # S = Diag(exp(gk)) S + k v^T, o = S^T (q * scale); gk <= 0: exp
        # never overflows (-inf resets to 0)
        b_h, b_o = recurrent_token(b_h, tl.exp(b_g)[:, None], b_q, b_k, b_v, m_k, K)
        tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_v)
    store_state(ht, slots, p_h, m_h, b_h, H, K, V, STORE_HT, HT_AT_SLOTS)


def fused_recurrent_fwd(q, k, v, gk, o, scale: float, initial_state=None, final_state=None,
                        ssm_state_indices=None, final_at_slots: bool = False) -> None:
    """Launch the fused recurrent kernel: one program per (V-tile, batch·head).

    q, k, gk: [B, T, H, K]; v, o: [B, T, H, V] (o written); initial_state (read) and
    final_state (written): fp32 [B, H, K, V] or None. All contiguous. After the first call with a
    given (device, dtypes, K, V, tile), the compiled kernel is launched directly (`attention_kernels.launch`).
    ssm_state_indices (int [B], contiguous) and final_at_slots: the pool's rows, as `launch_step` takes them.
    """
    launch_step(_fused_recurrent_gla_kernel, "gla step", (q, k, v, gk), o, scale, initial_state, final_state,
                key=(gk.dtype,), ssm_state_indices=ssm_state_indices, final_at_slots=final_at_slots)
