"""The pieces of a fused recurrent step that the linear families share: the state tile a program
holds in registers, one token's update and read-out, and the step's tiles and direct launch. Each
family's kernel supplies its decay (GLA: a gate per key channel; Lightning: one number per head;
KDA: a gate per key channel and the delta rule's correction) and its own loads.
"""
import triton
import triton.language as tl

from ..common import INTERPRET
from ..launch import cdiv, launch, pow2_at_least_16


def decode_tiles(K: int, V: int, NBH: int):
    """(BM, BN, num_warps, num_stages) for the step: BM = the key rows (K
    padded to a power of two), BN = the value columns of one program's tile.
    The choices are what the H200's autotuner picked for GLA's step (the same
    state tile and traffic as Lightning's and KDA's): narrow tiles and many
    warps when few (batch, head) pairs must fill 132 SMs, wider ones when
    there are plenty. The tile is kept at <= 128 fp32 registers per thread,
    and never wider than V needs."""
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


def launch_step(kernel, name: str, inputs, o, scale: float, initial_state=None, final_state=None, key=(),
                tiles=None, ssm_state_indices=None, final_at_slots: bool = False, **constexprs) -> None:
    """Launch a family's fused recurrent kernel, one program per (V-tile, batch·head), with the tiles
    of `decode_tiles` (or the given `tiles`, a list of (BM, BN, num_warps, num_stages)) and, after the
    first call, directly (`attention_kernels.launch`). The kernel's arguments:
    *inputs (q [B, T, H, K] and v [B, T, H, V] first and third), o, h0, ht, slots, scale, T, H, then the
    constexprs K, V, USE_H0, STORE_HT, H0_AT_SLOTS, HT_AT_SLOTS, BM, BN and `constexprs`. `key` adds what
    else selects the compiled variant beyond q's dtype, the sizes and the state flags (other inputs'
    dtypes, a flag).

    ssm_state_indices (int32/int64 [B], contiguous): batch row b reads its initial state from row
    ssm_state_indices[b] of initial_state (a pool of states) and, with final_at_slots, writes its final
    state into that row of final_state (the pool again, for an in-place step); without, final_state is
    [B, H, K, V]. final_state may be initial_state itself: each program reads its tile once, before it
    writes it, and no other program touches that tile (slots must be distinct for an in-place step)."""
    q, v = inputs[0], inputs[2]
    B, T, H, K = q.shape
    V = v.shape[-1]
    tiles = tiles or decode_tiles(K, V, B * H)
    use_h0, store_ht = initial_state is not None, final_state is not None
    h0_at_slots = ssm_state_indices is not None
    ht_at_slots = h0_at_slots and final_at_slots
    # an unused pointer gets a stand-in tensor (never read nor written: its flag is False), so every
    # argument is a tensor and the direct launch path applies
    h0 = initial_state if use_h0 else o
    ht = final_state if store_ht else o
    slots = ssm_state_indices if h0_at_slots else o
    launch(kernel, lambda BM, BN: (cdiv(V, BN), B * H), tiles,
           (name, q.device, q.dtype, K, V, use_h0, store_ht, h0_at_slots, ht_at_slots, slots.dtype, *key, tiles[0]),
           *inputs, o, h0, ht, slots, float(scale), T, H, K=K, V=V, USE_H0=use_h0, STORE_HT=store_ht,
           H0_AT_SLOTS=h0_at_slots, HT_AT_SLOTS=ht_at_slots, **constexprs)


@triton.jit
def slot_row(p_h, slots, H, K: tl.constexpr, V: tl.constexpr, AT_SLOTS: tl.constexpr):
    """The state offsets p_h (the program's batch row b of a [B, H, K, V] state) moved to row slots[b]
    of a pool of states [S, H, K, V], when AT_SLOTS; else p_h as it is. int64: a pool may pass 2^31
    elements."""
    if AT_SLOTS:
        i_b = tl.program_id(1) // H
        slot = tl.load(slots + i_b).to(tl.int64)
        p_h = p_h + (slot - i_b) * H * K * V
    return p_h


@triton.jit
def state_tile(h0, slots, p_h, m_h, H, K: tl.constexpr, V: tl.constexpr, USE_H0: tl.constexpr,
               AT_SLOTS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """A program's [BK, BV] slice of the state, fp32: read from h0 at p_h (at its slot's row, when
    AT_SLOTS: `slot_row`), or zeros."""
    if USE_H0:
        b_h = tl.load(h0 + slot_row(p_h, slots, H, K, V, AT_SLOTS), mask=m_h, other=0.0)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    return b_h


@triton.jit
def recurrent_token(b_h, b_decay, b_q, b_k, b_v, m_k, K: tl.constexpr):
    """One token: S = decay ⊙ S + k vᵀ, then o = Sᵀ q. b_decay is [BK, 1] (a gate per key channel)
    or a scalar (one per head); b_q (scale included), b_k: [BK] (mask m_k, K real rows); b_v: [BV];
    all fp32. Returns (the new state tile, o [BV]).

    The padded key rows (K < BK) hold k = 0, and 0 · inf is NaN: an inf in v would turn them to NaN,
    and the read-out and the delta rule's prediction sum over them. A select keeps them exactly 0, so
    the real rows' ±inf comes out as the math says; a tile without padding compiles without it."""
    b_kv = b_k[:, None] * b_v[None, :]
    if K < b_h.shape[0]:
        b_kv = tl.where(m_k[:, None], b_kv, 0.0)
    b_h = b_h * b_decay + b_kv
    return b_h, tl.sum(b_h * b_q[:, None], axis=0)


@triton.jit
def program_tile(T, H, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Where this program works: grid (V / BV, B·H), the whole key range (BK >= K) and one slice of
    value columns of one (batch, head). Returns the head i_h, key and value offsets and masks, the
    state tile's offsets p_h in a [B, H, K, V] state, and token 0's offsets in [B, T, H, K] and
    [B, T, H, V], 64-bit: B·T·H·K passes 2^31 at training lengths (B 8, T 64K, 32 heads x 128); the
    offsets t·H·K added to them stay 32-bit (one row's T·H·K < 2^31 is assumed)."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    p_h = i_bh * K * V + o_k[:, None] * V + o_v[None, :]
    r_b = (i_b * T).to(tl.int64) * H + i_h          # token 0's row in the B·T·H rows
    return i_h, o_k, o_v, m_k, m_v, p_h, r_b * K, r_b * V


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
def store_state(ht, slots, p_h, m_h, b_h, H, K: tl.constexpr, V: tl.constexpr, STORE_HT: tl.constexpr,
                AT_SLOTS: tl.constexpr):
    """Write the final state tile, if asked for (at its slot's row, when AT_SLOTS: `slot_row`)."""
    if STORE_HT:
        tl.store(ht + slot_row(p_h, slots, H, K, V, AT_SLOTS), b_h, mask=m_h)
