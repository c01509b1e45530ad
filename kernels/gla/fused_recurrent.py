"""Fused recurrent GLA: the recurrence in one Triton kernel, state kept in registers.

One program owns one (batch, head, V-tile): it loads the [K, BV] fp32 state tile once,
walks the T tokens in order (decay, rank-1 update, read-out), and writes the state back
once. With T = 1 this is the decode step: one HBM read and one write of the state.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..launch import autotune_configs, pow2_at_least_16
from ..linear.recurrent import program_tile, recurrent_token, state_tile, store_state, token_inputs

# the H200's picks for the decode step at B·H = 32, 256 and 2048 (K = V = 128)
_CONFIGS = autotune_configs([({"BV": 16}, 8, 3), ({"BV": 64}, 2, 3), ({"BV": 32}, 4, 3)], interpreter={"BV": 32})


def _prune(configs, named_args, **kwargs):
    # Keep the state tile at <= 128 fp32 registers per thread, and BV no wider than V needs.
    BK, V = kwargs.get("BK", named_args.get("BK")), named_args["V"]
    keep = [c for c in configs
            if BK * c.kwargs["BV"] <= 128 * 32 * c.num_warps and c.kwargs["BV"] <= pow2_at_least_16(V)]
    return keep or configs[:1]


@triton.autotune(configs=_CONFIGS, key=["BK", "V", "NBH", "T_ONE"], prune_configs_by={"early_config_prune": _prune})
@triton.jit
def _fused_recurrent_gla_kernel(
    q, k, v, gk, o, h0, ht, scale,
    T, H, K: tl.constexpr, V: tl.constexpr, NBH, T_ONE,
    BK: tl.constexpr, BV: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
):
    i_h, o_k, o_v, m_k, m_v, p_h, base_k, base_v = program_tile(T, H, K, V, BK, BV)
    m_h = m_k[:, None] & m_v[None, :]
    # the [BK, BV] state tile: fp32, in registers for the whole sequence
    b_h = state_tile(h0, p_h, m_h, USE_H0, BK, BV)
    for t in range(0, T):
        b_q, b_k, b_v, p_tk, p_tv = token_inputs(q, k, v, t, base_k, base_v, o_k, o_v, m_k, m_v, scale, H, K, V)
        b_g = tl.load(gk + p_tk, mask=m_k, other=0.0).to(tl.float32)
        # S = Diag(exp(gk)) S + k v^T, o = S^T (q * scale); gk <= 0: exp never overflows (-inf resets to 0)
        b_h, b_o = recurrent_token(b_h, tl.exp(b_g)[:, None], b_q, b_k, b_v, m_k, K)
        tl.store(o + p_tv, b_o.to(o.dtype.element_ty), mask=m_v)
    store_state(ht, p_h, m_h, b_h, STORE_HT)


def fused_recurrent_fwd(q, k, v, gk, o, scale: float, initial_state=None, final_state=None) -> None:
    """Launch the fused recurrent kernel: one program per (V-tile, batch·head).

    q, k, gk: [B, T, H, K]; v, o: [B, T, H, V] (o written); initial_state (read) and
    final_state (written): fp32 [B, H, K, V] or None. All contiguous.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    _fused_recurrent_gla_kernel[lambda meta: (triton.cdiv(V, meta["BV"]), B * H)](
        q, k, v, gk, o, initial_state, final_state, scale,
        T, H, K, V, B * H, 1 if T == 1 else 2,
        BK=pow2_at_least_16(K), USE_H0=initial_state is not None, STORE_HT=final_state is not None,
    )
