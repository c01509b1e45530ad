"""FlashAttention forward for Hopper (sm_90a) in Gluon: a TMA copy warp and two consumer warpgroups.

`flash_attn_func` runs it for dense inputs on an sm_90 GPU where it measured faster than the Triton forward
(`interface.gluon_fwd_loop`, which also picks the loop); `launch_gluon` is that call's launcher (inputs already
checked) and `gluon_attention_fwd` calls it directly, checking its inputs first. Checked on a Hopper GPU by
`tests/test_flash_attn_gluon.py` and `scripts/tune_probe.py fa_gluon`.

Shapes as the Triton forward (`forward.py`), whose outputs it matches so that the backward could read them:
    q [B, T, Hq, D], k, v [B, S, Hkv, D] (Hq % Hkv == 0, query head h reads KV head h // (Hq // Hkv)),
    bf16 or fp16, D 64 or 128, contiguous; returns o like q and lse fp32 [B, Hq, T] in base 2
    (lse = log2 sum_j exp2(s_ij * scale * log2 e); a row that sees no key: o = 0, lse = +inf).
    causal: bottom-right aligned, query i sees key j iff j <= i + S - T.

One CTA per (128 query rows, batch * query head), three partitions (gl.warp_specialize):
  * a 1-warp producer makes the CTA's TMA descriptors on the device (each covers this batch element's rows
    only, so the copy engine zero-fills rows past T and S instead of reading the next sequence), copies the
    query block once as two 64-row halves, then every K and V tile of BN keys into a ring of STAGES slots; K
    and V each have a ready barrier (the copy landed) and an empty one (both consumers are done with it), so a
    slot's K is refilled while its V is still being read;
  * two 4-warp consumer warpgroups, warpgroup w owning query rows 64w ... 64w + 63 of the block: S = Q K^T
    with wgmma (both operands in shared memory), the online softmax in registers in base 2 with the scale
    folded into the exponent, O += P V with wgmma, P from registers; last, O / l and the lse stored with
    plain masked stores.
Tiles that every row of the block sees in full skip the mask; the causal diagonal and the ragged last tile
take it (`key_tiles`). Non-causal calls pass a shift of S, so one masked path serves both settings.

The default loop keeps each warpgroup's steps in order (scores, softmax, P V, each waited on). Two variants
(`_consumer`'s SCHEDULE), on the unmasked tiles: `overlap=True` issues the next tile's S = Q K^T before this
tile's softmax, so the tensor cores compute it while the exponentials run; `pingpong=True` has the two
warpgroups take turns on the tensor cores, one's P V and next scores issued while the other runs its softmax,
handed over through a pair of mbarriers (`_pingpong`; Triton 3.6's Gluon has no named barriers), not run on
a GPU yet. Still to try (notes/TUNING.md): a TMA store of O.
A NaN or inf in V at a key the mask hides must not reach the rows that cannot see it (0 * NaN is NaN): a
masked tile first checks its V tile and, only if it is not finite, takes P V on the CUDA cores key by key,
skipping zero probabilities (as the Triton forward's `dot_visible` does); keys past S are zero-filled.

Gluon/ptxas rules kept here (learnt on `attention_kernels/mla/gluon_decode.py`): no wgmma in flight across a
loop back edge (ptxas would serialize every wgmma); shared buffers handed to wgmma indexed by an opaque zero
(`gluon_helpers.opaque_zero`), so LLVM does not hoist every per-k-step descriptor out of the loop; constexprs do
not cross into the partitions, which read sizes off the buffers' shapes.
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from ..checks import check_no_grad
from ..gluon_helpers import opaque_zero
from ..launch import LOG2E, aligned16, cdiv, launch_direct

BM = 128           # query rows per CTA: two consumer warpgroups of 64 (wgmma's M)
WG_ROWS = BM // 2
# (keys per tile, ring slots) per head dim: a slot is a K and a V tile, BN x D each. D = 128: 2 x 64 KB
# next to the 32 KB query block; D = 64: 3 x 32 KB. Not measured yet (the next GPU session's first probe).
FWD_TILES = {64: (128, 3), 128: (128, 2)}
# 4 + 4 + 1 warps (three warpgroups' register slots): the producer drops to 24 registers (setmaxnreg), which
# leaves 240 to each consumer thread: 64 for S, 64 for O (D = 128), 32 for P, the rest for softmax state.
WS_MAXNREG = 168
WS_CONSUMER_REGS = 240
WS_PRODUCER_REGS = 24
# The consumers' loops (`_consumer`'s SCHEDULE): each warpgroup's steps in order; the next tile's S = Q K^T
# issued before this tile's softmax; the two warpgroups taking turns on the tensor cores (ping-pong).
IN_ORDER = gl.constexpr(0)
OVERLAPPED = gl.constexpr(1)
PINGPONG = gl.constexpr(2)
# Whether a direct call's consumers issue the next tile's S = Q K^T before this tile's softmax;
# `flash_attn_func` picks the loop per shape from the timings (`interface.GLUON_FWD_MEASURED`).
OVERLAP_SCORES = False


@gluon.jit
def rows_desc(base, rows, row_stride, BLOCK_ROWS: gl.constexpr, D: gl.constexpr, layout: gl.constexpr):
    """`rows` rows of D elements, row_stride apart, from `base`, in blocks of BLOCK_ROWS rows: rows past `rows`
    are zero-filled by the copy engine."""
    return tma.make_tensor_descriptor(base, shape=[rows, D], strides=[row_stride, 1], block_shape=[BLOCK_ROWS, D],
                                      layout=layout)


@gluon.jit
def _load_partition(q_ptr, k_ptr, v_ptr, q_base, kv_base, m0, T, S, HQ, HKV, n_tiles, q_s, k_s, v_s, q_bar,
                    k_ready, v_ready, k_empty, v_empty):
    """1 warp: the query block (two 64-row halves, one barrier), then K and V of every key tile, each into its
    ring slot as soon as both consumers have released that slot's previous tile."""
    STAGES: gl.constexpr = k_s.shape[0]
    BN: gl.constexpr = k_s.shape[1]
    D: gl.constexpr = k_s.shape[2]
    HALF: gl.constexpr = q_s.shape[1]
    q_layout: gl.constexpr = q_s.layout
    kv_layout: gl.constexpr = k_s.layout
    qd = rows_desc(q_ptr + q_base, T, HQ * D, HALF, D, q_layout)
    mbarrier.expect(q_bar, 2 * HALF * D * q_s.dtype.primitive_bitwidth // 8)
    tma.async_copy_global_to_shared(qd, [m0, 0], q_bar, q_s.index(0))
    tma.async_copy_global_to_shared(qd, [m0 + HALF, 0], q_bar, q_s.index(1))
    kd = rows_desc(k_ptr + kv_base, S, HKV * D, BN, D, kv_layout)
    vd = rows_desc(v_ptr + kv_base, S, HKV * D, BN, D, kv_layout)
    TILE_BYTES: gl.constexpr = BN * D * k_s.dtype.primitive_bitwidth // 8
    for t in range(n_tiles):
        st = t % STAGES
        phase = ((t // STAGES) & 1) ^ 1   # a fresh barrier counts as having completed the phase before 0
        mbarrier.wait(k_empty.index(st), phase)
        mbarrier.expect(k_ready.index(st), TILE_BYTES)   # zero-filled rows are counted too
        tma.async_copy_global_to_shared(kd, [t * BN, 0], k_ready.index(st), k_s.index(st))
        mbarrier.wait(v_empty.index(st), phase)
        mbarrier.expect(v_ready.index(st), TILE_BYTES)
        tma.async_copy_global_to_shared(vd, [t * BN, 0], v_ready.index(st), v_s.index(st))


@gluon.jit
def _tile_update(acc, m_i, l_i, q_op, t, k_s, v_s, k_ready, v_ready, k_empty, v_empty, scale_log2, rows, S, shift,
                 MASKED: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr, row_o: gl.constexpr):
    """One key tile t for this warpgroup's 64 rows: S = Q K^T, the online softmax (base 2, scale folded in), O
    rescaled, O += P V; each product waited on, and the slot's K and V released once read. MASKED: a score
    whose key is past S or, causal, past the row's diagonal (shift = S - T; S when not causal) is -inf."""
    STAGES: gl.constexpr = k_s.shape[0]
    st = t % STAGES
    s = _scores_issue(q_op, t, k_s, k_ready, rows.shape[0], s_layout)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    mbarrier.arrive(k_empty.index(st), count=1)
    acc, m_i, l_i, s = _softmax_pv(acc, m_i, l_i, s, t, v_s, v_ready, v_empty, scale_log2, rows, S, shift, MASKED,
                                   p_layout, row_o, s, False)
    return acc, m_i, l_i


@gluon.jit
def _scores_issue(q_op, t, k_s, k_ready, ROWS: gl.constexpr, s_layout: gl.constexpr):
    """S = Q K_t^T issued on the tensor cores once tile t's K has landed; not waited on."""
    STAGES: gl.constexpr = k_s.shape[0]
    BN: gl.constexpr = k_s.shape[1]
    st = t % STAGES
    mbarrier.wait(k_ready.index(st), (t // STAGES) & 1)
    s_zero = gl.zeros([ROWS, BN], gl.float32, s_layout)
    return warpgroup_mma(q_op, k_s.index(st + opaque_zero(t)).permute((1, 0)), s_zero, use_acc=False,
                         is_async=True)


@gluon.jit
def _softmax_pv(acc, m_i, l_i, s, t, v_s, v_ready, v_empty, scale_log2, rows, S, shift, MASKED: gl.constexpr,
                p_layout: gl.constexpr, row_o: gl.constexpr, s_next, HAS_NEXT: gl.constexpr):
    """The online softmax of tile t's scores s, O rescaled, O += P V_t, waited on (with HAS_NEXT, together with
    s_next, the next tile's scores in flight), and V_t's slot released. Returns acc, m, l and s_next (waited
    on; passed through as given without HAS_NEXT)."""
    acc, m_i, l_i, p = _online_softmax(acc, m_i, l_i, s, t, scale_log2, rows, S, shift, MASKED, row_o)
    acc = _pv_released(acc, p, t, v_s, v_ready, v_empty, MASKED, p_layout, row_o)
    if HAS_NEXT:   # an issued product cannot cross a branch, so its wait is out here (P V's took it already)
        gl.static_assert(not MASKED, "a masked tile's check needs the registers the next scores would hold")
        s_next = warpgroup_mma_wait(num_outstanding=0, deps=(s_next, ))
    return acc, m_i, l_i, s_next


@gluon.jit
def _online_softmax(acc, m_i, l_i, s, t, scale_log2, rows, S, shift, MASKED: gl.constexpr, row_o: gl.constexpr):
    """Tile t's scores s into probabilities p (fp32, base 2, scale folded in), the running max m and sum l
    updated and O rescaled to the new max; returns acc, m, l, p. MASKED: a score whose key is past S or, causal,
    past the row's diagonal (shift = S - T; S when not causal) is -inf."""
    BN: gl.constexpr = s.shape[1]
    if MASKED:
        cols = t * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s.type.layout))
        keep = (gl.expand_dims(cols, 0) < S) & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows + shift, 1))
        s = gl.where(keep, s * scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)   # a row that has seen no key yet
        p = gl.exp2(s - gl.expand_dims(m_use, 1))
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale_log2)
        m_use = m_new
        p = gl.exp2(s * scale_log2 - gl.expand_dims(m_use, 1))
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
    return acc, m_new, l_i, p


@gluon.jit
def _pv_released(acc, p, t, v_s, v_ready, v_empty, MASKED: gl.constexpr, p_layout: gl.constexpr,
                 row_o: gl.constexpr):
    """acc + P V_t once V_t has landed (p fp32 or 16-bit, rounded to V's type), waited on, and V_t's slot
    released. MASKED: V_t is first checked, and if it holds a NaN or an inf, the product is taken on the CUDA
    cores (`pv_skipping_zeros`)."""
    STAGES: gl.constexpr = v_s.shape[0]
    st = t % STAGES
    slot = st + opaque_zero(t)
    mbarrier.wait(v_ready.index(st), (t // STAGES) & 1)
    if MASKED and has_non_finite(v_s.index(slot)):
        acc = pv_skipping_zeros(acc, p.to(v_s.dtype), v_s.index(slot), row_o)
    else:
        acc = warpgroup_mma(gl.convert_layout(p.to(v_s.dtype), p_layout), v_s.index(slot), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(v_empty.index(st), count=1)
    return acc


@gluon.jit
def has_non_finite(v_tile):
    """Whether the [BN, D] tile in shared memory holds a NaN or an inf, read 16 rows at a time (16 values a
    thread). Only masked tiles ask: there a key the row cannot see may hold one, and 0 * NaN is NaN."""
    BN: gl.constexpr = v_tile.shape[0]
    D: gl.constexpr = v_tile.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    bad = 0
    for j0 in gl.static_range(0, BN, 16):
        rows = v_tile.slice(j0, 16).load(layout).to(gl.float32)
        bad = gl.maximum(bad, gl.max(gl.max(gl.where(gl.abs(rows) < float("inf"), 0, 1), axis=1), axis=0))
    return bad > 0


@gluon.jit
def pv_skipping_zeros(acc, p, v_tile, row_o: gl.constexpr):
    """acc + P V on the CUDA cores, key by key, where a zero P[i, j] adds nothing even if row j of V holds a
    NaN or an inf: a row then gets NaN or inf only from a key it sees, as the formula says. The slow path of
    a masked tile whose V is not finite (never taken for finite inputs); P as the tensor cores would see it.
    The dQ kernel (`gluon_dq.py`) takes dS K through it, with dS for P and K for V."""
    BN: gl.constexpr = v_tile.shape[0]
    col_o: gl.constexpr = gl.SliceLayout(0, acc.type.layout)
    rows_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    keys = gl.arange(0, BN, layout=gl.SliceLayout(0, p.type.layout))
    in_block = gl.arange(0, 16, layout=gl.SliceLayout(1, rows_layout))
    for j0 in gl.static_range(0, BN, 16):          # shared memory is sliced at constant rows only
        v_rows = v_tile.slice(j0, 16).load(rows_layout).to(gl.float32)
        for j in range(16):
            # one nonzero term per row: the 16-bit sum is exact, and P stays packed (registers)
            p_j = gl.sum(gl.where(gl.expand_dims(keys, 0) == j0 + j, p, 0.0), axis=1)
            p_j = gl.convert_layout(p_j.to(gl.float32), row_o)
            v_j = gl.sum(gl.where(gl.expand_dims(in_block, 1) == j, v_rows, 0.0), axis=0)
            v_j = gl.convert_layout(v_j, col_o)
            term = gl.expand_dims(p_j, 1) * gl.expand_dims(v_j, 0)
            acc = acc + gl.where(gl.expand_dims(p_j, 1) != 0.0, term, 0.0)
    return acc


@gluon.jit
def _consumer(WG: gl.constexpr, SCHEDULE: gl.constexpr, o_ptr, lse_ptr, o_base, lse_base, m0, T, S, HQ, shift,
              n_full, n_tiles, scale_log2, q_s, k_s, v_s, q_bar, k_ready, v_ready, k_empty, v_empty, turn):
    """Warpgroup WG: query rows m0 + 64 WG ... + 63 over every key tile
    (unmasked tiles first), then O / l and the lse (masked stores: rows past
    T are not written).

    SCHEDULE OVERLAPPED: each unmasked tile's softmax overlapped with the
    next tile's S = Q K^T (FA3's intra-warpgroup pipelining), one
    more [64, BN] fp32 tile of scores held in registers. An issued product
    cannot cross a branch, so that loop takes the unmasked tiles that have an
    unmasked next one, and the last unmasked tile comes after it. The masked
    tiles (the diagonal, the ragged end) stay in order either way: their
    hidden-NaN check needs the registers the next scores would hold.

    SCHEDULE PINGPONG (FA3's inter-warpgroup ping-pong, Shah et al. 2024
    section 3.1): round t's products, O += P_{t-1} V_{t-1} and S_t = Q K_t^T,
    are issued in this warpgroup's turn on the tensor cores, then the turn
    goes to the other warpgroup, whose products run during this one's softmax
    of tile t (`_pingpong`)."""
    HALF: gl.constexpr = q_s.shape[1]
    BN: gl.constexpr = k_s.shape[1]
    D: gl.constexpr = k_s.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    rows = m0 + WG * HALF + gl.arange(0, HALF, layout=row_s)
    acc = gl.zeros([HALF, D], gl.float32, o_layout)
    m_i = gl.full([HALF], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([HALF], gl.float32, row_s)
    mbarrier.wait(q_bar, 0)
    if SCHEDULE == PINGPONG:
        acc, m_i, l_i = _pingpong(WG, acc, m_i, l_i, n_full, scale_log2, rows, S, shift, q_s, k_s, v_s, k_ready,
                                  v_ready, k_empty, v_empty, turn, s_layout, p_layout, row_o)
    elif SCHEDULE == OVERLAPPED:
        if n_full > 0:
            s = _scores_issue(q_s.index(WG), 0, k_s, k_ready, HALF, s_layout)   # tile 0's scores, before the loop
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            mbarrier.arrive(k_empty.index(0), count=1)
            for t in range(n_full - 1):
                q_op = q_s.index(WG + opaque_zero(t))
                acc, m_i, l_i, s = _overlapped_step(acc, m_i, l_i, s, t, q_op, k_s, v_s, k_ready, v_ready, k_empty,
                                                    v_empty, scale_log2, rows, S, shift, s_layout, p_layout, row_o)
            acc, m_i, l_i, s = _softmax_pv(acc, m_i, l_i, s, n_full - 1, v_s, v_ready, v_empty, scale_log2, rows,
                                           S, shift, False, p_layout, row_o, s, False)
    else:
        for t in range(n_full):
            q_op = q_s.index(WG + opaque_zero(t))
            acc, m_i, l_i = _tile_update(acc, m_i, l_i, q_op, t, k_s, v_s, k_ready, v_ready, k_empty, v_empty,
                                         scale_log2, rows, S, shift, False, s_layout, p_layout, row_o)
    for t in range(n_full, n_tiles):
        q_op = q_s.index(WG + opaque_zero(t))
        acc, m_i, l_i = _tile_update(acc, m_i, l_i, q_op, t, k_s, v_s, k_ready, v_ready, k_empty, v_empty,
                                     scale_log2, rows, S, shift, True, s_layout, p_layout, row_o)
    _finish(acc, m_i, l_i, rows, o_ptr, lse_ptr, o_base, lse_base, T, HQ, D, row_o, o_layout)


@gluon.jit
def _finish(acc, m_i, l_i, rows, o_ptr, lse_ptr, o_base, lse_base, T, HQ, D: gl.constexpr, row_o: gl.constexpr,
            o_layout: gl.constexpr):
    """O / l and the lse, stored with masks (rows past T are not written)."""
    empty = l_i == 0.0   # causal with T > S: a row that sees no key; its output is 0
    l_safe = gl.where(empty, 1.0, l_i)
    lse = gl.where(empty, float("inf"), m_i + gl.log2(l_safe))   # +inf makes P = 0 in the backward
    out = acc / gl.expand_dims(gl.convert_layout(l_safe, row_o), 1)
    rows_o = gl.convert_layout(rows, row_o)
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    offs = gl.expand_dims(rows_o.to(gl.int64) * (HQ * D), 1) + gl.expand_dims(cols, 0)
    gl.store(o_ptr + o_base + offs, out.to(o_ptr.dtype.element_ty), mask=gl.expand_dims(rows_o < T, 1))
    gl.store(lse_ptr + lse_base + rows, lse, mask=rows < T)


@gluon.jit
def _overlapped_step(acc, m_i, l_i, s, t, q_op, k_s, v_s, k_ready, v_ready, k_empty, v_empty, scale_log2, rows, S,
                     shift, s_layout: gl.constexpr, p_layout: gl.constexpr, row_o: gl.constexpr):
    """Unmasked tile t, its scores s already in registers, and an unmasked tile after it: the next tile's
    S = Q K^T issued first, so the tensor cores compute it during this tile's softmax; then P V_t; both waited
    on before the loop's back edge. Returns the next tile's scores."""
    STAGES: gl.constexpr = k_s.shape[0]
    s_next = _scores_issue(q_op, t + 1, k_s, k_ready, rows.shape[0], s_layout)
    acc, m_i, l_i, s_next = _softmax_pv(acc, m_i, l_i, s, t, v_s, v_ready, v_empty, scale_log2, rows, S, shift,
                                        False, p_layout, row_o, s_next, True)
    mbarrier.arrive(k_empty.index((t + 1) % STAGES), count=1)
    return acc, m_i, l_i, s_next


@gluon.jit
def _pingpong(WG: gl.constexpr, acc, m_i, l_i, n_full, scale_log2, rows, S, shift, q_s, k_s, v_s, k_ready, v_ready,
              k_empty, v_empty, turn, s_layout: gl.constexpr, p_layout: gl.constexpr, row_o: gl.constexpr):
    """Warpgroup WG's unmasked tiles 0 ... n_full - 1 in rounds 0 ... n_full, the two warpgroups taking turns on
    the tensor cores. Round t, in WG's turn: O += P_{t-1} V_{t-1} (none in round 0) and S_t = Q K_t^T (none in
    round n_full) issued back to back, the turn handed over, both waited on; then, during the other warpgroup's
    turn, tile t's softmax. Returns acc, m, l; the masked tiles follow in order (`_consumer`).

    Why the hand-over cannot deadlock: `turn` holds one mbarrier per warpgroup, arrived on once per round by the
    other. Round r of warpgroup 0 waits for warpgroup 1's hand-over of round r - 1, round r of warpgroup 1 for
    warpgroup 0's of round r, so the turns alternate 0, 1, 0, 1 ... and each barrier is at most one phase ahead
    of its waiter (its parity never aliases); round 0 is warpgroup 0's, which waits on the parity a fresh
    barrier counts as completed. Both warpgroups run the same rounds, n_full + 1 or none (n_full is the CTA's,
    as is the mask: a warpgroup whose rows see no key takes its turns all the same), and warpgroup 1's last
    hand-over has no waiter, which is harmless. The masked tiles (the causal diagonal, the ragged end) come after
    the last round, outside the turns, in order as in the other loops: their hidden-NaN check and its CUDA-core
    product stay out of the hand-over. While it holds the turn a warpgroup waits only for copies (K_t,
    V_{t-1}) and its own products; the producer issues a copy once both warpgroups released the slot's tile
    STAGES back, and each releases a tile right after its own product, never waiting on the other's turn to
    do so. The turn guards no data, only the order in which the products reach the tensor cores."""
    if n_full > 0:
        _turn_begin(turn, WG, 0)
        s = _scores_in_turn(q_s.index(WG), 0, k_s, k_ready, k_empty, turn, WG, s_layout)
        acc, m_i, l_i, p = _online_softmax(acc, m_i, l_i, s, 0, scale_log2, rows, S, shift, False, row_o)
        p = gl.convert_layout(p.to(v_s.dtype), p_layout)   # held through the next round's product, packed
        for t in range(1, n_full):
            _turn_begin(turn, WG, t)
            acc, s = _pv_scores_in_turn(acc, p, t, q_s.index(WG + opaque_zero(t)), k_s, v_s, k_ready, v_ready,
                                        k_empty, v_empty, turn, WG, s_layout, p_layout)
            acc, m_i, l_i, p = _online_softmax(acc, m_i, l_i, s, t, scale_log2, rows, S, shift, False, row_o)
            p = gl.convert_layout(p.to(v_s.dtype), p_layout)
        _turn_begin(turn, WG, n_full)   # the last round: the last unmasked tile's P V
        acc = _pv_released(acc, p, n_full - 1, v_s, v_ready, v_empty, False, p_layout, row_o)
        _turn_end(turn, WG)
    return acc, m_i, l_i


@gluon.jit
def _turn_begin(turn, WG: gl.constexpr, r):
    """Wait until warpgroup WG may issue round r's products: warpgroup 0 first (a fresh barrier counts the phase
    of parity 1 as completed), then alternately."""
    mbarrier.wait(turn.index(WG), (r & 1) ^ (1 - WG))


@gluon.jit
def _turn_end(turn, WG: gl.constexpr):
    """Hand the tensor cores to the other warpgroup (this one's products are issued)."""
    mbarrier.arrive(turn.index(1 - WG), count=1)


@gluon.jit
def _scores_in_turn(q_op, t, k_s, k_ready, k_empty, turn, WG: gl.constexpr, s_layout: gl.constexpr):
    """S_t = Q K_t^T issued, the turn handed over, S_t waited on and K_t's slot released."""
    STAGES: gl.constexpr = k_s.shape[0]
    s = _scores_issue(q_op, t, k_s, k_ready, q_op.shape[0], s_layout)
    _turn_end(turn, WG)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    mbarrier.arrive(k_empty.index(t % STAGES), count=1)
    return s


@gluon.jit
def _pv_scores_in_turn(acc, p, t, q_op, k_s, v_s, k_ready, v_ready, k_empty, v_empty, turn, WG: gl.constexpr,
                       s_layout: gl.constexpr, p_layout: gl.constexpr):
    """An unmasked round t: O += P_{t-1} V_{t-1} and S_t = Q K_t^T issued back to back, the turn handed over,
    both waited on, and the slots of V_{t-1} and K_t released. Returns acc and S_t."""
    STAGES: gl.constexpr = v_s.shape[0]
    prev = t - 1
    st = prev % STAGES
    mbarrier.wait(v_ready.index(st), (prev // STAGES) & 1)
    acc = warpgroup_mma(gl.convert_layout(p, p_layout), v_s.index(st + opaque_zero(t)), acc, is_async=True)
    s = _scores_issue(q_op, t, k_s, k_ready, q_op.shape[0], s_layout)
    _turn_end(turn, WG)
    acc, s = warpgroup_mma_wait(num_outstanding=0, deps=(acc, s))
    mbarrier.arrive(v_empty.index(st), count=1)
    mbarrier.arrive(k_empty.index(t % STAGES), count=1)
    return acc, s


# One entry point per warpgroup and loop: gl.warp_specialize cannot pass constexprs, so each binds its own.
@gluon.jit
def _consumer0(o_ptr, lse_ptr, o_base, lse_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2, q_s, k_s, v_s, q_bar,
               k_ready, v_ready, k_empty, v_empty, turn):
    _consumer(0, IN_ORDER, o_ptr, lse_ptr, o_base, lse_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2, q_s, k_s,
              v_s, q_bar, k_ready, v_ready, k_empty, v_empty, turn)


@gluon.jit
def _consumer1(o_ptr, lse_ptr, o_base, lse_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2, q_s, k_s, v_s, q_bar,
               k_ready, v_ready, k_empty, v_empty, turn):
    _consumer(1, IN_ORDER, o_ptr, lse_ptr, o_base, lse_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2, q_s, k_s,
              v_s, q_bar, k_ready, v_ready, k_empty, v_empty, turn)


@gluon.jit
def _consumer0_overlapped(o_ptr, lse_ptr, o_base, lse_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2, q_s, k_s,
                          v_s, q_bar, k_ready, v_ready, k_empty, v_empty, turn):
    _consumer(0, OVERLAPPED, o_ptr, lse_ptr, o_base, lse_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2, q_s,
              k_s, v_s, q_bar, k_ready, v_ready, k_empty, v_empty, turn)


@gluon.jit
def _consumer1_overlapped(o_ptr, lse_ptr, o_base, lse_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2, q_s, k_s,
                          v_s, q_bar, k_ready, v_ready, k_empty, v_empty, turn):
    _consumer(1, OVERLAPPED, o_ptr, lse_ptr, o_base, lse_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2, q_s,
              k_s, v_s, q_bar, k_ready, v_ready, k_empty, v_empty, turn)


@gluon.jit
def _consumer0_pingpong(o_ptr, lse_ptr, o_base, lse_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2, q_s, k_s,
                        v_s, q_bar, k_ready, v_ready, k_empty, v_empty, turn):
    _consumer(0, PINGPONG, o_ptr, lse_ptr, o_base, lse_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2, q_s, k_s,
              v_s, q_bar, k_ready, v_ready, k_empty, v_empty, turn)


@gluon.jit
def _consumer1_pingpong(o_ptr, lse_ptr, o_base, lse_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2, q_s, k_s,
                        v_s, q_bar, k_ready, v_ready, k_empty, v_empty, turn):
    _consumer(1, PINGPONG, o_ptr, lse_ptr, o_base, lse_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2, q_s, k_s,
              v_s, q_bar, k_ready, v_ready, k_empty, v_empty, turn)


@gluon.jit
def key_tiles(m0, T, S, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr):
    """For query rows [m0, m0 + BM): key tiles [0, n_full) are seen in full by every row (no mask), tiles
    [n_full, n_tiles) need the mask (the forward's `_key_ranges`, counted in tiles)."""
    if CAUSAL:
        shift = S - T
        n_full = gl.minimum(gl.maximum(m0 + shift + 1, 0), S) // BN
        n_tiles = gl.maximum(gl.cdiv(gl.minimum(m0 + BM + shift, S), BN), n_full)
    else:
        n_full = S // BN
        n_tiles = gl.cdiv(S, BN)
    return n_full, n_tiles


@gluon.jit
def query_block(T, S, HQ, HKV, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr):
    """Where a CTA of grid (cdiv(T, BM), B * HQ) stands: its batch row i_b and query head i_h, its first query
    row m0 (causal: the last blocks, which see the most keys, first), the mask's shift (query i sees key j iff
    j <= i + shift), its key tiles (`key_tiles`), and 64-bit element offsets: row 0 of (i_b, i_h) in a [B, T, HQ,
    D] tensor, row 0 of its KV head (GQA: i_h // (HQ // HKV), no copy) in a [B, S, HKV, D] one, and its row in a
    [B, HQ, T] one (lse, delta)."""
    i_m = gl.program_id(0)
    if CAUSAL:
        i_m = gl.num_programs(0) - 1 - i_m
    i_bh = gl.program_id(1)
    i_b = i_bh // HQ
    i_h = i_bh % HQ
    i_hk = i_h // (HQ // HKV)
    m0 = i_m * BM
    n_full, n_tiles = key_tiles(m0, T, S, BM, BN, CAUSAL)
    if CAUSAL:
        shift = S - T
    else:
        shift = S   # every key < S is at or before row + S: the mask keeps only keys past S out
    q_base = (i_b.to(gl.int64) * T * HQ + i_h) * D
    kv_base = (i_b.to(gl.int64) * S * HKV + i_hk) * D
    stats_base = i_bh.to(gl.int64) * T
    return i_b, i_h, m0, shift, n_full, n_tiles, q_base, kv_base, stats_base


# Integer arguments equal to 1 would be specialized into constants, which gl.warp_specialize cannot hand to the
# partitions (T = 1, one KV head): none is specialized, which also lets launch_direct skip the dispatcher.
@gluon.jit(do_not_specialize=["T", "S", "HQ", "HKV"])
def attn_fwd_ws_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, scale_log2, T, S, HQ, HKV, D: gl.constexpr,
                       BN: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, SCHEDULE: gl.constexpr,
                       CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """q, o: [B, T, HQ, D], k, v: [B, S, HKV, D] contiguous; lse fp32 [B, HQ, T]. Grid (cdiv(T, 128), B * HQ)."""
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    BM: gl.constexpr = 128
    HALF: gl.constexpr = 64
    i_b, i_h, m0, shift, n_full, n_tiles, q_base, kv_base, lse_base = query_block(T, S, HQ, HKV, D, BM, BN, CAUSAL)

    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF, D], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], dtype)
    q_s = gl.allocate_shared_memory(dtype, [2, HALF, D], q_layout)
    k_s = gl.allocate_shared_memory(dtype, [STAGES, BN, D], kv_layout)
    v_s = gl.allocate_shared_memory(dtype, [STAGES, BN, D], kv_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())   # ping-pong: one a warpgroup
    mbarrier.init(q_bar, count=1)
    for wg in gl.static_range(2):
        mbarrier.init(turn.index(wg), count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(st), count=1)
        mbarrier.init(v_ready.index(st), count=1)
        mbarrier.init(k_empty.index(st), count=2)   # both consumer warpgroups read every tile
        mbarrier.init(v_empty.index(st), count=2)

    cargs = (o_ptr, lse_ptr, q_base, lse_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2, q_s, k_s, v_s,
             q_bar, k_ready, v_ready, k_empty, v_empty, turn)
    largs = (q_ptr, k_ptr, v_ptr, q_base, kv_base, m0, T, S, HQ, HKV, n_tiles, q_s, k_s, v_s, q_bar, k_ready,
             v_ready, k_empty, v_empty)
    if SCHEDULE == PINGPONG:
        gl.warp_specialize([(_consumer0_pingpong, cargs), (_consumer1_pingpong, cargs), (_load_partition, largs)],
                           [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    elif SCHEDULE == OVERLAPPED:
        gl.warp_specialize([(_consumer0_overlapped, cargs), (_consumer1_overlapped, cargs), (_load_partition, largs)],
                           [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([(_consumer0, cargs), (_consumer1, cargs), (_load_partition, largs)], [4, 1],
                           [CONSUMER_REGS, PRODUCER_REGS])


def gluon_forward_misfit(q, k, v) -> str | None:
    """Why the Gluon forward cannot take these inputs (None if it can): a Hopper GPU, bf16 or fp16, D 64 or
    128, contiguous [B, T, Hq, D] and [B, S, Hkv, D] with Hq % Hkv == 0, 16-byte aligned."""
    if not (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9):
        return "it runs on a Hopper GPU (sm_90) only"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q, k and v must all be bf16 or fp16, got {q.dtype}, {k.dtype}, {v.dtype}"
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        return f"q must be [B, T, Hq, D] and k, v [B, S, Hkv, D], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
    if q.shape[3] not in FWD_TILES:
        return f"head dim must be one of {sorted(FWD_TILES)}, got {q.shape[3]}"
    if q.shape[2] % k.shape[2]:
        return f"query heads ({q.shape[2]}) must be a multiple of KV heads ({k.shape[2]})"
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        return "q, k and v must be contiguous"
    if not aligned16((q, k, v)):
        return "q, k and v must start at 16-byte aligned addresses (the copy engine reads them)"
    return None


def gluon_attention_fwd(q, k, v, causal: bool, softmax_scale: float | None = None, overlap: bool | None = None,
                        pingpong: bool = False):
    """The Gluon forward, called directly. Returns (o like q, lse fp32 [B, Hq, T] in base 2), the Triton
    forward's (`forward.attention_fwd`) outputs. overlap: the consumers' loop with the next tile's scores issued
    before the softmax (None: `OVERLAP_SCORES`); pingpong: the two consumer warpgroups taking turns on the tensor
    cores instead (not with overlap=True). ValueError, saying why, for inputs it cannot take
    (`gluon_forward_misfit`) and for inputs that require grad (`flash_attn_func` trains through it: the Triton
    backward reads its outputs).

    >>> q, k, v = (torch.randn(2, 4096, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
    >>> o, lse = gluon_attention_fwd(q, k, v, causal=True)   # on an H100 or H200
    """
    check_no_grad("gluon_attention_fwd", q=q, k=k, v=v)
    if pingpong and overlap:
        raise ValueError("pingpong and overlap are two different loops: pass one of them")
    misfit = gluon_forward_misfit(q, k, v)
    if misfit:
        raise ValueError(f"the Gluon forward cannot take these inputs: {misfit}")
    overlap = OVERLAP_SCORES if overlap is None else overlap
    schedule = PINGPONG.value if pingpong else OVERLAPPED.value if overlap else IN_ORDER.value
    D = q.shape[3]
    return launch_gluon(q, k, v, causal, softmax_scale if softmax_scale is not None else D ** -0.5, schedule)


def launch_gluon(q, k, v, causal: bool, softmax_scale: float, schedule: int):
    """Launch the forward with the consumers' loop `schedule` (IN_ORDER, OVERLAPPED or PINGPONG's value) on
    inputs `gluon_forward_misfit` accepts (not checked again here; inputs may require grad: the autograd
    Function's forward calls it). Returns (o, lse) allocated as the Triton forward allocates them: o contiguous
    like q, lse fp32 [B, Hq, T] contiguous, base 2, so the Triton backward reads either."""
    B, T, HQ, D = q.shape
    S, HKV = k.shape[1], k.shape[2]
    o = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    lse = torch.empty((B, HQ, T), device=q.device, dtype=torch.float32)
    BN, STAGES = FWD_TILES[D]
    grid = (cdiv(T, BM), B * HQ)
    constexprs = dict(D=D, BN=BN, STAGES=STAGES, CAUSAL=bool(causal), SCHEDULE=schedule,
                      CONSUMER_REGS=WS_CONSUMER_REGS, PRODUCER_REGS=WS_PRODUCER_REGS)
    launch_direct(attn_fwd_ws_kernel, grid, ("gluon_fwd", q.device.index, q.dtype, D, bool(causal), schedule),
                  (q, k, v, o, lse, softmax_scale * LOG2E, T, S, HQ, HKV), constexprs, aligned=True,   # o, lse fresh
                  num_warps=4, maxnreg=WS_MAXNREG)
    return o, lse


__all__ = ["gluon_attention_fwd", "gluon_forward_misfit", "launch_gluon", "attn_fwd_ws_kernel", "FWD_TILES", "BM",
           "WS_MAXNREG", "WS_CONSUMER_REGS", "WS_PRODUCER_REGS", "IN_ORDER", "OVERLAPPED", "PINGPONG"]
