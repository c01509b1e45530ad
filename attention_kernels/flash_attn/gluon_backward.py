"""FlashAttention backward for Hopper (sm_90a) in Gluon: a dK/dV kernel with a TMA copy warp and two consumer
warpgroups, and beside it the Triton dQ pass (`backward.py`) or the Gluon dQ kernel (`gluon_dq.py`).

`gluon_attention_bwd` is a whole backward with `backward.attention_bwd`'s contract (dense inputs only);
`flash_attn_func`'s backward runs it on an sm_90 GPU where it measured faster than the Triton backward, with the dQ
kernel that measured faster (`interface.gluon_bwd_form`, `interface.GLUON_BWD_MEASURED`; `scripts/tune_probe.py
fa_gluon_bwd`), and where it takes the inputs (`gluon_backward_misfit`). Checked on a Hopper GPU by
`tests/test_flash_attn_gluon_backward.py`.

With P = exp2(s * scale * log2 e - lse) (lse in base 2, from the forward), dP = dO V^T, delta = rowsum(dO o O),
dS = P o (dP - delta): dV = P^T dO, dK = scale * dS^T Q, dQ = scale * dS K.

The schedule follows FlashAttention-3's Hopper backward (Shah et al. 2024; `hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp`
in Dao-AILab/flash-attention, read, not copied): one CTA per key block, K and V resident in shared memory, a
producer warp streaming Q and dO tiles with their lse and delta rows through a pipeline, and the MMA warpgroups
holding the transposed products (its SdP_swapAB), so that P^T and dS^T come out of the accumulators as the
register A operands of dV += P^T dO and dK += dS^T Q. Unlike FA3, dQ is not accumulated here (FA3 writes dS to
shared memory and adds dQ with atomics): a deterministic pass computes it, and delta with it, before this kernel
runs: the Triton dQ pass or the Gluon dQ kernel (`gluon_dq.py`).

One CTA per (block of 128 keys, KV head [, part of its GQA group], batch), three partitions (gl.warp_specialize):
  * a 1-warp producer copies the CTA's K and V once (two 64-key halves each), then for each query head of the
    part and each query block that sees any of the keys, the Q tile with its lse row and the dO tile with its
    delta row into a ring of STAGES slots; Q and dO each have a ready barrier and an empty one (both consumers
    are done with it), so a slot's dO is refilled while its Q is still read by dK += dS^T Q;
  * two 4-warp consumer warpgroups, warpgroup w owning keys 64w ... 64w + 63: per query block S^T = K Q^T,
    P^T = exp2(S^T scale log2 e - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T o (dP^T - delta),
    dK += dS^T Q, all accumulated in fp32. Last, dK * scale and dV stored with plain masked stores, into dk, dv
    or, for a group split into parts (`backward.group_parts`, the Triton backward's rule), the fp32 workspace
    that one sum over the parts reduces.
The consumers wait on every product before the step that reads it (`_block_update`); a loop that overlapped
the products with the elementwise work in FA3's order measured no faster on an H100.
Causal: only the query blocks that cross this key block's diagonal take the mask (`_query_blocks`); a hidden
pair's dS is 0 whatever dO or V hold there. Keys past S and queries past T need no mask: the copy engine
zero-fills their rows (a query row past T adds 0 * 0 to dK and dV) and keys past S are not stored.
The lse and delta rows ride in the ring as [1, BM] fp32 tiles of a batch element's [Hq, T] view, whose row stride
the copy engine needs 16-byte aligned: for T not a multiple of 4 the launcher pads a copy of them first.

The forward's Gluon/ptxas rules hold here too (`gluon_forward.py`'s docstring): no wgmma in flight across a loop
back edge, ring buffers handed to wgmma indexed through `gluon_helpers.opaque_zero`, sizes read off the buffers'
shapes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from ..checks import check_tensor
from ..gluon_helpers import opaque_zero
from ..launch import LOG2E, aligned16, cdiv, launch_direct
from .backward import dq_and_delta, group_parts

BN = 128           # keys per CTA: two consumer warpgroups of 64 (wgmma's M)
# (query rows per ring tile, ring slots) per head dim. A slot holds a Q and a dO tile, BM x D each, next to the
# resident K and V (2 x BN x D): D = 128: 64 KB + 2 x 32 KB; D = 64: 32 KB + 3 x 16 KB. BM = 64 keeps S^T and
# dP^T at 32 fp32 registers a thread each beside dK and dV (64 each at D = 128), as FA3 does at D = 128.
# Timed on an H200 (notes/TUNING.md 2026-12-06 (19)).
BWD_TILES = {64: (64, 3), 128: (64, 2)}
# 4 + 4 + 1 warps, as the forward: the producer drops to 24 registers, each consumer thread gets 240.
WS_MAXNREG = 168
WS_CONSUMER_REGS = 240
WS_PRODUCER_REGS = 24
ROW_ALIGN = 4      # fp32 elements in 16 bytes: the lse and delta views' row length must be a multiple of it


@gluon.jit
def _query_blocks(n0, T, S, BM: gl.constexpr, BN: gl.constexpr, CAUSAL: gl.constexpr):
    """For keys [n0, n0 + BN): query blocks [m_lo, m_full) see some of them and need the causal mask, blocks
    [m_full, n_blocks) see all of them; blocks before m_lo see none. Not causal: every block, none masked."""
    n_blocks = gl.cdiv(T, BM)
    if CAUSAL:   # query i sees key j iff j <= i + S - T
        shift = S - T
        m_lo = gl.minimum(gl.maximum(n0 - shift, 0) // BM, n_blocks)
        m_full = gl.maximum(gl.minimum(gl.cdiv(gl.maximum(n0 + BN - 1 - shift, 0), BM), n_blocks), m_lo)
    else:
        m_lo = 0
        m_full = 0
    return m_lo, m_full, n_blocks


@gluon.jit
def _load_partition(q_ptr, do_ptr, k_ptr, v_ptr, lse_ptr, delta_ptr, q_row0, kv_base, row_stride, stats_row0, h0,
                    n_heads, m_lo, n_blocks, n0, T, S, HQ, HKV, k_s, v_s, q_s, do_s, lse_s, delta_s, kv_bar, q_ready,
                    do_ready, q_empty, do_empty):
    """1 warp: K and V of the CTA's keys (two 64-key halves each, one barrier), then for each of the n_heads query
    heads h0 ... and each query block m_lo ... n_blocks - 1 the Q tile and its lse row, then the dO tile and its
    delta row, each into its ring slot once both consumers have released that slot's previous tile."""
    STAGES: gl.constexpr = q_s.shape[0]
    BM: gl.constexpr = q_s.shape[1]
    D: gl.constexpr = q_s.shape[2]
    HALF: gl.constexpr = k_s.shape[1]
    kv_layout: gl.constexpr = k_s.layout
    qdo_layout: gl.constexpr = q_s.layout
    row_layout: gl.constexpr = lse_s.layout
    # rows of this KV head: keys past S are zero-filled
    kd = tma.make_tensor_descriptor(k_ptr + kv_base, shape=[S, D], strides=[HKV * D, 1], block_shape=[HALF, D],
                                    layout=kv_layout)
    vd = tma.make_tensor_descriptor(v_ptr + kv_base, shape=[S, D], strides=[HKV * D, 1], block_shape=[HALF, D],
                                    layout=kv_layout)
    HALF_BYTES: gl.constexpr = HALF * D * k_s.dtype.primitive_bitwidth // 8
    mbarrier.expect(kv_bar, 4 * HALF_BYTES)   # zero-filled rows past S are counted too
    for w in gl.static_range(2):
        tma.async_copy_global_to_shared(kd, [n0 + w * HALF, 0], kv_bar, k_s.index(w))
        tma.async_copy_global_to_shared(vd, [n0 + w * HALF, 0], kv_bar, v_s.index(w))
    # [T, Hq * D] views of this batch element: one descriptor serves every head (column h * D), rows past T
    # are zero-filled instead of read from the next sequence
    qd = tma.make_tensor_descriptor(q_ptr + q_row0, shape=[T, HQ * D], strides=[HQ * D, 1], block_shape=[BM, D],
                                    layout=qdo_layout)
    dod = tma.make_tensor_descriptor(do_ptr + q_row0, shape=[T, HQ * D], strides=[HQ * D, 1], block_shape=[BM, D],
                                     layout=qdo_layout)
    # [Hq, T] views of this batch element's lse and delta rows (row_stride: T rounded up to 16 bytes)
    lsed = tma.make_tensor_descriptor(lse_ptr + stats_row0, shape=[HQ, T], strides=[row_stride, 1],
                                      block_shape=[1, BM], layout=row_layout)
    deltad = tma.make_tensor_descriptor(delta_ptr + stats_row0, shape=[HQ, T], strides=[row_stride, 1],
                                        block_shape=[1, BM], layout=row_layout)
    TILE_BYTES: gl.constexpr = BM * D * q_s.dtype.primitive_bitwidth // 8 + BM * 4
    per_head = n_blocks - m_lo
    for i in range(n_heads * per_head):
        h = h0 + i // per_head
        row = (m_lo + i % per_head) * BM
        st = i % STAGES
        phase = ((i // STAGES) & 1) ^ 1   # a fresh barrier counts as having completed the phase before 0
        mbarrier.wait(q_empty.index(st), phase)
        mbarrier.expect(q_ready.index(st), TILE_BYTES)
        tma.async_copy_global_to_shared(qd, [row, h * D], q_ready.index(st), q_s.index(st))
        tma.async_copy_global_to_shared(lsed, [h, row], q_ready.index(st), lse_s.index(st))
        mbarrier.wait(do_empty.index(st), phase)
        mbarrier.expect(do_ready.index(st), TILE_BYTES)
        tma.async_copy_global_to_shared(dod, [row, h * D], do_ready.index(st), do_s.index(st))
        tma.async_copy_global_to_shared(deltad, [h, row], do_ready.index(st), delta_s.index(st))


@gluon.jit
def _ring_slot(i, q_s):
    """Ring tile i's slot: its index (barriers, lse and delta rows), the same index made opaque (the Q and dO
    buffers handed to wgmma, `opaque_zero`), and the parity of the slot's use that tile i is."""
    STAGES: gl.constexpr = q_s.shape[0]
    st = i % STAGES
    return st, st + opaque_zero(i), (i // STAGES) & 1


@gluon.jit
def _stats_row(rows_s, st, col_s: gl.constexpr):
    """Ring slot st's [1, BM] fp32 row (lse or delta) as a [BM] vector laid out along S^T's columns (col_s)."""
    BM: gl.constexpr = rows_s.shape[2]
    stats_layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0])
    return gl.convert_layout(gl.reshape(rows_s.index(st).load(stats_layout), [BM]), col_s)


@gluon.jit
def _hide_past_diagonal(s_t, keys, row0, shift, col_s: gl.constexpr):
    """S^T (keys x query rows row0 ...) with -inf where the key is past the query's diagonal (key > query +
    shift), before exp2: a hidden score may exceed lse by far. Returns (the masked S^T, where it was kept)."""
    BM: gl.constexpr = s_t.shape[1]
    rows = row0 + gl.arange(0, BM, layout=col_s)
    keep = gl.expand_dims(keys, 1) <= gl.expand_dims(rows + shift, 0)
    return gl.where(keep, s_t, float("-inf")), keep


@gluon.jit
def _block_update(dk, dv, i, row0, keys, shift, scale_log2, k_op, v_op, q_s, do_s, lse_s, delta_s, q_ready, do_ready,
                  q_empty, do_empty, MASKED: gl.constexpr, s_layout: gl.constexpr, a_layout: gl.constexpr):
    """Ring tile i (query rows row0 ... row0 + BM - 1 of one head) for this warpgroup's 64 keys: S^T = K Q^T,
    P^T, dV += P^T dO, dP^T = V dO^T, dS^T, dK += dS^T Q; each product waited on, and the slot's dO and Q released
    once read. MASKED: a pair whose key is past the query's diagonal (key > query + shift) has P = dS = 0."""
    BM: gl.constexpr = q_s.shape[1]
    HALF: gl.constexpr = k_op.shape[0]
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    st, slot, phase = _ring_slot(i, q_s)
    s_zero = gl.zeros([HALF, BM], gl.float32, s_layout)

    mbarrier.wait(q_ready.index(st), phase)
    q_tile = q_s.index(slot)
    s_t = warpgroup_mma(k_op, q_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    lse = _stats_row(lse_s, st, col_s)   # during the product
    s_t = warpgroup_mma_wait(num_outstanding=0, deps=(s_t, ))
    s_t = s_t * scale_log2 - gl.expand_dims(lse, 0)
    if MASKED:
        s_t, keep = _hide_past_diagonal(s_t, keys, row0, shift, col_s)
    p_t = gl.exp2(s_t)

    mbarrier.wait(do_ready.index(st), phase)
    do_tile = do_s.index(slot)
    dv = warpgroup_mma(gl.convert_layout(p_t.to(do_s.dtype), a_layout), do_tile, dv, is_async=True)
    dp_t = warpgroup_mma(v_op, do_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    delta = _stats_row(delta_s, st, col_s)
    dv, dp_t = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dp_t))
    mbarrier.arrive(do_empty.index(st), count=1)
    ds_t = p_t * (dp_t - gl.expand_dims(delta, 0))
    if MASKED:   # 0 * NaN is NaN: a hidden pair's dS is 0 whatever dO or V hold there
        ds_t = gl.where(keep, ds_t, 0.0)
    dk = warpgroup_mma(gl.convert_layout(ds_t.to(q_s.dtype), a_layout), q_tile, dk, is_async=True)
    dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk, ))
    mbarrier.arrive(q_empty.index(st), count=1)
    return dk, dv


@gluon.jit
def _consumer(WG: gl.constexpr, dk_ptr, dv_ptr, out_base, out_row_stride, n0, S, shift,
              n_heads, m_lo, m_full, n_blocks, scale_log2, sm_scale, k_s, v_s, q_s, do_s, lse_s, delta_s, kv_bar,
              q_ready, do_ready, q_empty, do_empty):
    """Warpgroup WG: keys n0 + 64 WG ... + 63 over every query block of every head of the part (the masked blocks
    of a head first, as the producer sends them), each through `_block_update`, then dK * scale and dV stored
    (keys past S are not)."""
    BM: gl.constexpr = q_s.shape[1]
    D: gl.constexpr = q_s.shape[2]
    HALF: gl.constexpr = k_s.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, D, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    keys = n0 + WG * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, s_layout))
    dk = gl.zeros([HALF, D], gl.float32, acc_layout)
    dv = gl.zeros([HALF, D], gl.float32, acc_layout)
    mbarrier.wait(kv_bar, 0)
    i = 0   # the ring tile, numbered as the producer sends them
    for g in range(n_heads):
        for m in range(m_lo, m_full):
            dk, dv = _block_update(dk, dv, i, m * BM, keys, shift, scale_log2, k_s.index(WG + opaque_zero(i)),
                                   v_s.index(WG + opaque_zero(i)), q_s, do_s, lse_s, delta_s, q_ready, do_ready,
                                   q_empty, do_empty, True, s_layout, a_layout)
            i += 1
        for m in range(m_full, n_blocks):
            dk, dv = _block_update(dk, dv, i, m * BM, keys, shift, scale_log2, k_s.index(WG + opaque_zero(i)),
                                   v_s.index(WG + opaque_zero(i)), q_s, do_s, lse_s, delta_s, q_ready, do_ready,
                                   q_empty, do_empty, False, s_layout, a_layout)
            i += 1
    keys_o = gl.convert_layout(keys, gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, acc_layout))
    offs = gl.expand_dims(keys_o.to(gl.int64) * out_row_stride, 1) + gl.expand_dims(cols, 0)
    inside = gl.expand_dims(keys_o < S, 1)
    gl.store(dk_ptr + out_base + offs, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=inside)
    gl.store(dv_ptr + out_base + offs, dv.to(dv_ptr.dtype.element_ty), mask=inside)


# One entry point per warpgroup: gl.warp_specialize cannot pass constexprs, so each binds its own.
@gluon.jit
def _consumer0(dk_ptr, dv_ptr, out_base, out_row_stride, n0, S, shift, n_heads, m_lo, m_full, n_blocks, scale_log2,
               sm_scale, k_s, v_s, q_s, do_s, lse_s, delta_s, kv_bar, q_ready, do_ready, q_empty, do_empty):
    _consumer(0, dk_ptr, dv_ptr, out_base, out_row_stride, n0, S, shift, n_heads, m_lo, m_full, n_blocks, scale_log2,
              sm_scale, k_s, v_s, q_s, do_s, lse_s, delta_s, kv_bar, q_ready, do_ready, q_empty, do_empty)


@gluon.jit
def _consumer1(dk_ptr, dv_ptr, out_base, out_row_stride, n0, S, shift, n_heads, m_lo, m_full, n_blocks, scale_log2,
               sm_scale, k_s, v_s, q_s, do_s, lse_s, delta_s, kv_bar, q_ready, do_ready, q_empty, do_empty):
    _consumer(1, dk_ptr, dv_ptr, out_base, out_row_stride, n0, S, shift, n_heads, m_lo, m_full, n_blocks, scale_log2,
              sm_scale, k_s, v_s, q_s, do_s, lse_s, delta_s, kv_bar, q_ready, do_ready, q_empty, do_empty)


# Integer arguments equal to 1 would be specialized into constants, which gl.warp_specialize cannot hand to the
# partitions (T = 1, MQA, one part): none is specialized, which also lets launch_direct skip the dispatcher.
@gluon.jit(do_not_specialize=["T", "S", "HQ", "HKV", "PARTS", "row_stride"])
def attn_bwd_dkdv_ws_kernel(q_ptr, k_ptr, v_ptr, do_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr, scale_log2, sm_scale, T,
                            S, HQ, HKV, PARTS, row_stride, D: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
                            CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                            num_warps: gl.constexpr):
    """q, do: [B, T, HQ, D], k, v: [B, S, HKV, D] contiguous; lse (base 2), delta: fp32 [B, HQ, row_stride]
    (row_stride >= T, a multiple of 4). dk, dv: like k and v, or with PARTS > 1 fp32 [B, S, HKV, PARTS, D], each
    part's sums over its GROUP // PARTS query heads. Grid (cdiv(S, 128), B * HKV * PARTS)."""
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    BN: gl.constexpr = 128
    HALF: gl.constexpr = 64
    i_n = gl.program_id(0)
    i_bhp = gl.program_id(1)
    i_part = i_bhp % PARTS
    i_bh = i_bhp // PARTS
    i_b = i_bh // HKV
    i_hk = i_bh % HKV
    group = HQ // HKV
    n_heads = group // PARTS
    h0 = i_hk * group + i_part * n_heads   # the part's first query head
    n0 = i_n * BN
    m_lo, m_full, n_blocks = _query_blocks(n0, T, S, BM, BN, CAUSAL)
    if CAUSAL:
        shift = S - T
    else:
        shift = S   # unused: no block is masked
    q_row0 = i_b.to(gl.int64) * T * HQ * D
    kv_base = (i_b.to(gl.int64) * S * HKV + i_hk) * D
    stats_row0 = i_b.to(gl.int64) * HQ * row_stride
    out_base = ((i_b.to(gl.int64) * S * HKV + i_hk) * PARTS + i_part) * D
    out_row_stride = HKV * PARTS * D

    dtype: gl.constexpr = q_ptr.dtype.element_ty
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF, D], dtype)
    qdo_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D], dtype)
    row_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    k_s = gl.allocate_shared_memory(dtype, [2, HALF, D], kv_layout)
    v_s = gl.allocate_shared_memory(dtype, [2, HALF, D], kv_layout)
    q_s = gl.allocate_shared_memory(dtype, [STAGES, BM, D], qdo_layout)
    do_s = gl.allocate_shared_memory(dtype, [STAGES, BM, D], qdo_layout)
    lse_s = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BM], row_layout)
    delta_s = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BM], row_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    # The barriers' invariants (a wrong parity hangs the GPU). Ring tile i (numbered as the producer sends them:
    # head by head, query block by query block) goes to slot i % STAGES in that slot's use u = i // STAGES, and
    # every waiter waits on the parity of u:
    #   q_ready[s], do_ready[s] (1 arrival + the copies' bytes): phase u completes when use u's Q + lse (dO +
    #     delta) landed. Consumers wait parity u & 1. The producer arms use u + 1 only after waiting q_empty[s]
    #     (do_empty[s]) for use u, which needs both consumers past their wait on use u: a ready barrier is never
    #     more than one phase ahead of a waiter, so its parity cannot alias.
    #   q_empty[s], do_empty[s] (2 arrivals, one a warpgroup, each after its last product reading the tile is
    #     waited on: dK for Q, dV for dO): phase u completes when both released use u. The producer, before
    #     filling use u, waits parity (u & 1) ^ 1, i.e. use u - 1's release (a fresh barrier counts as having
    #     completed the phase of parity 1, so use 0 does not wait). A warpgroup cannot release use u + 1 before
    #     the producer filled it (it waits on ready first), so an empty barrier is never more than one phase ahead
    #     of the producer either.
    #   kv_bar (1 arrival + 4 halves' bytes): one phase, waited on with parity 0 by each consumer once.
    # Each warpgroup passes every ring tile in the producer's order, waits on Q's ready before dO's and releases
    # dO's slot before Q's. No warpgroup ever waits on the other, only on the producer, and a warpgroup waiting on
    # tile i has released every tile before i, so the producer's wait for tile i - STAGES's release always ends: no
    # deadlock.
    mbarrier.init(kv_bar, count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(st), count=1)
        mbarrier.init(do_ready.index(st), count=1)
        mbarrier.init(q_empty.index(st), count=2)   # both consumer warpgroups read every tile
        mbarrier.init(do_empty.index(st), count=2)

    cargs = (dk_ptr, dv_ptr, out_base, out_row_stride, n0, S, shift, n_heads, m_lo, m_full, n_blocks, scale_log2,
             sm_scale, k_s, v_s, q_s, do_s, lse_s, delta_s, kv_bar, q_ready, do_ready, q_empty, do_empty)
    largs = (q_ptr, do_ptr, k_ptr, v_ptr, lse_ptr, delta_ptr, q_row0, kv_base, row_stride, stats_row0, h0, n_heads,
             m_lo, n_blocks, n0, T, S, HQ, HKV, k_s, v_s, q_s, do_s, lse_s, delta_s, kv_bar, q_ready, do_ready,
             q_empty, do_empty)
    gl.warp_specialize([(_consumer0, cargs), (_consumer1, cargs), (_load_partition, largs)], [4, 1],
                       [CONSUMER_REGS, PRODUCER_REGS])


def _check_inputs(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k) -> None:
    """TypeError or ValueError, naming the argument, for what the Gluon backward cannot take: packed sequences,
    dtypes other than bf16 or fp16 (lse fp32), a head dim other than 64 or 128, shapes that do not match, tensors
    that are not contiguous (do may be any view) or not 16-byte aligned, a GPU that is not a Hopper. Reads no
    value (no device sync)."""
    for name, offsets in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if offsets is not None:
            raise ValueError(f"{name}: the Gluon backward takes dense inputs only (no packed sequences); "
                             "backward.attention_bwd takes them")
    check_tensor("q", q, ndim=4, dtypes=(torch.bfloat16, torch.float16))
    B, T, HQ, D = q.shape
    check_tensor("k", k, ndim=4, dtypes=(q.dtype, ), shape=(B, None, None, D))
    check_tensor("v", v, dtypes=(q.dtype, ), shape=tuple(k.shape))
    check_tensor("o", o, dtypes=(q.dtype, ), shape=tuple(q.shape))
    check_tensor("do", do, dtypes=(q.dtype, ), shape=tuple(q.shape))
    check_tensor("lse", lse, dtypes=(torch.float32, ), shape=(B, HQ, T))
    if D not in BWD_TILES:
        raise ValueError(f"q: head dim must be one of {sorted(BWD_TILES)}, got {D}")
    if HQ % k.shape[2]:
        raise ValueError(f"k: query heads ({HQ}) must be a multiple of KV heads ({k.shape[2]})")
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if not (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9):
        raise ValueError("q: the Gluon backward runs on a Hopper GPU (sm_90) only")
    if not aligned16((q, k, v, o, lse)):
        raise ValueError("q, k, v, o and lse must start at 16-byte aligned addresses (the copy engine reads them)")


def gluon_backward_misfit(do, q, k, v, o, lse) -> str | None:
    """Why the Gluon backward cannot take these dense inputs (None if it can), as a phrase: `_check_inputs`'s
    refusal, or do's address where do is contiguous (a view is copied, so its copy is aligned)."""
    try:
        _check_inputs(do, q, k, v, o, lse, None, None)
    except (TypeError, ValueError) as refusal:
        return str(refusal)
    if do.is_contiguous() and not aligned16((do, )):
        return "do must start at a 16-byte aligned address (the copy engine reads it)"
    return None


def _rows_for_the_copy_engine(x):
    """x fp32 [B, Hq, T] as rows the copy engine can read (row stride a multiple of 16 bytes): x itself, or a
    copy padded to a multiple of 4 columns. Returns (rows, row_stride)."""
    T = x.shape[-1]
    if T % ROW_ALIGN == 0:
        return x, T
    padded = F.pad(x, (0, ROW_ALIGN - T % ROW_ALIGN))
    return padded, padded.shape[-1]


def gluon_attention_bwd(do, q, k, v, o, lse, causal: bool, softmax_scale: float, cu_seqlens_q=None,
                        cu_seqlens_k=None, dq_kernel: str = "triton"):
    """The backward with `backward.attention_bwd`'s contract for dense inputs: do, q, o [B, T, Hq, D], k, v
    [B, S, Hkv, D], lse fp32 [B, Hq, T] (base 2) from the forward; bf16 or fp16, D 64 or 128, on a Hopper GPU.
    Returns (dq, dk, dv) in the input dtype; for GQA, dk and dv summed over each group's query heads.
    dQ and delta come from the Triton dQ pass (or the Gluon dQ kernel, `dq_kernel`), dK and dV from the Gluon
    kernel (`attn_bwd_dkdv_ws_kernel`). cu_seqlens_q, cu_seqlens_k: packed sequences are refused (ValueError),
    as is anything else `_check_inputs` names, before any launch. dq_kernel: "triton" (the Triton dQ pass) or
    "gluon" (`gluon_dq.gluon_dq_and_delta`), else ValueError before any launch.

    >>> o, lse = attention_fwd(q, k, v, causal=True, softmax_scale=scale)   # forward.py
    >>> dq, dk, dv = gluon_attention_bwd(do, q, k, v, o, lse, True, scale)  # on an H100 or H200
    """
    _check_inputs(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k)
    if dq_kernel not in ("triton", "gluon"):
        raise ValueError(f"dq_kernel: must be 'triton' or 'gluon', got {dq_kernel!r}")
    from .gluon_dq import gluon_dq_and_delta   # only this call needs the dQ kernel's module
    BM, STAGES = BWD_TILES[q.shape[3]]
    do = do.contiguous()  # e.g. the gradient of out.sum() arrives as a stride-0 view
    if not aligned16((do, )):
        raise ValueError("do must start at a 16-byte aligned address (the copy engine reads it)")
    B, T, HQ, D = q.shape
    S, HKV = k.shape[1], k.shape[2]
    group = HQ // HKV
    dq, delta = (gluon_dq_and_delta if dq_kernel == "gluon" else dq_and_delta)(do, q, k, v, o, lse, bool(causal),
                                                                              softmax_scale)   # delta for dK/dV

    # the GQA split as the Triton backward's (`bwd_plan`), counted in this kernel's programs
    parts = group_parts(group, cdiv(S, BN) * B * HKV)
    if parts > 1:   # [B, S, Hkv, parts, D]: each part's sums, added up below
        dk, dv = (torch.empty((B, S, HKV, parts, D), device=q.device, dtype=torch.float32) for _ in "kv")
    else:
        dk, dv = torch.empty_like(k), torch.empty_like(v)
    lse_rows, row_stride = _rows_for_the_copy_engine(lse)
    delta_rows, _ = _rows_for_the_copy_engine(delta)
    grid = (cdiv(S, BN), B * HKV * parts)
    constexprs = dict(D=D, BM=BM, STAGES=STAGES, CAUSAL=bool(causal), CONSUMER_REGS=WS_CONSUMER_REGS,
                      PRODUCER_REGS=WS_PRODUCER_REGS)
    launch_direct(attn_bwd_dkdv_ws_kernel, grid,
                  ("gluon_bwd", q.device.index, q.dtype, D, bool(causal), parts > 1),
                  (q, k, v, do, dk, dv, lse_rows, delta_rows, softmax_scale * LOG2E, softmax_scale, T, S, HQ, HKV,
                   parts, row_stride), constexprs, aligned=True, num_warps=4, maxnreg=WS_MAXNREG)   # checked above
    if parts == 1:
        return dq, dk, dv
    return dq, dk.sum(-2).to(k.dtype), dv.sum(-2).to(v.dtype)


__all__ = ["gluon_attention_bwd", "gluon_backward_misfit", "attn_bwd_dkdv_ws_kernel", "BWD_TILES", "BN", "WS_MAXNREG",
           "WS_CONSUMER_REGS", "WS_PRODUCER_REGS"]
