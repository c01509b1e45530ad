"""The chunk machinery of linear attention: the pieces every chunk-parallel family shares.

A recurrence S_t = Diag(e^{g_t}) S_{t-1} + k_t v_t^T, o_t = S_t^T (q_t · scale) is cut into chunks
of CHUNK = 64 tokens. With b_t the cumulative log-gate inside a chunk and S the state at its start,

    o_t    = (q_t ⊙ e^{b_t})^T S · scale  +  Σ_{j ≤ t} A_tj v_j        (inter-chunk + intra-chunk)
    S_next = Diag(e^{b_C}) S  +  Σ_j (k_j ⊙ e^{b_C - b_j}) v_j^T

Three launchable pieces compute everything but the scores A, which each family computes its own
way (GLA: per-channel decays inside the sum over keys; Lightning: a fixed decay per head):

    chunk_local_cumsum(g, b)                         b = the in-chunk cumulative sum of the log gates
    chunk_state_pass(k, v, b, states, h0, ht)        the state at every chunk start, and the final one
    chunk_output(q, v, b, states, A, o, scale)       o = (Q ⊙ e^b) S_start · scale + A V

The caller allocates every buffer (the shapes are in each docstring). Gates are a log decay per
key channel, [B, T, H, K] (GLA, KDA), or one per head and token, passed as [B, T, H, 1]: the gate's
last size G is K or 1, and G = 1 is read once per token and broadcast over the key channels (Mamba-2,
whose gate is one per head, has a state pass of its own that takes one exponential per token instead;
attention_kernels/mamba2/chunk.py). A decay that is the same at every step (Lightning Attention's λ_h = e^{-s_h}) needs no gate
tensor at all: the state pass takes it as `gamma` [H], the log decay per step, and computes the
decays itself. fp32 inputs multiply in IEEE fp32 (`tl.dot` with input_precision="ieee"), 16-bit
inputs on tensor cores with fp32 accumulation.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import autotune_configs, cdiv, next_power_of_2, pow2_at_least_16
from ..tl_helpers import dot_causal

CHUNK = 64  # tokens per chunk, in every chunk-parallel kernel (the scores A are [CHUNK] wide)
SUB_CHUNK = 16  # rows of the secondary chunks the score kernels cut a chunk into: the smallest side of a
                # tensor-core product

# Log gates below this are raised to it before they are summed. A gate of -inf is legitimate (the
# channel forgets everything, and the recurrent forms compute e^-inf = 0), but the kernels take
# differences b_t - b_j of cumulative gates, and -inf - -inf is NaN. Raising it to -110 is exact up
# to fp32 underflow: e^-110 ≈ 2e-48 is below half of fp32's smallest subnormal (1.4e-45 = e^-103.3),
# so every factor e^{b_t - b_j} whose span holds the gate (exponent <= -110, all other gates being
# <= 0) is exactly 0, as e^-inf is, and every other factor keeps its exponent. Why not lower: b is
# stored in fp32, so its rounding error grows with |b| (2^-24 |b|); each floored gate in a chunk
# adds 110 to |b|, and the exponents of the tokens after it carry that error (up to 4e-6 after one).
GATE_FLOOR = -110.0


def dot_precision(dtype: torch.dtype) -> str:
    """input_precision for `tl.dot` on inputs of this dtype: IEEE for fp32, so that fp32 results
    are fp32-accurate on the GPU too (16-bit inputs ignore it)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def chunk_state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the backward stores its per-chunk tensors [B, NT, H, K, V] in, for inputs of this dtype:
    the chunk-start states and their gradients dstates. The input dtype for 16-bit inputs (as the forward's
    states, and as mamba_ssm's backward stores them), fp32 for fp32 ones. Every product that reads them
    rounds them to the input dtype anyway; the one elementwise use, the gate's rowsum(S ⊙ dS'), multiplies
    the stored values in fp32. Each is written once and read two or three times: half the bytes of fp32.
    The state a pass carries from chunk to chunk, and the initial and final states, stay fp32.

        >>> states = torch.empty(B, NT, H, K, V, dtype=chunk_state_dtype(q.dtype), device=q.device)
    """
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32


def tiles_that_fit(k: str = "K", v: str = "V"):
    """An autotune prune (`early_config_prune`): drop the configs whose BK or BV tile is wider than the
    kernel arguments named k and v, padded to a power of two (a config without BK or BV is kept on that
    axis); keep the first if none fits."""
    def prune(configs, named_args, **kwargs):
        pk, pv = pow2_at_least_16(named_args[k]), pow2_at_least_16(named_args[v])
        keep = [c for c in configs if c.kwargs.get("BK", 16) <= pk and c.kwargs.get("BV", 16) <= pv]
        return keep or configs[:1]
    return prune


_fits = tiles_that_fit()


# 64-bit offsets. Products of sizes that pass 2^31 at training shapes: the chunk-start states B·NT·H·K·V
# (2^31 at B 8, T 64K, 16 heads, K = V = 128; 4.3e9 at 32 heads), the per-token tensors B·T·H·K (q, k, v, w,
# the gates per key channel, o: 2^31 at B 8, T 64K, 32 heads x 128; 4.3e9 at 64 heads) and the scores
# B·T·H·CHUNK (2^31 at 64 heads). Each kernel takes one 64-bit number a program: `chunk_row`, the row of its
# chunk's (or sub-chunk's, or token's) first token in the B·T·H rows of a [B, T, H, ...] tensor, times a row's
# length; a chunk-start state's offset, `chunk_state_base`, its (batch row, chunk, head) index widened before
# the multiply by K·V. Offsets inside a chunk ([BT] tokens x a tile: at most CHUNK·H·max(K, V, CHUNK)) stay
# 32-bit, as do the per-token scalars of a gate per head or β ([B, T, H]: B·T·H < 2^31 is assumed, and so
# B·NT·H) and the initial and final states (B·H·K·V). The sequential state pass reads the per-token tensors
# from a 64-bit base per batch row, at 32-bit offsets inside it (one row's T·H·max(K, V) < 2^31 is assumed),
# as the backward's reverse pass does (chunk_backward.py).
@triton.jit
def chunk_row(i_b, t0, i_h, T, H):
    """The row of (batch i_b, token t0, head i_h) in a [B, T, H, ...] tensor's B·T·H rows, as a 64-bit number:
    times a row's length it may pass 2^31."""
    return (i_b * T + t0).to(tl.int64) * H + i_h


@triton.jit
def chunk_state_base(i_b, i_t, i_h, NT, H, K, V):
    """The first element of (batch i_b, chunk i_t, head i_h)'s state in a [B, NT, H, K, V] tensor, as a 64-bit
    number: B·NT·H·K·V passes 2^31 at training shapes."""
    return ((i_b * NT + i_t) * H + i_h).to(tl.int64) * K * V


@triton.jit
def chunk_at(i_c, i_b, T, cu_seqlens, chunk_indices, VARLEN: tl.constexpr):
    """Where chunk program i_c works: (the first token of its sequence among the B·T tokens, the chunk's index
    in that sequence, the sequence's length). Dense inputs [B, T, ...]: batch row i_b, chunk i_c. Packed
    (VARLEN, B = 1): chunk_indices[i_c] = (sequence n, its chunk), sequence n from cu_seqlens[n] to
    cu_seqlens[n + 1] (`attention_kernels.linear.packed.packed_chunks`): every sequence's chunks start at its
    first token, and none holds tokens of two sequences."""
    if VARLEN:
        i_n = tl.load(chunk_indices + 2 * i_c)
        tok0 = tl.load(cu_seqlens + i_n)
        return tok0, tl.load(chunk_indices + 2 * i_c + 1), tl.load(cu_seqlens + i_n + 1) - tok0
    else:
        return i_b * T, i_c, T


@triton.jit
def sequence_at(i_b, T, NT, cu_seqlens, chunk_offsets, VARLEN: tl.constexpr):
    """Where a program that walks sequence i_b's chunks works: (its first token among the B·T tokens, its length,
    the slot of its first chunk's state: that chunk's place among all sequences' chunks). Packed (VARLEN):
    sequence i_b of cu_seqlens, its chunks from chunk_offsets[i_b] on."""
    if VARLEN:
        tok0 = tl.load(cu_seqlens + i_b)
        return tok0, tl.load(cu_seqlens + i_b + 1) - tok0, tl.load(chunk_offsets + i_b)
    else:
        return i_b * T, T, i_b * NT


def n_chunks(T: int, packed=None) -> int:
    """The chunk programs of a launch: ceil(T / CHUNK) per batch row, or every packed sequence's chunks."""
    return cdiv(T, CHUNK) if packed is None else packed.n_chunks


def varlen(packed=None, offsets: bool = False) -> dict:
    """A kernel's packed-sequence arguments: none for dense inputs; the offsets and the chunk table (`chunk_at`)
    or, with offsets, the offsets and each sequence's first chunk (`sequence_at`)."""
    if packed is None:
        return {}
    table = dict(chunk_offsets=packed.chunk_offsets) if offsets else dict(chunk_indices=packed.chunk_indices)
    return dict(cu_seqlens=packed.cu_seqlens, **table, VARLEN=True)


# ------------------------------------------------------------------ 1. the in-chunk cumulative gate
# T, H and the chunk count NT change with every prompt; they only enter address arithmetic
# (always multiplied by the constexpr head dims), so `do_not_specialize` lets one compiled
# kernel serve every length instead of one per divisibility class of T.
@triton.jit(do_not_specialize=["T", "H"])
def _chunk_local_cumsum_kernel(g, b, T, H, G: tl.constexpr, FLOOR: tl.constexpr,
                               BT: tl.constexpr, BG: tl.constexpr,
                               q=None, k=None, qn=None, kn=None, L2NORM: tl.constexpr = False,
                               EPS: tl.constexpr = 0.0, cu_seqlens=None, chunk_indices=None,
                               VARLEN: tl.constexpr = False):
    i_g, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    tok0, i_t, T = chunk_at(i_c, i_b, T, cu_seqlens, chunk_indices, VARLEN)
    o_t = i_t * BT + tl.arange(0, BT)
    o_g = i_g * BG + tl.arange(0, BG)
    m_g = (o_t < T)[:, None] & (o_g < G)[None, :]
    r_c = chunk_row(0, tok0 + i_t * BT, i_h, T, H)       # 64-bit (comment above chunk_row)
    g, b = g + r_c * G, b + r_c * G
    p_g = (tl.arange(0, BT)[:, None] * H) * G + o_g[None, :]
    b_g = tl.load(g + p_g, mask=m_g, other=0.0).to(tl.float32)
    b_g = tl.where(b_g < FLOOR, FLOOR, b_g)   # -inf -> FLOOR (see GATE_FLOOR); NaN stays NaN
    b_b = tl.cumsum(b_g, axis=0)
    tl.store(b + p_g, b_b, mask=m_g)
    if L2NORM:
        # q and k, [B, T, H, G] as the gates, divided by their L2 norm in the
        # same pass (KDA): the program holds whole rows (BG >= G)
        q, k, qn, kn = q + r_c * G, k + r_c * G, qn + r_c * G, kn + r_c * G
        b_q = tl.load(q + p_g, mask=m_g, other=0.0).to(tl.float32)
        b_k = tl.load(k + p_g, mask=m_g, other=0.0).to(tl.float32)
        b_qn = (b_q * tl.rsqrt(tl.sum(b_q * b_q, axis=1) + EPS)[:, None]).to(qn.dtype.element_ty)
        tl.store(qn + p_g, b_qn, mask=m_g)
        tl.store(kn + p_g, (b_k * tl.rsqrt(tl.sum(b_k * b_k, axis=1) + EPS)[:, None]).to(kn.dtype.element_ty),
                 mask=m_g)


def chunk_local_cumsum(g: torch.Tensor, b: torch.Tensor, *, q=None, k=None, q_normed=None, k_normed=None,
                       eps: float = 0.0, packed=None) -> None:
    """b = the cumulative sum of the log gates g inside each chunk of CHUNK tokens, in fp32.

    g: [B, T, H, G] (G = K per-channel gates, or 1 for a gate per head), contiguous, any float
    dtype; b: fp32 [B, T, H, G], written. Gates below GATE_FLOOR count as GATE_FLOOR.
    With q, k (like g, G = K) and q_normed, k_normed (like q, written) given, the same pass also
    writes q / sqrt(Σ q² + eps) and the same for k (KDA's use_qk_l2norm_in_kernel).
    packed: the chunks of packed sequences (`packed_chunks`, B = 1), each sequence's starting at its first token.

        >>> b = torch.empty(gk.shape, dtype=torch.float32, device=gk.device)
        >>> chunk_local_cumsum(gk, b)
        >>> b[:, :CHUNK].exp()      # the decay from the first chunk's start to each of its tokens
    """
    B, T, H, G = g.shape
    l2norm = {} if q_normed is None else dict(k=k, qn=q_normed, kn=k_normed, L2NORM=True, EPS=eps,
                                              num_warps=8 if G > 64 else 4)
    # the norm sums over every key channel: one program holds whole rows then
    BG = pow2_at_least_16(G) if l2norm else min(64, next_power_of_2(G))
    _chunk_local_cumsum_kernel[(cdiv(G, BG), n_chunks(T, packed), B * H)](
        g, b, T, H, G, FLOOR=GATE_FLOOR, BT=CHUNK, BG=BG, q=q, **l2norm, **varlen(packed))


# ------------------------------------------------------------------ 2. the inter-chunk state pass
@triton.jit
def decay_exponent(gamma, n):
    """gamma · n, the log of a fixed decay e^gamma taken n times, as fp32; 0 where n <= 0 (a padded
    row, the diagonal, or a pair above it that a mask drops later). The select, not the product, makes
    λ^0 = 1 also for gamma = -inf (λ = 0, a full reset each step), where -inf · 0 would be NaN, and keeps
    a negative n from overflowing (which `load_log_decay`'s finite floor alone would not)."""
    return tl.where(n > 0, gamma * n.to(tl.float32), 0.0)


@triton.jit
def load_log_decay(gamma, i_h):
    """Head i_h's log decay per step, gamma[i_h] (<= 0), with -inf raised to fp32's most negative
    finite value: a decay λ = 0 (a full reset at every step) then still gives λ^0 = e^{gamma · 0} = 1,
    where -inf · 0 would be NaN, and λ^n = e^{-3.4e38 · n} = 0 for n >= 1, as e^-inf is. One scalar
    maximum per program instead of a select on every exponent; a NaN stays NaN."""
    return tl.maximum(tl.load(gamma + i_h), -3.4028234663852886e38, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _chunk_values(v, w, v_new, b_h, o_t, m_t, o_k, m_k, o_v, m_v, H, K: tl.constexpr,
                  V: tl.constexpr, DELTA: tl.constexpr, DOT_PREC: tl.constexpr):
    """The [BT, BV] values one chunk adds to the state: v's tile, or with the delta rule (KDA, v holding
    the pseudo-values W') U = W' - W S, a sum over every key channel (one K-tile, BK >= K), also written
    to v_new for the output kernel. v, w and v_new point at the batch row's (and head's) first token."""
    if DELTA:
        b_w = tl.load(w + (o_t[:, None] * H) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
        p_v = (o_t[:, None] * H) * V + o_v[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        b_u = tl.load(v + p_v, mask=m_tv, other=0.0).to(tl.float32) \
            - tl.dot(b_w, b_h.to(b_w.dtype), input_precision=DOT_PREC)
        b_v = b_u.to(v_new.dtype.element_ty)
        tl.store(v_new + p_v, b_v, mask=m_tv)
    else:
        b_v = tl.load(v + (o_t[:, None] * H) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
    return b_v


# (BK, BV), num_warps, num_stages. The H200 picked (64, 32) at B·H = 32 and (64, 64) at 64.
_STATE_CONFIGS = autotune_configs([({"BK": 64, "BV": 32}, 2, 3), ({"BK": 64, "BV": 32}, 2, 4),
                                   ({"BK": 64, "BV": 64}, 2, 3)])


@triton.autotune(configs=_STATE_CONFIGS, key=["K", "V", "NBH"], prune_configs_by={"early_config_prune": _fits})
@triton.jit(do_not_specialize=["T", "H", "NT", "NBH"])
def _chunk_state_kernel(
    k, v, b, h, h0, ht, T, H, NT, NBH,
    K: tl.constexpr, V: tl.constexpr, G: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, DOT_PREC: tl.constexpr,
    gamma=None, GAMMA: tl.constexpr = False,
    w=None, v_new=None, DELTA: tl.constexpr = False, DECAYED_KEYS: tl.constexpr = False,
    cu_seqlens=None, chunk_offsets=None, VARLEN: tl.constexpr = False,
):
    # one program: key rows [i_k·BK, ..) and value columns [i_v·BV, ..) of
    # one (sequence, head)'s state, walking that sequence's chunks
    i_k, i_v, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    tok0, T, slot0 = sequence_at(i_b, T, NT, cu_seqlens, chunk_offsets, VARLEN)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_gk = o_k if G == K else o_k * 0          # a gate per head (G = 1): every key channel reads it
    m_k, m_v = o_k < K, o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    p_h = o_k[:, None] * V + o_v[None, :]
    if USE_H0:
        b_h = tl.load(h0 + i_bh * K * V + p_h, mask=m_h, other=0.0)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)

    # the sequence's first token of head i_h, 64-bit (comment above
    # chunk_row)
    r_b = chunk_row(0, tok0, i_h, T, H)
    k, v = k + r_b * K, v + r_b * V
    if not GAMMA:   # (a fixed decay has no gate tensor)
        if G == K:
            b = b + r_b * G
        else:
            b = b + (tok0 * H + i_h)            # a gate per head: [B, T, H] scalars, 32-bit
    if DELTA:
        w, v_new = w + r_b * K, v_new + r_b * V
    for i_t in range(tl.cdiv(T, BT)):
        # the state at the start of chunk i_t, for the output kernel (in the
        # input dtype)
        tl.store(h + chunk_state_base(0, slot0 + i_t, i_h, NT, H, K, V) + p_h, b_h.to(h.dtype.element_ty),
                 mask=m_h)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        # K^T and b^T as [BK, BT] tiles, V as [BT, BV]
        m_kt = m_k[:, None] & m_t[None, :]
        b_kt = tl.load(k + (o_t[None, :] * H) * K + o_k[:, None], mask=m_kt, other=0.0)
        t_last = tl.minimum(i_t * BT + BT, T) - 1
        if GAMMA:
            b_v = _chunk_values(v, w, v_new, b_h, o_t, m_t, o_k, m_k, o_v, m_v, H, K, V, DELTA, DOT_PREC)
            # a fixed log decay per step and head: from token t to the chunk
            # end it is gamma·(t_last - t), one product (no difference of
            # cumulative sums); <= 0 on every real token, 0 on the padding
            b_gam = load_log_decay(gamma, i_h)
            b_kt = (b_kt * tl.exp(b_gam * tl.maximum(t_last - o_t, 0).to(tl.float32))[None, :]).to(b_v.dtype)
            b_h = b_h * tl.exp(b_gam * (t_last + 1 - i_t * BT).to(tl.float32)) \
                + tl.dot(b_kt, b_v, input_precision=DOT_PREC)
        else:
            if not DECAYED_KEYS:
                b_gt = tl.load(b + (o_t[None, :] * H) * G + o_gk[:, None], mask=m_kt, other=0.0)
            b_gl = tl.load(b + (t_last * H) * G + o_gk, mask=m_k, other=0.0)
            b_v = _chunk_values(v, w, v_new, b_h, o_t, m_t, o_k, m_k, o_v, m_v, H, K, V, DELTA, DOT_PREC)
            if not DECAYED_KEYS:
                # decay to the chunk end; every exponent b_last - b_t <= 0
                b_kt = (b_kt * tl.exp(b_gl[:, None] - b_gt)).to(b_v.dtype)
            b_h = b_h * tl.exp(b_gl)[:, None] + tl.dot(b_kt, b_v, input_precision=DOT_PREC)

    if STORE_HT:
        tl.store(ht + i_bh * K * V + p_h, b_h, mask=m_h)


# The delta rule's pass: one K-tile (BK = K padded) and BV value columns a program. BV, num_warps,
# num_stages: at K = 128 and bf16, ptxas (sm_90) fits BV = 32 and 16 in registers with 8 warps (245 and
# 217 per thread); BV = 32 with 4 warps spills 480 bytes, BV = 64 spills at 4 and 8.
_DELTA_STATE_CONFIGS = autotune_configs([({"BV": 32}, 8, 3), ({"BV": 32}, 8, 2), ({"BV": 16}, 4, 2)],
                                        interpreter={"BV": 32})
_delta_state_kernel = triton.autotune(configs=_DELTA_STATE_CONFIGS, key=["K", "V", "NBH"],
                                      prune_configs_by={"early_config_prune": _fits})(_chunk_state_kernel.fn)


def launch_state_pass(kernel, delta_kernel, args: tuple, flags: dict, delta: dict | None = None,
                      packed=None) -> None:
    """Launch a sequential state pass, forward or backward: `kernel`, one program per K-tile, V-tile and
    batch·head, or, with `delta` (the delta rule's tensors by their parameter names), `delta_kernel`, whose
    program holds a whole key row. args: the kernels' leading arguments, which begin with the per-token inputs
    ([B, T, H, K], [B, T, H, V], the gates [B, T, H, G] or None); the sizes (T, H, NT, B·H, K, V, G) follow
    them. flags: the constexprs and the gamma. packed: packed sequences (`packed_chunks`), one program per
    sequence and head walking that sequence's chunks."""
    x, y, b = args[:3]
    B, T, _, K = x.shape
    _, _, H, V = y.shape             # the heads: y's (x may hold one row per group of heads)
    # NBH, the autotune key, is the program count; a packed batch's sequence count changes from batch to batch,
    # so it is rounded up to a power of two there (each new count would tune the pass again)
    nbh = B * H
    if packed is not None:
        B, flags = packed.n_sequences, {**flags, **varlen(packed, offsets=True)}
        nbh = next_power_of_2(B) * H
    args = (*args, T, H, n_chunks(T, packed), nbh, K, V, 1 if b is None else b.shape[-1])
    if delta is None:
        kernel[lambda m: (cdiv(K, m["BK"]), cdiv(V, m["BV"]), B * H)](*args, **flags)
    else:
        delta_kernel[lambda m: (1, cdiv(V, m["BV"]), B * H)](
            *args, **flags, BK=pow2_at_least_16(K), **delta, DELTA=True)


def chunk_state_pass(k, v, b, states, initial_state=None, final_state=None, *, gamma=None, w=None, v_new=None,
                     decayed_keys=False, packed=None) -> None:
    """The state at the start of every chunk, and after the last: the only pass that is sequential
    over chunks (one program per K-tile, V-tile and batch·head walks them).

    k: [B, T, H, K]; v: [B, T, H, V]; b: fp32 [B, T, H, G], the in-chunk cumulative gates
    (`chunk_local_cumsum`), G = K or 1. Or, for a decay that is the same at every step (Lightning
    Attention, RetNet), b = None and gamma: fp32 [H], the log decay per step of each head (<= 0;
    -inf resets the state at every step); the kernel then computes the decays itself and reads no
    gates. Written: states [B, NT, H, K, V] (NT = ceil(T / CHUNK)) in k's dtype, which feeds the
    output matmul; final_state fp32 [B, H, K, V] unless None. initial_state: fp32 [B, H, K, V] or
    None (zeros). All contiguous.

    The delta rule (KDA): w [B, T, H, K] and v_new [B, T, H, V] given, v holds the pseudo-values W'
    and each chunk adds U = W' - W S instead of v, U written to v_new (in its dtype) for the output.
    decayed_keys: k already holds the keys decayed to their chunk's last token, K ⊙ e^{b_last - b}
    (KDA's solve computes them in parallel over chunks), so the pass reads only b's last row per chunk.

    packed: packed sequences (`packed_chunks`, B = 1): states [1, NC, H, K, V] hold every sequence's chunks in
    order (NC = packed.n_chunks), initial_state and final_state one state per sequence, [N, H, K, V].

        >>> states = torch.empty(B, triton.cdiv(T, CHUNK), H, K, V, dtype=k.dtype, device=k.device)
        >>> chunk_state_pass(k, v, b, states)
        >>> states[:, 1]            # S after the first chunk, [B, H, K, V]
    """
    if (b is None) == (gamma is None):
        raise ValueError("chunk_state_pass takes exactly one of b (cumulative gates) and gamma (a decay per head)")
    if (w is None) != (v_new is None):
        raise ValueError("chunk_state_pass takes w and v_new together (the delta rule) or neither")
    if decayed_keys and b is None:
        raise ValueError("chunk_state_pass: decayed_keys needs the cumulative gates b")
    args = (k, v, b, states, initial_state, final_state)
    flags = dict(BT=CHUNK, USE_H0=initial_state is not None, STORE_HT=final_state is not None,
                 DOT_PREC=dot_precision(k.dtype), gamma=gamma, GAMMA=gamma is not None, DECAYED_KEYS=decayed_keys)
    launch_state_pass(_chunk_state_kernel, _delta_state_kernel, args, flags,
                      None if w is None else dict(w=w, v_new=v_new), packed)


# ------------------------------------------------------------------ 3. the output assembly
@triton.jit
def output_tile(h, T, H, NT, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                cu_seqlens, chunk_indices, VARLEN: tl.constexpr):
    """Where an output program works: grid (V / BV, NT, B·H), the BT rows of chunk i_t and value
    columns [i_v·BV, (i_v+1)·BV) of one (batch, head), or of packed sequences' chunk program_id(1)
    (`chunk_at`). Returns i_h, the rows inside the chunk o_c and in the sequence o_t (mask m_t), the value
    columns o_v (mask m_v), a pointer to the state at the chunk's start in h [B, NT, H, K, V], and the
    chunk's first row r_c (`chunk_row`, 64-bit): token t's row of a [B, T, H, D] tensor starts at
    (r_c + (t - i_t·BT)·H)·D."""
    i_v, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    tok0, i_t, T = chunk_at(i_c, i_b, T, cu_seqlens, chunk_indices, VARLEN)
    o_c = tl.arange(0, BT)
    o_t = i_t * BT + o_c
    o_v = i_v * BV + tl.arange(0, BV)
    # the chunk's state: chunk i_c of batch row i_b, or of the packed sequences' NT chunks in order (B = 1)
    p_hc = h + chunk_state_base(i_b, i_c, i_h, NT, H, K, V)
    return i_h, o_c, o_t, o_t < T, o_v, o_v < V, p_hc, chunk_row(0, tok0 + i_t * BT, i_h, T, H)


# (BK, BV), num_warps, num_stages. V = 64 keeps only the BV = 64 one.
_OUTPUT_CONFIGS = autotune_configs([({"BK": 64, "BV": 128}, 4, 3), ({"BK": 64, "BV": 128}, 8, 3),
                                    ({"BK": 64, "BV": 64}, 4, 3)])


@triton.autotune(configs=_OUTPUT_CONFIGS, key=["K", "V"], prune_configs_by={"early_config_prune": _fits})
@triton.jit(do_not_specialize=["T", "H", "NT"])
def _chunk_output_kernel(
    q, v, b, h, A, o, scale, T, H, NT,
    K: tl.constexpr, V: tl.constexpr, G: tl.constexpr, BT: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, DOT_PREC: tl.constexpr,
    cu_seqlens=None, chunk_indices=None, VARLEN: tl.constexpr = False,
):
    i_h, o_c, o_t, m_t, o_v, m_v, p_hc, r_c = output_tile(h, T, H, NT, K, V, BT, BV, cu_seqlens, chunk_indices,
                                                          VARLEN)
    q, b, A, v, o = q + r_c * K, b + r_c * G, A + r_c * BT, v + r_c * V, o + r_c * V
    p_row = o_c[:, None] * H                   # the chunk's tokens' rows after r_c

    # inter-chunk: (Q ⊙ e^{b}) S_start · scale, a [BT, K] x [K, BV] product
    # (exponent b <= 0)
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        o_gk = o_k if G == K else o_k * 0      # a gate per head (G = 1): every key channel reads it
        m_k = o_k < K
        m_q = m_t[:, None] & m_k[None, :]
        b_q = tl.load(q + p_row * K + o_k[None, :], mask=m_q, other=0.0).to(tl.float32)
        b_g = tl.load(b + p_row * G + o_gk[None, :], mask=m_q, other=0.0)
        b_h = tl.load(p_hc + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_o += tl.dot((b_q * tl.exp(b_g) * scale).to(b_h.dtype), b_h, input_precision=DOT_PREC)

    # intra-chunk: A V, a [BT, BT] x [BT, BV] product over the causal
    # triangle. A is zero above the diagonal, and dot_causal keeps a NaN or
    # inf in a later token's v out of the earlier rows.
    b_A = tl.load(A + p_row * BT + o_c[None, :], mask=m_t[:, None], other=0.0)
    b_A = tl.where(o_c[:, None] >= o_c[None, :], b_A, 0.0)
    p_v = p_row * V + o_v[None, :]
    m_ov = m_t[:, None] & m_v[None, :]
    b_v = tl.load(v + p_v, mask=m_ov, other=0.0)
    b_o = dot_causal(b_A.to(b_v.dtype), b_v, b_o, DOT_PREC)
    tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_ov)


def chunk_output(q, v, b, states, A, o, scale: float, packed=None) -> None:
    """o = (Q ⊙ e^b) S_start · scale + A V for every chunk, all chunks in parallel (one program per
    V-tile, chunk and batch·head): two matmuls, no loop over tokens.

    q: [B, T, H, K]; v: [B, T, H, V]; b: fp32 [B, T, H, G] (G = K or 1); states: [B, NT, H, K, V]
    (`chunk_state_pass`); A: [B, T, H, CHUNK], row t's scores against the tokens of its chunk,
    scale included, read on and below the diagonal only. Written: o [B, T, H, V]. All contiguous. packed:
    packed sequences (`packed_chunks`, B = 1; states as `chunk_state_pass` writes them for them).

        >>> o = torch.empty_like(v)
        >>> chunk_output(q, v, b, states, A, o, scale=K ** -0.5)
    """
    B, T, H, K = q.shape
    V, G = v.shape[-1], b.shape[-1]
    NT = n_chunks(T, packed)
    _chunk_output_kernel[lambda m: (cdiv(V, m["BV"]), NT, B * H)](
        q, v, b, states, A, o, scale, T, H, NT, K, V, G, BT=CHUNK, DOT_PREC=dot_precision(q.dtype),
        **varlen(packed))


__all__ = ["CHUNK", "SUB_CHUNK", "GATE_FLOOR", "chunk_local_cumsum", "chunk_state_pass", "chunk_output",
           "chunk_at", "chunk_row", "chunk_state_dtype", "decay_exponent", "dot_precision", "load_log_decay",
           "n_chunks", "varlen"]
