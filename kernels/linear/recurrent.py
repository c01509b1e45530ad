"""The pieces of a fused recurrent step that every linear family shares: the state tile a program
holds in registers, and one token's update and read-out. Each family's kernel supplies its decay
(GLA: a gate per key channel; Lightning: one number per head) and its own loads.
"""
import triton
import triton.language as tl


@triton.jit
def state_tile(h0, p_h, m_h, USE_H0: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """A program's [BK, BV] slice of the state, fp32: read from h0 at p_h, or zeros."""
    if USE_H0:
        b_h = tl.load(h0 + p_h, mask=m_h, other=0.0)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    return b_h


@triton.jit
def recurrent_token(b_h, b_decay, b_q, b_k, b_v):
    """One token: S = decay ⊙ S + k vᵀ, then o = Sᵀ q. b_decay is [BK, 1] (a gate per key channel)
    or a scalar (one per head); b_q (scale included), b_k: [BK]; b_v: [BV]; all fp32.
    Returns (the new state tile, o [BV])."""
    b_h = b_h * b_decay + b_k[:, None] * b_v[None, :]
    return b_h, tl.sum(b_h * b_q[:, None], axis=0)


@triton.jit
def program_tile(T, H, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Where this program works: grid (V / BV, B·H), the whole key range (BK >= K) and one slice of
    value columns of one (batch, head). Returns the head i_h, key and value offsets and masks, the
    state tile's offsets p_h in a [B, H, K, V] state, and token 0's offsets in [B, T, H, K] and
    [B, T, H, V]."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    p_h = i_bh * K * V + o_k[:, None] * V + o_v[None, :]
    return i_h, o_k, o_v, m_k, m_v, p_h, (i_b * T * H + i_h) * K, (i_b * T * H + i_h) * V


@triton.jit
def token_inputs(q, k, v, t, base_k, base_v, o_k, o_v, m_k, m_v, scale, H, K: tl.constexpr, V: tl.constexpr):
    """Token t's q (times scale), k and v, as fp32, and the offsets of its [K] and [V] rows."""
    p_tk = base_k + t * H * K + o_k
    p_tv = base_v + t * H * V + o_v
    b_q = tl.load(q + p_tk, mask=m_k, other=0.0).to(tl.float32) * scale
    b_k = tl.load(k + p_tk, mask=m_k, other=0.0).to(tl.float32)
    b_v = tl.load(v + p_tv, mask=m_v, other=0.0).to(tl.float32)
    return b_q, b_k, b_v, p_tk, p_tv


@triton.jit
def store_state(ht, p_h, m_h, b_h, STORE_HT: tl.constexpr):
    """Write the final state tile, if asked for."""
    if STORE_HT:
        tl.store(ht + p_h, b_h, mask=m_h)
