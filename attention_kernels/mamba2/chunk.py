"""The SSD chunk scan (Dao & Gu 2024): Mamba-2's prefill, built like the other linear families'.

Mamba-2 is linear attention with a scalar gate per head and token: with the log decay a_t = dt_t·A
(<= 0 in a model), k_t = B_t (per group), v_t = x_t·dt_t and q_t = C_t, the step h_t = e^{a_t} h_{t-1} + v_t k_tᵀ,
y_t = h_t q_t is the book's recurrence S_t = e^{g_t} S_{t-1} + k_t v_tᵀ with S = hᵀ ([dstate, headdim]
= [K, V]). The chunk is 16, 32, 64, 128 or 256 tokens long (mamba_ssm's models use 256); a chunk
longer than 64 is read in blocks of 64 rows, so no program holds more than a 64-token chunk's tiles.
A prompt takes three launches (four with chunks of 256), and (for contiguous x, B, C, z) nothing else
runs on the GPU but the allocations of what they write:

    ssd_gates(dt, dt_bias, A)          dt after its bias and softplus, and b, the in-chunk cumulative
                                       log decay of dt·A (one elementwise kernel)
    ssd_state_pass(B, x, dt, b)        the state at every chunk start, and the final one: the shared
                                       pass's loop with one decay per head, B read per group and dt
                                       folded into the keys; for chunks of 256 split in two, every
                                       chunk's own state at once, then an elementwise walk along the chunks

then the output of every block of every chunk at once, in the SSD form:

    Y = diag(e^{b}) C S_start  +  (L ∘ C Bᵀ) diag(dt) x  +  D ⊙ x,    then  Y ⊙ silu(z)
    L_ts = e^{b_t - b_s} for s <= t (the 1-semiseparable mask, exp of a segment sum), else 0

C Bᵀ is formed in place over dstate in tiles (one tensor-core product per tile, never stored), L and
dt_s scale its entries, and the product with x is a second tensor-core product: the intra-chunk part
is the quadratic, attention-like form, the inter-chunk part the linear one. The values x·dt are never
written: the state pass folds dt into the keys, the output kernel into the columns of the scores. B
and C are read per group, as GQA reads its shared keys, and the initial and final states are read
and written in mamba_ssm's [headdim, dstate] layout by the state pass itself.

The backward (`ssd_chunk_scan_bwd`) is the shared one of attention_kernels/linear/chunk_backward.py on that same
mapping, with k = B·dt (dt folded into the keys there) and v = x, recomputed in chunks of 64 from the
inputs, with q = C and k = B read per group, as the forward reads them; dq and dk are summed over each
group's heads inside their two kernels (B's and C's gradients, with dt's share through the keys), never written
per head. The elementwise chain rule around it,
silu(z) and D, in one-pass Triton kernels; the softplus, dt_bias and A on [Bt, T, H] in PyTorch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ..launch import autotune_configs, cdiv, next_power_of_2, pow2_at_least_16
from ..linear.chunk import CHUNK, GATE_FLOOR, chunk_state_base, chunk_state_dtype, dot_precision, tiles_that_fit
from ..linear.chunk_backward import (chunk_dv, chunk_row, chunk_state_grad_pass, decayed_score_grad,
                                     inter_chunk_products, score_grad_tile)
from ..tl_helpers import dot_causal
from .decode import _softplus

BLOCK = CHUNK   # the most rows of a chunk one program holds: a chunk of 128 or 256 is walked in blocks of 64


# ------------------------------------------------------------------ 1. dt and the cumulative decay
@triton.jit(do_not_specialize=["T", "H"])
def _ssd_gates_kernel(
    dt, dt_bias, A, dtf, b, T, H,
    s_db, s_dt, s_dh, s_bias, s_A,             # dt's strides (batch, token, head); dt_bias's and A's
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, FLOOR: tl.constexpr, BT: tl.constexpr, BH: tl.constexpr,
):
    # one program: the BT tokens of chunk i_t (BT = the chunk length), heads [i_hb·BH, (i_hb+1)·BH), of
    # batch row i_b
    i_t, i_hb, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = i_t * BT + tl.arange(0, BT)
    o_h = i_hb * BH + tl.arange(0, BH)
    m_h = o_h < H
    m = (o_t < T)[:, None] & m_h[None, :]
    # dt may be a strided view (a slice of the input projection): 64-bit offsets, its own strides
    p_dt = dt + i_b.to(tl.int64) * s_db + o_t.to(tl.int64)[:, None] * s_dt + o_h[None, :] * s_dh
    b_dt = tl.load(p_dt, mask=m, other=0.0).to(tl.float32)
    if HAS_BIAS:
        b_dt += tl.load(dt_bias + o_h * s_bias, mask=m_h, other=0.0).to(tl.float32)[None, :]
    if SOFTPLUS:
        b_dt = _softplus(b_dt)
    b_g = b_dt * tl.load(A + o_h * s_A, mask=m_h, other=0.0).to(tl.float32)[None, :]
    b_g = tl.where(b_g < FLOOR, FLOOR, b_g)    # -inf -> FLOOR, as chunk_local_cumsum does; NaN stays NaN
    p_out = (i_b * T + o_t[:, None]) * H + o_h[None, :]
    tl.store(dtf + p_out, b_dt, mask=m)
    tl.store(b + p_out, tl.cumsum(b_g, axis=0), mask=m)


def ssd_gates(dt, dt_bias, A, dt_softplus: bool, dtf, b, chunk_size: int = CHUNK) -> None:
    """dt after its bias and softplus, and the in-chunk cumulative log decay, in one launch.

    dt: [Bt, T, H], any float dtype and strides; dt_bias: [H] or None; A: [H] (<= 0 in a model; any
    sign computes). Written: dtf fp32 [Bt, T, H] = softplus(dt + dt_bias) (the softplus when
    dt_softplus; the decode step's cut-off at 20), and b fp32 [Bt, T, H, 1] = the cumulative sum
    of dtf·A inside each chunk of chunk_size tokens (16 to 256), gates below GATE_FLOOR counted as
    GATE_FLOOR: what `chunk_local_cumsum` writes for g = dtf·A. dtf and b contiguous.

        >>> dtf, b = torch.empty(Bt, T, H, device=dt.device), torch.empty(Bt, T, H, 1, device=dt.device)
        >>> ssd_gates(dt, dt_bias, A, True, dtf, b)
        >>> b[:, :CHUNK, :, 0].exp()        # the decay from the first chunk's start to each of its tokens
    """
    Bt, T, H = dt.shape
    BH = min(64, next_power_of_2(H), 8192 // chunk_size)    # a block of at most 8K gates
    bias = dt_bias if dt_bias is not None else A          # a stand-in pointer, never read
    _ssd_gates_kernel[(cdiv(T, chunk_size), cdiv(H, BH), Bt)](
        dt, bias, A, dtf, b, T, H, *dt.stride(), bias.stride(0), A.stride(0),
        HAS_BIAS=dt_bias is not None, SOFTPLUS=dt_softplus, FLOOR=GATE_FLOOR, BT=chunk_size, BH=BH)


# ------------------------------------------------------------------ 2. the state at every chunk start
# Two ways, picked by the chunk length (`ssd_state_pass`). The sequential pass walks the chunks with the
# products inside the walk, one program per batch·head and state tile: it reads x once per dstate tile and
# writes the states once. The split (the SSD paper's, mamba_ssm's) computes every chunk's own state at once,
# then passes the states along the chunks elementwise: it reads x once, but writes the local states in fp32
# and reads them back. Per token and head (bf16, dstate N = 128, headdim P = 64, dstate tiles of 64):
# sequential 2·2P + 2NP/L bytes, 512 at L = 64 and 320 at 256; split 2P + 10NP/L, 1408 and 448. The split
# moves more bytes at every length and buys parallelism with them: the sequential pass has B·H·N/BK programs
# (160 at batch 1, 80 heads), too few to reach the memory's bandwidth (its 316 µs at 16K on the H200, chunk
# 64, moved 0.67 GB: ~2.1 TB/s). At L = 256 the split's extra bytes are 1.4x, at 64 2.75x: the split takes
# the chunks of 256 (mamba_ssm's), the sequential pass the shorter ones (the book's 64, and the backward's).
# Timed at chunks of 64 (B 1, T 16K, 80 heads, an H100, `scripts/tune_probe.py ssd_state_split`): sequential
# 310 µs with bf16 states, split 743 (399 the chunks' own states, 344 the pass); fp32 states 402 against 862.
SPLIT_FROM_CHUNK = 256

# 2a. The sequential pass.
# (BK over dstate, BV over headdim), num_warps, num_stages on the GPU (the interpreter runs (32, 32)).
# On the H200 at dstate 128, headdim 64, 80 heads, B = 1, T = 4K, this loop as the shared pass ran
# it: (32, 64) on 2 warps 345 µs, (64, 64) on 4 warps 392, (64, 64) on 2 warps 450, (64, 32) 515.
_STATE_TILES = [({"BK": 32, "BV": 64}, 2, 3), ({"BK": 64, "BV": 64}, 4, 3), ({"BK": 64, "BV": 64}, 2, 3)]
_STATE_CONFIGS = autotune_configs(_STATE_TILES, interpreter={"BK": 32, "BV": 32})

_fits = tiles_that_fit("N", "P")  # dstate and headdim


@triton.jit
def _add_chunk_tokens(b_h, B, x, dt, b, b_last, i_t, i_b, i_h, i_g, o_k, o_v, m_k, m_v, T, H, G,
                      N: tl.constexpr, P: tl.constexpr, L: tl.constexpr, BT: tl.constexpr, DOT_PREC: tl.constexpr):
    """b_h [dstate tile, headdim tile] plus what chunk i_t's tokens write into the state by its end, read in
    blocks of BT <= 64 (L / BT of them, unrolled), so a long chunk holds no more in registers than a chunk of
    64: token s enters as (dt_s e^{b_last - b_s} B_s) x_sᵀ. dt and the decay to the chunk end (exponent <= 0 in a
    model) are one number per token, applied to Bᵀ's columns; x·dt is never formed."""
    for i_s in tl.static_range(L // BT):
        t0 = i_t * L + i_s * BT
        o_c = tl.arange(0, BT)
        o_t = t0 + o_c
        m_t = o_t < T
        p_th = (i_b * T + o_t) * H + i_h
        b_w = tl.load(dt + p_th, mask=m_t, other=0.0) * tl.exp(b_last - tl.load(b + p_th, mask=m_t, other=0.0))
        b_w = tl.where(m_t, b_w, 0.0)
        b_kt = tl.load(B + chunk_row(i_b, t0, i_g, T, G) * N + (o_c[None, :] * G) * N + o_k[:, None],
                       mask=m_k[:, None] & m_t[None, :], other=0.0)
        b_x = tl.load(x + chunk_row(i_b, t0, i_h, T, H) * P + (o_c[:, None] * H) * P + o_v[None, :],
                      mask=m_t[:, None] & m_v[None, :], other=0.0)
        b_h += tl.dot((b_kt * b_w[None, :]).to(b_x.dtype), b_x, input_precision=DOT_PREC)
    return b_h


@triton.autotune(configs=_STATE_CONFIGS, key=["N", "P", "NBH", "L"], prune_configs_by={"early_config_prune": _fits})
@triton.jit(do_not_specialize=["T", "H", "NT", "NBH", "HPG", "G"])
def _ssd_state_kernel(
    B, x, dt, b, h, h0, ht, T, H, NT, NBH, HPG, G,
    N: tl.constexpr, P: tl.constexpr, L: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, DOT_PREC: tl.constexpr,
):
    # one program: dstate rows [i_k·BK, ..) and headdim columns [i_v·BV, ..)
    # of one (batch, head)'s state, carried in fp32 from chunk to chunk; a
    # chunk of L tokens is read in blocks of BT <= 64 (L / BT of them,
    # unrolled), so a long chunk holds no more in registers than a chunk of
    # 64
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    i_g = i_h // HPG                                     # the head's group: its B
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < N, o_v < P
    m_h = m_k[:, None] & m_v[None, :]
    p_h = o_k[:, None] * P + o_v[None, :]                # a chunk state, [dstate, headdim]
    p_io = o_k[:, None] + o_v[None, :] * N               # the initial and final ones, mamba_ssm's [headdim, dstate]
    if USE_H0:
        b_h = tl.load(h0 + i_bh.to(tl.int64) * N * P + p_io, mask=m_h, other=0.0)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)

    for i_t in range(NT):
        # the state at the start of chunk i_t, for the output kernel (in the
        # input dtype)
        tl.store(h + chunk_state_base(i_b, i_t, i_h, NT, H, N, P) + p_h, b_h.to(h.dtype.element_ty), mask=m_h)
        t_last = tl.minimum(i_t * L + L, T) - 1
        b_last = tl.load(b + (i_b * T + t_last) * H + i_h)
        b_h = b_h * tl.exp(b_last)
        b_h = _add_chunk_tokens(b_h, B, x, dt, b, b_last, i_t, i_b, i_h, i_g, o_k, o_v, m_k, m_v, T, H, G,
                                N, P, L, BT, DOT_PREC)

    if STORE_HT:
        tl.store(ht + i_bh.to(tl.int64) * N * P + p_io, b_h, mask=m_h)


# 2b. The split, first every chunk's own state: (BK over dstate, BV over headdim), num_warps, num_stages on
# the GPU. ptxas (sm_90a, bf16, dstate 128, headdim 64) at L = 64 and 256: (64, 64) on 4 warps 76 and 96
# registers, (128, 64) on 4 warps 122 and 204, on 8 warps 74 and 114; no spills, wgmma in each
# (scripts/ssd_state_compile.py). The walk's kernel below: 32 registers (bf16 states), 40 (fp32, in place).
_CHUNK_STATE_TILES = [({"BK": 64, "BV": 64}, 4, 2), ({"BK": 128, "BV": 64}, 4, 2), ({"BK": 128, "BV": 64}, 8, 2)]
_CHUNK_STATE_CONFIGS = autotune_configs(_CHUNK_STATE_TILES, interpreter={"BK": 32, "BV": 32})


@triton.autotune(configs=_CHUNK_STATE_CONFIGS, key=["N", "P", "L"], prune_configs_by={"early_config_prune": _fits})
@triton.jit(do_not_specialize=["T", "H", "NT", "HPG", "G"])
def _ssd_chunk_state_kernel(
    B, x, dt, b, local, T, H, NT, HPG, G,
    N: tl.constexpr, P: tl.constexpr, L: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    # one program: dstate rows [i_k·BK, ..) and headdim columns [i_v·BV, ..)
    # of chunk i_t's own state, of one (batch, head):
    # Σ_s (dt_s e^{b_last - b_s} B_s) x_sᵀ over the chunk's tokens, from a
    # zero state. No program waits for another; a chunk of L tokens is read
    # in blocks of BT <= 64 (unrolled)
    i_t, i_kv, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NV = tl.cdiv(P, BV)
    i_k, i_v = i_kv // NV, i_kv % NV
    i_b, i_h = i_bh // H, i_bh % H
    i_g = i_h // HPG                                     # the head's group: its B
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < N, o_v < P
    t_last = tl.minimum(i_t * L + L, T) - 1
    b_last = tl.load(b + (i_b * T + t_last) * H + i_h)
    b_h = _add_chunk_tokens(tl.zeros([BK, BV], dtype=tl.float32), B, x, dt, b, b_last, i_t, i_b, i_h, i_g,
                            o_k, o_v, m_k, m_v, T, H, G, N, P, L, BT, DOT_PREC)
    p_c = chunk_state_base(i_b, i_t, i_h, NT, H, N, P)          # this chunk's own state in local [Bt, NT, H, N, P]
    tl.store(local + p_c + o_k[:, None] * P + o_v[None, :], b_h, mask=m_k[:, None] & m_v[None, :])


# 2c. Then the walk over the chunks. Elements of one (batch, head)'s state per program, and warps: each element
# is its own scalar recurrence, so a program's tile is a flat run of the [dstate, headdim] state.
_PASS_BLOCK, _PASS_WARPS = 1024, 4


@triton.jit(do_not_specialize=["T", "H", "NT"])
def _ssd_state_pass_kernel(
    local, b, h, h0, ht, T, H, NT,
    N: tl.constexpr, P: tl.constexpr, L: tl.constexpr, BE: tl.constexpr,
    IN_PLACE: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
):
    # one program: state elements [i_e·BE, ..) of one (batch, head), walking
    # the chunks in order:
    # S_start(c+1) = e^{b_last(c)} S_start(c) + local(c), one multiply-add
    # per element and chunk. With IN_PLACE the chunk-start states overwrite
    # the local ones (chunk c's is read before it is written)
    i_e, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_e = i_e * BE + tl.arange(0, BE)
    m_e = o_e < N * P
    p_io = (o_e % P) * N + o_e // P                      # the initial and final states: [headdim, dstate]
    if IN_PLACE:
        h = local
    if USE_H0:
        b_h = tl.load(h0 + i_bh.to(tl.int64) * N * P + p_io, mask=m_e, other=0.0)
    else:
        b_h = tl.zeros([BE], dtype=tl.float32)
    p_c = chunk_state_base(i_b, 0, i_h, NT, H, N, P) + o_e   # chunk 0's state of this head
    # the next chunk's local state and decay are loaded one step ahead, so
    # that their latency overlaps the current step instead of stalling it
    b_next = tl.load(local + p_c, mask=m_e, other=0.0)
    g_next = tl.load(b + (i_b * T + tl.minimum(L, T) - 1) * H + i_h)
    for i_t in range(NT):
        b_loc, g_last = b_next, g_next
        # the condition as a tensor (o_e * 0 + ...): newer Tritons'
        # interpreter refuses a scalar in a mask
        b_next = tl.load(local + p_c + H * N * P, mask=m_e & (o_e * 0 + i_t + 1 < NT), other=0.0)
        g_next = tl.load(b + (i_b * T + tl.minimum(i_t * L + 2 * L, T) - 1) * H + i_h)
        tl.store(h + p_c, b_h.to(h.dtype.element_ty), mask=m_e)
        b_h = b_h * tl.exp(g_last) + b_loc
        p_c += H * N * P
    if STORE_HT:
        tl.store(ht + i_bh.to(tl.int64) * N * P + p_io, b_h, mask=m_e)


def ssd_state_pass(B, x, dtf, b, states, initial_states=None, final_states=None, chunk_size: int = CHUNK) -> None:
    """The state at the start of every chunk, and after the last: the one part sequential over chunks. The
    shared pass's recurrence (attention_kernels/linear/chunk.py) with Mamba-2's three differences: one decay
    per head and token, B read per group, and dt folded into the keys. Chunks of SPLIT_FROM_CHUNK tokens or
    more take the split (two launches: every chunk's own state from a zero start, all chunks at once, then
    S_start(c+1) = e^{b_last(c)} S_start(c) + local(c) elementwise along the chunks); shorter ones the
    sequential pass (one launch, the products inside the walk). Section 2's comment counts the bytes.

    B: [Bt, T, G, N]; x: [Bt, T, H, P]; dtf, b: fp32 [Bt, T, H] and [Bt, T, H, 1] (`ssd_gates`, with
    the same chunk_size). Written: states [Bt, NT, H, N, P] (NT = ceil(T / chunk_size)), in x's dtype (the
    output kernel's and the backward's operand) or fp32 (the split then computes the local states in it and
    overwrites them in place, taking no more memory); final_states fp32 [Bt, H, P, N]
    unless None. initial_states: fp32
    [Bt, H, P, N] or None (zeros). The initial and final states are in mamba_ssm's layout, which the decode
    step reads. All contiguous.
    """
    Bt, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    NT = cdiv(T, chunk_size)
    if chunk_size < SPLIT_FROM_CHUNK:
        _ssd_state_kernel[lambda m: (cdiv(N, m["BK"]), cdiv(P, m["BV"]), Bt * H)](
            B, x, dtf, b, states, initial_states, final_states, T, H, NT, Bt * H, H // G, G, N, P, L=chunk_size,
            BT=min(chunk_size, BLOCK),
            USE_H0=initial_states is not None, STORE_HT=final_states is not None, DOT_PREC=dot_precision(x.dtype))
        return
    in_place = states.dtype == torch.float32
    local = states if in_place else torch.empty(states.shape, dtype=torch.float32, device=states.device)
    _ssd_chunk_state_kernel[lambda m: (NT, cdiv(N, m["BK"]) * cdiv(P, m["BV"]), Bt * H)](
        B, x, dtf, b, local, T, H, NT, H // G, G, N, P, L=chunk_size, BT=min(chunk_size, BLOCK),
        DOT_PREC=dot_precision(x.dtype))
    block = min(_PASS_BLOCK, next_power_of_2(N * P))
    _ssd_state_pass_kernel[(cdiv(N * P, block), Bt * H)](
        local, b, states, initial_states, final_states, T, H, NT, N, P, L=chunk_size, BE=block,
        IN_PLACE=in_place, USE_H0=initial_states is not None, STORE_HT=final_states is not None,
        num_warps=_PASS_WARPS)


# ------------------------------------------------------------------ 3. the output of every chunk
# (BK over dstate, BV over headdim), num_warps, num_stages on the GPU (the interpreter runs (32, 32)
# alone). (128, 64) at 4 warps and 2 stages was the fastest on the H200 at dstate 128, headdim 64,
# 80 heads. No BV below 64: (128, 32) at 4 warps and 2 stages ended in an illegal memory access there,
# though the same tile computes the right result under the interpreter (tests/test_mamba2.py).
_TILES = [({"BK": 128, "BV": 64}, 4, 2), ({"BK": 64, "BV": 64}, 4, 3), ({"BK": 64, "BV": 64}, 4, 2),
          ({"BK": 128, "BV": 64}, 8, 3)]
_CONFIGS = autotune_configs(_TILES, interpreter={"BK": 32, "BV": 32})


@triton.jit
def _group_tile_at(i_b, i_t, i_g, o_c, o_k, T, G, N: tl.constexpr, BT: tl.constexpr):
    """Where C's and B's [BT, BK] tiles of group i_g, block i_t of BT tokens and dstate columns o_k lie in
    [Bt, T, G, N]: the block's first row (64-bit, `chunk_row`) and the tiles' 32-bit offsets after it."""
    return chunk_row(i_b, i_t * BT, i_g, T, G), (o_c[:, None] * G) * N + o_k[None, :]


@triton.autotune(configs=_CONFIGS, key=["N", "P", "HAS_D", "HAS_Z", "STORE_UNGATED", "L"],
                 prune_configs_by={"early_config_prune": _fits})
@triton.jit(do_not_specialize=["T", "H", "NT", "HPG", "G"])
def _ssd_output_kernel(
    C, B, x, dt, b, h, D, z, y, y_ungated, T, H, NT, HPG, G, s_Dh, s_Dp,
    N: tl.constexpr, P: tl.constexpr, L: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, STORE_UNGATED: tl.constexpr, DOT_PREC: tl.constexpr,
):
    # one program: block i_s (BT rows) of chunk i_t (L = NB·BT rows), headdim
    # columns [i_v·BV, ..), of one (batch, head). A chunk of at most 64
    # tokens is one block.
    NB = L // BT                                         # blocks per chunk (a constexpr)
    i_v, i_ts, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_t, i_s = i_ts // NB, i_ts % NB
    i_b, i_h = i_bh // H, i_bh % H
    i_g = i_h // HPG                                     # the head's group: its B and C
    i_blk = i_t * NB + i_s                               # the block's place among the sequence's blocks of BT
    o_c = tl.arange(0, BT)
    o_t = i_t * L + i_s * BT + o_c
    m_t = o_t < T
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < P
    p_hc = h + chunk_state_base(i_b, i_t, i_h, NT, H, N, P)     # the state at the chunk's start
    p_th = (i_b * T + o_t) * H + i_h                     # token rows of this head in [Bt, T, H]
    b_b = tl.load(b + p_th, mask=m_t, other=0.0)         # [BT] cumulative log decay from the chunk start
    b_dt = tl.load(dt + p_th, mask=m_t, other=0.0)       # [BT] dt after bias and softplus

    # C S_start and C Bᵀ, both over dstate in tiles of BK: [BT, BV] and
    # [BT, BT]
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_S = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(N, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < N
        b_c, b_k, _, _, _ = _group_tiles(C, B, i_b, i_blk, i_g, o_c, m_t, o_k, T, G, N, BT)
        b_h = tl.load(p_hc + o_k[:, None] * P + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_o += tl.dot(b_c, b_h.to(b_c.dtype), input_precision=DOT_PREC)
        b_S += tl.dot(b_c, tl.trans(b_k), input_precision=DOT_PREC)

    # inter-chunk: diag(e^{b_t}) (C S_start): one decay per row, from the
    # chunk start to token t
    b_o = b_o * tl.exp(b_b)[:, None]

    # intra-chunk, the chunk's earlier blocks (a chunk longer than one
    # block): every token s of block j < i_s precedes every row t, so (L ∘ C
    # Bᵀ) needs no mask there, L_ts = e^{b_t - b_s}
    if NB > 1:
        for j in range(i_s):
            o_j = i_t * L + j * BT + o_c                 # block j's tokens (all < T: block i_s has a row < T)
            p_tj = (i_b * T + o_j) * H + i_h
            b_Sj = tl.zeros([BT, BT], dtype=tl.float32)
            for i_k in range(tl.cdiv(N, BK)):
                o_k = i_k * BK + tl.arange(0, BK)
                m_k = o_k < N
                r_g, p_g = _group_tile_at(i_b, i_blk, i_g, o_c, o_k, T, G, N, BT)
                r_j, _ = _group_tile_at(i_b, i_t * NB + j, i_g, o_c, o_k, T, G, N, BT)   # block j's row: p_g again
                b_c = tl.load(C + r_g * N + p_g, mask=m_t[:, None] & m_k[None, :], other=0.0)
                b_kj = tl.load(B + r_j * N + p_g, mask=m_k[None, :], other=0.0)
                b_Sj += tl.dot(b_c, tl.trans(b_kj), input_precision=DOT_PREC)
            b_Lj = tl.exp(b_b[:, None] - tl.load(b + p_tj)[None, :]) * tl.load(dt + p_tj)[None, :]
            b_xj = tl.load(x + chunk_row(i_b, i_t * L + j * BT, i_h, T, H) * P + (o_c[:, None] * H) * P
                           + o_v[None, :], mask=m_v[None, :], other=0.0)
            b_o += tl.dot((b_Sj * b_Lj).to(b_xj.dtype), b_xj, input_precision=DOT_PREC)

    # intra-chunk, the block itself: (L ∘ C Bᵀ) diag(dt) x, with
    # L_ts = e^{b_t - b_s} on and below the diagonal: column s of the scores
    # takes token s's dt, so x·dt is never formed. The exponent is -inf above
    # the diagonal (e^{b_t - b_s} there would overflow when the gates grow);
    # on and below it is the recurrence's, unclamped, whatever the sign of
    # dt·A. The select (not a factor 0) keeps the pairs s > t out, whatever a
    # later token's values.
    m_lo = o_c[:, None] >= o_c[None, :]
    b_L = tl.exp(tl.where(m_lo, b_b[:, None] - b_b[None, :], float("-inf"))) * b_dt[None, :]
    b_S = tl.where(m_lo, b_S * b_L, 0.0)
    p_x = chunk_row(i_b, i_t * L + i_s * BT, i_h, T, H) * P + (o_c[:, None] * H) * P + o_v[None, :]
    m_x = m_t[:, None] & m_v[None, :]
    b_x = tl.load(x + p_x, mask=m_x, other=0.0)
    b_o = dot_causal(b_S.to(b_x.dtype), b_x, b_o, DOT_PREC)

    # the skip D ⊙ x (x is already in registers) and the gate silu(z), on the
    # fp32 accumulator; a training forward also stores o + D ⊙ x before the
    # gate, the backward's operand for z's gradient
    if HAS_D:
        b_D = tl.load(D + i_h * s_Dh + o_v * s_Dp, mask=m_v, other=0.0).to(tl.float32)
        b_o += b_x.to(tl.float32) * b_D[None, :]
    if STORE_UNGATED:
        tl.store(y_ungated + p_x, b_o.to(y_ungated.dtype.element_ty), mask=m_x)
    if HAS_Z:
        b_z = tl.load(z + p_x, mask=m_x, other=0.0).to(tl.float32)
        b_o = b_o * b_z * tl.sigmoid(b_z)
    tl.store(y + p_x, b_o.to(y.dtype.element_ty), mask=m_x)


def ssd_output(C, B, x, dtf, b, states, D, z, y, chunk_size: int = CHUNK, y_ungated=None) -> None:
    """Y = diag(e^b) C S_start + (L ∘ C Bᵀ) diag(dt) x (+ D ⊙ x, ⊙ silu(z)) for every chunk, all
    chunks in parallel: one program per headdim tile, block of at most 64 rows of a chunk, and
    batch·head; in a chunk longer than 64 a block's program also walks the chunk's earlier blocks.

    C, B: [Bt, T, G, N]; x, z: [Bt, T, H, P]; dtf, b: fp32 [Bt, T, H] and [Bt, T, H, 1] (`ssd_gates`);
    states: [Bt, NT, H, N, P] (`ssd_state_pass`), all three with the same chunk_size (16, 32, 64,
    128 or 256); D: [H, P] or [H] (any strides and float dtype) or None. Written: y [Bt, T, H, P],
    and, where y_ungated is given (with z), the output before its gate, Y without ⊙ silu(z), into
    y_ungated [Bt, T, H, P] (one more store in the same launch: the training forward keeps it for
    z's gradient). C, B, x, z, dtf, b, states, y, y_ungated contiguous.

        >>> y = torch.empty_like(x)
        >>> ssd_output(C, B, x, dtf, b, states, D, z, y, chunk_size=256)
    """
    Bt, T, H, P = x.shape
    G, N = C.shape[2], C.shape[3]
    BT = min(chunk_size, BLOCK)
    s_D = (0, 0) if D is None else (D.stride(0), D.stride(1) if D.dim() == 2 else 0)   # [H]: one D per head
    _ssd_output_kernel[lambda m: (cdiv(P, m["BV"]), cdiv(T, BT), Bt * H)](
        C, B, x, dtf, b, states, D, z, y, y if y_ungated is None else y_ungated,   # y: a stand-in, never written
        T, H, cdiv(T, chunk_size), H // G, G, *s_D, N, P, L=chunk_size, BT=BT, HAS_D=D is not None,
        HAS_Z=z is not None, STORE_UNGATED=y_ungated is not None, DOT_PREC=dot_precision(x.dtype))


def ssd_chunk_scan_fwd(dims, x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states,
                       return_final_states, y_ungated=None):
    """The scan on checked inputs (interface.ssd_chunk_scan): returns (y,
    final_states or None). y_ungated (with z; contiguous, x's shape and
    dtype), where given, is written with the output before its gate,
    o + D ⊙ x, for a backward to take instead of recomputing it."""
    Bt, T, H, P, N, G = dims
    x, B, C = x.contiguous(), B.contiguous(), C.contiguous()
    z = None if z is None else z.contiguous()
    dtf = torch.empty(Bt, T, H, dtype=torch.float32, device=x.device)
    b = torch.empty(Bt, T, H, 1, dtype=torch.float32, device=x.device)
    ssd_gates(dt, dt_bias, A, dt_softplus, dtf, b, chunk_size)
    states = torch.empty(Bt, cdiv(T, chunk_size), H, N, P, dtype=x.dtype, device=x.device)
    h0 = None if initial_states is None else initial_states.contiguous()
    ht = torch.empty(Bt, H, P, N, dtype=torch.float32, device=x.device) if return_final_states else None
    ssd_state_pass(B, x, dtf, b, states, h0, ht, chunk_size)
    y = torch.empty_like(x)
    ssd_output(C, B, x, dtf, b, states, D, z, y, chunk_size, y_ungated)
    return y, ht


# ------------------------------------------------------------------ 4. the backward
# The elementwise step before the shared backward, one pass over its tensors: the gate's gradient (the skip's
# share of dx is added by chunk_dv). 8 warps on tiles of 2K elements: ptxas (sm_90a, bf16, dstate 128) gives
# it 48 registers, no spills; 4K-element tiles on 4 warps spill.
_TAIL_ROWS, _TAIL_COLS = 16, 128          # tokens × (head, headdim) columns of the elementwise pass
_TAIL_WARPS = 8
# dq and dk summed over a group's heads, in two launches over runs of 16 heads a program (80 heads: 5 runs;
# partial sums 2 x 42 MB). First the intra-chunk work, once per chunk and run (1,280 programs at 16K), on 4 warps
# and 2 stages: C Bᵀ over the whole dstate in tiles of 64, then per head the decay tile, W and the intra shares of
# the gate's and dt's gradients. Then the key tiles (5,120 programs): dstate tiles of 32, a whole headdim of 64 a
# tile, on 4 warps and 3 stages. With the headdim in one tile the loop over the heads is the innermost loop, so
# Triton pipelines it: the next heads' x, do, states, dt and gates are copied to shared memory while this head's
# two inter-chunk products run; W B and Wᵀ C once a program. Measured on an H200 (B 1, T 16K, 80 heads x 64,
# dstate 128, bf16; the backward alone, `scripts/tune_probe.py ssd_dqk_configs`): 965 µs for the two (532 key
# tiles + 434 intra), against 1,192 with the intra kernel on 8 warps (662) and 1,506 with the key tiles on 8
# warps too; the backward 2,672 µs (on an H100: 1,048 µs, against 1,263 and 1,534; the backward 2,938).
# ptxas (sm_90a, bf16, dstate 128, headdim 64): the intra kernel 254 registers (182 on 8 warps), 32 KB of
# shared memory; the key-tile kernel 167 (102 on 8 warps); no spills. The key tiles' shared memory: 72 KB at 3
# stages with 16-bit inputs; with fp32 inputs 136 KB, 96 at 2 stages, which a GPU with ~100 KB a program (sm_86,
# sm_89) needs.
_DQK_HEADS, _DQK_BK, _DQK_BV, _DQK_WARPS, _DQK_STAGES = 16, 32, 64, 4, 3
_DQK_STAGES_ON = {}   # device -> the stage count that fits there, where it is not _DQK_STAGES
_DQK_INTRA_BK, _DQK_INTRA_WARPS, _DQK_INTRA_STAGES = 64, 4, 2


@triton.jit
def _row_tile(T, HP, BT: tl.constexpr, BC: tl.constexpr):
    """The elementwise pass's tile: tokens [i_t·BT, ..) × columns [i_c·BC, ..) of batch row i_b's [T, H·P]
    rows, (i_t, i_c, i_b) the program ids. Returns its columns, its mask and its offsets: a 64-bit offset for
    the tile, 32-bit ones inside it (64-bit ones per element cost registers)."""
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_r = tl.arange(0, BT)
    o_c = i_c * BC + tl.arange(0, BC)
    m = (i_t * BT + o_r < T)[:, None] & (o_c < HP)[None, :]
    base = (i_b * T + i_t * BT).to(tl.int64) * HP
    return o_c, m, base + (o_r[:, None] * HP + o_c[None, :])


@triton.jit(do_not_specialize=["T", "HP", "NTB"])
def _ssd_gate_grad_kernel(
    dy, z, y_ungated, x, do, dz, dD_part, T, HP, NTB,
    HAS_Z: tl.constexpr, HAS_D: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
):
    # one program: tokens [i_t·BT, ..) × columns [i_c·BC, ..) of the [T, H·P] rows of batch row i_b. From
    # y = (o + D ⊙ x) ⊙ silu(z): dz = dy ⊙ (o + D ⊙ x) ⊙ σ(z)(1 + z(1 - σ(z))), o's gradient do = dy ⊙ silu(z)
    # (in x's dtype, as the shared backward reads it), and this tile's share of dD = Σ_t do ⊙ x
    i_t, i_b = tl.program_id(0), tl.program_id(2)
    o_c, m, p = _row_tile(T, HP, BT, BC)
    b_do = tl.load(dy + p, mask=m, other=0.0).to(tl.float32)
    if HAS_Z:
        b_z = tl.load(z + p, mask=m, other=0.0).to(tl.float32)
        b_sig = tl.sigmoid(b_z)
        b_y = tl.load(y_ungated + p, mask=m, other=0.0).to(tl.float32)
        tl.store(dz + p, (b_do * b_y * b_sig * (1 + b_z * (1 - b_sig))).to(dz.dtype.element_ty), mask=m)
        b_do = b_do * b_z * b_sig
    tl.store(do + p, b_do.to(do.dtype.element_ty), mask=m)
    if HAS_D:
        b_x = tl.load(x + p, mask=m, other=0.0).to(tl.float32)
        tl.store(dD_part + (i_b * NTB + i_t) * HP + o_c, tl.sum(b_do * b_x, axis=0), mask=o_c < HP)


@triton.jit
def _w_tile(i_run, i_b, i_t, i_g, NB, NT, G, BT: tl.constexpr):
    """The offset of W's [BT, BT] tile for (run, batch, chunk, group) in its buffer [runs, Bt, NT, G, BT, BT]."""
    return (((i_run * NB + i_b) * NT + i_t) * G + i_g).to(tl.int64) * BT * BT


@triton.jit
def _batch_group_run(i_z, HPG, G, HEADS: tl.constexpr):
    """The dq/dk kernels' program id over (batch row, group, run of HEADS of the group's HPG heads), decoded."""
    n_runs = tl.cdiv(HPG, HEADS)
    i_bg, i_run = i_z // n_runs, i_z % n_runs
    return i_bg // G, i_bg % G, i_run


@triton.jit
def _chunk_tokens(i_t, T, BT: tl.constexpr):
    """Chunk i_t's places o_c, tokens o_t and their mask (tokens before T)."""
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    return o_c, o_t, o_t < T


@triton.jit
def _group_tiles(C, B, i_b, i_t, i_g, o_c, m_t, o_k, T, G, N: tl.constexpr, BT: tl.constexpr):
    """C's and B's [BT, BK] tiles of group i_g, chunk (or block) i_t of BT tokens, dstate columns o_k; with where
    they lie (`_group_tile_at`) and their mask."""
    r_g, p_g = _group_tile_at(i_b, i_t, i_g, o_c, o_k, T, G, N, BT)
    m_tk = m_t[:, None] & (o_k < N)[None, :]
    b_c = tl.load(C + r_g * N + p_g, mask=m_tk, other=0.0)
    b_B = tl.load(B + r_g * N + p_g, mask=m_tk, other=0.0)
    return b_c, b_B, r_g, p_g, m_tk


@triton.jit
def _head_scalars(dt, b, i_b, i_h, o_t, m_t, T, H):
    """Head i_h's offsets of chunk tokens o_t in the head-major [Bt, H, T] scalars, and its dt and cumulative
    gate there."""
    p_th = (i_b * H + i_h) * T + o_t
    return p_th, tl.load(dt + p_th, mask=m_t, other=0.0), tl.load(b + p_th, mask=m_t, other=0.0)


@triton.jit
def _under_floor_zeroed(b_dg, g, p_th, m_t, FLOOR: tl.constexpr):
    """The gate's gradient b_dg with 0 where the gate as given is under the floor (-inf: not a variable)."""
    b_gk = tl.load(g + p_th, mask=m_t, other=0.0)
    return tl.where(b_gk < FLOOR, 0.0, b_dg)


@triton.jit(do_not_specialize=["T", "H", "NT", "HPG", "G", "NB"])
def _ssd_dqk_intra_kernel(
    C, B, dt, g, b, dA, W, dg_intra, ddt_intra, T, H, NT, HPG, G, NB,
    N: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, HEADS: tl.constexpr, FLOOR: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    # one program: chunk i_t and a run of HEADS heads of one (batch, group). The intra-chunk part of dq and dk
    # (`_ssd_dqk_kernel` below does the inter-chunk part), once per chunk and head, not once per key tile: the
    # whole score CB = C Bᵀ (summed over dstate in tiles of BK), then per head D_h = dA_h ⊙ M_h,
    # W += D_h ⊙ dt_h[None, s], E_h = D_h ⊙ CB and R_h = E_h ⊙ dt_h[None, s] strictly below the diagonal.
    # Written: W, in B's dtype after the sum over the run, and per head the intra shares of the gate's and dt's
    # gradients, which need per-head sums of q·dq and k·dk: with k_s · (D_hᵀ C)_s = dt_s Σ_t E_h,ts
    # and B_s · (D_hᵀ C)_s = Σ_t E_h,ts, the gate's is Σ_{s>=t} (rowsum R - colsum R)_s (`one_decay_dqk`'s sum)
    # and dt's through the keys colsum E. Both are linear in R and E, so they add to the key-tile kernel's
    # inter shares, and the floor's zeroing distributes over the sum
    i_t, i_z = tl.program_id(0), tl.program_id(1)
    i_b, i_g, i_run = _batch_group_run(i_z, HPG, G, HEADS)
    o_c, o_t, m_t = _chunk_tokens(i_t, T, BT)
    b_cb = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(N, BK)):
        b_c, b_B, _, _, _ = _group_tiles(C, B, i_b, i_t, i_g, o_c, m_t, i_k * BK + tl.arange(0, BK), T, G, N, BT)
        b_cb += tl.dot(b_c, tl.trans(b_B), input_precision=DOT_PREC)
    m_lo = (o_c[:, None] >= o_c[None, :]) & m_t[:, None] & m_t[None, :]
    m_below = o_c[:, None] > o_c[None, :]
    b_W = tl.zeros([BT, BT], dtype=tl.float32)
    for i_r in range(i_run * HEADS, tl.minimum(i_run * HEADS + HEADS, HPG)):
        i_h = i_g * HPG + i_r
        p_th, b_dt, b_gc = _head_scalars(dt, b, i_b, i_h, o_t, m_t, T, H)
        b_D = decayed_score_grad(score_grad_tile(dA, chunk_row(i_b, i_t * BT, i_h, T, H), o_c, m_t, H, BT), b_gc,
                                 m_lo)
        b_W += b_D * b_dt[None, :]
        b_E = b_D * b_cb
        b_R = tl.where(m_below, b_E * b_dt[None, :], 0.0)
        b_dg = tl.cumsum(tl.sum(b_R, axis=1) - tl.sum(b_R, axis=0), axis=0, reverse=True)
        tl.store(dg_intra + p_th, _under_floor_zeroed(b_dg, g, p_th, m_t, FLOOR), mask=m_t)
        tl.store(ddt_intra + p_th, tl.sum(b_E, axis=0), mask=m_t)
    tl.store(W + _w_tile(i_run, i_b, i_t, i_g, NB, NT, G, BT) + o_c[:, None] * BT + o_c[None, :],
             b_W.to(W.dtype.element_ty))


@triton.jit(do_not_specialize=["T", "H", "NT", "HPG", "G", "NB"])
def _ssd_dqk_kernel(
    C, B, x, dt, g, b, h, dh, do, W, dC_part, dB_part, dg_tiles, ddt_tiles, T, H, NT, HPG, G, NB,
    N: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HEADS: tl.constexpr, FLOOR: tl.constexpr, DOT_PREC: tl.constexpr,
):
    # one program: chunk i_t, dstate columns [i_k·BK, ..), and a run of HEADS heads of one (batch, group),
    # walked in turn. Each head's dq and dk are the shared backward's (`one_decay_dqk`) for q = C, k = B·dt_h
    # (a decay per head), summed here over the run, dC = Σ_h dq_h and dB = Σ_h dt_h ⊙ dk_h, instead of
    # written per head. With D_h = dA_h ⊙ M_h (M_ts = e^{b_t - b_s} for s <= t, else 0):
    #   dq_h = e^{b_t} ⊙ dO_h S_hᵀ + D_h (B ⊙ dt_h)    dk_h = e^{b_L - b_t} ⊙ X_h dS'_hᵀ + D_hᵀ C
    # C and B are the group's, the same for every head, so the intra-chunk products factor out of the sum:
    #   Σ_h D_h (B ⊙rows dt_h) = W B    and    Σ_h dt_h ⊙rows D_hᵀ C = Wᵀ C,    W = Σ_h D_h ⊙ dt_h[None, s]
    # W comes from `_ssd_dqk_intra_kernel` (with the intra parts of the gate's and dt's shares): two products a
    # program. The inter-chunk products stay per head (each head its own states), scaled in fp32 after the
    # product and added into one accumulator each. Per head it writes this key tile's inter share of the
    # gate's gradient and of dt's through the keys, dk · B. The per-head scalars (dt, g, b, and those two
    # shares) are head-major, [Bt, H, T]: a head's chunk is 256 contiguous bytes, where [Bt, T, H] would cost
    # a 32-byte sector per token and head
    i_k, i_t, i_z = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_g, i_run = _batch_group_run(i_z, HPG, G, HEADS)
    o_c, o_t, m_t = _chunk_tokens(i_t, T, BT)
    t_last = tl.minimum(i_t * BT + BT, T) - 1
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < N
    b_c, b_B, r_g, p_g, m_tk = _group_tiles(C, B, i_b, i_t, i_g, o_c, m_t, o_k, T, G, N, BT)
    b_dC = tl.zeros([BT, BK], dtype=tl.float32)
    b_dB = tl.zeros([BT, BK], dtype=tl.float32)
    p_tile = i_k * NB * H * T                           # this key tile's [Bt, H, T] in the [NK + 1, Bt, H, T] tiles
    for i_r in range(i_run * HEADS, tl.minimum(i_run * HEADS + HEADS, HPG)):
        i_h = i_g * HPG + i_r
        p_th, b_dt, b_gc = _head_scalars(dt, b, i_b, i_h, o_t, m_t, T, H)
        b_gl = tl.load(b + (i_b * H + i_h) * T + t_last)
        b_dos, b_vdh, b_hdh = inter_chunk_products(x, do, h, dh, chunk_state_base(i_b, i_t, i_h, NT, H, N, P),
                                                   chunk_row(i_b, i_t * BT, i_h, T, H), o_c, m_t, o_k, m_k, H, P,
                                                   BT, BK, BV, True, DOT_PREC)
        b_dq_inter = b_dos * tl.exp(b_gc)[:, None]
        b_dk_inter = b_vdh * tl.exp(tl.where(m_t, b_gl - b_gc, 0.0))[:, None]
        b_Bdk = tl.sum(b_B.to(tl.float32) * b_dk_inter, axis=1)
        b_dC += b_dq_inter
        b_dB += b_dk_inter * b_dt[:, None]
        # the gate's inter share: dg_t = Σ_{s>=t} r_s + Σ_{s<t} p_s + (S·dS') e^{b_L}, as scans of [BT]
        b_r = tl.sum(b_c.to(tl.float32) * b_dq_inter, axis=1)
        b_p = b_dt * b_Bdk
        b_dg = tl.cumsum(b_r, axis=0, reverse=True) + (tl.cumsum(b_p, axis=0) - b_p) + tl.sum(b_hdh) * tl.exp(b_gl)
        tl.store(dg_tiles + p_tile + p_th, _under_floor_zeroed(b_dg, g, p_th, m_t, FLOOR), mask=m_t)
        tl.store(ddt_tiles + p_tile + p_th, b_Bdk, mask=m_t)
    b_W = tl.load(W + _w_tile(i_run, i_b, i_t, i_g, NB, NT, G, BT) + o_c[:, None] * BT + o_c[None, :])
    b_dC += tl.dot(b_W, b_B, input_precision=DOT_PREC)
    b_dB += tl.dot(tl.trans(b_W), b_c, input_precision=DOT_PREC)
    p_run = i_run.to(tl.int64) * NB * T * G * N + r_g * N    # this run's partial sums, [runs, Bt, T, G, N]
    tl.store(dC_part + p_run + p_g, b_dC, mask=m_tk)
    tl.store(dB_part + p_run + p_g, b_dB, mask=m_tk)


def _elementwise_grid(Bt, T, HP):
    """The grid of the gate's pass: token tiles first (a grid's first side has no 65535 limit)."""
    return cdiv(T, _TAIL_ROWS), cdiv(HP, _TAIL_COLS), Bt


def ssd_chunk_scan_bwd(x, dt, A, B, C, D: torch.Tensor | None, z: torch.Tensor | None,
                       dt_bias: torch.Tensor | None, dt_softplus: bool, initial_states: torch.Tensor | None,
                       dy, dfinal: torch.Tensor | None, y_ungated: torch.Tensor | None = None):
    """The scan's gradients, recomputed from its inputs in chunks of CHUNK =
    64 tokens, whatever chunk the forward took (the gradient is the same
    function's). dy: y's gradient [Bt, T, H, P]; dfinal: the final states'
    (fp32 [Bt, H, P, N]) or None; y_ungated: with z, the forward's output
    before its gate, o + D ⊙ x (`ssd_chunk_scan_fwd`'s y_ungated, in x's
    shape and dtype), or None to recompute it. Other arguments as
    `ssd_chunk_scan_fwd` takes them.

    SSD is linear attention with one log gate per head and token (chunk.py's
    docstring), so the chunk recurrence's gradient is the shared backward's
    (attention_kernels/linear/chunk_backward.py) with q = C and k = B·dt,
    read per group of heads (group_size; k's dt per head applied in the
    kernels: chunk_dv scales the rows of its fp32 products of B by it, the
    dq/dk kernels the columns of their fp32 score gradients), v = x, scale 1,
    the gate g = dt·A per head and the states transposed
    ([dstate, headdim] = [K, V]); the chunk-start states and their gradients
    in `chunk_state_dtype` (x's dtype for 16-bit x). dq and dk are summed
    over each group's heads in two launches, which read B and C per group
    (the same for every head of a group). The first does the intra-chunk work
    once per chunk and head: the decay tile, the intra-chunk score gradients
    summed over a run of heads before their products, W = Σ_h D_h ⊙ dt_h, and
    the intra shares of the gate's gradient and of dt's through the keys
    (dk · B). The second, per dstate tile, does each head's inter-chunk
    products and their shares, then W's two products once; it writes B's and
    C's gradients as partial sums over runs of heads: no [Bt, T, H, N]
    gradient is written. Before them, one elementwise launch (fp32 inside,
    every tensor of [Bt, T, H, P] read or written once) for the tail
    y = (o + D ⊙ x) ⊙ silu(z): dz, o's gradient do in x's dtype and dD's
    per-tile sums (with z, its o + D ⊙ x is the forward's y_ungated, or
    recomputed by the output kernel where none is given: the same function at
    any chunk size, so the forward's is taken whatever its chunk). The skip's
    share of x's gradient, do ⊙ D, is added by chunk_dv to its dv in fp32
    before its one store (skip = D), so dv is dx, written once in x's dtype.
    dt's gate and softplus paths, on [Bt, T, H], stay in PyTorch.

    Returns the gradients of x, dt, A, B, C, then of D, z, dt_bias and
    initial_states where those are given (an absent argument has no entry, so
    the tuple is the same eagerly and as a compiled op's result), each in its
    argument's dtype and shape, contiguous.
    """
    Bt, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    HP = H * P
    dev, f32 = x.device, torch.float32
    x, B, C, dy = x.contiguous(), B.contiguous(), C.contiguous(), dy.contiguous()
    z = None if z is None else z.contiguous()
    NT = cdiv(T, CHUNK)
    dtf = torch.empty(Bt, T, H, dtype=f32, device=dev)
    b = torch.empty(Bt, T, H, 1, dtype=f32, device=dev)
    ssd_gates(dt, dt_bias, A, dt_softplus, dtf, b, CHUNK)
    states = torch.empty(Bt, NT, H, N, P, dtype=chunk_state_dtype(x.dtype), device=dev)
    h0 = None if initial_states is None else initial_states.contiguous()
    ssd_state_pass(B, x, dtf, b, states, h0, None, CHUNK)

    # the tail: y = (o + D ⊙ x) ⊙ silu(z); do is o's gradient, in x's dtype
    dz = dD = None
    if z is None and D is None:
        do = dy.to(x.dtype)
    else:
        if z is not None:
            if y_ungated is None:      # the forward kept none: o + D ⊙ x again, from this pass's states
                y_ungated = torch.empty_like(x)
                ssd_output(C, B, x, dtf, b, states, D, None, y_ungated, CHUNK)
            y_ungated = y_ungated.contiguous()
            dz = torch.empty_like(z)
        do = torch.empty_like(x)
        NTB = cdiv(T, _TAIL_ROWS)
        dD_part = None if D is None else torch.empty(Bt * NTB, HP, dtype=f32, device=dev)
        _ssd_gate_grad_kernel[_elementwise_grid(Bt, T, HP)](
            dy, z, y_ungated, x, do, dz, dD_part, T, HP, NTB,
            HAS_Z=z is not None, HAS_D=D is not None, BT=_TAIL_ROWS, BC=_TAIL_COLS, num_warps=_TAIL_WARPS)
        if D is not None:
            dD = dD_part.sum(0).view(H, P)
            dD = (dD if D.dim() == 2 else dD.sum(-1)).to(D.dtype)

    # the chunk recurrence: q = C and k = B·dt, read per group (B scaled by
    # each head's dt in the kernels), v = x, the gate dt·A per head
    Af = A.to(f32)
    dstates = torch.empty_like(states)
    dht = None if dfinal is None else dfinal.to(f32).transpose(-1, -2).contiguous()
    dh0 = None if h0 is None else torch.empty(Bt, H, N, P, dtype=f32, device=dev)
    chunk_state_grad_pass(C, do, b, dstates, 1.0, dht, dh0, group_size=H // G)
    dx = torch.empty_like(x)      # chunk_dv's dv with the skip's do ⊙ D: x's whole gradient
    dscores = torch.empty(Bt, T, H, CHUNK, dtype=f32, device=dev)
    chunk_dv(C, B, x, b, None, dstates, do, dx, dscores, 1.0, group_size=H // G, key_scale=dtf, skip=D)
    # dq and dk summed over each group's heads (dC, dB) with dt's share
    # through the keys, in runs of _DQK_HEADS heads a program: partial sums
    # per run; the gate's and dt's shares per key tile, the intra ones in the
    # last
    BK = min(_DQK_BK, pow2_at_least_16(N))
    NK, runs = cdiv(N, BK), cdiv(H // G, _DQK_HEADS)
    # its per-head scalars read head-major ([Bt, H, T]: a head's chunk
    # contiguous), its dg and ddt tiles written so
    dt_heads = dtf.transpose(1, 2).contiguous()
    b_heads = b.view(Bt, T, H).transpose(1, 2).contiguous()
    g_heads = dt_heads * Af[:, None]      # as given: a gate below the floor gets gradient 0 (both dq/dk kernels)
    dC_part, dB_part = (torch.empty(runs, Bt, T, G, N, dtype=f32, device=dev) for _ in range(2))
    dg_tiles, ddt_tiles = (torch.empty(NK + 1, Bt, H, T, dtype=f32, device=dev) for _ in range(2))
    # the intra-chunk work once per chunk and head: W = Σ_h D_h ⊙ dt_h (in
    # B's dtype) and the intra shares
    W = torch.empty(runs, Bt, NT, G, CHUNK, CHUNK, dtype=B.dtype, device=dev)
    _ssd_dqk_intra_kernel[(NT, Bt * G * runs)](
        C, B, dt_heads, g_heads, b_heads, dscores, W, dg_tiles[NK], ddt_tiles[NK], T, H, NT, H // G, G, Bt,
        N=N, BT=CHUNK, BK=min(_DQK_INTRA_BK, pow2_at_least_16(N)), HEADS=_DQK_HEADS, FLOOR=GATE_FLOOR,
        DOT_PREC=dot_precision(x.dtype), num_warps=_DQK_INTRA_WARPS, num_stages=_DQK_INTRA_STAGES)
    # per key tile: each head's inter-chunk products, then W B and Wᵀ C
    dqk_args = (C, B, x, dt_heads, g_heads, b_heads, states, dstates, do, W, dC_part, dB_part, dg_tiles,
                ddt_tiles, T, H, NT, H // G, G, Bt, N, P)
    dqk_meta = dict(BT=CHUNK, BK=BK, BV=min(_DQK_BV, pow2_at_least_16(P)), HEADS=_DQK_HEADS, FLOOR=GATE_FLOOR,
                    DOT_PREC=dot_precision(x.dtype), num_warps=_DQK_WARPS)
    # with fp32 inputs a GPU with less shared memory a program than the H100
    # (~100 KB on sm_86 and sm_89) refuses three stages: the first refusal is
    # remembered per device, so later calls launch two at once
    stages = _DQK_STAGES_ON.get(dev, _DQK_STAGES)
    try:
        _ssd_dqk_kernel[(NK, NT, Bt * G * runs)](*dqk_args, **dqk_meta, num_stages=stages)
    except OutOfResources:
        if stages == 2:
            raise
        _DQK_STAGES_ON[dev] = 2
        _ssd_dqk_kernel[(NK, NT, Bt * G * runs)](*dqk_args, **dqk_meta, num_stages=2)

    # back through k = B·dt (the group sums), g = dt·A, dt = softplus(dt +
    # dt_bias)
    dC, dB = dC_part.sum(0).to(C.dtype), dB_part.sum(0).to(B.dtype)
    dg = dg_tiles.sum(0).transpose(1, 2)
    ddt = ddt_tiles.sum(0).transpose(1, 2) + dg * Af
    dA = (dg * dtf).sum((0, 1)).to(A.dtype)
    if dt_softplus:
        raw = dt.to(f32) + (0 if dt_bias is None else dt_bias.to(f32))
        ddt = ddt * torch.where(raw <= 20.0, torch.sigmoid(raw), 1.0)     # the forward's softplus cut-off
    ddt_bias = None if dt_bias is None else ddt.sum((0, 1)).to(dt_bias.dtype)
    dh0 = None if dh0 is None else dh0.transpose(-1, -2).contiguous()
    grads = (dx, ddt.to(dt.dtype).contiguous(), dA, dB, dC, dD, dz, ddt_bias, dh0)
    return tuple(t for t in grads if t is not None)


__all__ = ["ssd_gates", "ssd_state_pass", "ssd_output", "ssd_chunk_scan_fwd", "ssd_chunk_scan_bwd"]
