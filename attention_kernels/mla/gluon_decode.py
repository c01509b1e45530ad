"""MLA decode for Hopper (sm_90a) in Gluon, Triton's explicit dialect: warpgroups, mbarriers and TMA by hand.

Shapes (DeepSeek-V3 absorbed form, one query token):
    q             bf16 [B, 1, H, 576]   per head: 512 latent dims, then 64 RoPE dims; H % 64 == 0
    kv_cache      bf16 [B, T_max, 576]  key = the whole row, value = its first 512 columns; or paged (PAGED):
                  bf16 [num_blocks, 64, 576] with block_table int32 [B, max_blocks], FlashMLA's layout
    cache_seqlens int32 [B]             positions >= seqlen are never read (they may hold NaN)
    returns out bf16 [B, 1, H, 512] and lse fp32 [B, H, 1] (natural log)

The design follows FlashMLA: one CTA per (64-head block, slice of the sequence, batch element), three
partitions. Large batches take whole sequences (one slice); small ones cut each sequence into slices
(split-KV) whose partial results `decode.py` merges with its combine kernel.
  * A 1-warp producer issues every copy with TMA: the query block once (72 KB, resident in shared memory)
    and the cache in tiles of 64 positions into a ring of two slots (2 x 72 KB). A slot is three regions,
    each with its own pair of barriers: value half 0 (latent columns 0-255), value half 1 (256-511) and the
    64 RoPE columns. Each region is refilled as soon as its own last reader is done, not the whole slot at
    once: with two slots, the time from a slot's release to its next tile's scores bounds the loop.
  * Two 4-warp consumer warpgroups take the tiles in pairs (2k, 2k + 1): warpgroup 0 scores the first,
    warpgroup 1 the second (wgmma, Q and K read from shared memory, so Q is read once per tile, not once
    per half tile), each with the online softmax in base 2.
  * The output accumulator, 64 x 512 fp32, is split by columns: warpgroup w owns O[:, 256w : 256w+256]
    (128 registers a thread) and adds every tile's P V[:, its half]. V is the first 512 columns of the same
    ring slot: no second copy.
  * A whole sequence's output leaves through the copy engine too: each warpgroup writes its half of O / l, in
    bf16, into the query block's buffer (no score reads it any more), and the copy warp stores the 64 x 512
    block with TMA. Stored straight from the accumulator layout, each thread's 64 narrow stores kept the
    CTA on the SM, and the next CTA off it, long after the last product (slices' fp32 partials still go
    that way).
The row max is one chain through both warpgroups, handed over once a pair: warpgroup 0 takes its tile's
softmax and publishes its max and P; warpgroup 1's softmax starts from that max, so its max is the pair's,
and it reads warpgroup 0's P into registers and hands back its own P with the pair's max through the same
shared buffer. Each warpgroup multiplies both tiles of a pair with P from registers (warpgroup 1 first brings
warpgroup 0's P to the pair's max), so at the end of each pair both halves of O and both row sums refer to
the same max; the two row sums are added at the end. Every warpgroup issues the scores of its tile before it
waits for the other, so the scores run while the other warpgroup does its softmax.
Each slice gets its own TMA descriptor, made on the device with the slice's rows of the sequence: the copy engine
zero-fills rows past the sequence, so padding (even NaN) never reaches the value product, and the scores
of those rows are set to -inf. A paged cache changes only the copy warp: the kernel's tile is 64 positions,
so one tile is one page; the cache is one descriptor over all num_blocks * 64 rows, each tile's first row
is block_table[b, page] * 64, and a sequence's last page, when the sequence ends inside it, gets a
descriptor of its own that stops at the sequence's end, so that page's unused slots are zero-filled too.
(The descriptors need a little global scratch per CTA, which the launch lends from PyTorch's allocator:
`attention_kernels.launch.launch_direct`.)

Gluon/ptxas constraints this code works around (see the comments at each place):
  * no wgmma may be in flight across a loop back edge or the end of an `if`: ptxas copies the
    accumulator registers there and then serializes every wgmma in the kernel (C7514/C7515);
  * shared buffers handed to wgmma are indexed by an opaque zero (`gluon_helpers.opaque_zero`), or LLVM hoists all
    per-k-step wgmma descriptors out of the loop and ptxas spills them;
  * constexprs do not survive gl.warp_specialize's argument tuples: partitions read sizes off the
    buffers' static shapes.
`scripts/mla_gluon_compile.py` compiles it for sm_90a without a GPU and checks the first two.
The kernel and its launch only: `interface.py` checks the inputs, `planning.py` decides when it applies.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..gluon_helpers import opaque_zero
from ..launch import LN2, LOG2E, aligned16, launch_direct

D_QK, D_V = 576, 512
D_PE = D_QK - D_V
BLOCK_H = 64                 # heads per CTA: one wgmma M of 64 rows per warpgroup
_LN2 = gl.constexpr(LN2)     # a kernel reads a module-level number only as a constexpr
# Cache tile and ring: 64 positions x 2 slots fit in 227 KB next to the 72 KB query block. Measured on the
# H200 against 32 positions x 4 slots: 0.546 against 0.596 ms at B=128, T=8K (notes/TUNING.md).
BN, STAGES = 64, 2
# The kernel runs 4 + 4 + 1 warps as three partitions (384 threads). At maxnreg 168 the register file holds
# 3 x 168 = 504 registers per thread slot; the producer drops to 24 (setmaxnreg), which leaves 240 for
# each consumer warpgroup: 128 for its half of O, 32 for S, the rest for P, softmax state, addresses.
WS_MAXNREG = 168
WS_CONSUMER_REGS = 240


# ----------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------
@gluon.jit
def _q_descs(q_ptr, q_row0, BM: gl.constexpr, D_V: gl.constexpr, D_PE: gl.constexpr, qn_layout: gl.constexpr,
             qp_layout: gl.constexpr):
    """The query block's two TMA descriptors, a 512-wide and a 64-wide part (block shapes must be powers of
    two; 576 is not)."""
    D: gl.constexpr = D_V + D_PE
    q_base = q_ptr + q_row0.to(gl.int64) * D
    qn = tma.make_tensor_descriptor(q_base, shape=[BM, D], strides=[D, 1], block_shape=[BM, D_V], layout=qn_layout)
    qp = tma.make_tensor_descriptor(q_base, shape=[BM, D], strides=[D, 1], block_shape=[BM, D_PE], layout=qp_layout)
    return qn, qp


@gluon.jit
def _rows_descs(base, rows, stride_kt, BN: gl.constexpr, D_V: gl.constexpr, D_PE: gl.constexpr,
                nope_layout: gl.constexpr, pe_layout: gl.constexpr):
    """Cache rows base ... base + rows as a 256-wide descriptor (a half of the latent columns: the tile is
    copied region by region) and a 64-wide one: the copy engine zero-fills every row of a tile at or past
    `rows`, so nothing past them is read."""
    D: gl.constexpr = D_V + D_PE
    kn = tma.make_tensor_descriptor(base, shape=[rows, D], strides=[stride_kt, 1], block_shape=[BN, D_V // 2],
                                    layout=nope_layout)
    kp = tma.make_tensor_descriptor(base, shape=[rows, D], strides=[stride_kt, 1], block_shape=[BN, D_PE],
                                    layout=pe_layout)
    return kn, kp


@gluon.jit
def _slice_descs(kv_ptr, b, start, n_valid, t_max, stride_kb, stride_kt, BN: gl.constexpr, D_V: gl.constexpr,
                 D_PE: gl.constexpr, nope_layout: gl.constexpr, pe_layout: gl.constexpr):
    """This CTA's slice of a contiguous cache as two TMA descriptors: they start at its first position `start`
    and hold its n_valid rows, so the copy engine zero-fills rows past the sequence instead of reading the
    padding or the next sequence."""
    kv_base = kv_ptr + b.to(gl.int64) * stride_kb + start.to(gl.int64) * stride_kt
    # A zero-row descriptor is invalid (with nothing to read no tile is loaded anyway); a seqlen past T_max
    # is outside the contract, but the clamp keeps the copies inside this sequence's rows of the cache.
    rows = gl.minimum(gl.maximum(n_valid, 1), gl.maximum(t_max - start, 1))
    return _rows_descs(kv_base, rows, stride_kt, BN, D_V, D_PE, nope_layout, pe_layout)


@gluon.jit
def _load_q(q_ptr, q_row0, q_nope_s, q_pe_s, q_bar):
    """Start the copy of this CTA's query block (64 heads x 576); q_bar flips when it has landed. Each CTA
    makes its descriptors on the device, and each one costs a round trip through global memory (written,
    then fenced for the copy engine): the query's are made first, so that its copy overlaps the making of
    the cache's."""
    BM: gl.constexpr = q_nope_s.shape[1]
    D_V: gl.constexpr = q_nope_s.shape[2]
    D_PE: gl.constexpr = q_pe_s.shape[2]
    qn_layout: gl.constexpr = q_nope_s.layout
    qp_layout: gl.constexpr = q_pe_s.layout
    qn, qp = _q_descs(q_ptr, q_row0, BM, D_V, D_PE, qn_layout, qp_layout)
    mbarrier.expect(q_bar, BM * (D_V + D_PE) * 2)
    tma.async_copy_global_to_shared(qn, [0, 0], q_bar, q_nope_s.index(0))
    tma.async_copy_global_to_shared(qp, [0, D_V], q_bar, q_pe_s.index(0))


@gluon.jit
def _copy_region(desc, row, col, dst, ready, empty, r, t, STAGES: gl.constexpr, NBYTES: gl.constexpr):
    """Region r of tile t: wait until its slot's previous tile released it, then copy it in."""
    i = (t % STAGES) * 3 + r
    mbarrier.wait(empty.index(i), ((t // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(i), NBYTES)   # rows past the sequence are zero-filled and still counted
    tma.async_copy_global_to_shared(desc, [row, col], ready.index(i), dst)


@gluon.jit
def _load_kv_tile(kn, kp, row, kv_nope_s, kv_pe_s, ready, empty, t, BN: gl.constexpr, STAGES: gl.constexpr,
                  D_V: gl.constexpr, D_PE: gl.constexpr):
    """Copy cache tile t (BN rows x 576, from cache row `row` of the
    descriptors) into ring slot t % STAGES as three regions with a barrier
    pair each: value half 0 (latent columns 0-255, region 0), half 1 (region
    1) and the RoPE columns (region 2). Each is refilled as soon as its last
    reader of tile t - STAGES is done: the RoPE columns after that tile's
    scores, half h after warpgroup h's value product. They are copied in the
    order they free up: RoPE, then the half of warpgroup t % 2 (which scores
    tile t, scored tile t - 2 too and multiplied its own half of that tile
    first), then the other half."""
    st = t % STAGES
    HALF: gl.constexpr = D_V // 2
    half0 = kv_nope_s.index(st).slice(0, HALF, dim=1)
    half1 = kv_nope_s.index(st).slice(HALF, HALF, dim=1)
    _copy_region(kp, row, D_V, kv_pe_s.index(st), ready, empty, 2, t, STAGES, BN * D_PE * 2)
    if t % 2 == 0:
        _copy_region(kn, row, 0, half0, ready, empty, 0, t, STAGES, BN * HALF * 2)
        _copy_region(kn, row, HALF, half1, ready, empty, 1, t, STAGES, BN * HALF * 2)
    else:
        _copy_region(kn, row, HALF, half1, ready, empty, 1, t, STAGES, BN * HALF * 2)
        _copy_region(kn, row, 0, half0, ready, empty, 0, t, STAGES, BN * HALF * 2)


@gluon.jit
def _lse2(m_i, l_tot):
    """log2 of the row sums against the max m_i (attention_kernels.tl_helpers.log2_sum_exp2, written again: a Gluon kernel
    cannot call a triton.jit function). A row that saw nothing: -inf; one that saw a NaN score: NaN (never
    -inf, which reads as "saw nothing"); a +inf score: +inf."""
    safe = gl.where(l_tot > 0, l_tot, 1.0)
    lse = gl.where(l_tot > 0, m_i + gl.log2(safe), gl.where(l_tot == 0, float("-inf"), float("nan")))
    return gl.where(m_i == float("inf"), float("inf"), lse)


@gluon.jit
def _normalized(acc, l_tot, o_layout: gl.constexpr):
    """O / l row by row (a row that saw nothing, l = 0, stays 0)."""
    l_o = gl.convert_layout(l_tot, gl.SliceLayout(1, o_layout))
    return acc / gl.expand_dims(gl.where(l_o > 0, l_o, 1.0), 1)


@gluon.jit
def _store_partial(ws_o_ptr, ws_lse_ptr, acc, m_i, l_tot, row0, col0, split, num_splits, BM: gl.constexpr,
                   BV: gl.constexpr, D_V: gl.constexpr, o_layout: gl.constexpr, row_s: gl.constexpr,
                   WRITE_LSE: gl.constexpr):
    """One slice's result as `_mla_combine_kernel` reads it: columns col0 ... col0 + BV of acc / l, fp32, into
    ws_o [B * H, num_splits, 512] at slice `split`, and lse in base 2 (`_lse2`) into ws_lse [B * H, num_splits].
    A row that saw nothing: 0 and -inf."""
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    out = _normalized(acc, l_tot, o_layout)
    rows = ((row0 + gl.arange(0, BM, layout=row_o)).to(gl.int64) * num_splits + split) * D_V
    cols = col0 + gl.arange(0, BV, layout=col_o)
    gl.store(ws_o_ptr + gl.expand_dims(rows, 1) + gl.expand_dims(cols, 0), out)
    if WRITE_LSE:
        gl.store(ws_lse_ptr + (row0 + gl.arange(0, BM, layout=row_s)) * num_splits + split, _lse2(m_i, l_tot))


@gluon.jit
def _copy_out(o_ptr, row0, q_nope_s, o_staged):
    """The copy warp's last step (whole sequences): once both consumer warpgroups have written their halves of
    the output, in bf16, into the query block's buffer (free once every score is done), copy it out with TMA
    as one 64 x 512 block: a few bulk copies instead of each consumer thread's 64 narrow stores."""
    BM: gl.constexpr = q_nope_s.shape[1]
    D_V: gl.constexpr = q_nope_s.shape[2]
    od = tma.make_tensor_descriptor(o_ptr + row0.to(gl.int64) * D_V, shape=[BM, D_V], strides=[D_V, 1],
                                    block_shape=[BM, D_V], layout=q_nope_s.layout)
    mbarrier.wait(o_staged, 0)
    tma.async_copy_shared_to_global(od, [0, 0], q_nope_s.index(0))
    tma.store_wait(0)


@gluon.jit
def _stage_out(q_nope_s, lse_ptr, acc, m_i, l_tot, row0, o_staged, WG: gl.constexpr, o_layout: gl.constexpr,
               row_s: gl.constexpr):
    """Warpgroup WG's half of the whole sequence's output, O / l in bf16, into its columns of the query block's
    buffer for the copy warp's TMA store (`_copy_out`); warpgroup 0 also stores lse (natural log)."""
    BM: gl.constexpr = q_nope_s.shape[1]
    BV: gl.constexpr = q_nope_s.shape[2] // 2
    q_nope_s.index(0).slice(WG * BV, BV, dim=1).store(_normalized(acc, l_tot, o_layout).to(gl.bfloat16))
    fence_async_shared()       # the generic-proxy writes, before the copy engine reads them
    gl.thread_barrier()        # every thread's part, before the one arrival
    mbarrier.arrive(o_staged, count=1)
    if WG == 0:
        gl.store(lse_ptr + row0 + gl.arange(0, BM, layout=row_s), _lse2(m_i, l_tot) * _LN2)


# ----------------------------------------------------------------------------------------------------------
# The partitions: producer warp, two ping-pong consumer warpgroups (gl.warp_specialize)
# ----------------------------------------------------------------------------------------------------------
@gluon.jit
def _ws_load_partition(q_ptr, kv_ptr, o_ptr, num_splits, q_row0, b, start, n_valid, n_tiles, t_max, stride_kb,
                       stride_kt, q_nope_s, q_pe_s, kv_nope_s, kv_pe_s, q_bar, kv_ready, kv_empty, o_staged):
    """1 warp: the query block once, then every cache tile, region by region,
    each as soon as it is free; last, a whole sequence's output
    (`_copy_out`)."""
    STAGES: gl.constexpr = kv_nope_s.shape[0]
    BN: gl.constexpr = kv_nope_s.shape[1]
    D_V: gl.constexpr = kv_nope_s.shape[2]
    D_PE: gl.constexpr = kv_pe_s.shape[2]
    _load_q(q_ptr, q_row0, q_nope_s, q_pe_s, q_bar)
    kn_layout: gl.constexpr = kv_nope_s.layout
    kp_layout: gl.constexpr = kv_pe_s.layout
    kn, kp = _slice_descs(kv_ptr, b, start, n_valid, t_max, stride_kb, stride_kt, BN, D_V, D_PE, kn_layout, kp_layout)
    for t in range(n_tiles):
        # (A fresh mbarrier counts as having completed the phase before phase
        # 0: the first lap passes at once.)
        _load_kv_tile(kn, kp, t * BN, kv_nope_s, kv_pe_s, kv_ready, kv_empty, t, BN, STAGES, D_V, D_PE)
    if num_splits == 1:
        _copy_out(o_ptr, q_row0, q_nope_s, o_staged)


@gluon.jit
def _ws_load_partition_paged(q_ptr, kv_ptr, bt_ptr, o_ptr, num_splits, q_row0, b, start, n_valid, n_tiles, n_rows,
                             stride_bt, stride_kt, q_nope_s, q_pe_s, kv_nope_s, kv_pe_s, q_bar, kv_ready, kv_empty,
                             o_staged):
    """1 warp, paged cache (pages of BN positions, so one tile is one page):
    the query block once, then every page of this CTA's slice, its row found
    in the block table, region by region as in `_load_kv_tile`; last, a whole
    sequence's output (`_copy_out`).

    The cache is read as one matrix of n_rows = num_blocks * BN rows; tile t
    is the BN rows from block_table[b, start // BN + t] * BN on. A sequence
    that ends mid-page ends in its last tile: that tile is copied through
    descriptors of its own, bounded at the sequence's last row, so the copy
    engine zero-fills the rest of the page (whatever the unused slots hold,
    NaN included, never reaches P V)."""
    STAGES: gl.constexpr = kv_nope_s.shape[0]
    BN: gl.constexpr = kv_nope_s.shape[1]
    D_V: gl.constexpr = kv_nope_s.shape[2]
    D_PE: gl.constexpr = kv_pe_s.shape[2]
    kn_layout: gl.constexpr = kv_nope_s.layout
    kp_layout: gl.constexpr = kv_pe_s.layout
    _load_q(q_ptr, q_row0, q_nope_s, q_pe_s, q_bar)
    kn, kp = _rows_descs(kv_ptr, n_rows, stride_kt, BN, D_V, D_PE, kn_layout, kp_layout)   # the whole cache
    bt_row = bt_ptr + b.to(gl.int64) * stride_bt + start // BN   # this slice's first page
    tail = gl.minimum(n_valid - (n_tiles - 1) * BN, BN)           # valid rows of the last tile (BN: whole)
    for t in range(n_tiles):
        # The page index is loaded before the waits for free regions, so its
        # latency hides behind them.
        page = gl.load(bt_row + t)
        if (t == n_tiles - 1) & (tail < BN):
            # The sequence ends inside this page: descriptors of its own,
            # bounded at the sequence's last row. Made here, before the
            # waits, the making overlaps the tiles still being worked on.
            tn, tp = _rows_descs(kv_ptr + page.to(gl.int64) * BN * stride_kt, tail, stride_kt, BN, D_V, D_PE,
                                 kn_layout, kp_layout)
            _load_kv_tile(tn, tp, 0, kv_nope_s, kv_pe_s, kv_ready, kv_empty, t, BN, STAGES, D_V, D_PE)
        else:
            _load_kv_tile(kn, kp, page * BN, kv_nope_s, kv_pe_s, kv_ready, kv_empty, t, BN, STAGES, D_V, D_PE)
    if num_splits == 1:
        _copy_out(o_ptr, q_row0, q_nope_s, o_staged)


@gluon.jit
def _v_half(kv_nope_s, t, h: gl.constexpr, STAGES: gl.constexpr):
    """Value half h (latent columns 256h to 256h + 255) of ring tile t, as wgmma's B operand (the slot indexed
    through `opaque_zero`)."""
    BV: gl.constexpr = kv_nope_s.shape[2] // 2
    return kv_nope_s.index(t % STAGES + opaque_zero(t)).slice(h * BV, BV, dim=1)


@gluon.jit
def _release(kv_empty, t, r: gl.constexpr, STAGES: gl.constexpr):
    """Region r of ring tile t has been read for the last time: the copy warp may refill it."""
    mbarrier.arrive(kv_empty.index((t % STAGES) * 3 + r), count=1)


@gluon.jit
def _ws_issue_scores(q_nope_s, q_pe_s, kv_nope_s, kv_pe_s, kv_ready, t, s_zero, WG: gl.constexpr,
                     STAGES: gl.constexpr):
    """S = Q K^T for own tile t (t % 2 == WG), as three async wgmma groups, each once its region of the tile
    has landed, in the order they are copied: the 64 RoPE columns, this warpgroup's latent half, the other's."""
    HALF: gl.constexpr = kv_nope_s.shape[2] // 2
    st = t % STAGES
    phase = (t // STAGES) & 1
    qz = opaque_zero(t)
    ks = st + qz
    mbarrier.wait(kv_ready.index(st * 3 + 2), phase)
    s_acc = warpgroup_mma(q_pe_s.index(qz), kv_pe_s.index(ks).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
    mbarrier.wait(kv_ready.index(st * 3 + WG), phase)
    s_acc = warpgroup_mma(q_nope_s.index(qz).slice(WG * HALF, HALF, dim=1),
                          kv_nope_s.index(ks).slice(WG * HALF, HALF, dim=1).permute((1, 0)), s_acc, is_async=True)
    mbarrier.wait(kv_ready.index(st * 3 + 1 - WG), phase)
    s_acc = warpgroup_mma(q_nope_s.index(qz).slice((1 - WG) * HALF, HALF, dim=1),
                          kv_nope_s.index(ks).slice((1 - WG) * HALF, HALF, dim=1).permute((1, 0)), s_acc,
                          is_async=True)
    return s_acc


@gluon.jit
def _ws_scores(q_nope_s, q_pe_s, kv_nope_s, kv_pe_s, kv_ready, kv_empty, t, s_zero, WG: gl.constexpr,
               STAGES: gl.constexpr):
    """Own tile t's scores, complete, and its RoPE columns released: only S reads them."""
    s_acc = _ws_issue_scores(q_nope_s, q_pe_s, kv_nope_s, kv_pe_s, kv_ready, t, s_zero, WG, STAGES)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s_acc, ))
    _release(kv_empty, t, 2, STAGES)
    return s


@gluon.jit
def _ws_softmax(s, t, n_valid, m_prev, scale_log2, BN: gl.constexpr, s_layout: gl.constexpr):
    """Tile t's max along the chain (m_prev covers every earlier tile) and its P in bf16, with its row sum."""
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    cols = t * BN + gl.arange(0, BN, layout=col_s)
    s = gl.where(gl.expand_dims(cols < n_valid, 0), s, float("-inf"))  # rows past the end were zero-filled
    m_t = gl.maximum(m_prev, gl.max(s, axis=1) * scale_log2)          # finite: column 0 of a tile is valid
    p = gl.exp2(s * scale_log2 - gl.expand_dims(m_t, 1))
    return p.to(gl.bfloat16), m_t, gl.sum(p, axis=1)


@gluon.jit
def _ws_scale(acc, f, row_o: gl.constexpr):
    """O (finished: no product of it in flight) times a per-row factor."""
    return acc * gl.expand_dims(gl.convert_layout(f, row_o), 1)


@gluon.jit
def _ws_scale_p(p, f):
    """P (bf16) times a per-row factor, in bf16 pairs."""
    c, p = gl.broadcast(gl.expand_dims(f.to(gl.bfloat16), 1), p)
    return gl.inline_asm_elementwise("mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", [p, c], dtype=gl.bfloat16,
                                     is_pure=True, pack=2)


@gluon.jit
def _ws_pv(acc, p, v, p_layout: gl.constexpr):
    """Issue O += P V (async), P from registers (the accumulator layout of S converts to wgmma's A operand)."""
    return warpgroup_mma(gl.convert_layout(p, p_layout), v, acc, is_async=True)


@gluon.jit
def _ws_hand(p, m, p_s, m_s, pub, i: gl.constexpr):
    """Publish P (bf16) and its max through shared memory, then arrive on pub[i]."""
    p_s.index(0).store(p)
    m_s.index(i).store(m)
    mbarrier.arrive(pub.index(i), count=1)


@gluon.jit
def _ws_take(p_s, m_s, pub, i: gl.constexpr, phase, s_layout: gl.constexpr, row_s: gl.constexpr):
    """Wait on pub[i] and read the P and max published with it into registers; the buffer is then free."""
    mbarrier.wait(pub.index(i), phase)
    p = p_s.index(0).load(s_layout)
    m = m_s.index(i).load(row_s)
    gl.thread_barrier()
    return p, m


@gluon.jit
def _ws_add_taken(acc, m_i, p_s, m_s, pub, i: gl.constexpr, phase, kv_nope_s, t, h: gl.constexpr,
                  STAGES: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr, row_s: gl.constexpr,
                  row_o: gl.constexpr):
    """The other warpgroup's P of tile t, taken with its max from pub[i]: O brought to that max, then
    O += P V_t[:, half h], finished. Returns O, the max it now refers to, and the factor the row sum needs too."""
    p, m = _ws_take(p_s, m_s, pub, i, phase, s_layout, row_s)
    f = gl.exp2(m_i - m)
    acc = _ws_pv(_ws_scale(acc, f, row_o), p, _v_half(kv_nope_s, t, h, STAGES), p_layout)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    return acc, m, f


@gluon.jit
def _ws_first_of_pair(acc, m_i, l_i, s, t, n_tiles, n_valid, scale_log2, p_s, m_s, kv_nope_s, kv_empty, pub,
                      STAGES: gl.constexpr, BN: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
                      row_s: gl.constexpr, row_o: gl.constexpr):
    """Warpgroup 0's part of the pair of tiles t (its own, t even) and u = t
    + 1: the softmax of tile t from the max so far, that max and P handed to
    warpgroup 1, O += P_t V_t; then P_u, taken with the pair's max, and O +=
    P_u V_u, O rescaled to each new max first. The pair's hand-overs are in
    phase (t // 2) & 1. Returns O, the max it refers to and the row sum of
    own tiles."""
    p, m_t, rs = _ws_softmax(s, t, n_valid, m_i, scale_log2, BN, s_layout)
    m_s.index(0).store(m_t)
    mbarrier.arrive(pub.index(2), count=1)     # the max first: warpgroup 1's softmax needs nothing else
    p_s.index(0).store(p)
    mbarrier.arrive(pub.index(0), count=1)
    alpha = gl.exp2(m_i - m_t)
    l_i = l_i * alpha + rs
    acc = _ws_pv(_ws_scale(acc, alpha, row_o), p, _v_half(kv_nope_s, t, 0, STAGES), p_layout)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    _release(kv_empty, t, 0, STAGES)   # half 0 of tile t: its last reader
    m_i = m_t
    if t + 1 < n_tiles:   # warpgroup 1's P, against the pair's max
        acc, m_i, beta = _ws_add_taken(acc, m_i, p_s, m_s, pub, 1, (t // 2) & 1, kv_nope_s, t + 1, 0, STAGES,
                                       s_layout, p_layout, row_s, row_o)
        _release(kv_empty, t + 1, 0, STAGES)
        l_i = l_i * beta
    return acc, m_i, l_i


@gluon.jit
def _ws_second_of_pair(acc, m_i, l_i, s, t, n_valid, scale_log2, p_s, m_s, kv_nope_s, kv_empty, pub,
                       STAGES: gl.constexpr, BN: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
                       row_s: gl.constexpr, row_o: gl.constexpr):
    """Warpgroup 1's part of the pair of tiles u = t - 1 and t (its own, t
    odd): the softmax of tile t from warpgroup 0's max, which makes its max
    the pair's; P_u read, P_t and the pair's max handed back in the same
    buffer; then O += P_u V_u (P_u brought to the pair's max here, in
    registers) and O += P_t V_t, the older tile first, so that its half of
    the ring slot is released first."""
    u = t - 1
    mbarrier.wait(pub.index(2), (t // 2) & 1)
    m_u = m_s.index(0).load(row_s)
    p, m_t, rs = _ws_softmax(s, t, n_valid, m_u, scale_log2, BN, s_layout)
    p_u, _ = _ws_take(p_s, m_s, pub, 0, (t // 2) & 1, s_layout, row_s)   # against m_u
    _ws_hand(p, m_t, p_s, m_s, pub, 1)
    alpha = gl.exp2(m_i - m_t)
    l_i = l_i * alpha + rs
    p_u = _ws_scale_p(p_u, gl.exp2(m_u - m_t))
    acc = _ws_pv(_ws_scale(acc, alpha, row_o), p_u, _v_half(kv_nope_s, u, 1, STAGES), p_layout)
    acc = _ws_pv(acc, p, _v_half(kv_nope_s, t, 1, STAGES), p_layout)
    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
    _release(kv_empty, u, 1, STAGES)   # half 1 of tile u: its last reader
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    _release(kv_empty, t, 1, STAGES)
    return acc, m_t, l_i


@gluon.jit
def _ws_consumer(WG: gl.constexpr, lse_ptr, ws_o_ptr, ws_lse_ptr, split, num_splits, row0, n_valid, n_tiles,
                 scale_log2, q_nope_s, q_pe_s, kv_nope_s, kv_pe_s, p_s, m_s, l_s, q_bar, kv_ready, kv_empty, pub, fin,
                 o_staged):
    """One consumer warpgroup: tiles in pairs (2k, 2k + 1), warpgroup WG
    scoring tile 2k + WG and adding both tiles' P V to its half WG of the
    output columns. Each warpgroup issues its own tile's scores before it
    waits for the other, so they run while the other does its softmax.
    pub[0]: warpgroup 0's P; pub[1]: warpgroup 1's P and the pair's max;
    pub[2]: warpgroup 0's max."""
    BM: gl.constexpr = q_nope_s.shape[1]
    STAGES: gl.constexpr = kv_nope_s.shape[0]
    BN: gl.constexpr = kv_nope_s.shape[1]
    D_V: gl.constexpr = kv_nope_s.shape[2]
    BV: gl.constexpr = D_V // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BV, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    acc = gl.zeros([BM, BV], gl.float32, o_layout)
    m_i = gl.full([BM], float("-inf"), gl.float32, row_s)   # the max O and l are kept against
    l_i = gl.zeros([BM], gl.float32, row_s)                 # row sum of own tiles' P
    s_zero = gl.zeros([BM, BN], gl.float32, s_layout)
    mbarrier.wait(q_bar, 0)

    for k in range((n_tiles + 1 - WG) // 2):
        t = 2 * k + WG          # own tile
        s = _ws_scores(q_nope_s, q_pe_s, kv_nope_s, kv_pe_s, kv_ready, kv_empty, t, s_zero, WG, STAGES)
        if WG == 0:
            acc, m_i, l_i = _ws_first_of_pair(acc, m_i, l_i, s, t, n_tiles, n_valid, scale_log2, p_s, m_s,
                                              kv_nope_s, kv_empty, pub, STAGES, BN, s_layout, p_layout, row_s, row_o)
        else:
            acc, m_i, l_i = _ws_second_of_pair(acc, m_i, l_i, s, t, n_valid, scale_log2, p_s, m_s, kv_nope_s,
                                               kv_empty, pub, STAGES, BN, s_layout, p_layout, row_s, row_o)
    if WG == 1:
        if n_tiles % 2 == 1:
            # An odd count: the last tile is warpgroup 0's alone, handed over
            # with its max.
            last = n_tiles - 1
            acc, m_i, alpha = _ws_add_taken(acc, m_i, p_s, m_s, pub, 0, (last // 2) & 1, kv_nope_s, last, 1,
                                            STAGES, s_layout, p_layout, row_s, row_o)
            l_i = l_i * alpha

    # Both halves now refer to the same max (the last tile's); the row sum is
    # the two partial sums.
    l_s.index(WG).store(l_i)
    mbarrier.arrive(fin, count=1)
    mbarrier.wait(fin, 0)
    l_tot = l_i + l_s.index(1 - WG).load(row_s)
    if num_splits > 1:
        _store_partial(ws_o_ptr, ws_lse_ptr, acc, m_i, l_tot, row0, WG * BV, split, num_splits, BM, BV, D_V,
                       o_layout, row_s, WG == 0)
    else:
        _stage_out(q_nope_s, lse_ptr, acc, m_i, l_tot, row0, o_staged, WG, o_layout, row_s)


# One entry point per warpgroup: gl.warp_specialize cannot pass the constexpr WG, so each binds its own.
@gluon.jit
def _ws_consumer1(lse_ptr, ws_o_ptr, ws_lse_ptr, split, num_splits, row0, n_valid, n_tiles, scale_log2,
                  q_nope_s, q_pe_s, kv_nope_s, kv_pe_s, p_s, m_s, l_s, q_bar, kv_ready, kv_empty, pub, fin, o_staged):
    _ws_consumer(1, lse_ptr, ws_o_ptr, ws_lse_ptr, split, num_splits, row0, n_valid, n_tiles, scale_log2,
                 q_nope_s, q_pe_s, kv_nope_s, kv_pe_s, p_s, m_s, l_s, q_bar, kv_ready, kv_empty, pub, fin, o_staged)


@gluon.jit
def _ws_consumer0(lse_ptr, ws_o_ptr, ws_lse_ptr, split, num_splits, row0, n_valid, n_tiles, scale_log2,
                  q_nope_s, q_pe_s, kv_nope_s, kv_pe_s, p_s, m_s, l_s, q_bar, kv_ready, kv_empty, pub, fin, o_staged):
    _ws_consumer(0, lse_ptr, ws_o_ptr, ws_lse_ptr, split, num_splits, row0, n_valid, n_tiles, scale_log2,
                 q_nope_s, q_pe_s, kv_nope_s, kv_pe_s, p_s, m_s, l_s, q_bar, kv_ready, kv_empty, pub, fin, o_staged)


# Integer arguments equal to 1 would be specialized into constants, and constants cannot be handed to the
# partitions through gl.warp_specialize (the compiler fails): these may be 1 (a one-slot cache, no split, a
# one-column block table). Specializing none of them also lets a launch skip Triton's dispatcher (launch_gluon).
@gluon.jit(do_not_specialize=["t_max", "stride_kb", "stride_kt", "stride_bt", "num_splits"])
def _mla_decode_ws_kernel(q_ptr, kv_ptr, seqlens_ptr, bt_ptr, o_ptr, lse_ptr, ws_o_ptr, ws_lse_ptr, scale_log2, t_max,
                          stride_kb, stride_kt, stride_bt, num_splits, H: gl.constexpr, BN: gl.constexpr,
                          STAGES: gl.constexpr, D_V: gl.constexpr, D_PE: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                          PAGED: gl.constexpr, num_warps: gl.constexpr):
    """Dense cache (PAGED False): kv_ptr is [B, t_max, 576] with strides
    stride_kb, stride_kt, 1; bt_ptr and stride_bt are not read. Paged (PAGED
    True, pages of BN positions): kv_ptr is [t_max = num_blocks * BN, 576]
    rows with stride stride_kt, bt_ptr the int32 block table with row stride
    stride_bt."""
    BM: gl.constexpr = 64
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    hb = gl.program_id(0)       # head block varies fastest: the CTAs that read the same cache run together
    split = gl.program_id(1)    # this CTA's slice of the sequence (split-KV), a whole number of tiles
    b = gl.program_id(2)
    seqlen = gl.load(seqlens_ptr + b)
    tiles_per_split = gl.cdiv(gl.cdiv(seqlen, BN), num_splits)
    start = split * tiles_per_split * BN
    n_valid = seqlen - start    # positions of this slice's tiles that hold the sequence (<= 0: none)
    n_tiles = gl.maximum(gl.minimum(tiles_per_split, gl.cdiv(n_valid, BN)), 0)
    row0 = b * H + hb * BM      # row of q / out viewed as [B * H, ...] (s_q = 1); also the lse index

    nope_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D_V], gl.bfloat16)
    pe_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, D_PE], gl.bfloat16)
    qn_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D_V], gl.bfloat16)
    qp_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, D_PE], gl.bfloat16)
    p_smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], gl.bfloat16)
    vec_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # rank 1: indexed out of [2, BM]

    q_nope_s = gl.allocate_shared_memory(gl.bfloat16, [1, BM, D_V], qn_layout)    # [1, ...]: see _ws_issue_scores
    q_pe_s = gl.allocate_shared_memory(gl.bfloat16, [1, BM, D_PE], qp_layout)
    kv_nope_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, D_V], nope_layout)
    kv_pe_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, D_PE], pe_layout)
    p_s = gl.allocate_shared_memory(gl.bfloat16, [1, BM, BN], p_smem_layout)  # one P buffer, handed back and forth
    m_s = gl.allocate_shared_memory(gl.float32, [2, BM], vec_layout)         # row max published by each warpgroup
    l_s = gl.allocate_shared_memory(gl.float32, [2, BM], vec_layout)         # final partial row sums

    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES * 3, 1], mbarrier.MBarrierLayout())   # 3 regions a slot
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES * 3, 1], mbarrier.MBarrierLayout())
    pub = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
    fin = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    o_staged = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES * 3):
        mbarrier.init(kv_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=1)     # each region has one last reader
    mbarrier.init(pub.index(0), count=1)
    mbarrier.init(pub.index(1), count=1)
    mbarrier.init(pub.index(2), count=1)
    mbarrier.init(fin, count=2)
    mbarrier.init(o_staged, count=2)   # both warpgroups' halves of the output written

    cargs = (lse_ptr, ws_o_ptr, ws_lse_ptr, split, num_splits, row0, n_valid, n_tiles, scale_log2, q_nope_s,
             q_pe_s, kv_nope_s, kv_pe_s, p_s, m_s, l_s, q_bar, kv_ready, kv_empty, pub, fin, o_staged)
    # The consumers are the same for both caches (rows past the sequence
    # arrive as zeros either way); only the copy warp differs. (A constexpr
    # cannot cross into the partitions: the choice is made here.)
    if PAGED:
        largs = (q_ptr, kv_ptr, bt_ptr, o_ptr, num_splits, row0, b, start, n_valid, n_tiles, t_max, stride_bt,
                 stride_kt, q_nope_s, q_pe_s, kv_nope_s, kv_pe_s, q_bar, kv_ready, kv_empty, o_staged)
        gl.warp_specialize([(_ws_consumer0, cargs), (_ws_consumer1, cargs), (_ws_load_partition_paged, largs)],
                           [4, 1], [CONSUMER_REGS, 24])
    else:
        largs = (q_ptr, kv_ptr, o_ptr, num_splits, row0, b, start, n_valid, n_tiles, t_max, stride_kb, stride_kt,
                 q_nope_s, q_pe_s, kv_nope_s, kv_pe_s, q_bar, kv_ready, kv_empty, o_staged)
        gl.warp_specialize([(_ws_consumer0, cargs), (_ws_consumer1, cargs), (_ws_load_partition, largs)],
                           [4, 1], [CONSUMER_REGS, 24])


# ----------------------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------------------
def launch_gluon(q, kv_cache, block_table, cache_seqlens, softmax_scale, out, lse, ws_o=None, ws_lse=None,
                 num_splits=1):
    """The kernel launch alone, for inputs `interface.py` has checked (FlashMLA's argument order, then the
    outputs and the workspace): q bf16 [B, 1, H, 576] dense, H % 64 == 0;
    cache_seqlens int32 [B] dense; kv_cache bf16 with TMA-ready rows, either [B, T_max, 576] (block_table None)
    or pages [num_blocks, 64, 576] stored back to back (stride(0) == 64 * stride(1)) with block_table int32
    [B, max_blocks], rows unit-stride; out bf16 [B, 1, H, 512] and lse fp32 [B, H, 1] fresh and dense (a whole
    sequence's output is stored by TMA, from out's address on). With num_splits > 1 it writes partial results
    to ws_o fp32 [B * H, num_splits, 512] and ws_lse fp32 [B * H, num_splits] (base 2), which
    `decode.launch_combine` merges into out and lse. Returns `attention_kernels.launch.launch_direct`'s result (the launch,
    to be made again)."""
    B, _, H, _ = q.shape
    if num_splits == 1:  # not read, but their pointer types are compiled in: fp32, as the workspace's
        ws_o, ws_lse = lse, lse
    paged = block_table is not None
    if paged:  # the cache as num_blocks * 64 rows; the block table says where each sequence's pages are
        bt, t_max, stride_bt = block_table, kv_cache.shape[0] * BN, block_table.stride(0)
    else:      # (the block table pointer is not read: any int32 tensor will do)
        bt, t_max, stride_bt = cache_seqlens, kv_cache.shape[1], 0
    args = (q, kv_cache, cache_seqlens, bt, out, lse, ws_o, ws_lse, softmax_scale * LOG2E, t_max, kv_cache.stride(0),
            kv_cache.stride(1), stride_bt, num_splits)
    grid = (H // BLOCK_H, num_splits, B)
    # The kernel specializes on its constexprs and its pointers' dtypes (q's decides them all, once
    # `interface.py` has checked the inputs); every integer argument is do_not_specialize. out, lse and the
    # workspace are fresh allocations and the cache is TMA-ready: the caller's pointers are checked for alignment.
    constexprs = dict(H=H, BN=BN, STAGES=STAGES, D_V=D_V, D_PE=D_PE, CONSUMER_REGS=WS_CONSUMER_REGS, PAGED=paged)
    return launch_direct(_mla_decode_ws_kernel, grid, (q.device.index, H, paged, q.dtype), args, constexprs,
                         aligned=aligned16((q, cache_seqlens, bt)), num_warps=4, maxnreg=WS_MAXNREG)


__all__ = ["launch_gluon"]
