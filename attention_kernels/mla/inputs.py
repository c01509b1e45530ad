"""The MLA decode contract's input checks (FlashMLA's), shared by the reference and every decode entry.

The arguments come in FlashMLA's order: q, kv_cache, block_table (None for a dense cache), cache_seqlens,
head_dim_v, softmax_scale, causal. `check_decode_inputs` judges the tensors' types, ranks, dtypes, devices
and shapes and the scalars (no value is read, nothing launched); its verdict is kept per call signature
(`attention_kernels.checks.check_once_per_signature`), so a decode step's repeated call costs a read of its tensors'
metadata and a dict lookup.
`check_cache_lengths` reads the lengths and the block table (one device sync).

    >>> kv_cache = paged_rows(kv_cache, block_table)
    >>> scale = check_decode_inputs(q, kv_cache, block_table, cache_seqlens, 512, None, kernel=True)
    >>> longest = check_cache_lengths(kv_cache, block_table, cache_seqlens, s_q=1, causal=False)
"""
from __future__ import annotations

import torch

from ..checks import (FLOATS, REFERENCE_FLOATS, check_bool, check_int, check_kernel_device, check_no_grad,
                      check_not_empty, check_once_per_signature, check_same_device, check_same_device_and_dtype,
                      check_tensor, softmax_scale_or_default)


@check_once_per_signature
def check_decode_inputs(q, kv_cache, block_table, cache_seqlens, head_dim_v=512, softmax_scale=None, causal=False,
                        *, kernel=False) -> float:
    """Check a decode call's arguments (TypeError/ValueError naming the argument); return the scale.

    q [B, s_q, H, D_qk]; kv_cache [B, T_max, D_qk] (block_table None) or [num_blocks, page_size, D_qk] (pass
    FlashMLA's 4D pages through `paged_rows` first) with block_table int32 [B, max_blocks]; cache_seqlens
    int32 [B]; q and kv_cache of one float dtype, everything on one device, no size 0. head_dim_v an int in
    [1, D_qk]; softmax_scale a float > 0, default D_qk ** -0.5 (FlashMLA's); causal a bool.
    kernel: the caller launches a kernel, so the kernels' dtypes (no fp64), the machine rule
    (`check_kernel_device`) and no input that requires grad (the kernels have no backward) apply too.
    """
    floats = FLOATS if kernel else REFERENCE_FLOATS
    check_tensor("q", q, ndim=4, dtypes=floats)
    check_tensor("kv_cache", kv_cache, ndim=3, dtypes=floats)
    check_tensor("cache_seqlens", cache_seqlens, ndim=1, dtypes=(torch.int32,))
    tensors = {"q": q, "kv_cache": kv_cache, "cache_seqlens": cache_seqlens}
    if block_table is not None:
        tensors["block_table"] = check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,))
    if kernel:
        check_kernel_device(**tensors)
        check_no_grad("mla_decode", q=q, kv_cache=kv_cache)
    check_same_device(**tensors)
    check_same_device_and_dtype(q=q, kv_cache=kv_cache)
    check_not_empty("q", q, "B, s_q, H, D_qk")
    B, _, _, D_QK = q.shape
    if block_table is None:
        check_tensor("kv_cache", kv_cache, shape=(B, None, D_QK))
        check_not_empty("kv_cache", kv_cache, "B, T_max, D_qk")
    else:
        check_tensor("kv_cache", kv_cache, shape=(None, None, D_QK))
        check_not_empty("kv_cache", kv_cache, "num_blocks, page_size, D_qk")
        check_tensor("block_table", block_table, shape=(B, None))
        check_not_empty("block_table", block_table, "B, max_blocks")
    check_tensor("cache_seqlens", cache_seqlens, shape=(B,))
    check_int("head_dim_v", head_dim_v, low=1, high=D_QK)
    check_bool("causal", causal)
    return softmax_scale_or_default(softmax_scale, D_QK)


def paged_rows(kv_cache, block_table):
    """FlashMLA's paged cache, [num_blocks, page_size, 1, D_qk] (one KV head), as the
    [num_blocks, page_size, D_qk] the kernels read: a view, no copy. Anything else is returned as it is
    (the checks that follow judge it).

    >>> paged_rows(torch.empty(10, 64, 1, 576), table).shape     # [10, 64, 576]
    """
    if block_table is not None and isinstance(kv_cache, torch.Tensor) and kv_cache.dim() == 4:
        check_tensor("kv_cache", kv_cache, shape=(None, None, 1, None))
        return kv_cache.squeeze(2)
    return kv_cache


def cache_capacity(kv_cache, block_table) -> int:
    """The most positions a sequence can hold: T_max, or max_blocks * page_size for a paged cache.

    >>> cache_capacity(torch.empty(4, 100, 576), None)           # 100
    """
    return kv_cache.shape[1] * (1 if block_table is None else block_table.shape[1])


def check_cache_lengths(kv_cache, block_table, cache_seqlens, s_q, causal) -> int:
    """Every length in [1, capacity] (and >= s_q when causal), every page a sequence uses inside the cache
    (ValueError otherwise). Reads the values: one device sync. Returns the longest length.

    >>> check_cache_lengths(kv_cache, block_table, cache_seqlens, s_q=1, causal=False)   # the longest length
    """
    page, capacity = kv_cache.shape[1], cache_capacity(kv_cache, block_table)
    checks = [cache_seqlens.min(), cache_seqlens.max()]
    if block_table is not None:
        used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] * page < cache_seqlens[:, None]
        checks.append((used & ((block_table < 0) | (block_table >= kv_cache.shape[0]))).any().to(cache_seqlens.dtype))
    lo, hi, *bad_page = torch.stack(checks).tolist()
    if lo < 1:
        raise ValueError(f"cache_seqlens must be >= 1, got min {lo}")
    if hi > capacity:
        what = "block_table too short: " if block_table is not None else ""
        raise ValueError(f"{what}cache_seqlens max {hi} exceeds the cache capacity {capacity}")
    if bad_page and bad_page[0]:
        raise ValueError(f"block_table holds page indices outside [0, {kv_cache.shape[0]}) for used pages")
    if causal and lo < s_q:
        raise ValueError(f"causal=True needs every cache_seqlens >= s_q={s_q}, got min {lo}")
    return hi


__all__ = ["check_decode_inputs", "paged_rows", "cache_capacity", "check_cache_lengths"]
