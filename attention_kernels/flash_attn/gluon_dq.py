"""FlashAttention's dQ pass for Hopper (sm_90a) in Gluon: a TMA copy warp and two consumer warpgroups, with the
query block resident and the keys streamed, as in the forward (`gluon_forward.py`).

`gluon_dq_and_delta` has `backward.dq_and_delta`'s contract: dense inputs do, q, o [B, T, Hq, D], k, v
[B, S, Hkv, D] (contiguous, bf16 or fp16, D 64 or 128, Hq % Hkv == 0), lse fp32 [B, Hq, T] (base 2) from the
forward; it returns dq like q and delta = rowsum(dO o O), fp32 [B, Hq, T], which the dK/dV kernel reads.
`gluon_backward.gluon_attention_bwd(dq_kernel="gluon")` runs it in place of the Triton dQ pass; checked on a
Hopper GPU by `tests/test_flash_attn_gluon_backward.py` and `scripts/tune_probe.py fa_gluon_bwd`.

With P = exp2(s * scale * log2 e - lse), dP = dO V^T, dS = P o (dP - delta): dQ = scale * dS K.

FlashAttention-3's Hopper backward (Shah et al. 2024; `hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp` in
Dao-AILab/flash-attention, read, not copied) computes dQ inside its dK/dV kernel: each key block's dS goes to
shared memory and its dQ share is added into an fp32 buffer by TMA reduce-add, so the sum's order depends on
the schedule unless its deterministic mode makes the blocks take turns. This kernel is a separate pass
instead, deterministic: one CTA owns its query rows' dQ and walks the keys in order, paying the scores and dP
a second time (3 products a tile: S, dP, dQ), as the Triton dQ pass does. (Atomics inside the Gluon dK/dV
kernel measured slower: notes/TUNING.md, Experiments not landed, 9.)

One CTA per (128 query rows, query head, batch), three partitions (gl.warp_specialize):
  * a 1-warp producer copies the CTA's Q and dO once (two 64-row halves each, one barrier), then every K and V
    tile of BN keys of the head's KV head (GQA: h // group) into a ring of STAGES slots, each with a ready
    and an empty barrier (the forward's ring, `gluon_forward._load_partition`, with dO beside Q);
  * two 4-warp consumer warpgroups, warpgroup w owning rows 64w ... 64w + 63: first delta = rowsum(dO o O) for
    its rows (dO read from shared memory, O from global memory), stored for the dK/dV kernel; then per key
    tile S = Q K^T and dP = dO V^T issued back to back, P computed while dP runs, dS, and dQ += dS K with dS
    from registers (16-bit) and K from shared memory; last, dQ * scale stored with plain masked stores.
Tiles that every row of the block sees in full take no mask (`gluon_forward.key_tiles`): the causal diagonal
and the ragged last tile do, with selects, so that a hidden pair's dS is 0 whatever K, V or dO hold there. The
product dS K would still meet a NaN or inf that K holds at a hidden key (0 * NaN is NaN): a masked tile first
checks its K tile and, only if it is not finite, takes that product on the CUDA cores key by key, skipping
zero terms (the forward's `pv_skipping_zeros`, with dS for P and K for V). Rows that see no key get dq = 0.

The forward's Gluon/ptxas rules hold here (`gluon_forward.py`'s docstring): no wgmma in flight across a loop
back edge, ring buffers handed to wgmma indexed through `gluon_helpers.opaque_zero`, sizes read off the
buffers' shapes, the consumers at 240 registers (setmaxnreg; the producer at 32, `WS_PRODUCER_REGS`).
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from ..gluon_helpers import opaque_zero
from ..launch import LOG2E, cdiv, launch_direct
from .gluon_forward import has_non_finite, pv_skipping_zeros, query_block, rows_desc

BM = 128           # query rows per CTA: two consumer warpgroups of 64 (wgmma's M)
# (keys per ring tile, ring slots) per head dim. Registers per consumer thread (a [64, N] fp32 tile of one
# warpgroup is N / 2 a thread): S and dP BN / 2 each, dQ's accumulator D / 2, dS as the 16-bit A operand BN / 4,
# and in a masked tile P and the mask beside dP. D = 128, BN = 64: 32 + 32 + 64 + 16 = 144 of the 240 (BN = 128
# would take 224, no room for the rest); D = 64, BN = 64: 112 (BN = 128 compiled with spills in the masked tile,
# where P, dP and the mask are held together). Shared memory: Q and dO resident, 2 x 128 x D x 2 B (64 KB at
# D = 128, 32 KB at 64), and a slot of K and V, 2 x BN x D x 2 B (32 KB at D = 128, 16 KB at 64): 3 slots, 160
# KB, and 4 slots, 96 KB, of the 227 KB. Not measured yet (`tune_probe.py fa_gluon_bwd`, notes/TUNING.md (30)).
DQ_TILES = {64: (64, 4), 128: (64, 3)}
# 4 + 4 + 1 warps, as the forward, each consumer thread at 240 registers; the producer at 32, not the forward's
# 24: it makes four descriptors (Q, dO, K, V) where the forward makes three, and at 24 ptxas spilled 8-16 bytes
# of its prologue. 2 x 128 x 240 + 32 x 32 registers fit the 384 x 168 the launch reserves.
WS_MAXNREG = 168
WS_CONSUMER_REGS = 240
WS_PRODUCER_REGS = 32


@gluon.jit
def _load_partition(q_ptr, do_ptr, k_ptr, v_ptr, q_row0, h, kv_base, m0, T, S, HQ, HKV, n_tiles, q_s, do_s, k_s, v_s,
                    q_bar, k_ready, v_ready, k_empty, v_empty):
    """1 warp: the query block's Q and dO (two 64-row halves each, one barrier), then K and V of every key tile,
    each into its ring slot as soon as both consumers have released that slot's previous tile."""
    STAGES: gl.constexpr = k_s.shape[0]
    BN: gl.constexpr = k_s.shape[1]
    D: gl.constexpr = k_s.shape[2]
    HALF: gl.constexpr = q_s.shape[1]
    q_layout: gl.constexpr = q_s.layout
    kv_layout: gl.constexpr = k_s.layout
    # [T, Hq * D] views of this batch element (the head at column h * D): rows past T zero-filled
    qd = tma.make_tensor_descriptor(q_ptr + q_row0, shape=[T, HQ * D], strides=[HQ * D, 1], block_shape=[HALF, D],
                                    layout=q_layout)
    dod = tma.make_tensor_descriptor(do_ptr + q_row0, shape=[T, HQ * D], strides=[HQ * D, 1],
                                     block_shape=[HALF, D], layout=q_layout)
    mbarrier.expect(q_bar, 4 * HALF * D * q_s.dtype.primitive_bitwidth // 8)
    for w in gl.static_range(2):
        tma.async_copy_global_to_shared(qd, [m0 + w * HALF, h * D], q_bar, q_s.index(w))
        tma.async_copy_global_to_shared(dod, [m0 + w * HALF, h * D], q_bar, do_s.index(w))
    kd = rows_desc(k_ptr + kv_base, S, HKV * D, BN, D, kv_layout)   # keys past S zero-filled
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
def _delta_rows(do_tile, o_ptr, o_base, rows, T, HQ, row_s: gl.constexpr):
    """delta = rowsum(dO o O) in fp32 for this warpgroup's rows (dO from shared memory, O from global memory,
    rows past T read as 0), laid out along the scores' rows (row_s). Before the key loop: its registers are free
    again by the time the accumulator and the scores need them."""
    D: gl.constexpr = do_tile.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows_l = gl.convert_layout(rows, gl.SliceLayout(1, layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    offs = gl.expand_dims(rows_l.to(gl.int64) * (HQ * D), 1) + gl.expand_dims(cols, 0)
    o_tile = gl.load(o_ptr + o_base + offs, mask=gl.expand_dims(rows_l < T, 1), other=0.0)
    delta = gl.sum(do_tile.load(layout).to(gl.float32) * o_tile.to(gl.float32), axis=1)
    return gl.convert_layout(delta, row_s)


@gluon.jit
def _tile_update(acc, t, q_op, do_op, k_s, v_s, k_ready, v_ready, k_empty, v_empty, scale_log2, lse, delta, rows, S,
                 shift, MASKED: gl.constexpr, s_layout: gl.constexpr, ds_layout: gl.constexpr, row_o: gl.constexpr):
    """Key tile t for this warpgroup's 64 rows: S = Q K^T and dP = dO V^T issued back to back, P computed once S
    is done (dP may still run), dS once dP is, V_t's slot released; dQ += dS K_t, waited on, K_t's slot released.
    No product is in flight when it returns. MASKED: a pair whose key is past S or, causal, past the row's
    diagonal (shift = S - T; S when not causal) has P = dS = 0 (selects: 0 * NaN is NaN), and K_t is checked
    for a NaN or an inf before dS K_t (`pv_skipping_zeros` takes the product if it holds one)."""
    STAGES: gl.constexpr = k_s.shape[0]
    BN: gl.constexpr = k_s.shape[1]
    ROWS: gl.constexpr = rows.shape[0]
    st = t % STAGES
    slot = st + opaque_zero(t)
    phase = (t // STAGES) & 1
    s_zero = gl.zeros([ROWS, BN], gl.float32, s_layout)
    mbarrier.wait(k_ready.index(st), phase)
    k_tile = k_s.index(slot)
    s = warpgroup_mma(q_op, k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(st), phase)
    dp = warpgroup_mma(do_op, v_s.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))   # S done, dP may still run
    p = gl.exp2(s * scale_log2 - gl.expand_dims(lse, 1))
    if MASKED:
        cols = t * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        keep = (gl.expand_dims(cols, 0) < S) & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows + shift, 1))
        p = gl.where(keep, p, 0.0)
    dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
    mbarrier.arrive(v_empty.index(st), count=1)
    ds = p * (dp - gl.expand_dims(delta, 1))
    if MASKED:   # a hidden pair's dP may be NaN (V or dO there): its dS is 0 all the same
        ds = gl.where(keep, ds, 0.0)
    ds = ds.to(k_s.dtype)
    if MASKED and has_non_finite(k_tile):
        acc = pv_skipping_zeros(acc, ds, k_tile, row_o)
    else:
        acc = warpgroup_mma(gl.convert_layout(ds, ds_layout), k_tile, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(k_empty.index(st), count=1)
    return acc


@gluon.jit
def _consumer(WG: gl.constexpr, o_ptr, dq_ptr, lse_ptr, delta_ptr, q_base, stats_base, m0, T, S, HQ, shift, n_full,
              n_tiles, scale_log2, sm_scale, q_s, do_s, k_s, v_s, q_bar, k_ready, v_ready, k_empty, v_empty):
    """Warpgroup WG: query rows m0 + 64 WG ... + 63: delta stored, then every key tile (unmasked ones first),
    then dQ * scale stored (rows past T are not written; a row that sees no key stores 0)."""
    HALF: gl.constexpr = q_s.shape[1]
    BN: gl.constexpr = k_s.shape[1]
    D: gl.constexpr = k_s.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, D, 16])
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, acc_layout)

    rows = m0 + WG * HALF + gl.arange(0, HALF, layout=row_s)
    lse = gl.load(lse_ptr + stats_base + rows, mask=rows < T, other=0.0)   # during the copies
    mbarrier.wait(q_bar, 0)
    delta = _delta_rows(do_s.index(WG), o_ptr, q_base, rows, T, HQ, row_s)
    gl.store(delta_ptr + stats_base + rows, delta, mask=rows < T)
    acc = gl.zeros([HALF, D], gl.float32, acc_layout)
    for t in range(n_full):
        acc = _tile_update(acc, t, q_s.index(WG + opaque_zero(t)), do_s.index(WG + opaque_zero(t)), k_s, v_s,
                           k_ready, v_ready, k_empty, v_empty, scale_log2, lse, delta, rows, S, shift, False,
                           s_layout, ds_layout, row_o)
    for t in range(n_full, n_tiles):
        acc = _tile_update(acc, t, q_s.index(WG + opaque_zero(t)), do_s.index(WG + opaque_zero(t)), k_s, v_s,
                           k_ready, v_ready, k_empty, v_empty, scale_log2, lse, delta, rows, S, shift, True,
                           s_layout, ds_layout, row_o)
    rows_o = gl.convert_layout(rows, row_o)
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, acc_layout))
    offs = gl.expand_dims(rows_o.to(gl.int64) * (HQ * D), 1) + gl.expand_dims(cols, 0)
    gl.store(dq_ptr + q_base + offs, (acc * sm_scale).to(dq_ptr.dtype.element_ty),
             mask=gl.expand_dims(rows_o < T, 1))


# One entry point per warpgroup: gl.warp_specialize cannot pass constexprs, so each binds its own.
@gluon.jit
def _consumer0(o_ptr, dq_ptr, lse_ptr, delta_ptr, q_base, stats_base, m0, T, S, HQ, shift, n_full, n_tiles,
               scale_log2, sm_scale, q_s, do_s, k_s, v_s, q_bar, k_ready, v_ready, k_empty, v_empty):
    _consumer(0, o_ptr, dq_ptr, lse_ptr, delta_ptr, q_base, stats_base, m0, T, S, HQ, shift, n_full, n_tiles,
              scale_log2, sm_scale, q_s, do_s, k_s, v_s, q_bar, k_ready, v_ready, k_empty, v_empty)


@gluon.jit
def _consumer1(o_ptr, dq_ptr, lse_ptr, delta_ptr, q_base, stats_base, m0, T, S, HQ, shift, n_full, n_tiles,
               scale_log2, sm_scale, q_s, do_s, k_s, v_s, q_bar, k_ready, v_ready, k_empty, v_empty):
    _consumer(1, o_ptr, dq_ptr, lse_ptr, delta_ptr, q_base, stats_base, m0, T, S, HQ, shift, n_full, n_tiles,
              scale_log2, sm_scale, q_s, do_s, k_s, v_s, q_bar, k_ready, v_ready, k_empty, v_empty)


# Integer arguments equal to 1 would be specialized into constants, which gl.warp_specialize cannot hand to the
# partitions (T = 1, one KV head): none is specialized, which also lets launch_direct skip the dispatcher.
@gluon.jit(do_not_specialize=["T", "S", "HQ", "HKV"])
def attn_bwd_dq_ws_kernel(q_ptr, k_ptr, v_ptr, o_ptr, do_ptr, dq_ptr, lse_ptr, delta_ptr, scale_log2, sm_scale, T, S,
                          HQ, HKV, D: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                          CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """q, o, do, dq: [B, T, HQ, D], k, v: [B, S, HKV, D] contiguous; lse (base 2) and delta fp32 [B, HQ, T].
    Grid (cdiv(T, 128), B * HQ)."""
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    BM: gl.constexpr = 128
    HALF: gl.constexpr = 64
    # q_base: row 0 of this (batch, head) in q, o, do and dq; stats_base: its row of lse and delta
    i_b, i_h, m0, shift, n_full, n_tiles, q_base, kv_base, stats_base = query_block(T, S, HQ, HKV, D, BM, BN, CAUSAL)
    q_row0 = i_b.to(gl.int64) * T * HQ * D

    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF, D], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D], dtype)
    q_s = gl.allocate_shared_memory(dtype, [2, HALF, D], q_layout)
    do_s = gl.allocate_shared_memory(dtype, [2, HALF, D], q_layout)
    k_s = gl.allocate_shared_memory(dtype, [STAGES, BN, D], kv_layout)
    v_s = gl.allocate_shared_memory(dtype, [STAGES, BN, D], kv_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    # The barriers, as the forward's: key tile t goes to slot t % STAGES in that slot's use u = t // STAGES.
    #   k_ready[s], v_ready[s] (1 arrival + the copy's bytes): phase u completes when use u landed; consumers
    #     wait parity u & 1. The producer refills the slot only after both consumers released use u, so a ready
    #     barrier is never more than one phase ahead of a waiter.
    #   k_empty[s], v_empty[s] (2 arrivals, one a warpgroup: V's once dP is waited on, K's once dQ += dS K is):
    #     the producer, before filling use u, waits parity (u & 1) ^ 1 (a fresh barrier counts the phase of
    #     parity 1 as completed, so use 0 does not wait).
    #   q_bar (1 arrival + Q's and dO's bytes): one phase, waited on with parity 0 by each consumer once.
    # A warpgroup waits on K_t's ready before V_t's and releases V_t before K_t; no warpgroup waits on the other.
    mbarrier.init(q_bar, count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(st), count=1)
        mbarrier.init(v_ready.index(st), count=1)
        mbarrier.init(k_empty.index(st), count=2)   # both consumer warpgroups read every tile
        mbarrier.init(v_empty.index(st), count=2)

    cargs = (o_ptr, dq_ptr, lse_ptr, delta_ptr, q_base, stats_base, m0, T, S, HQ, shift, n_full, n_tiles, scale_log2,
             sm_scale, q_s, do_s, k_s, v_s, q_bar, k_ready, v_ready, k_empty, v_empty)
    largs = (q_ptr, do_ptr, k_ptr, v_ptr, q_row0, i_h, kv_base, m0, T, S, HQ, HKV, n_tiles, q_s, do_s, k_s, v_s, q_bar,
             k_ready, v_ready, k_empty, v_empty)
    gl.warp_specialize([(_consumer0, cargs), (_consumer1, cargs), (_load_partition, largs)], [4, 1],
                       [CONSUMER_REGS, PRODUCER_REGS])


def gluon_dq_and_delta(do, q, k, v, o, lse, causal: bool, softmax_scale: float):
    """`backward.dq_and_delta` as the Gluon kernel: do, q, o [B, T, Hq, D], k, v [B, S, Hkv, D], contiguous,
    bf16 or fp16, D 64 or 128, 16-byte aligned, on a Hopper GPU (what `gluon_backward._check_inputs` accepts;
    not checked again here); lse fp32 [B, Hq, T], base 2. Returns (dq in q's dtype, delta fp32 [B, Hq, T])."""
    B, T, HQ, D = q.shape
    S, HKV = k.shape[1], k.shape[2]
    dq = torch.empty_like(q)
    delta = torch.empty((B, HQ, T), device=q.device, dtype=torch.float32)
    BN, STAGES = DQ_TILES[D]
    constexprs = dict(D=D, BN=BN, STAGES=STAGES, CAUSAL=bool(causal), CONSUMER_REGS=WS_CONSUMER_REGS,
                      PRODUCER_REGS=WS_PRODUCER_REGS)
    launch_direct(attn_bwd_dq_ws_kernel, (cdiv(T, BM), B * HQ),
                  ("gluon_bwd_dq", q.device.index, q.dtype, D, bool(causal)),
                  (q, k, v, o, do, dq, lse, delta, softmax_scale * LOG2E, softmax_scale, T, S, HQ, HKV), constexprs,
                  aligned=True, num_warps=4, maxnreg=WS_MAXNREG)   # the caller checked the addresses
    return dq, delta


__all__ = ["gluon_dq_and_delta", "attn_bwd_dq_ws_kernel", "DQ_TILES", "BM", "WS_MAXNREG", "WS_CONSUMER_REGS",
           "WS_PRODUCER_REGS"]
