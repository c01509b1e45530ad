"""MLA decode in TileLang: the book's third version of the kernel, for comparison with the Triton and
Gluon ones (`decode.py`, `gluon_decode.py`), in TileLang's tile language.

Two kernels, compiled on first use for each (rows = s_q * H, split or not, dtype); B, the cache's size and the
number of slices are runtime values:
- `_decode_kernel`: one program per (block of 64 query rows, slice of the sequence, batch element). It
  walks its slice in tiles of 64 cache positions through the block table, with an online softmax in fp32:
  S = Q Kᵀ over the 576 key channels (latent 512 + RoPE 64), then P V over the 512 value channels, the
  first 512 channels of the same tile. With one slice (`num_splits=1`) this is the single pass and it
  writes out (bf16) and lse; with more it writes each slice's partial output and base-2 lse (fp32).
- `_merge_kernel`: the log-sum-exp merge of the slices' partials, one program per (row, batch element).

The cache is always read as pages: a paged cache [num_blocks, page, 576] as its rows [num_blocks * page, 576]
with the block table; a dense cache [B, T_max, 576] as B pages of T_max rows each, with the identity table
[[0], [1], ...]. A tile never crosses a page (pages hold a multiple of 64 positions, or, dense, the whole
sequence), so one block-table read gives the tile's first row, and TMA copies the tile whole. On the
sequence's last tile the rows past its end (an unused page slot may hold NaN) are set to 0 in shared
memory before P V reads them: a probability of 0 times NaN would be NaN.

What TileLang makes of it for sm_90a (`scripts/mla_tilelang_compile.py`, no GPU needed): the tile copies
become TMA loads issued by a producer warpgroup it adds (warp specialization, 384 threads), two stages of
72 KB; the three products become wgmma; 168 registers, no spills; about 226 KB of shared memory, so one
program per SM.

TileLang is imported lazily (`attention_kernels.peers.tilelang`): this module imports anywhere, and
`interface.mla_decode_tilelang` says so when TileLang is missing.
"""
# No `from __future__ import annotations`: TileLang reads the kernels' annotations (their shapes) as values.

import torch

from .. import peers
from ..launch import LN2, LOG2E
from .planning import workspace

BH, BN = 64, 64            # query rows per program (wgmma's smallest M), cache positions per tile
THREADS = 256              # two warpgroups: each keeps half of the [64, 512] fp32 accumulator
D_QK, D_V = 576, 512       # the only head dims these kernels are built for (DeepSeek's, FlashMLA's)
DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _decode_kernel(T, rows, split, dtype, d_qk=D_QK, d_v=D_V):
    """The decode kernel for `rows` = s_q * H query rows per batch element;
    `split`: num_splits > 1.

    q [B, rows, d_qk]; kv [n_rows, d_qk] (the cache's rows, pages back to
    back); block_table int32 [B, max_blocks]; seqlens int32 [B]; page: rows
    per page; scale_log2 = softmax_scale * log2(e). Writes o [B, rows,
    num_splits, d_v] and lse fp32 [B, rows, num_splits]: the outputs (o in
    dtype, lse natural log, num_splits = 1) unless split, else every slice's
    partial (o fp32, lse base 2). num_splits is read off o's shape at launch,
    so one compiled kernel serves every split.
    """
    d_pe, f32 = d_qk - d_v, T.float32
    o_dtype, lse_unit = (f32, 1.0) if split else (dtype, LN2)
    B, n_rows, max_blocks = T.dynamic("B"), T.dynamic("n_rows", "int64"), T.dynamic("max_blocks")
    num_splits = T.dynamic("num_splits") if split else 1

    @T.prim_func
    def mla_decode_tilelang(
        q: T.Tensor([B, rows, d_qk], dtype), kv: T.Tensor([n_rows, d_qk], dtype),
        block_table: T.Tensor([B, max_blocks], T.int32), seqlens: T.Tensor([B], T.int32),
        page: T.int32, scale_log2: T.float32,
        o: T.Tensor([B, rows, num_splits, d_v], o_dtype), lse: T.Tensor([B, rows, num_splits], f32),
    ):
        with T.Kernel(T.ceildiv(rows, BH), num_splits, B, threads=THREADS) as (i_h, i_s, i_b):
            q_c, q_pe = T.alloc_shared([BH, d_v], dtype), T.alloc_shared([BH, d_pe], dtype)
            kv_c, kv_pe = T.alloc_shared([BN, d_v], dtype), T.alloc_shared([BN, d_pe], dtype)
            p_shared = T.alloc_shared([BH, BN], dtype)
            s = T.alloc_fragment([BH, BN], f32)
            acc = T.alloc_fragment([BH, d_v], f32)
            m, m_prev = T.alloc_fragment([BH], f32), T.alloc_fragment([BH], f32)
            l, l_tile = T.alloc_fragment([BH], f32), T.alloc_fragment([BH], f32)
            alpha = T.alloc_fragment([BH], f32)

            # This program's slice [start, end) of the sequence, a whole
            # number of tiles long.
            seqlen = seqlens[i_b]
            split_len = T.ceildiv(seqlen, num_splits * BN) * BN  # = ceil(ceil(seqlen / num_splits) / BN) * BN
            start = i_s * split_len
            end = T.min(start + split_len, seqlen)
            # The query block. An empty slice (split-KV only) must issue no
            # copy: as a TMA copy it would still be in flight into this
            # program's shared memory when the program ends. Guarded,
            # TileLang makes it a plain copy by all threads in the split
            # kernel; the single pass keeps its TMA copy.
            if split:
                if end > start:
                    T.copy(q[i_b, i_h * BH, 0], q_c)
                    T.copy(q[i_b, i_h * BH, d_v], q_pe)
            else:
                T.copy(q[i_b, i_h * BH, 0], q_c)
                T.copy(q[i_b, i_h * BH, d_v], q_pe)
            T.fill(acc, 0)
            T.fill(l, 0)
            T.fill(m, -T.infinity(f32))
            for k in T.Pipelined(T.ceildiv(T.max(end - start, 0), BN), num_stages=2):
                t0 = start + k * BN
                row0 = T.cast(block_table[i_b, t0 // page], "int64") * page + t0 % page
                T.copy(kv[row0:row0 + BN, 0:d_v], kv_c)  # TMA, by a producer warpgroup
                T.copy(kv[row0:row0 + BN, d_v:d_qk], kv_pe)
                # The last tile: rows past the end become 0. Written as a
                # select that reads the tile, TileLang runs it in the
                # consumer warpgroups after the copy has landed (a plain
                # store of 0 went to the producer, before the copy that
                # overwrote it).
                if t0 + BN > end:
                    for i, j in T.Parallel(BN, d_v):
                        kv_c[i, j] = T.if_then_else(t0 + i < end, kv_c[i, j], 0)
                T.gemm(q_c, kv_c, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
                T.gemm(q_pe, kv_pe, s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                for i, j in T.Parallel(BH, BN):
                    s[i, j] = T.if_then_else(t0 + j < end, s[i, j], -T.infinity(f32))
                # Online softmax: m is the running max of the raw scores, l
                # the running sum of exp2.
                T.copy(m, m_prev)
                T.reduce_max(s, m, dim=1, clear=False)
                for i in T.Parallel(BH):
                    alpha[i] = T.exp2((m_prev[i] - m[i]) * scale_log2)
                for i, j in T.Parallel(BH, BN):
                    s[i, j] = T.exp2((s[i, j] - m[i]) * scale_log2)
                T.reduce_sum(s, l_tile, dim=1)
                for i in T.Parallel(BH):
                    l[i] = l[i] * alpha[i] + l_tile[i]
                for i, j in T.Parallel(BH, d_v):
                    acc[i, j] *= alpha[i]
                T.copy(s, p_shared)  # P as the A operand: every warpgroup needs all 64 columns
                T.gemm(p_shared, kv_c, acc, policy=T.GemmWarpPolicy.FullCol)
            # An empty slice (l = 0) writes o = 0 and lse = -inf: the merge
            # gives it no weight. (A NaN l, from a NaN score, still divides:
            # the NaN reaches the row, as in the reference.)
            for i, j in T.Parallel(BH, d_v):
                if i_h * BH + i < rows:
                    o[i_b, i_h * BH + i, i_s, j] = T.if_then_else(l[i] == 0, 0, acc[i, j] / l[i])
            for i in T.Parallel(BH):
                if i_h * BH + i < rows:
                    lse[i_b, i_h * BH + i, i_s] = (T.log2(l[i]) + m[i] * scale_log2) * lse_unit
    return mla_decode_tilelang


def _merge_kernel(T, rows, dtype, d_v=D_V):
    """Merge the slices' partials o fp32 [B, rows, num_splits, d_v] and lse
    (base 2) [B, rows, num_splits] into out [B, rows, d_v] (dtype) and lse
    fp32 [B, rows] (natural log)."""
    f32, B, num_splits = T.float32, T.dynamic("B"), T.dynamic("num_splits")

    @T.prim_func
    def mla_merge_tilelang(
        o_part: T.Tensor([B, rows, num_splits, d_v], f32), lse_part: T.Tensor([B, rows, num_splits], f32),
        out: T.Tensor([B, rows, d_v], dtype), lse: T.Tensor([B, rows], f32),
    ):
        with T.Kernel(rows, B, threads=128) as (r, i_b):
            acc = T.alloc_fragment([d_v], f32)
            lse_max, total = T.alloc_var(f32), T.alloc_var(f32)
            lse_max = -T.infinity(f32)
            for i in T.serial(num_splits):
                lse_max = T.max(lse_max, lse_part[i_b, r, i])
            total = 0
            for i in T.serial(num_splits):  # slice 0 is never empty: lse_max is finite
                total += T.exp2(lse_part[i_b, r, i] - lse_max)
            T.fill(acc, 0)
            for i in T.serial(num_splits):
                for j in T.Parallel(d_v):
                    acc[j] += o_part[i_b, r, i, j] * (T.exp2(lse_part[i_b, r, i] - lse_max) / total)
            for j in T.Parallel(d_v):
                out[i_b, r, j] = acc[j]
            lse[i_b, r] = (T.log2(total) + lse_max) * LN2
    return mla_merge_tilelang


_KERNELS: dict = {}  # (builder, rows[, split], dtype) -> compiled kernel


def _compiled(build, *key):
    """The compiled kernel `build(T, *key)`, compiled on first use (a few seconds) for this machine's GPU."""
    kernel = _KERNELS.get((build, *key))
    if kernel is None:
        tilelang = peers.tilelang()
        kernel = _KERNELS[(build, *key)] = tilelang.compile(build(tilelang.language, *key[:-1],
                                                                  getattr(tilelang.language, key[-1])))
    return kernel


def launch_tilelang(q, kv_cache, block_table, cache_seqlens, softmax_scale, num_splits):
    """Allocate and launch, for inputs `interface.mla_decode_tilelang` has checked: the decode kernel, and the
    merge kernel when num_splits > 1 (its partials in `planning.workspace`). kv_cache [B, T_max, 576] with
    block_table None, or pages [num_blocks, page, 576] with block_table. Returns out [B, s_q, H, 512] in q's
    dtype and lse fp32 [B, H, s_q]."""
    B, S_Q, H, _ = q.shape
    rows = S_Q * H
    if block_table is None:  # a dense cache is B pages of T_max rows: the identity table [[0], [1], ...]
        block_table = torch.arange(B, device=q.device, dtype=torch.int32).view(B, 1)
    page, dtype = kv_cache.shape[1], DTYPES[q.dtype]
    q_rows = q.contiguous().view(B, rows, D_QK)
    kv_rows = kv_cache.reshape(-1, D_QK).contiguous()   # a view unless the pages are not back to back
    args = (q_rows, kv_rows, block_table.contiguous(), cache_seqlens.contiguous(), page, softmax_scale * LOG2E)
    out = torch.empty(B, S_Q, H, D_V, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, rows, device=q.device, dtype=torch.float32)
    if num_splits == 1:
        _compiled(_decode_kernel, rows, False, dtype)(*args, out.view(B, rows, 1, D_V), lse.view(B, rows, 1))
    else:
        o_part, lse_part = workspace(B, rows, num_splits, D_V, q.device)
        _compiled(_decode_kernel, rows, True, dtype)(*args, o_part, lse_part)
        _compiled(_merge_kernel, rows, dtype)(o_part, lse_part, out.view(B, rows, D_V), lse)
    return out, lse.view(B, S_Q, H).transpose(1, 2).contiguous()   # lse [B, H, s_q]


__all__ = ["launch_tilelang", "BH", "BN", "D_QK", "D_V", "DTYPES"]
