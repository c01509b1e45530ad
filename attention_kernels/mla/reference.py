"""DeepSeek MLA in plain PyTorch: the naive path, the absorbed path, and the reference for the decode
kernel's contract (its input checks are `inputs.py`'s, which the kernels' entries apply too).

Layout [B, T, H, D] throughout. The latent cache holds, per token, c_kv (d_c = 512)
and k_pe (64 RoPE dims), shared by every head. W_uk [H, d_nope, d_c] rebuilds the
keys' no-RoPE part, W_uv [H, d_v, d_c] the values.
Every function takes fp16, bf16, fp32 or fp64 tensors of one dtype on one device (any device).
"""
from __future__ import annotations

import math

import torch

from ..checks import (REFERENCE_FLOATS, check_has_values, check_int, check_not_empty, check_same_device_and_dtype,
                      check_tensor, softmax_scale_or_default)
from .inputs import check_cache_lengths, check_decode_inputs, paged_rows


def _check_layout(**inputs):
    """inputs: name=(tensor, "B T d_c"). Each a float tensor of that rank with no size 0, all of one dtype
    and device, and a named size the same wherever it appears (ValueError naming the tensor otherwise)."""
    for name, (t, dims) in inputs.items():
        check_tensor(name, t, ndim=len(dims.split()), dtypes=REFERENCE_FLOATS)
    check_same_device_and_dtype(**{name: t for name, (t, _) in inputs.items()})
    sizes = {}
    for name, (t, dims) in inputs.items():
        want = tuple(sizes.setdefault(d, s) for d, s in zip(dims.split(), t.shape))
        if want != tuple(t.shape):
            raise ValueError(f"{name} must have shape [{', '.join(dims.split())}] = {want} to match the other "
                             f"inputs, got {tuple(t.shape)}")
        check_not_empty(name, t, ", ".join(dims.split()))


def _check_mla_inputs(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, softmax_scale) -> float:
    _check_layout(c_kv=(c_kv, "B T d_c"), k_pe=(k_pe, "B T d_r"), q_nope=(q_nope, "B s_q H d_nope"),
                  q_pe=(q_pe, "B s_q H d_r"), W_uk=(W_uk, "H d_nope d_c"), W_uv=(W_uv, "H d_v d_c"))
    return softmax_scale_or_default(softmax_scale, None)


def mla_naive(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, softmax_scale):
    """MLA by reconstruction: rebuild every head's K and V from the latent,
    then attend.

    c_kv [B, T, d_c], k_pe [B, T, d_r], q_nope [B, s_q, H, d_nope], q_pe [B,
    s_q, H, d_r], W_uk [H, d_nope, d_c], W_uv [H, d_v, d_c]; every query sees
    all T positions.
    softmax_scale: required (a float > 0). Returns [B, s_q, H, d_v] in the
    inputs' dtype.

    >>> out = mla_naive(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv,
    ...                 softmax_scale=0.1352)
    >>> out.shape    # [B, s_q, H, 128]
    """
    softmax_scale = _check_mla_inputs(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, softmax_scale)
    H = W_uk.shape[0]
    k_nope = torch.einsum("btc,hdc->bthd", c_kv, W_uk)              # [B, T, H, d_nope]
    v = torch.einsum("btc,hvc->bthv", c_kv, W_uv)                   # [B, T, H, d_v]
    k_rope = k_pe[:, :, None, :].expand(-1, -1, H, -1)              # one RoPE key for all heads
    k = torch.cat([k_nope, k_rope], dim=-1)                         # [B, T, H, d_nope + d_r]
    q = torch.cat([q_nope, q_pe], dim=-1)                           # [B, s_q, H, d_nope + d_r]
    s = torch.einsum("bshd,bthd->bsht", q, k) * softmax_scale
    return torch.einsum("bsht,bthv->bshv", torch.softmax(s, dim=-1), v)


def mla_absorbed(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, softmax_scale):
    """MLA with the up-projections absorbed: attend in the 512-dim latent
    space.

    Same arguments and result as `mla_naive`. W_uk is folded into the query
    (q_nope W_uk: [B, s_q, H, d_c]) and W_uv is applied after the attention,
    so the keys and values are the cached latent itself, never rebuilt per
    head.

    >>> out = mla_absorbed(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv,
    ...                    softmax_scale=0.1352)
    >>> torch.testing.assert_close(
    ...     out, mla_naive(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, 0.1352))
    """
    softmax_scale = _check_mla_inputs(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, softmax_scale)
    q_abs = torch.einsum("bshd,hdc->bshc", q_nope, W_uk)            # fold W_uk into q
    s = (torch.einsum("bshc,btc->bsht", q_abs, c_kv)                # latent part of the score
         + torch.einsum("bshr,btr->bsht", q_pe, k_pe)) * softmax_scale  # RoPE part
    out_c = torch.einsum("bsht,btc->bshc", torch.softmax(s, dim=-1), c_kv)  # value = c_kv
    return torch.einsum("bshc,hvc->bshv", out_c, W_uv)              # W_uv after the attention


def absorb_query(q_nope, q_pe, W_uk):
    """The decode kernel's query: [q_nope W_uk, q_pe] -> [B, s_q, H, d_c + d_r].

    q_nope [B, s_q, H, d_nope], q_pe [B, s_q, H, d_r], W_uk [H, d_nope, d_c].

    >>> q = absorb_query(q_nope, q_pe, W_uk)          # [B, 1, 128, 576]
    """
    _check_layout(q_nope=(q_nope, "B s_q H d_nope"), q_pe=(q_pe, "B s_q H d_r"), W_uk=(W_uk, "H d_nope d_c"))
    return torch.cat([torch.einsum("bshd,hdc->bshc", q_nope, W_uk), q_pe], dim=-1)


def latent_cache(c_kv, k_pe):
    """The decode kernel's cache: [c_kv, k_pe] -> [B, T, d_c + d_r].

    c_kv [B, T, d_c], k_pe [B, T, d_r].

    >>> kv = latent_cache(c_kv, k_pe)                 # [B, T, 576]
    """
    _check_layout(c_kv=(c_kv, "B T d_c"), k_pe=(k_pe, "B T d_r"))
    return torch.cat([c_kv, k_pe], dim=-1)


def unabsorb_output(out_c, W_uv):
    """Apply W_uv after the latent attention: out_c [B, s_q, H, d_c], W_uv [H, d_v, d_c] -> [B, s_q, H, d_v].

    >>> out = unabsorb_output(out_c, W_uv)            # [B, 1, 128, 128]
    """
    _check_layout(out_c=(out_c, "B s_q H d_c"), W_uv=(W_uv, "H d_v d_c"))
    return torch.einsum("bshc,hvc->bshv", out_c, W_uv)


# ---------------------------------------------------------------------------------- the decode contract
def mla_decode_ref(q, kv_cache, block_table, cache_seqlens, head_dim_v=512, softmax_scale=None, causal=False):
    """Reference for `mla_decode`'s contract (FlashMLA's, in its argument
    order): MQA over a latent cache, one batch element and query at a time.

    q [B, s_q, H, D_qk]; kv_cache [B, T_max, D_qk] with block_table None, or
    [num_blocks, page_size, D_qk] (or FlashMLA's [num_blocks, page_size, 1,
    D_qk]) with block_table int32 [B, max_blocks]; cache_seqlens int32 [B],
    each in [1, capacity]. The key is the whole cache row, the value its
    first head_dim_v columns.
    softmax_scale: a float > 0, default D_qk ** -0.5 (FlashMLA's).
    causal: query i sees cache positions < seqlen - s_q + i + 1; no other
    position enters its row. Computes in fp32 (fp64 for fp64 inputs); returns
    out [B, s_q, H, head_dim_v] and lse [B, H, s_q] (natural log).

    >>> out, lse = mla_decode_ref(q, kv, None, seqlens)
    >>> out.shape, lse.shape     # [B, s_q, H, 512], [B, H, s_q]
    """
    kv_cache = paged_rows(kv_cache, block_table)
    scale = check_decode_inputs(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal)
    check_has_values(q=q, kv_cache=kv_cache, cache_seqlens=cache_seqlens)
    check_cache_lengths(kv_cache, block_table, cache_seqlens, q.shape[1], causal)
    B, s_q, H, D = q.shape
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.empty(B, s_q, H, head_dim_v, dtype=dtype, device=q.device)
    lse = torch.empty(B, H, s_q, dtype=dtype, device=q.device)
    for b in range(B):
        n = int(cache_seqlens[b])
        if block_table is None:
            rows = kv_cache[b, :n]
        else:
            page = kv_cache.shape[1]
            pages = block_table[b, : math.ceil(n / page)].long()
            rows = kv_cache[pages].reshape(-1, D)[:n]
        rows = rows.to(dtype)                                          # [n, D]: positions < n only
        for i in range(s_q):
            k = rows[: n - s_q + i + 1] if causal else rows            # what query i sees
            s = q[b, i].to(dtype) @ k.T * scale                        # [H, positions]
            lse[b, :, i] = torch.logsumexp(s, dim=-1)
            out[b, i] = torch.softmax(s, dim=-1) @ k[:, :head_dim_v]
    return out, lse


def yarn_softmax_scale(d_qk: int = 192, factor: float = 40.0, mscale_all_dim: float = 1.0) -> float:
    """DeepSeek-V3's softmax scale: d_qk^-1/2 times mscale^2, mscale = 0.1 ln(factor) + 1 (YaRN).

    >>> round(yarn_softmax_scale(), 4)
    0.1352
    """
    check_int("d_qk", d_qk, low=1)
    factor = softmax_scale_or_default(factor, None, name="factor")  # a finite float > 0, as a scale is
    mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
    return d_qk ** -0.5 * mscale * mscale


__all__ = ["mla_naive", "mla_absorbed", "absorb_query", "latent_cache", "unabsorb_output",
           "mla_decode_ref", "yarn_softmax_scale"]
