"""The backward of the chunk form, shared by the chunk-parallel linear families (GLA, Lightning; Mamba-2 and
KDA can reuse it): any gate of shape [B, T, H, G] (G = K per key channel, G = 1 per head), or a fixed log
decay per head `gamma` [H] (Lightning Attention), as the forward's state pass takes them (chunk.py).

The forward per chunk, with S the state at its start, S' the state at its end, b_t the in-chunk cumulative
log gate and L the chunk's last token (chunk.py's docstring):

    o_t = (q_t ⊙ e^{b_t})^T S · scale + Σ_{j ≤ t} A_tj v_j,     A_tj = scale · Σ_k q_tk k_jk e^{b_tk - b_jk}
    S'  = Diag(e^{b_L}) S + Σ_j (k_j ⊙ e^{b_L - b_j}) v_j^T

Given dO and dS' (the gradient reaching S' from every later chunk and from the final state's gradient),
the chain rule gives, with dA_tj = scale · dO_t · v_j for j <= t (the gradient of A, scale folded in):

    dS   = Diag(e^{b_L}) dS' + Σ_t (q_t ⊙ e^{b_t}) dO_t^T · scale          the reverse state pass
    dv_j = Σ_{t ≥ j} A_tj dO_t + dS'^T (k_j ⊙ e^{b_L - b_j})               intra + inter
    dq_t = e^{b_t} ⊙ (S dO_t) · scale + Σ_{j ≤ t} dA_tj k_j ⊙ e^{b_t - b_j}
    dk_j = e^{b_L - b_j} ⊙ (dS' v_j) + Σ_{t ≥ j} dA_tj q_t ⊙ e^{b_t - b_j}

The gate: gk_s enters b_t for every t >= s of its chunk, and b_L. Treating b as free, db_t = q_t ⊙ dq_t -
k_t ⊙ dk_t, and b_L also carries rowsum(S' ⊙ dS') (from the e^{b_L} of the state update), so

    dgk_s = Σ_{t ≥ s} (q_t ⊙ dq_t - k_t ⊙ dk_t) + rowsum(S' ⊙ dS')         (a reverse cumulative sum)

Summed that way, terms of size 1 cancel (the pair j = t adds scale (dO_t · v_t) q_t ⊙ k_t to both
products, and the row sum holds k_L ⊙ dk_L) to leave a gradient that can be e^-35 small. The kernel sums
only what survives the cancellation, every term at its own size. Split dq = dq^inter + dq^off + dq^diag
(the S term, the pairs j < t, the pair j = t) and dk alike: the diagonal parts cancel exactly, and
rowsum(S' ⊙ dS') - Σ_{j ≥ s} k_j ⊙ dk_j^inter = e^{b_L} ⊙ rowsum(S ⊙ dS') + Σ_{j < s} k_j ⊙ dk_j^inter, so

    dgk_s = Σ_{t ≥ s} (q_t ⊙ (dq_t^inter + dq_t^off) - k_t ⊙ dk_t^off)          (a reverse cumulative sum)
            + Σ_{j < s} k_j ⊙ dk_j^inter                                       (an exclusive prefix sum)
            + e^{b_L} ⊙ rowsum(S ⊙ dS')

A gate below GATE_FLOOR (-inf: a full reset) has gradient exactly 0: the forward raises it to the floor,
and e^{gk} = 0 multiplies its gradient in the recurrence.

A gate per head (G = 1, Mamba-2) or a fixed decay (Lightning) factors out of the key sum: with M_tj =
e^{b_t - b_j} (or λ^(t-j)) for j <= t, at most 1, the intra-chunk terms are whole-chunk tensor-core products,
dq^intra = (dA ⊙ M) K and dk^intra = (dA ⊙ M)^T Q, and the gate's gradient is dgk above summed over the key
channels, where q_t · dq_t^off = Σ_{j<t} R_tj and k_t · dk_t^off = Σ_{i>t} R_it are the row and column sums of
R = dA ⊙ M ⊙ Q K^T below the diagonal. A gate per key channel (G = K, GLA) does not factor out: its pairs
j < t are summed in sub-chunks of 16 rows, each re-based so that no exponent is positive (in a launch of
their own, inside chunk_dqk).

Three launchable pieces, after the forward's chunk_local_cumsum and chunk_state_pass have recomputed b and
the chunk-start states (the backward keeps the inputs and, GLA and KDA, the forward's scores), and the
sub-chunk launch on its own:

    chunk_state_grad_pass(q, do, b, dstates, scale, dht, dh0)   dS' at every chunk end, and dS at the start (dh0)
        with Aqk, kg, w, du: the delta rule's (KDA), which also writes U's gradient du
    chunk_dv(q, k, v, b, A, dstates, do, dv, dA, scale)         dv and dA
    chunk_dqk(q, k, v, gk, b, states, dstates, do, dA, ...)     dq, dk and the gate's gradient (with the
        intra-chunk pairs of a gate per key channel first, in sub-chunks)
    chunk_dqk_intra(q, k, b, dA, dq, dk)                        those pairs j < t alone (with dA_kk and
        dk_rows, KDA's two score matrices in one launch; their other terms its backward forms apart)
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..launch import autotune_configs, cdiv, on_machine, pow2_at_least_16
from .chunk import (CHUNK, GATE_FLOOR, SUB_CHUNK, chunk_at, chunk_row, chunk_state_base, decay_exponent,
                    dot_precision, launch_state_pass, n_chunks, sequence_at, tiles_that_fit, varlen)

_fits = tiles_that_fit()


def _sum_precision(dtype: torch.dtype) -> str:
    """input_precision of the gate gradient's triangle sums (products of fp32 values with ones): IEEE for fp32
    inputs, 3xTF32 on the tensor cores for 16-bit ones (~22 bits a term, every term still at its own size)."""
    return "ieee" if dtype == torch.float32 else "tf32x3"


def _tile(n: int) -> int:
    """The K or V tile of the chunk-wide backward kernels: the whole dim up to 64, padded to a power of two."""
    return min(64, pow2_at_least_16(n))


# 64-bit offsets. Products of sizes that pass 2^31 at training shapes (B 8, T 64K, 80 heads x 64, dstate 128):
# B·T·H·CHUNK (dA, the scores' gradient: 2.7e9), B·T·H·K and B·T·H·V (q, k, v, do, a gate per key channel:
# 2.7e9 at K or V = 64) and B·NT·H·K·V (the chunk-start states and their gradients: 5.4e9; the first to pass,
# at B·T·H >= 2^24, e.g. B 4, T 64K, 80 heads). Each kernel takes one 64-bit number a program (or a step of
# the state pass): `chunk_row`, the row of its chunk's first token in the B·T·H rows of a [B, T, H, ...]
# tensor, and a state's offset widened before its multiply by K·V; the pointer advanced by it, the offsets
# inside a chunk ([BT] tokens x a tile, at most CHUNK·H·max(K, V, CHUNK)) stay 32-bit, as do the per-token
# scalars of a gate per head ([B, T, H]: B·T·H < 2^31 is assumed) and B·T (under the 64-bit multiply). The
# reverse state pass reads q, do and a gate per key channel from a 64-bit base per batch row, at 32-bit offsets
# inside it (one row's T·H·K < 2^31): a 64-bit base per step cost GLA's pass (BK = BV = 64) an 8-byte spill
# at 255 registers (the delta rule's tensors, on a pass of 8 warps, take one per step). `chunk_row` is defined
# in chunk.py, whose forward kernels take the same 64-bit bases.


# ------------------------------------------------------------------ 1. the reverse state pass
@triton.jit
def _gate_at(b, i_h, t, H, o_k, m_k, G: tl.constexpr):
    """The cumulative gate of head i_h at token t of the B·T tokens: a scalar for a gate per head (G = 1), else
    key channels o_k."""
    if G == 1:
        return tl.load(b + t * H + i_h)
    else:
        return tl.load(b + chunk_row(0, t, i_h, 0, H) * G + o_k, mask=m_k, other=0.0)


# (BK, BV), num_warps, num_stages: the forward state pass's space (chunk.py), and tiles for more programs where
# the heads are few for the SMs or V is small (Mamba-2: K = dstate 128, V = headdim 64, 64 x 64 tiles make 2
# programs a head), of 2 warps (mma.sync) or 4 (one warpgroup, wgmma; not at BV 16 or 32, where the delta rule's pass met
# a wgmma reading past its B operand's shared tile, notes/TUNING.md). The autotuner picks per K, V and B·H.
_STATE_GRAD_CONFIGS = autotune_configs([({"BK": 64, "BV": 32}, 2, 3), ({"BK": 64, "BV": 32}, 2, 4),
                                        ({"BK": 64, "BV": 64}, 2, 3), ({"BK": 64, "BV": 16}, 2, 3),
                                        ({"BK": 32, "BV": 32}, 2, 3), ({"BK": 64, "BV": 64}, 4, 3)])


@triton.autotune(configs=_STATE_GRAD_CONFIGS, key=["K", "V", "NBH"], prune_configs_by={"early_config_prune": _fits})
@triton.jit(do_not_specialize=["T", "H", "NT", "NBH"])
def _chunk_state_grad_kernel(
    q, do, b, dh, dht, dh0, scale, T, H, NT, NBH,
    K: tl.constexpr, V: tl.constexpr, G: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, DOT_PREC: tl.constexpr,
    gamma=None, GAMMA: tl.constexpr = False,
    Aqk=None, kg=None, w=None, du=None, DELTA: tl.constexpr = False, GROUP=1,
    cu_seqlens=None, chunk_offsets=None, VARLEN: tl.constexpr = False,
):
    # one program: key rows [i_k·BK, ..) and value columns [i_v·BV, ..) of one (sequence, head)'s gradient,
    # walking that sequence's chunks backward
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    tok0, T, slot0 = sequence_at(i_b, T, NT, cu_seqlens, chunk_offsets, VARLEN)
    t_end = tok0 + T - 1            # the sequence's last token
    if VARLEN:
        NT = tl.cdiv(T, BT)
        t_end = tl.maximum(t_end, 0)    # an empty sequence: any token in the tensor (its gate goes unused)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    p_h = o_k[:, None] * V + o_v[None, :]
    if USE_DHT:
        b_dh = tl.load(dht + i_bh.to(tl.int64) * K * V + p_h, mask=m_h, other=0.0).to(tl.float32)
    else:
        b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if not GAMMA:
        # the gate at the last token of the chunk the next step takes, loaded a step ahead: loaded in the step,
        # its latency would stand before the step's product (Lightning's decay is computed)
        b_gl_next = _gate_at(b, i_h, t_end, H, o_k, m_k, G)

    r_b = chunk_row(0, tok0, i_h, T, H)     # the sequence's first row (64-bit comment above)
    q_b = q + chunk_row(0, tok0, i_h // GROUP, T, H // GROUP) * K
    do_b = do + r_b * V
    for i_s in range(NT):
        # chunk NT - 1 - i_s; the maximum keeps the addresses a pipelined prefetch computes for the steps
        # past the last (predicated off, at negative chunks) inside the tensors
        i_t = tl.maximum(NT - 1 - i_s, 0)
        # the gradient at the end of chunk i_t (from every later chunk and the final state)
        tl.store(dh + chunk_state_base(0, slot0 + i_t, i_h, NT, H, K, V) + p_h, b_dh.to(dh.dtype.element_ty),
                 mask=m_h)
        o_c = tl.arange(0, BT)
        o_t = i_t * BT + o_c
        m_t = o_t < T
        r_c = r_b + i_t * BT * H
        t_last = tl.minimum(i_t * BT + BT, T) - 1
        if not GAMMA:
            b_gl = b_gl_next
            b_gl_next = _gate_at(b, i_h, tok0 + tl.maximum(i_t * BT - 1, 0), H, o_k, m_k, G)
        # Q^T as a [BK, BT] tile, dO as [BT, BV]
        m_kt = m_k[:, None] & m_t[None, :]
        # q: one row per GROUP heads (Mamba-2's C, per group)
        b_qt = tl.load(q_b + ((i_t * BT + o_c[None, :]) * (H // GROUP)) * K + o_k[:, None], mask=m_kt, other=0.0)
        b_do = tl.load(do_b + ((i_t * BT + o_c[:, None]) * H) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :],
                       other=0.0)
        if DELTA:
            # the delta rule (KDA): the chunk added K_gᵀ U with U = W' - W S, so U's gradient is
            # dU = A_qkᵀ dO + K_g dS' (dS' the gradient at the chunk's end, b_dh here), written for the
            # rest of the backward, and the state's loses Wᵀ dU below. Sums over every key channel: one
            # K-tile (BK >= K). A_qk's entries above the diagonal were never written: masked. A_qk is read
            # as stored and transposed in the product (its shared-memory tile then has the keys' layout).
            p_row = o_c * H                                 # the tokens' rows after r_c
            m_tk = m_t[:, None] & m_k[None, :]
            b_a = tl.load(Aqk + r_c * BT + p_row[:, None] * BT + o_c[None, :],
                          mask=m_t[:, None] & (o_c[:, None] >= o_c[None, :]), other=0.0)    # [t, j], as stored
            b_kg = tl.load(kg + r_c * K + p_row[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
            b_du = tl.dot(tl.trans(b_a.to(b_do.dtype)), b_do, input_precision=DOT_PREC) \
                + tl.dot(b_kg, b_dh.to(b_kg.dtype), input_precision=DOT_PREC)
            tl.store(du + r_c * V + p_row[:, None] * V + o_v[None, :], b_du.to(du.dtype.element_ty),
                     mask=m_t[:, None] & m_v[None, :])
        if GAMMA or G == 1:
            # one decay per token (Lightning's fixed one, or a gate per head): it scales dO's rows, so that Q^T
            # goes from shared memory into the product as loaded, and the gate is read as a [BT] vector
            if GAMMA:
                # from the chunk start to token t the decay is gamma·(c + 1), c = t's place in the chunk
                b_gam = tl.load(gamma + i_h)
                b_et = tl.exp(decay_exponent(b_gam, o_t - i_t * BT + 1))
                b_el = tl.exp(decay_exponent(b_gam, t_last + 1 - i_t * BT))
            else:
                b_et = tl.exp(tl.load(b + (tok0 + o_t) * H + i_h, mask=m_t, other=0.0))
                b_el = tl.exp(b_gl)
            b_dh = b_dh * b_el
            b_dh += tl.dot(b_qt, (b_do * (b_et * scale)[:, None]).to(b_do.dtype), input_precision=DOT_PREC)
        else:
            b_gt = tl.load(b + r_b * G + ((i_t * BT + o_c[None, :]) * H) * G + o_k[:, None], mask=m_kt, other=0.0)
            b_qt = b_qt * tl.exp(b_gt)              # every exponent b_t <= 0
            b_dh = b_dh * tl.exp(b_gl)[:, None]
            b_dh += tl.dot((b_qt * scale).to(b_do.dtype), b_do, input_precision=DOT_PREC)
        if DELTA:
            b_wt = tl.load(w + r_c * K + p_row[None, :] * K + o_k[:, None], mask=m_kt, other=0.0)
            b_dh -= tl.dot(b_wt, b_du.to(b_wt.dtype), input_precision=DOT_PREC)

    if STORE_DH0:
        tl.store(dh0 + i_bh.to(tl.int64) * K * V + p_h, b_dh, mask=m_h)


# The delta rule's pass: one K-tile (BK = K padded) and 64 value columns a program, unpipelined. On an H100 in
# bf16 (K = 128) every config with BV = 32 or 16 (4 or 8 warps, 1 or 2 stages) read shared memory out of bounds
# in K_g dS' (compute-sanitizer: a 512-byte read past the tile), an illegal address under the autotuner; BV = 64
# with 8 warps passed (notes/TUNING.md). ptxas (sm_90, bf16, K = 128): 226 registers, no spills.
_DELTA_STATE_GRAD_CONFIGS = autotune_configs([({"BV": 64}, 8, 1)],
                                             interpreter={"BV": 32})
_delta_state_grad_kernel = triton.autotune(configs=_DELTA_STATE_GRAD_CONFIGS, key=["K", "V", "NBH"],
                                           prune_configs_by={"early_config_prune": _fits})(_chunk_state_grad_kernel.fn)


# The delta rule's pass with the state's gradient held as two [64, BV] halves of the key rows (`_DELTA_HALVES`,
# 64 < K <= 128: at K <= 64 the second half would be all padding), so that no product takes a [128, BV] register
# tile as its B operand (the shape that read past its shared tile at BV = 32, above). One product per half where
# the one-tile kernel has one over all of K. Its configs (BV, warps, stages) timed by `scripts/tune_probe.py
# delta_state_grad`, each in its own process (KDA's backward, B 1, T 16K, 32 heads, K = V = 128, bf16, an H100,
# twice): BV 64 on 4 warps and 2 stages 1,314-1,327 us against the one-tile pass's 1,479-1,482 (gradients
# bit-equal: each key row's sum keeps its order); BV 32 on 2 stages 1,505-1,518, BV 64 on 8 warps 1,547-1,562;
# BV 32 on one stage ends its process with an illegal address. ptxas (sm_90a, bf16, K = V = 128): BV 64 on 4
# warps 255 registers, 16 B spilled, 152 KB of shared memory (a GPU that offers a block less, as sm_86 and sm_89
# do, takes the one-tile pass); BV 32 on 4 warps and 2 stages 159, no spills.
_DELTA_HALVES = True
_DELTA_HALVES_CONFIG = (64, 4, 2)          # BV, num_warps, num_stages
_DELTA_HALVES_SHARED_KB = 152              # what that config's kernel takes a block (ptxas, sm_90a)
# An experiment, off (`_DELTA_AQK_ROW_MASK`, untimed): the halves' pass loads A_qk's tile under its rows' mask
# alone and zeroes the upper triangle after the load. Masked on the triangle, the load varies along each row,
# so it is issued as 32 two-byte loads a thread after the step's copies have landed, one more round trip on the
# walk's chain every step; under a row mask it joins the step's asynchronous copies. ptxas (sm_90a, bf16):
# at BV 64 on 4 warps and 2 stages 255 registers, 144 B spilled, 160 KB of shared memory (`_DELTA_HALVES_SHARED_KB`
# must follow); at BV 32 on 4 warps and 2 stages 162, none spilled, 144 KB. `scripts/tune_probe.py
# delta_state_grad` times both.
_DELTA_AQK_ROW_MASK = False
# An experiment, off (`_DELTA_GATED_QUERIES`, untimed): the halves' pass handed the queries already decayed and
# scaled, scale · q ⊙ e^b in q's dtype, so that a step loads no [BT, K] fp32 gates (a third of its bytes) and
# takes no exponential but its last row's. KDA's backward has them written by `_kda_wy_kernel`, which reads q's
# chunk beside the gates it already loads, as fla's W/U recompute writes its `qg`. (Written by the gate pass
# instead, the pass took 984 µs against 1,285, but the backward as a whole did not get faster: TUNING (42).)
# ptxas (sm_90a, bf16, K = V = 128), the two experiments together: at BV 64 on 4 warps 255 registers, 112 B
# spilled at 2 stages, none at 3 (208 KB of shared memory: `_DELTA_HALVES_SHARED_KB` must follow); at BV 32 on 4
# warps 193 registers at 2 stages (128 KB), 196 at 3 (188 KB), none spilled. `_kda_wy_kernel` writing the gated
# queries: 255 registers on 4 warps, 130 on 8 (106 without), none spilled.
_DELTA_GATED_QUERIES = False


@functools.lru_cache(maxsize=None)
def _shared_kb_per_block(device: torch.device) -> float:
    """The shared memory a block may take on `device` (its opt-in maximum), in KB; unbounded off a GPU."""
    if device.type != "cuda":
        return float("inf")
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin / 1024


def delta_walk_takes_gated_queries(K: int, device: torch.device) -> bool:
    """Whether the delta rule's reverse state pass takes the queries gated (`gated_queries` of
    `chunk_state_grad_pass`): the halves' pass only, with `_DELTA_GATED_QUERIES` on."""
    return _DELTA_GATED_QUERIES and delta_walk_in_halves(K, device)


def delta_walk_in_halves(K: int, device: torch.device) -> bool:
    """Whether the delta rule's reverse state pass at key dim K runs in key halves (`_DELTA_HALVES`): 64 < K
    <= 128, on a device that offers the config's shared memory."""
    return _DELTA_HALVES and 64 < K <= 128 and _shared_kb_per_block(device) >= _DELTA_HALVES_SHARED_KB


@triton.jit
def _key_half(x, r_c, o_c, m_t, o_k, m_k, H, K: tl.constexpr, TRANS: tl.constexpr):
    """Rows o_c of x [B, T, H, K] after the chunk's first row r_c (64-bit), key channels o_k: [BT, HALF], or
    [HALF, BT] with TRANS."""
    if TRANS:
        return tl.load(x + r_c * K + (o_c[None, :] * H) * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :],
                       other=0.0)
    return tl.load(x + r_c * K + (o_c[:, None] * H) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)


@triton.jit
def _gated_query_half(q, b, r_c, o_c, m_t, o_k, m_k, H, scale, K: tl.constexpr, GATED_Q: tl.constexpr):
    """One half's queries decayed from their chunk's start and scaled, scale (Q ⊙ e^b)ᵀ [HALF, BT]: read as
    they are (GATED_Q: q holds them, in its dtype) or formed from q and the gates b (fp32)."""
    b_qt = _key_half(q, r_c, o_c, m_t, o_k, m_k, H, K, True)
    if not GATED_Q:
        b_qt = b_qt * tl.exp(_key_half(b, r_c, o_c, m_t, o_k, m_k, H, K, True)) * scale   # every exponent <= 0
    return b_qt


@triton.jit
def _delta_half_step(b_dh, b_qt, b_gl, b_do, b_wt, b_du, DOT_PREC: tl.constexpr):
    """One half's step back over a chunk: dS = e^{b_last} ⊙ dS' + scale (Q ⊙ e^b)ᵀ dO - Wᵀ dU, with
    b_qt = scale (Q ⊙ e^b)ᵀ (`_gated_query_half`)."""
    b_dh = b_dh * tl.exp(b_gl)[:, None] + tl.dot(b_qt.to(b_do.dtype), b_do, input_precision=DOT_PREC)
    return b_dh - tl.dot(b_wt, b_du.to(b_wt.dtype), input_precision=DOT_PREC)


@triton.jit(do_not_specialize=["T", "H", "NT"])
def _delta_state_grad_halves_kernel(
    q, do, b, dh, dht, dh0, scale, Aqk, kg, w, du, T, H, NT,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, HALF: tl.constexpr, BV: tl.constexpr,
    USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, DOT_PREC: tl.constexpr, AQK_ROW_MASK: tl.constexpr = False,
    GATED_Q: tl.constexpr = False, cu_seqlens=None, chunk_offsets=None, VARLEN: tl.constexpr = False,
):
    # one program: value columns [i_v·BV, ..) of one (sequence, head), all K key rows as two halves of HALF;
    # with GATED_Q, q holds scale · q ⊙ e^b and b is read for the chunks' last rows only
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    tok0, T, slot0 = sequence_at(i_b, T, NT, cu_seqlens, chunk_offsets, VARLEN)
    if VARLEN:
        NT = tl.cdiv(T, BT)
    o_k1 = tl.arange(0, HALF)
    o_k2 = HALF + tl.arange(0, HALF)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k1, m_k2, m_v = o_k1 < K, o_k2 < K, o_v < V
    p_h1, p_h2 = o_k1[:, None] * V + o_v[None, :], o_k2[:, None] * V + o_v[None, :]
    m_h1, m_h2 = m_k1[:, None] & m_v[None, :], m_k2[:, None] & m_v[None, :]
    if USE_DHT:
        b_dh1 = tl.load(dht + i_bh.to(tl.int64) * K * V + p_h1, mask=m_h1, other=0.0).to(tl.float32)
        b_dh2 = tl.load(dht + i_bh.to(tl.int64) * K * V + p_h2, mask=m_h2, other=0.0).to(tl.float32)
    else:
        b_dh1 = tl.zeros([HALF, BV], dtype=tl.float32)
        b_dh2 = tl.zeros([HALF, BV], dtype=tl.float32)
    o_c = tl.arange(0, BT)
    for i_s in range(NT):
        i_t = NT - 1 - i_s
        # the gradient at the end of chunk i_t (from every later chunk and the final state)
        p_s = dh + chunk_state_base(0, slot0 + i_t, i_h, NT, H, K, V)
        tl.store(p_s + p_h1, b_dh1.to(dh.dtype.element_ty), mask=m_h1)
        tl.store(p_s + p_h2, b_dh2.to(dh.dtype.element_ty), mask=m_h2)
        m_t = i_t * BT + o_c < T
        r_c = chunk_row(0, tok0 + i_t * BT, i_h, T, H)
        r_l = chunk_row(0, tok0 + tl.minimum(i_t * BT + BT, T) - 1, i_h, T, H)     # the chunk's last token
        b_gl1 = tl.load(b + r_l * K + o_k1, mask=m_k1, other=0.0)
        b_gl2 = tl.load(b + r_l * K + o_k2, mask=m_k2, other=0.0)
        # dU = A_qkᵀ dO + K_g dS' (A_qk read as stored, masked on and below the diagonal), written for the rest
        # of the backward
        m_tv = m_t[:, None] & m_v[None, :]
        b_do = tl.load(do + r_c * V + (o_c[:, None] * H) * V + o_v[None, :], mask=m_tv, other=0.0)
        p_a = Aqk + r_c * BT + (o_c[:, None] * H) * BT + o_c[None, :]
        if AQK_ROW_MASK:
            b_a = tl.where(o_c[:, None] >= o_c[None, :], tl.load(p_a, mask=m_t[:, None], other=0.0), 0.0)
        else:
            b_a = tl.load(p_a, mask=m_t[:, None] & (o_c[:, None] >= o_c[None, :]), other=0.0)
        b_kg1 = _key_half(kg, r_c, o_c, m_t, o_k1, m_k1, H, K, False)
        b_kg2 = _key_half(kg, r_c, o_c, m_t, o_k2, m_k2, H, K, False)
        b_du = tl.dot(tl.trans(b_a.to(b_do.dtype)), b_do, input_precision=DOT_PREC) \
            + tl.dot(b_kg1, b_dh1.to(b_kg1.dtype), input_precision=DOT_PREC) \
            + tl.dot(b_kg2, b_dh2.to(b_kg2.dtype), input_precision=DOT_PREC)
        tl.store(du + r_c * V + (o_c[:, None] * H) * V + o_v[None, :], b_du.to(du.dtype.element_ty), mask=m_tv)
        b_dh1 = _delta_half_step(b_dh1, _gated_query_half(q, b, r_c, o_c, m_t, o_k1, m_k1, H, scale, K, GATED_Q),
                                 b_gl1, b_do, _key_half(w, r_c, o_c, m_t, o_k1, m_k1, H, K, True), b_du, DOT_PREC)
        b_dh2 = _delta_half_step(b_dh2, _gated_query_half(q, b, r_c, o_c, m_t, o_k2, m_k2, H, scale, K, GATED_Q),
                                 b_gl2, b_do, _key_half(w, r_c, o_c, m_t, o_k2, m_k2, H, K, True), b_du, DOT_PREC)
    if STORE_DH0:
        tl.store(dh0 + i_bh.to(tl.int64) * K * V + p_h1, b_dh1, mask=m_h1)
        tl.store(dh0 + i_bh.to(tl.int64) * K * V + p_h2, b_dh2, mask=m_h2)


def chunk_state_grad_pass(q, do, b, dstates, scale: float, dht=None, dh0=None, *, gamma=None,
                          Aqk=None, kg=None, w=None, du=None, group_size: int = 1, gated_queries=None,
                          packed=None) -> None:
    """The gradient of the state at the end of every chunk, walking the
    chunks backward from dht (the final state's gradient), and at the start
    of the first (dh0): the backward's only sequential pass.

    q: [B, T, H, K]; do: [B, T, H, V], o's gradient in q's dtype; b: fp32 [B,
    T, H, G], the in-chunk cumulative gates (G = K or 1), or b = None and
    gamma: fp32 [H], a log decay per step (as in `chunk_state_pass`).
    Written: dstates [B, NT, H, K, V] (any float dtype, the families'
    backwards `chunk_state_dtype`; the pass carries the gradient in fp32),
    dstates[:, n] the gradient reaching the state after chunk n; dh0 fp32
    [B, H, K, V] unless None. dht: fp32 [B, H, K, V] or None (zeros). All
    contiguous.

        >>> dstates = torch.empty(B, triton.cdiv(T, CHUNK), H, K, V,
        ...                       dtype=chunk_state_dtype(q.dtype),
        ...                       device=q.device)
        >>> chunk_state_grad_pass(q, do, b, dstates, K ** -0.5, dht, dh0)
        >>> dstates[:, -1]          # dht itself

    The delta rule (KDA), with Aqk [B, T, H, CHUNK] (the forward's query-key
    scores with scale, read on and below the diagonal), kg and w [B, T, H, K]
    (the keys decayed to their chunk's end, and W) and du [B, T, H, V] given:
    each chunk added K_gᵀ U, U = W' - W S, and du receives U's gradient A_qkᵀ
    dO + K_g dS' (in its dtype); q and b are then the normalised queries and
    KDA's gates. gated_queries: scale · q ⊙ e^b in q's dtype, taken in place
    of q (b is then read at each chunk's last row only) where
    `delta_walk_takes_gated_queries(K)` (KDA's `kda_wy` writes them), refused
    elsewhere.

    group_size: heads sharing one query row, q [B, T, H / group_size, K]
    (Mamba-2's C, one per group of heads; not with the delta rule).

    packed: packed sequences (`packed_chunks`, B = 1): one program per
    sequence and head walks that sequence's chunks; dstates [1, NC, H, K, V]
    in the chunk table's order (as `chunk_state_pass` writes the states),
    dht and dh0 one per sequence, [N, H, K, V].
    """
    if (b is None) == (gamma is None):
        raise ValueError("chunk_state_grad_pass takes exactly one of b (cumulative gates) and gamma")
    delta = (Aqk, kg, w, du)
    if any(t is None for t in delta) != all(t is None for t in delta):
        raise ValueError("chunk_state_grad_pass takes Aqk, kg, w and du together (the delta rule) or none")
    K, V = q.shape[-1], do.shape[-1]
    if gated_queries is not None and (Aqk is None or not delta_walk_takes_gated_queries(K, q.device)):
        raise ValueError("gated_queries is taken by the delta rule's pass in key halves only "
                         "(delta_walk_takes_gated_queries)")
    if Aqk is not None and delta_walk_in_halves(K, q.device):
        B, T, H = do.shape[:3]
        BV, warps, stages = on_machine(gpu=_DELTA_HALVES_CONFIG, interpreter=(16, 4, 1))
        N = B if packed is None else packed.n_sequences
        _delta_state_grad_halves_kernel[(cdiv(V, BV), N * H)](
            q if gated_queries is None else gated_queries, do, b, dstates, dht, dh0, scale, Aqk, kg, w, du, T, H,
            n_chunks(T, packed), K, V, BT=CHUNK, HALF=64, BV=BV, USE_DHT=dht is not None,
            STORE_DH0=dh0 is not None, DOT_PREC=dot_precision(q.dtype), AQK_ROW_MASK=_DELTA_AQK_ROW_MASK,
            GATED_Q=gated_queries is not None, **varlen(packed, offsets=True), num_warps=warps, num_stages=stages)
        return
    args = (q, do, b, dstates, dht, dh0, scale)
    flags = dict(BT=CHUNK, USE_DHT=dht is not None, STORE_DH0=dh0 is not None, DOT_PREC=dot_precision(q.dtype),
                 gamma=gamma, GAMMA=gamma is not None, GROUP=group_size)
    launch_state_pass(_chunk_state_grad_kernel, _delta_state_grad_kernel, args, flags,
                      None if Aqk is None else dict(Aqk=Aqk, kg=kg, w=w, du=du), packed)


# ------------------------------------------------------------------ 2. dv and the scores' gradient
@triton.jit
def _group_rows(x, key_scale, i_h, t0, o_c, m_t, o_k, m_k, H, K: tl.constexpr, GROUP, KEY_SCALE: tl.constexpr):
    """Head i_h's [BT, BK] tile of x [B, T, H / GROUP, K] (one row per GROUP heads) at tokens t0 + o_c of the
    B·T tokens, times key_scale [B, T, H] (one number per head and token, rounded once to x's dtype after the
    fp32 product) with KEY_SCALE."""
    b_x = tl.load(x + chunk_row(0, t0, i_h // GROUP, 0, H // GROUP) * K + (o_c[:, None] * (H // GROUP)) * K
                  + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
    if KEY_SCALE:
        b_s = tl.load(key_scale + (t0 + o_c) * H + i_h, mask=m_t, other=0.0)
        b_x = (b_x.to(tl.float32) * b_s[:, None]).to(x.dtype.element_ty)
    return b_x


@triton.jit(do_not_specialize=["T", "H", "NT"])
def _chunk_dv_kernel(
    q, k, v, b, A, dh, do, dv, dA, scale, T, H, NT,
    K: tl.constexpr, V: tl.constexpr, G: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT_PREC: tl.constexpr, gamma=None, GAMMA: tl.constexpr = False, RECOMPUTE_A: tl.constexpr = False,
    key_scale=None, KEY_SCALE: tl.constexpr = False, GROUP=1,
    skip=None, s_skip_h=None, s_skip_v=None, SKIP: tl.constexpr = False,
    cu_seqlens=None, chunk_indices=None, VARLEN: tl.constexpr = False,
):
    # one program: chunk i_t of one (batch, head), or of packed sequences' chunk program i_c (`chunk_at`), every
    # value column. With SKIP, o also carries skip ⊙ v (Mamba-2's D ⊙ x, skip[h, v] at strides s_skip_h,
    # s_skip_v), and dv takes do ⊙ skip before its store
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    tok0, i_t, T = chunk_at(i_c, i_b, T, cu_seqlens, chunk_indices, VARLEN)
    t0 = tok0 + i_t * BT                                # the chunk's first token among the B·T
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    m_t = o_t < T
    t_last = tl.minimum(i_t * BT + BT, T) - 1
    m_lo = (o_c[:, None] >= o_c[None, :]) & m_t[:, None] & m_t[None, :]
    p_dhc = dh + chunk_state_base(i_b, i_c, i_h, NT, H, K, V)   # packed: B = 1, chunk program i_c is the slot
    r_c = chunk_row(0, t0, i_h, T, H)                   # 64-bit; the tokens' rows r_c + o_c·H

    if G == 1:
        # a decay per head (a gate per head, Mamba-2, or λ, Lightning) is one number per token: every factor a
        # key row carries (key_scale_j, the decays e^{b_t - b_j} and e^{b_L - b_j}) scales a row of an fp32
        # product of the raw keys, so the key tiles go to the tensor cores as loaded
        if GAMMA:
            b_gam = tl.load(gamma + i_h)
            b_row = tl.exp(decay_exponent(b_gam, t_last - o_t))                 # λ^(L - j)
        else:
            b_gc = tl.load(b + (tok0 + o_t) * H + i_h, mask=m_t, other=0.0)
            b_gl = tl.load(b + (tok0 + t_last) * H + i_h)
            b_row = tl.exp(tl.where(m_t, b_gl - b_gc, 0.0))                      # <= 1 on every real token
        if KEY_SCALE:
            b_s = tl.load(key_scale + (tok0 + o_t) * H + i_h, mask=m_t, other=0.0)
            b_row *= b_s
    if GAMMA or RECOMPUTE_A:
        # the scores recomputed, transposed: A^T_jt = scale · key_scale_j · (K Q^T)_jt · M_tj, with M_tj =
        # λ^(t-j) or e^{b_t - b_j} on and below the diagonal of A (t >= j), as dv's intra product takes them
        # (with one value tile, V <= BV as Mamba-2's headdim, the same key tiles also give K dS')
        m_up = (o_c[:, None] <= o_c[None, :]) & m_t[:, None] & m_t[None, :]
        b_At = tl.zeros([BT, BT], dtype=tl.float32)
        if V <= BV:
            b_kdh = tl.zeros([BT, BV], dtype=tl.float32)
            o_v = tl.arange(0, BV)
        for i_k in range(tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            b_q = _group_rows(q, None, i_h, t0, o_c, m_t, o_k, m_k, H, K, GROUP, False)
            b_k = _group_rows(k, None, i_h, t0, o_c, m_t, o_k, m_k, H, K, GROUP, False)
            b_At += tl.dot(b_k, tl.trans(b_q), input_precision=DOT_PREC)
            if V <= BV:
                b_dh = tl.load(p_dhc + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & (o_v < V)[None, :],
                               other=0.0)
                b_kdh += tl.dot(b_k, b_dh.to(b_k.dtype), input_precision=DOT_PREC)
        if GAMMA:
            b_decay = tl.exp(decay_exponent(b_gam, o_c[None, :] - o_c[:, None]))
        else:
            b_decay = tl.exp(tl.where(m_up, b_gc[None, :] - b_gc[:, None], 0.0))
        if KEY_SCALE:
            b_decay *= b_s[:, None]
        b_At = tl.where(m_up, b_At * b_decay * scale, 0.0)
    else:
        b_A = tl.load(A + r_c * BT + (o_c[:, None] * H) * BT + o_c[None, :], mask=m_t[:, None],
                      other=0.0).to(tl.float32)
        b_At = tl.trans(tl.where(m_lo, b_A, 0.0))          # above the diagonal A was never written

    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        p_v = (o_c[:, None] * H) * V + o_v[None, :]
        b_do = tl.load(do + r_c * V + p_v, mask=m_tv, other=0.0)
        b_v = tl.load(v + r_c * V + p_v, mask=m_tv, other=0.0)
        # inter-chunk: (diag(row) K) dS', over the key dim in tiles; intra-chunk: A^T dO
        if G == 1:
            if not ((GAMMA or RECOMPUTE_A) and V <= BV):         # K dS' not taken with the scores
                b_kdh = tl.zeros([BT, BV], dtype=tl.float32)
                for i_k in range(tl.cdiv(K, BK)):
                    o_k = i_k * BK + tl.arange(0, BK)
                    m_k = o_k < K
                    b_k = _group_rows(k, None, i_h, t0, o_c, m_t, o_k, m_k, H, K, GROUP, False)
                    b_dh = tl.load(p_dhc + o_k[:, None] * V + o_v[None, :],
                                   mask=m_k[:, None] & (o_v < V)[None, :], other=0.0)
                    b_kdh += tl.dot(b_k, b_dh.to(b_k.dtype), input_precision=DOT_PREC)
            b_dv = tl.dot(b_At.to(b_do.dtype), b_do, b_kdh * b_row[:, None], input_precision=DOT_PREC)
        else:
            b_dv = tl.dot(b_At.to(b_do.dtype), b_do, input_precision=DOT_PREC)
            for i_k in range(tl.cdiv(K, BK)):
                o_k = i_k * BK + tl.arange(0, BK)
                m_k = o_k < K
                m_tk = m_t[:, None] & m_k[None, :]
                b_k = _group_rows(k, key_scale, i_h, t0, o_c, m_t, o_k, m_k, H, K, GROUP, KEY_SCALE)
                b_g = tl.load(b + r_c * G + (o_c[:, None] * H) * G + o_k[None, :], mask=m_tk, other=0.0)
                b_gl = tl.load(b + r_c * G + ((t_last - i_t * BT) * H) * G + o_k, mask=m_k, other=0.0)
                b_decay = tl.exp(tl.where(m_tk, b_gl[None, :] - b_g, 0.0))    # <= 0 on every real token
                b_dh = tl.load(p_dhc + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & (o_v < V)[None, :],
                               other=0.0)
                b_dv += tl.dot((b_k * b_decay).to(b_do.dtype), b_dh.to(b_do.dtype), input_precision=DOT_PREC)
        if SKIP:
            b_skip = tl.load(skip + i_h * s_skip_h + o_v * s_skip_v, mask=o_v < V, other=0.0).to(tl.float32)
            b_dv += b_do.to(tl.float32) * b_skip[None, :]
        tl.store(dv + r_c * V + p_v, b_dv.to(dv.dtype.element_ty), mask=m_tv)
        b_dA += tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)

    b_dA = tl.where(m_lo, b_dA * scale, 0.0)
    tl.store(dA + r_c * BT + (o_c[:, None] * H) * BT + o_c[None, :], b_dA, mask=m_t[:, None])


def chunk_dv(q, k, v, b, A, dstates, do, dv, dA, scale: float, *, gamma=None, group_size: int = 1,
             key_scale=None, skip=None, packed=None) -> None:
    """dv = A^T dO + (K ⊙ e^{b_L - b}) dS' for every chunk, and dA = scale ·
    dO V^T on and below the diagonal (the scores' gradient, scale folded in),
    all chunks in parallel.

    q, k: [B, T, H, K]; v, do: [B, T, H, V]; b: fp32 [B, T, H, G] (G = K or
    1) and A: [B, T, H, CHUNK] the forward's scores (`chunk_output`'s
    layout); or A = None with a gate per head (G = 1, Mamba-2): the scores
    scale · (Q K^T ⊙ e^{b_t - b_j}) are recomputed here; or b = A = None and
    gamma: fp32 [H], when the scores are scale · (Q K^T ⊙ λ^(t-j)),
    recomputed too (q is read only in these two cases).
    dstates: [B, NT, H, K, V] (`chunk_state_grad_pass`). Written: dv [B, T,
    H, V]; dA fp32 [B, T, H, CHUNK], zero above the diagonal.

    group_size: heads sharing one row of q and k, [B, T, H / group_size, K];
    key_scale: fp32 [B, T, H] or None, head h's keys are then k ⊙ key_scale
    (Mamba-2: q = C and k = B per group, key_scale = dt). skip: [H, V] or
    [H] (one per head) or None, a skip from v to the output, o + skip ⊙ v
    (Mamba-2's D): dv then also holds do ⊙ skip, added in fp32 before its
    one store, so dv is v's whole gradient.

    packed: packed sequences (`packed_chunks`, B = 1; dstates as
    `chunk_state_grad_pass` writes them for them).

        >>> dA = torch.empty(B, T, H, CHUNK, device=q.device)
        >>> chunk_dv(q, k, v, b, A, dstates, do, dv := torch.empty_like(v),
        ...          dA, scale=K ** -0.5)
    """
    B, T, _, K = k.shape
    H, V = v.shape[2], v.shape[3]
    G = 1 if b is None else b.shape[-1]
    recompute = A is None and gamma is None
    if recompute and G != 1:
        raise ValueError(f"chunk_dv recomputes the scores for a gate per head only (G = 1), got G = {G}")
    NT = n_chunks(T, packed)
    # the scores read (GLA, K = V = 128): with fp32 states 255 registers and
    # 120 KB of shared memory at 3 stages, one program of 4 warps an SM; at 2
    # stages 248 and 80 KB, two. With bf16 states 252 and 105 KB at 3 stages,
    # 251 and 72 KB at 2. The scores recomputed (Mamba-2, K = 128, V = 64,
    # bf16 states): 248 registers and 72 KB at 3 stages with the skip added
    # (227 without: do ⊙ skip takes do into the products' layout), two
    # programs an SM either way (ptxas, sm_90a, bf16:
    # scripts/linear_bwd_compile.py)
    stages = 2 if A is not None else 3
    # skip's strides; [H] is read as [H, V] at value stride 0. Without skip
    # they are None, so the kernel takes no argument for them and compiles as
    # it would without this option
    s_skip_h = s_skip_v = None
    if skip is not None:
        s_skip_h, s_skip_v = skip.stride(0), skip.stride(1) if skip.dim() == 2 else 0
    _chunk_dv_kernel[(NT, B * H)](
        q, k, v, b, A, dstates, do, dv, dA, scale, T, H, NT, K, V, G, BT=CHUNK, BK=_tile(K), BV=_tile(V),
        DOT_PREC=dot_precision(k.dtype), gamma=gamma, GAMMA=gamma is not None, RECOMPUTE_A=recompute,
        key_scale=key_scale, KEY_SCALE=key_scale is not None, GROUP=group_size,
        skip=skip, s_skip_h=s_skip_h, s_skip_v=s_skip_v, SKIP=skip is not None, **varlen(packed),
        num_stages=stages)


# ------------------------------------------------------------------ 3. dq, dk and the gate's gradient
# A gate per key channel (GLA, K = 128): the chunk-wide kernel on 8 warps. At 4 warps ptxas (sm_90a, bf16)
# spilled it 2.7 KB (with its gate sums as IEEE fp32 products, 4,284 FFMA); at 8 warps 237 registers, no spills.
# The sub-chunk kernel: one stage, as its loops over the other sub-chunks run at most 3 steps and a pipelined
# copy only stages their tiles through shared memory (scripts/linear_bwd_compile.py).
_PER_CHANNEL_WARPS = 8
_INTRA_STAGES = 1
# The sub-chunk kernel's key channels a program and warps. Every part of its work is separable by key channel,
# so smaller tiles give it NK times the programs at fewer registers each; its 16-step diagonal loop is a chain
# of dependent loads and exponentials, which more programs an SM hide. Inside GLA's backward (B 1, T 16K, 32
# heads, K = 128, bf16, an H100): all of K on 8 warps 1,773 us, tiles of 64 on 8 warps 1,722, on 4 warps
# 1,583, tiles of 32 on 4 warps 1,427, on 2 warps 1,397 (notes/TUNING.md "2026-12-07 (35)"). ptxas (sm_90a,
# bf16): 92 registers at tiles of 32 on 2 warps, 80 at 64 on 4, 113 over all of K on 8; no spills. KDA's launch
# (fp32 q and k, both score matrices, bf16 β on the columns, TF32 products): 136 at tiles of 32 on 2 warps, no spills.
_INTRA_BK, _INTRA_WARPS = 32, 2

@triton.jit(do_not_specialize=["T", "H"])
def _chunk_dqk_intra_kernel(
    q, k, b, dA, dq, dk, T, H,
    K: tl.constexpr, G: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
    DOT_PREC: tl.constexpr, dA_kk=None, dk_rows=None, beta=None, KEY_PAIRS: tl.constexpr = False,
    cu_seqlens=None, chunk_indices=None, VARLEN: tl.constexpr = False,
):
    # one program: sub-chunk i_c of chunk i_t, key channels [i_k·BK, ..); its rows' dq and its columns' dk
    # from the pairs j < t (the pairs j = t are left to the chunk-wide kernel, which drops them from the
    # gate's gradient). Each key channel's terms are its own (a gate per channel: no sum across channels).
    # The elementwise diagonal block and the tensor-core products accumulate apart and meet once, at the
    # store: an elementwise update of an accumulator in the products' layout is a shared-memory round trip.
    # KEY_PAIRS: a second score matrix with k in both places (KDA's A_kk, under a weight β per row) over the
    # same pairs, its rows without β to dk_rows and its columns with it into dk: the two share every
    # exponential and every load of k and b.
    # (packed sequences: chunk i_t of the sequence that chunk program i_tc is in, `chunk_at`)
    i_kc, i_tc, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_k, i_c = i_kc // (BT // BC), i_kc % (BT // BC)
    i_b, i_h = i_bh // H, i_bh % H
    tok0, i_t, T = chunk_at(i_tc, i_b, T, cu_seqlens, chunk_indices, VARLEN)
    t0 = i_t * BT + i_c * BC
    if t0 < T:
        o_r = tl.arange(0, BC)
        o_t = t0 + o_r
        m_t = o_t < T
        o_k = i_k * BK + tl.arange(0, BK)
        o_gk = o_k if G == K else o_k * 0
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        # every row after r_c, the chunk's first (64-bit), at 32-bit offsets
        r_c = chunk_row(0, tok0 + i_t * BT, i_h, T, H)
        q, k, b, dA, dq, dk = q + r_c * K, k + r_c * K, b + r_c * G, dA + r_c * BT, dq + r_c * K, dk + r_c * K
        o_cr = (i_c * BC + o_r) * H                                   # the rows of this sub-chunk after r_c
        p_x = o_cr[:, None] * K + o_k[None, :]
        p_dA = dA + o_cr * BT                                         # row starts of this sub-chunk's dA
        if KEY_PAIRS:
            dA_kk, dk_rows, beta = dA_kk + r_c * BT, dk_rows + r_c * K, beta + r_c   # beta: [B, T, H]
            p_dA2 = dA_kk + o_cr * BT
        b_g = tl.load(b + o_cr[:, None] * G + o_gk[None, :], mask=m_tk, other=0.0)

        b_dq_off = tl.zeros([BC, BK], dtype=tl.float32)
        b_dq2_off = tl.zeros([BC, BK], dtype=tl.float32)
        # (a) dq against the earlier sub-chunks, re-based at b_n = b[t0] as the forward's scores are:
        #     dq_t = e^{b_t - b_n} ⊙ Σ_j dA_tj (k_j ⊙ e^{b_n - b_j}), both exponents <= 0 (j < t0 <= t)
        if i_c > 0:
            b_gn = tl.load(b + (i_c * BC * H) * G + o_gk, mask=m_k, other=0.0)
            for i_j in range(0, i_c):
                p_j = (i_j * BC + o_r[:, None]) * H
                b_kj = tl.load(k + p_j * K + o_k[None, :], mask=m_k[None, :], other=0.0)
                b_gj = tl.load(b + p_j * G + o_gk[None, :], mask=m_k[None, :], other=0.0)
                b_kn = (b_kj * tl.exp(b_gn[None, :] - b_gj)).to(k.dtype.element_ty)
                b_dAj = tl.load(p_dA[:, None] + i_j * BC + o_r[None, :], mask=m_t[:, None], other=0.0)
                b_dq_off += tl.dot(b_dAj.to(k.dtype.element_ty), b_kn, input_precision=DOT_PREC)
                if KEY_PAIRS:
                    b_dAj = tl.load(p_dA2[:, None] + i_j * BC + o_r[None, :], mask=m_t[:, None], other=0.0)
                    b_dq2_off += tl.dot(b_dAj.to(k.dtype.element_ty), b_kn, input_precision=DOT_PREC)
            b_en = tl.exp(tl.where(m_tk, b_g - b_gn[None, :], 0.0))
            b_dq_off *= b_en
            if KEY_PAIRS:
                b_dq2_off *= b_en

        b_dk_off = tl.zeros([BC, BK], dtype=tl.float32)
        # (b) dk against the later sub-chunks, all re-based at one row, the first after this sub-chunk
        #     (b_n = b[t0 + BC]): dk_j = e^{b_n - b_j} ⊙ Σ_t dA_tj (q_t ⊙ e^{b_t - b_n}), both exponents
        #     <= 0 (j < t0 + BC <= t); where e^{b_t - b_n} underflows, e^{b_t - b_j} <= it is as small
        n_sub = tl.minimum(tl.cdiv(T - i_t * BT, BC), BT // BC)
        if i_c + 1 < n_sub:
            b_gn = tl.load(b + ((i_c * BC + BC) * H) * G + o_gk, mask=m_k, other=0.0)
            for i_i in range(i_c + 1, n_sub):
                o_i = i_t * BT + i_i * BC + o_r
                m_ik = (o_i < T)[:, None] & m_k[None, :]
                p_i = (i_i * BC + o_r[:, None]) * H
                b_qi = tl.load(q + p_i * K + o_k[None, :], mask=m_ik, other=0.0)
                b_gi = tl.load(b + p_i * G + o_gk[None, :], mask=m_ik, other=0.0)
                b_ei = tl.exp(tl.where(m_ik, b_gi - b_gn[None, :], float("-inf")))
                b_qn = (b_qi * b_ei).to(k.dtype.element_ty)
                b_dAi = tl.load(dA + p_i * BT + i_c * BC + o_r[None, :], mask=(o_i < T)[:, None], other=0.0)
                b_dk_off += tl.dot(tl.trans(b_dAi).to(k.dtype.element_ty), b_qn, input_precision=DOT_PREC)
                if KEY_PAIRS:
                    b_ki = tl.load(k + p_i * K + o_k[None, :], mask=m_ik, other=0.0)
                    b_bi = tl.load(beta + p_i, mask=(o_i < T)[:, None], other=0.0).to(tl.float32)
                    b_kin = (b_ki * b_ei * b_bi).to(k.dtype.element_ty)
                    b_dAi = tl.load(dA_kk + p_i * BT + i_c * BC + o_r[None, :], mask=(o_i < T)[:, None], other=0.0)
                    b_dk_off += tl.dot(tl.trans(b_dAi).to(k.dtype.element_ty), b_kin, input_precision=DOT_PREC)
            b_dk_off *= tl.exp(tl.where(m_tk, b_gn[None, :] - b_g, 0.0))

        # (c) the diagonal block's pairs j < t, elementwise in fp32, one row s of the block a step (a rolled
        #     loop: unrolled, ptxas hoists every step's loads and runs out of registers). Row s is the key j
        #     of the pairs (t > s, s), dq_t += dA_ts k_s ⊙ e^{b_t - b_s}, and the query t of the pairs
        #     (s, j < s), dk_j += dA_sj q_s ⊙ e^{b_s - b_j}: one exponent tile serves both, b_r - b_s for the
        #     rows r after s and b_s - b_r for those before, each that of one pair (never re-based: a gate can
        #     be GATE_FLOOR a step, and e^{b_s - b_r} of a common reference would overflow). Both updates are
        #     rank-1 on [BC, BK] tiles: no sum across rows (a cross-warp reduction through shared memory)
        b_dq_diag = tl.zeros([BC, BK], dtype=tl.float32)
        b_dk_diag = tl.zeros([BC, BK], dtype=tl.float32)
        b_dq2_diag = tl.zeros([BC, BK], dtype=tl.float32)
        b_gd = tl.where(m_t[:, None], b_g, float("-inf"))    # rows past T: e^{b_r - b_s} = 0, not e^{+...}
        for s in range(0, tl.minimum(BC, T - t0)):
            p_s = (i_c * BC + s) * H
            b_gs = tl.load(b + p_s * G + o_gk, mask=m_k, other=0.0)
            b_ks = tl.load(k + p_s * K + o_k, mask=m_k, other=0.0).to(tl.float32)
            b_qs = tl.load(q + p_s * K + o_k, mask=m_k, other=0.0).to(tl.float32)
            b_dAc = tl.load(p_dA + i_c * BC + s, mask=m_t & (o_r > s), other=0.0)   # column s, rows > s
            b_dAr = tl.load(dA + p_s * BT + i_c * BC + o_r, mask=o_r < s, other=0.0)  # row s, columns < s
            b_e = tl.exp((b_gd - b_gs[None, :]) * tl.where(o_r > s, 1.0, -1.0)[:, None])
            b_dq_diag += (b_dAc[:, None] * b_e) * b_ks[None, :]
            b_dk_diag += (b_dAr[:, None] * b_e) * b_qs[None, :]
            if KEY_PAIRS:
                # k_s is the query of row s's pairs in A_kk
                b_dAc = tl.load(p_dA2 + i_c * BC + s, mask=m_t & (o_r > s), other=0.0)
                b_dAr = tl.load(dA_kk + p_s * BT + i_c * BC + o_r, mask=o_r < s, other=0.0)
                b_dAr *= tl.load(beta + p_s).to(tl.float32)
                b_dq2_diag += (b_dAc[:, None] * b_e) * b_ks[None, :]
                b_dk_diag += (b_dAr[:, None] * b_e) * b_ks[None, :]

        tl.store(dq + p_x, b_dq_off + b_dq_diag, mask=m_tk)
        tl.store(dk + p_x, b_dk_off + b_dk_diag, mask=m_tk)
        if KEY_PAIRS:
            tl.store(dk_rows + p_x, b_dq2_off + b_dq2_diag, mask=m_tk)


@triton.jit
def inter_chunk_products(v, do, h, dh, s_c, r_c, o_c, m_t, o_k, m_k, H, V: tl.constexpr, BT: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, GATE_GRAD: tl.constexpr, DOT_PREC: tl.constexpr):
    """For one chunk of one head, whose state and state gradient start at s_c in h and dh ([B, NT, H, K, V],
    `chunk_state_base`) and whose first token's row is r_c (`chunk_row`), and the key columns o_k: dO S^T and
    V dS'^T ([BT, BK], fp32), over the value dim in tiles, and rowsum(S ⊙ dS') ([BK], for the gate; zeros
    without GATE_GRAD)."""
    h, dh = h + s_c, dh + s_c                                        # this chunk's state and its gradient
    v, do = v + r_c * V, do + r_c * V                                # the chunk's first row, 64-bit
    b_dos = tl.zeros([BT, BK], dtype=tl.float32)
    b_vdh = tl.zeros([BT, BK], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        p_v = (o_c[:, None] * H) * V + o_v[None, :]
        b_do = tl.load(do + p_v, mask=m_t[:, None] & m_v[None, :], other=0.0)
        b_v = tl.load(v + p_v, mask=m_t[:, None] & m_v[None, :], other=0.0)
        p_s = o_k[:, None] * V + o_v[None, :]
        m_s = m_k[:, None] & m_v[None, :]
        b_h = tl.load(h + p_s, mask=m_s, other=0.0)
        b_dh = tl.load(dh + p_s, mask=m_s, other=0.0)
        b_dos += tl.dot(b_do, tl.trans(b_h).to(b_do.dtype), input_precision=DOT_PREC)
        b_vdh += tl.dot(b_v, tl.trans(b_dh).to(b_v.dtype), input_precision=DOT_PREC)
        if GATE_GRAD:
            # the states as stored (16-bit for 16-bit inputs, `chunk_state_dtype`), multiplied and summed in
            # fp32: S and dS' are never in one kernel's registers in fp32 (two passes, opposite directions)
            b_hdh += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), axis=1)
    return b_dos, b_vdh, b_hdh


@triton.jit
def score_grad_tile(dA, r_c, o_c, m_t, H, BT: tl.constexpr):
    """One chunk's [BT, BT] tile of dA [B, T, H, BT] (`chunk_dv`'s scores' gradient), its first token's row r_c
    (`chunk_row`); 0 on tokens past the sequence's end (m_t)."""
    return tl.load(dA + r_c * BT + (o_c[:, None] * H) * BT + o_c[None, :], mask=m_t[:, None], other=0.0)


@triton.jit
def decayed_score_grad(b_dA, b_gc, m_lo):
    """dA ⊙ M for one cumulative gate per token b_gc: M_tj = e^{b_t - b_j} <= 1 for j <= t (every log gate
    <= 0), so no re-basing; the exponent taken on the real pairs on and below the diagonal only (m_lo;
    elsewhere it may be positive, and dA is 0)."""
    return b_dA * tl.exp(tl.where(m_lo, b_gc[:, None] - b_gc[None, :], float("-inf")))


@triton.jit
def one_decay_dqk(b_q, b_k, b_dos, b_vdh, b_hdh, dA, b, gk, gamma, scale, r_c, tok0, i_h, o_c, o_t, m_t, t_last,
                  H, BT: tl.constexpr, FLOOR: tl.constexpr, GATE_GRAD: tl.constexpr, DOT_PREC: tl.constexpr,
                  GAMMA: tl.constexpr):
    """dq and dk of one decay per head (b: the cumulative gates [B, T, H], gk the gates as given) or a fixed
    decay (GAMMA: gamma [H]), from the inter-chunk products (`inter_chunk_products`) and dA, for one chunk of
    head i_h (its first token's row r_c, `chunk_row`; its sequence's first token tok0 among the B·T, o_t and
    t_last counted from there) and one key tile (b_q, b_k [BT, BK]); and this key tile's share of the gate's
    gradient ([BT], zeros without GATE_GRAD or with GAMMA). The decay factors out of the key sum: the
    intra-chunk part is (dA ⊙ M) K and (dA ⊙ M)^T Q over the whole chunk, M_tj the decay from j to t (dA is
    zero above the diagonal)."""
    b_dA = score_grad_tile(dA, r_c, o_c, m_t, H, BT)
    if GAMMA:
        # M_tj = λ^(t-j), a fixed decay
        b_gam = tl.load(gamma + i_h)
        b_dA = b_dA * tl.exp(decay_exponent(b_gam, o_c[:, None] - o_c[None, :]))
        b_q_decay = tl.exp(decay_exponent(b_gam, o_c + 1)) * scale
        b_k_decay = tl.exp(decay_exponent(b_gam, t_last - o_t))
    else:
        p_gc, p_gl = (tok0 + o_t) * H + i_h, (tok0 + t_last) * H + i_h
        b_gc = tl.load(b + p_gc, mask=m_t, other=0.0)
        b_gl = tl.load(b + p_gl)
        b_dA = decayed_score_grad(b_dA, b_gc, (o_c[:, None] >= o_c[None, :]) & m_t[:, None] & m_t[None, :])
        b_q_decay = tl.exp(b_gc) * scale
        b_k_decay = tl.exp(tl.where(m_t, b_gl - b_gc, 0.0))
    b_dq_inter = b_dos * b_q_decay[:, None]
    b_dk_inter = b_vdh * b_k_decay[:, None]
    b_dg = tl.zeros([BT], dtype=tl.float32)
    if GATE_GRAD and not GAMMA:
        # the docstring's dgk summed over this tile's key channels: with R_tj = (dA ⊙ M)_tj q_t · k_j
        # (this tile's share of the scores), q_t · dq_t^off = Σ_{j<t} R_tj and k_t · dk_t^off = Σ_{i>t} R_it;
        # the pairs j = t cancel exactly, so R is kept strictly below the diagonal
        b_R = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PREC) * b_dA
        b_R = tl.where(o_c[:, None] > o_c[None, :], b_R, 0.0)
        b_r = tl.sum(b_q.to(tl.float32) * b_dq_inter, axis=1) + tl.sum(b_R, axis=1) - tl.sum(b_R, axis=0)
        b_p = tl.sum(b_k.to(tl.float32) * b_dk_inter, axis=1)
        # dg_s = Σ_{t >= s} r_t + Σ_{j < s} p_j + e^{b_L} Σ(S ⊙ dS'), one masked fp32 sum per row s
        b_dg = tl.sum(tl.where(o_c[None, :] >= o_c[:, None], b_r[None, :], b_p[None, :]), axis=1) \
            + tl.sum(b_hdh) * tl.exp(b_gl)
        b_gk = tl.load(gk + p_gc, mask=m_t, other=0.0)
        b_dg = tl.where(b_gk < FLOOR, 0.0, b_dg)      # a gate under the floor (-inf) is not a variable
    # after the gate's sums, which end in vectors: the products then have the registers to themselves
    # (in the other order, ptxas spills at 4 warps)
    b_dAc = b_dA.to(b_k.dtype)
    b_dq = b_dq_inter + tl.dot(b_dAc, b_k, input_precision=DOT_PREC)
    b_dk = b_dk_inter + tl.dot(tl.trans(b_dAc), b_q, input_precision=DOT_PREC)
    return b_dq, b_dk, b_dg


@triton.jit(do_not_specialize=["T", "H", "NT"])
def _chunk_dqk_kernel(
    q, k, v, gk, b, h, dh, do, dA, dq_intra, dk_intra, dq, dk, dg, scale, T, H, NT,
    K: tl.constexpr, V: tl.constexpr, G: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    FLOOR: tl.constexpr, GATE_GRAD: tl.constexpr, DOT_PREC: tl.constexpr, gamma=None, GAMMA: tl.constexpr = False,
    SUM_PREC: tl.constexpr = "ieee", cu_seqlens=None, chunk_indices=None, VARLEN: tl.constexpr = False,
):
    # one program: chunk i_t of one (batch, head), or of packed sequences' chunk program i_c (`chunk_at`), key
    # columns [i_k·BK, (i_k+1)·BK)
    i_k, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    s_tile = T * tl.num_programs(2)     # the stride between key tiles' [B, T, H] shares of dg (G = 1), whole T
    tok0, i_t, T = chunk_at(i_c, i_b, T, cu_seqlens, chunk_indices, VARLEN)
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    m_t = o_t < T
    t_last = tl.minimum(i_t * BT + BT, T) - 1
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    r_c = chunk_row(0, tok0 + i_t * BT, i_h, T, H)      # 64-bit; the tokens' rows r_c + o_c·H
    p_x = (o_c[:, None] * H) * K + o_k[None, :]
    q, k, dq, dk = q + r_c * K, k + r_c * K, dq + r_c * K, dk + r_c * K
    b_q = tl.load(q + p_x, mask=m_tk, other=0.0)
    b_k = tl.load(k + p_x, mask=m_tk, other=0.0)
    # the chunk's state: (batch row i_b, chunk i_c) dense; packed, B = 1 and chunk program i_c is its slot
    b_dos, b_vdh, b_hdh = inter_chunk_products(v, do, h, dh, chunk_state_base(i_b, i_c, i_h, NT, H, K, V), r_c,
                                               o_c, m_t, o_k, m_k, H, V, BT, BK, BV, GATE_GRAD, DOT_PREC)

    if GAMMA or G == 1:
        b_dq, b_dk, b_dg = one_decay_dqk(b_q, b_k, b_dos, b_vdh, b_hdh, dA, b, gk, gamma, scale, r_c, tok0, i_h,
                                         o_c, o_t, m_t, t_last, H, BT, FLOOR, GATE_GRAD, DOT_PREC, GAMMA)
        if GATE_GRAD and not GAMMA:
            # this key tile's share, summed over the tiles by the caller
            tl.store(dg + i_k * s_tile + (tok0 + o_t) * H + i_h, b_dg, mask=m_t)
        tl.store(dq + p_x, b_dq.to(dq.dtype.element_ty), mask=m_tk)
        tl.store(dk + p_x, b_dk.to(dk.dtype.element_ty), mask=m_tk)
    else:
        # a gate per key channel (G = K): the intra-chunk pairs j < t from _chunk_dqk_intra_kernel. dq, then dk,
        # each stored as soon as it is whole, so that few [BT, BK] tiles are alive at once (ptxas spills else)
        b, dq_intra, dk_intra = b + r_c * K, dq_intra + r_c * K, dk_intra + r_c * K
        b_g = tl.load(b + p_x, mask=m_tk, other=0.0)
        b_gl = tl.load(b + ((t_last - i_t * BT) * H) * K + o_k, mask=m_k, other=0.0)
        b_dAd = tl.load(dA + r_c * BT + (o_c * H) * BT + o_c, mask=m_t, other=0.0)    # the diagonal
        b_qf, b_kf = b_q.to(tl.float32), b_k.to(tl.float32)
        b_dq = b_dos * tl.exp(b_g) * scale + tl.load(dq_intra + p_x, mask=m_tk, other=0.0)   # inter + off-diagonal
        tl.store(dq + p_x, (b_dq + b_dAd[:, None] * b_kf).to(dq.dtype.element_ty), mask=m_tk)
        b_dk_inter = b_vdh * tl.exp(tl.where(m_tk, b_gl[None, :] - b_g, 0.0))
        b_dk_off = tl.load(dk_intra + p_x, mask=m_tk, other=0.0)
        tl.store(dk + p_x, (b_dk_inter + b_dk_off + b_dAd[:, None] * b_qf).to(dk.dtype.element_ty), mask=m_tk)
        if GATE_GRAD:
            # Σ_{t >= s} of what is left of q ⊙ dq - k ⊙ dk after the exact cancellations, Σ_{j < s} of
            # k ⊙ dk's inter-chunk part, as products with triangles of ones: every term at its own size (IEEE
            # fp32 for fp32 inputs; for 16-bit ones three tf32 products, r = r_hi + r_lo, ~22 bits, on the
            # tensor cores instead of 2·BT·BT·BK FMAs a thread block)
            b_r = b_qf * b_dq - b_kf * b_dk_off
            b_p = b_kf * b_dk_inter
            b_ge = tl.where(o_c[None, :] >= o_c[:, None], 1.0, 0.0)
            b_dg = tl.dot(b_ge, b_r, input_precision=SUM_PREC) \
                + tl.dot(1.0 - b_ge, b_p, input_precision=SUM_PREC) + (b_hdh * tl.exp(b_gl))[None, :]
            b_gk = tl.load(gk + r_c * K + p_x, mask=m_tk, other=0.0)
            b_dg = tl.where(b_gk < FLOOR, 0.0, b_dg)      # a gate under the floor (-inf) is not a variable
            tl.store(dg + r_c * K + p_x, b_dg.to(dg.dtype.element_ty), mask=m_tk)


def chunk_dqk_intra(q, k, b, dA, dq, dk, *, input_precision: str | None = None, dA_kk=None, dk_rows=None,
                    beta=None, packed=None) -> None:
    """The intra-chunk pairs j < t of scores with a gate per key channel,
    A_tj = Σ_c q_tc k_jc e^{b_tc - b_jc}, all chunks in parallel:
    dq_t = Σ_{j<t} dA_tj k_j ⊙ e^{b_t - b_j} and dk_j = Σ_{t>j} dA_tj q_t ⊙
    e^{b_t - b_j}, in sub-chunks of 16 rows, every exponent <= 0. dA's
    diagonal is not read (the pair j = t has no exponent: the caller adds
    dA_tt k_t to dq and dA_tt q_t to dk, and nothing to the gate's gradient).

    q, k: [B, T, H, K]; b: fp32 [B, T, H, K], their in-chunk cumulative
    gates; dA: fp32 [B, T, H, CHUNK], the scores' gradient, read below the
    diagonal. Written: dq, dk fp32 [B, T, H, K]. All contiguous.
    input_precision: that of the tensor-core products (default
    `dot_precision(q.dtype)`). GLA's `chunk_dqk` launches it first.

    dA_kk, dk_rows and beta (KDA's backward): a second score matrix over the
    same pairs with k in both places, A_kk, whose rows are weighted by beta
    ([B, T, H]): dA_kk (fp32, dA's layout) is the gradient of diag(β) A_kk.
    Its rows' share without β, Σ_{j<t} dA_kk,tj k_j ⊙ e^{b_t - b_j}, is
    written to dk_rows (the caller takes β_t times it to k_t, and k_t · it
    to β_t), and its columns' share Σ_{t>j} β_t dA_kk,tj k_t ⊙ e^{b_t - b_j}
    is added into dk, in the same launch (the two matrices share every
    exponential and every load of k and b).

    packed: packed sequences (`packed_chunks`, B = 1).

        >>> dq, dk = torch.empty_like(b), torch.empty_like(b)
        >>> chunk_dqk_intra(q, k, b, dA, dq, dk)
    """
    if not (dA_kk is None) == (dk_rows is None) == (beta is None):
        raise ValueError("chunk_dqk_intra takes dA_kk, dk_rows and beta together or none of them")
    B, T, H, K = q.shape
    BK = pow2_at_least_16(K) if _INTRA_BK is None else _INTRA_BK     # key channels a program
    _chunk_dqk_intra_kernel[(cdiv(K, BK) * (CHUNK // SUB_CHUNK), n_chunks(T, packed), B * H)](
        q, k, b, dA, dq, dk, T, H, K, b.shape[-1], BT=CHUNK, BC=SUB_CHUNK, BK=BK,
        DOT_PREC=input_precision or dot_precision(q.dtype), dA_kk=dA_kk, dk_rows=dk_rows, beta=beta,
        KEY_PAIRS=dA_kk is not None, **varlen(packed), num_warps=_INTRA_WARPS, num_stages=_INTRA_STAGES)


def chunk_dqk(q, k, v, gk, b, states, dstates, do, dA, dq, dk, dg, scale: float, *, gamma=None,
              packed=None) -> None:
    """dq, dk and the gate's gradient dg for every chunk, all chunks in
    parallel: the inter-chunk terms from the chunk-start states and the
    chunk-end gradients, the intra-chunk terms from dA.

    q, k: [B, T, H, K]; v, do: [B, T, H, V]; gk: [B, T, H, G], the log gates
    as given (G = K or 1);
    b: fp32 [B, T, H, G], their in-chunk cumulative sum; states: [B, NT, H,
    K, V] (`chunk_state_pass`) and dstates (`chunk_state_grad_pass`), any
    float dtype (`chunk_state_dtype`: the products round them to q's dtype,
    the gate's rowsum(S ⊙ dS') multiplies them in fp32); dA: fp32 [B, T, H,
    CHUNK] (`chunk_dv`). Or gk = b = None and gamma: fp32 [H], a fixed log
    decay per step (no gate gradient).
    Written: dq, dk [B, T, H, K]; dg [B, T, H, G] in any float dtype unless
    None. All contiguous. A gate per head (G = 1) or gamma: one launch of
    whole-chunk products (the decay factors out of the key sum); a gate per
    key channel (G = K): a first launch sums the pairs j < t in sub-chunks of
    16 rows. packed: packed sequences (`packed_chunks`, B = 1; states and
    dstates as the passes write them for them).

        >>> dq, dk = torch.empty_like(q), torch.empty_like(k)
        >>> dg = torch.empty_like(gk)
        >>> chunk_dqk(q, k, v, gk, b, states, dstates, do, dA, dq, dk, dg,
        ...           scale=K ** -0.5)
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    G = 1 if b is None else b.shape[-1]
    NT, BK = n_chunks(T, packed), _tile(K)
    NK = cdiv(K, BK)
    dq_intra = dk_intra = dg_tiles = None
    if gamma is None and G != 1:      # a gate per key channel: the intra-chunk pairs in sub-chunks first
        dq_intra = torch.empty(B, T, H, K, dtype=torch.float32, device=q.device)
        dk_intra = torch.empty_like(dq_intra)
        chunk_dqk_intra(q, k, b, dA, dq_intra, dk_intra, packed=packed)
    gate_out = dg
    if dg is not None and G == 1:
        gate_out = dg_tiles = torch.empty(NK, B, T, H, dtype=torch.float32, device=q.device)
    _chunk_dqk_kernel[(NK, NT, B * H)](
        q, k, v, gk, b, states, dstates, do, dA, dq_intra, dk_intra, dq, dk, gate_out, scale, T, H, NT,
        K, V, G, BT=CHUNK, BK=BK, BV=_tile(V), FLOOR=GATE_FLOOR, GATE_GRAD=dg is not None,
        DOT_PREC=dot_precision(q.dtype), gamma=gamma, GAMMA=gamma is not None, SUM_PREC=_sum_precision(q.dtype),
        **varlen(packed), num_warps=4 if gamma is not None or G == 1 else _PER_CHANNEL_WARPS)
    if dg_tiles is not None:
        dg.copy_(dg_tiles.sum(0).unsqueeze(-1))


__all__ = ["chunk_state_grad_pass", "chunk_dv", "chunk_dqk", "chunk_dqk_intra"]
