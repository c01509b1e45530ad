"""The MLA decode entry points, in FlashMLA's argument order: check the inputs (`inputs.py`), plan the call
(`planning.py`: the kernel, the split, the workspace), allocate, launch.

    mla_decode(q, kv_cache, block_table, cache_seqlens, head_dim_v=512, softmax_scale=None, causal=False, *,
               num_splits=None, check_seqlens=True, backend="auto")

`mla_decode` chooses between the Triton kernel (`decode.py`) and the hand-scheduled Hopper one
(`gluon_decode.py`); `mla_decode_gluon` and `mla_decode_tilelang` call one kernel each, to time or test it.

Host time: with check_seqlens=False a call reads nothing back from the GPU (the split is planned from the
cache's capacity, which the shapes give), reuses its split-KV workspace, and launches the compiled kernels
directly after their first call. Its checks and decisions are kept as a plan per input signature
(`planning.plan_key`), as FlashMLA keeps its scheduling metadata: a later call with that signature only
allocates its output and launches.
"""
from __future__ import annotations

import torch

from .. import peers
from ..custom_ops import compiled_as_op, mla_decode_fake
from ..checks import check_bool, check_choice, check_has_values, check_int, check_no_grad, check_tensor
from . import gluon_decode, tilelang_decode
from .inputs import cache_capacity, check_cache_lengths, check_decode_inputs, paged_rows
from .planning import BACKENDS, dense_inputs, gluon_misfit, keep_plan, kept_plan, plan_decode, plan_key, splits_for


@compiled_as_op("attention_kernels::mla_decode", fake=mla_decode_fake)
def mla_decode(q, kv_cache, block_table: torch.Tensor | None, cache_seqlens, head_dim_v=512, softmax_scale=None,
               causal=False, *, num_splits: int | None = None, check_seqlens=True, backend="auto"):
    """MLA decode attention over a latent cache (absorbed form), FlashMLA's
    contract and argument order.

    q: [B, s_q, H, D_qk] (D_qk = 576 for DeepSeek: the absorbed 512 then the
        64 RoPE dims), s_q >= 1.
    kv_cache: [B, T_max, D_qk] with block_table None; or, with block_table
        (int32 [B, max_blocks]), a paged cache [num_blocks, page_size, D_qk],
        or FlashMLA's [num_blocks, page_size, 1, D_qk] (read as a view),
        where position t of sequence b is row t % page_size of page
        block_table[b, t // page_size]. Page slots past a sequence's length
        are never read (they may hold anything, NaN included). The value is
        the first head_dim_v columns of the cache (the latent c_kv).
    cache_seqlens: int32 [B], 1 <= seqlen <= capacity; positions past a
        sequence's length are never read.
    head_dim_v: default 512. softmax_scale: default D_qk ** -0.5 (FlashMLA's;
        DeepSeek-V3 with YaRN: ~0.1352).
    causal: query i of s_q sees cache positions < seqlen - s_q + i + 1 (and
        nothing else reaches its row).
    num_splits: slices per sequence (split-KV); None picks from B, H, length
        and the SM count (the longest length when check_seqlens reads it,
        else the cache's capacity: no device sync).
    check_seqlens: validate seqlens / block table values (one device sync);
        False in graphs, timing loops and serving loops (then nothing is read
        back from the GPU, and a call like an earlier one, in its tensors'
        shapes, strides, dtypes, devices, requires_grad and alignment and in
        the other arguments, skips the checks and the choices: it launches as
        that call did; see the module docstring).
    backend: "auto" (the Gluon kernel where it applies, see `planning.py`;
        else Triton), "triton", or "gluon" (ValueError, saying why, where it
        does not apply).
    dtypes: q and kv_cache of one dtype, bf16/fp16/fp32 on a CUDA GPU (fp32
        products in TF32), fp16/fp32 on CPU tensors under Triton's
        interpreter. No input may require grad (the kernels have no backward;
        ValueError naming it). Strided inputs are fine (copied where the
        kernels need dense rows). A cache with 16-byte aligned rows is read
        with TMA (the copy engine bounds every tile by the sequence length),
        paged ones with pages of 64 in the Gluon kernel; other paged or
        unaligned caches with pointer loads.
    Returns out [B, s_q, H, head_dim_v] in q's dtype and lse fp32 [B, H, s_q]
    (natural log; NaN for a row that saw a NaN score, +inf for one that saw a
    +inf score).

    >>> q = torch.randn(4, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
    >>> kv = torch.randn(4, 8192, 576, device="cuda", dtype=torch.bfloat16)
    >>> out, lse = mla_decode(q, kv, None,
    ...                       torch.full((4,), 8192, dtype=torch.int32,
    ...                                  device="cuda"))
    """
    # ---- a call like an earlier one, both with check_seqlens=False: checked
    # and planned then, launch as it did
    key = None
    if check_seqlens is False:
        key = plan_key(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, num_splits,
                       backend)
        plan = kept_plan(key)
        if plan is not None:
            return plan(q, kv_cache, block_table, cache_seqlens)

    # ---- validate before any launch
    kv_cache = paged_rows(kv_cache, block_table)   # [num_blocks, page, 1, D_qk] -> [num_blocks, page, D_qk], a view
    scale = check_decode_inputs(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal,
                                kernel=True)
    check_int("num_splits", num_splits, low=1, allow_none=True)
    check_bool("check_seqlens", check_seqlens)
    check_choice("backend", backend, BACKENDS)
    max_len = cache_capacity(kv_cache, block_table)  # what the split plans for, unless the lengths are read
    if check_seqlens:
        max_len = check_cache_lengths(kv_cache, block_table, cache_seqlens, q.shape[1], causal)

    # ---- plan, allocate, launch; the plan is kept for the calls like this
    # one, where no input had to be copied
    given = (q, kv_cache, block_table, cache_seqlens)
    dense = dense_inputs(*given)
    plan = plan_decode(*dense, head_dim_v, scale, causal, num_splits, backend, max_len)
    out, lse = plan(*dense)
    if key is not None and all(now is before for now, before in zip(dense, given)):
        keep_plan(key, plan)
    return out, lse


def mla_decode_gluon(q, kv_cache, block_table, cache_seqlens, head_dim_v=512, softmax_scale=None):
    """MLA decode (absorbed form, s_q = 1, one pass per sequence) with the hand-scheduled Hopper kernel,
    FlashMLA's argument order; see `planning.py`. `mla_decode` calls it where it applies; call it directly
    only to time or test it.

    q bf16 [B, 1, H, 576] (H % 64 == 0); kv_cache bf16 [B, T_max, 576] with block_table None, rows 16-byte
    aligned, or with block_table (int32 [B, max_blocks]) pages of 64 positions, [num_blocks, 64, 576] or
    [num_blocks, 64, 1, 576], stored back to back. cache_seqlens int32 [B], each in [0, capacity] (not
    checked: that would cost a device sync; a dense cache clamps a longer one to T_max for the copies, so it
    cannot read outside its rows, but its result is then meaningless). head_dim_v: 512, the only one it takes.
    softmax_scale: default 576 ** -0.5. CUDA tensors on a Hopper GPU and a tested Triton
    (`attention_kernels.launch.TESTED_TRITON`) only (ValueError elsewhere); no input may require grad.
    Returns out bf16 [B, 1, H, 512] and lse fp32 [B, H, 1] (natural log; a sequence of length 0 gives out 0
    and lse -inf).

    >>> q = torch.randn(8, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
    >>> kv = torch.randn(8, 4096, 576, device="cuda", dtype=torch.bfloat16)
    >>> out, lse = mla_decode_gluon(q, kv, None, torch.full((8,), 4096, dtype=torch.int32, device="cuda"))
    """
    kv_cache = paged_rows(kv_cache, block_table)
    scale = check_decode_inputs(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, kernel=True)
    check_tensor("q", q, dtypes=(torch.bfloat16,))  # the one dtype this kernel takes
    q, kv_cache, block_table, cache_seqlens = dense_inputs(q, kv_cache, block_table, cache_seqlens)
    misfit = gluon_misfit(q, kv_cache, block_table, head_dim_v)
    if misfit is not None:
        raise ValueError(f"the Gluon kernel does not apply here: {misfit}")
    B, _, H, _ = q.shape
    out = torch.empty(B, 1, H, head_dim_v, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, H, 1, device=q.device, dtype=torch.float32)
    gluon_decode.launch_gluon(q, kv_cache, block_table, cache_seqlens, scale, out, lse)
    return out, lse


def mla_decode_tilelang(q, kv_cache, block_table, cache_seqlens, head_dim_v=512, softmax_scale=None, *,
                        num_splits=None, check_seqlens=True):
    """MLA decode (absorbed form) with the TileLang kernels (`tilelang_decode.py`), FlashMLA's contract and
    argument order, no causal mask.

    q: [B, s_q, H, 576], bf16 or fp16 (every query row sees the whole sequence).
    kv_cache: dense [B, T_max, 576] (block_table None), or paged [num_blocks, page, 576] or
        [num_blocks, page, 1, 576] with block_table int32 [B, max_blocks], page a multiple of 64
        (FlashMLA's is 64). The value is a row's first head_dim_v = 512 channels.
    cache_seqlens: int32 [B], each in [1, capacity]; page slots past a length may hold anything (NaN too).
    softmax_scale: default 576 ** -0.5. num_splits: slices per sequence (split-KV); None picks one with
        the Triton path's cost model (`planning.splits_for`). check_seqlens: read the lengths and block
        table to check them (one device sync); False in graphs and timing loops.
    CUDA tensors only, none requiring grad; needs TileLang (RuntimeError without it). The first call with a
    new (s_q * H, dtype, split or not) compiles its kernels, a few seconds each; B, the cache's size and
    num_splits are runtime. Returns out [B, s_q, H, 512] in q's dtype and lse fp32 [B, H, s_q] (natural log).

    >>> q = torch.randn(4, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
    >>> kv = torch.randn(4, 8192, 576, device="cuda", dtype=torch.bfloat16)
    >>> out, lse = mla_decode_tilelang(q, kv, None, torch.full((4,), 8192, dtype=torch.int32, device="cuda"))
    """
    # ---- validate before anything else (the same answers with or without TileLang)
    kv_cache = paged_rows(kv_cache, block_table)
    scale = check_decode_inputs(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale)
    check_tensor("q", q, dtypes=tuple(tilelang_decode.DTYPES))
    check_no_grad("mla_decode", q=q, kv_cache=kv_cache)
    check_has_values(q=q, kv_cache=kv_cache, cache_seqlens=cache_seqlens,
                     **({} if block_table is None else {"block_table": block_table}))
    D_QK, D_V, BN = tilelang_decode.D_QK, tilelang_decode.D_V, tilelang_decode.BN
    if q.shape[-1] != D_QK or head_dim_v != D_V:
        raise ValueError(f"the TileLang kernels are built for D_qk = {D_QK} (q.shape[-1]) and head_dim_v = {D_V}, "
                         f"got {q.shape[-1]} and {head_dim_v}")
    if block_table is not None and kv_cache.shape[1] % BN:
        raise ValueError(f"kv_cache: the TileLang kernel reads a page in tiles of {BN} positions, so the page size "
                         f"must be a multiple of {BN}, got {kv_cache.shape[1]}")
    check_int("num_splits", num_splits, low=1, allow_none=True)
    check_bool("check_seqlens", check_seqlens)
    if peers.tilelang() is None:
        raise RuntimeError("mla_decode_tilelang needs TileLang (`pip install tilelang`), which is not installed here")
    for name, t in {"q": q, "kv_cache": kv_cache, "block_table": block_table, "cache_seqlens": cache_seqlens}.items():
        if t is not None and t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}: the TileLang kernels run on a CUDA GPU and take CUDA tensors")
    B, S_Q, H, _ = q.shape
    max_len = cache_capacity(kv_cache, block_table)
    if check_seqlens:
        max_len = check_cache_lengths(kv_cache, block_table, cache_seqlens, S_Q, False)
    if num_splits is None:
        num_splits = splits_for(B, S_Q * H, max_len, q.device)
    return tilelang_decode.launch_tilelang(q, kv_cache, block_table, cache_seqlens, scale, num_splits)


__all__ = ["mla_decode", "mla_decode_gluon", "mla_decode_tilelang"]
