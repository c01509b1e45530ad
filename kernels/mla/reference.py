"""DeepSeek MLA in plain PyTorch: the naive path, the absorbed path, and the fp32
reference for the decode kernel's contract.

Layout [B, T, H, D] throughout. The latent cache holds, per token, c_kv (d_c = 512)
and k_pe (64 RoPE dims), shared by every head. W_uk [H, d_nope, d_c] rebuilds the
keys' no-RoPE part, W_uv [H, d_v, d_c] the values.
"""
from __future__ import annotations

import math

import torch


def mla_naive(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, softmax_scale):
    """MLA by reconstruction: rebuild every head's K and V from the latent, then attend.

    c_kv [B, T, d_c], k_pe [B, T, d_r], q_nope [B, s_q, H, d_nope], q_pe [B, s_q, H, d_r],
    W_uk [H, d_nope, d_c], W_uv [H, d_v, d_c]; every query sees all T positions.
    Returns [B, s_q, H, d_v] in the inputs' dtype.

    >>> out = mla_naive(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, softmax_scale=0.1352)
    >>> out.shape    # [B, s_q, H, 128]
    """
    H = W_uk.shape[0]
    k_nope = torch.einsum("btc,hdc->bthd", c_kv, W_uk)              # [B, T, H, d_nope]
    v = torch.einsum("btc,hvc->bthv", c_kv, W_uv)                   # [B, T, H, d_v]
    k_rope = k_pe[:, :, None, :].expand(-1, -1, H, -1)              # one RoPE key for all heads
    k = torch.cat([k_nope, k_rope], dim=-1)                         # [B, T, H, d_nope + d_r]
    q = torch.cat([q_nope, q_pe], dim=-1)                           # [B, s_q, H, d_nope + d_r]
    s = torch.einsum("bshd,bthd->bsht", q, k) * softmax_scale
    return torch.einsum("bsht,bthv->bshv", torch.softmax(s, dim=-1), v)


def mla_absorbed(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, softmax_scale):
    """MLA with the up-projections absorbed: attend in the 512-dim latent space.

    Same arguments and result as `mla_naive`. W_uk is folded into the query
    (q_nope W_uk: [B, s_q, H, d_c]) and W_uv is applied after the attention, so the
    keys and values are the cached latent itself, never rebuilt per head.

    >>> out = mla_absorbed(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, softmax_scale=0.1352)
    >>> torch.testing.assert_close(out, mla_naive(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, 0.1352))
    """
    q_abs = torch.einsum("bshd,hdc->bshc", q_nope, W_uk)            # fold W_uk into q
    s = (torch.einsum("bshc,btc->bsht", q_abs, c_kv)                # latent part of the score
         + torch.einsum("bshr,btr->bsht", q_pe, k_pe)) * softmax_scale  # RoPE part
    out_c = torch.einsum("bsht,btc->bshc", torch.softmax(s, dim=-1), c_kv)  # value = c_kv
    return torch.einsum("bshc,hvc->bshv", out_c, W_uv)              # W_uv after the attention


def absorb_query(q_nope, q_pe, W_uk):
    """The decode kernel's query: [q_nope W_uk, q_pe] -> [B, s_q, H, d_c + d_r].

    >>> q = absorb_query(q_nope, q_pe, W_uk)          # [B, 1, 128, 576]
    """
    return torch.cat([torch.einsum("bshd,hdc->bshc", q_nope, W_uk), q_pe], dim=-1)


def latent_cache(c_kv, k_pe):
    """The decode kernel's cache: [c_kv, k_pe] -> [B, T, d_c + d_r].

    >>> kv = latent_cache(c_kv, k_pe)                 # [B, T, 576]
    """
    return torch.cat([c_kv, k_pe], dim=-1)


def unabsorb_output(out_c, W_uv):
    """Apply W_uv after the latent attention: [B, s_q, H, d_c] -> [B, s_q, H, d_v].

    >>> out = unabsorb_output(out_c, W_uv)            # [B, 1, 128, 128]
    """
    return torch.einsum("bshc,hvc->bshv", out_c, W_uv)


def mla_decode_ref(q, kv_cache, cache_seqlens, softmax_scale, head_dim_v=512, block_table=None, causal=False):
    """fp32 reference for `mla_decode`'s contract: MQA over a latent cache, one batch element at a time.

    q [B, s_q, H, D_qk]; kv_cache [B, T_max, D_qk], or [num_blocks, page_size, D_qk] with
    block_table int [B, max_blocks]; cache_seqlens int [B]. The value is kv_cache[..., :head_dim_v].
    causal: query i sees cache positions < seqlen - s_q + i + 1.
    Returns out fp32 [B, s_q, H, head_dim_v] and lse fp32 [B, H, s_q] (natural log).

    >>> out, lse = mla_decode_ref(q, kv, seqlens, softmax_scale=576 ** -0.5)
    >>> out.shape, lse.shape     # [B, s_q, H, 512], [B, H, s_q]
    """
    B, s_q, H, D = q.shape
    outs, lses = [], []
    for b in range(B):
        n = int(cache_seqlens[b])
        if block_table is None:
            k = kv_cache[b, :n]
        else:
            page = kv_cache.shape[1]
            pages = block_table[b, : math.ceil(n / page)].long()
            k = kv_cache[pages].reshape(-1, D)[:n]
        k = k.float()                                                 # [n, D]: positions < n only
        v = k[:, :head_dim_v]
        s = torch.einsum("qhd,td->hqt", q[b].float(), k) * softmax_scale  # [H, s_q, n]
        if causal:
            seen = n - s_q + torch.arange(s_q, device=k.device) + 1       # positions query i sees
            allowed = torch.arange(n, device=k.device)[None, :] < seen[:, None]
            s = s.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)                              # [H, s_q]
        p = torch.exp(s - lse[..., None])
        outs.append(torch.einsum("hqt,tv->qhv", p, v))
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def yarn_softmax_scale(d_qk: int = 192, factor: float = 40.0, mscale_all_dim: float = 1.0) -> float:
    """DeepSeek-V3's softmax scale: d_qk^-1/2 times mscale^2, mscale = 0.1 ln(factor) + 1 (YaRN).

    >>> round(yarn_softmax_scale(), 4)
    0.1352
    """
    mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
    return d_qk ** -0.5 * mscale * mscale


__all__ = ["mla_naive", "mla_absorbed", "absorb_query", "latent_cache", "unabsorb_output",
           "mla_decode_ref", "yarn_softmax_scale"]
